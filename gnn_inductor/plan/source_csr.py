"""The transposed CSR of a graph for the split attention backward's src pass (:class:`SourceCSR`: rows are source
nodes), and the map from the CSR's positions to the transposed one's, each built once per graph and kept in the
graph's state (slot ``"csr_by_src"``, :mod:`gnn_inductor.plan.state`: it lives, and is invalidated, with the graph).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gnn_inductor.kernels.runtime.cuda_graphs import capturing, kept_outside_graph_pool
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan.work_items import WorkItems, rows_to_fill, work_items


class SourceCSR(NamedTuple):
    """The CSR transposed for the split backward's src pass: rows are source nodes, each row's edges
    in CSR order (a stable sort by source)."""
    rowptr: Tensor   # [num_src + 1] int64
    dst: Tensor      # [E] the destination of each edge (col's dtype)
    eid: Tensor      # [E] its edge id, perm[position in the CSR] (what edge-role arguments are indexed by)
    items: WorkItems  # work items of these rows, at most ``max_edges`` edges each
    max_edges: int = 0  # their split: rows of more entries have several (shared) items; 0 when unknown
    fill_rows: Tensor | None = None  # the rows without entries or of more than ``max_edges`` (rows_to_fill)


def build_source_csr(rowptr: Tensor, col: Tensor, perm: Tensor, num_src: int, max_edges: int) -> SourceCSR:
    """:class:`SourceCSR` of the CSR ``(rowptr, col, perm)``: a stable sort of the ``E`` sources and a
    histogram, on ``rowptr``'s device; edges whose source is ``>= num_src`` are left out (no row)."""
    num_dst, num_edges = rowptr.numel() - 1, col.numel()
    degree = (rowptr[1:] - rowptr[:-1]).long()
    dst_of_position = torch.repeat_interleave(torch.arange(num_dst, device=rowptr.device, dtype=col.dtype), degree,
                                              output_size=num_edges)
    position = torch.sort(col, stable=True).indices
    counts = torch.bincount(col.long(), minlength=num_src)[:num_src]
    t_rowptr = torch.zeros(num_src + 1, dtype=torch.long, device=rowptr.device)
    torch.cumsum(counts, 0, out=t_rowptr[1:])
    return SourceCSR(t_rowptr, dst_of_position.index_select(0, position), perm.index_select(0, position),
                     work_items(t_rowptr, max_edges), max_edges, rows_to_fill(t_rowptr, max_edges))


def source_csr(rowptr: Tensor, col: Tensor, perm: Tensor, num_src: int, max_edges: int) -> SourceCSR | None:
    """The graph's :class:`SourceCSR` of ``num_src`` source rows split at ``max_edges``, built at the first call and
    kept in the graph's state. None when it is not built yet and a CUDA graph is being captured: its work items
    count their hubs on the host (a synchronisation a capture refuses)."""
    key = (num_src, max_edges)
    cache = graph_state.state_of(rowptr, col, perm).slot("csr_by_src")
    if key not in cache and capturing(rowptr.device):
        return None
    return kept_outside_graph_pool(cache, key, lambda: build_source_csr(rowptr, col, perm, *key), rowptr.device)


def source_positions(rowptr: Tensor, col: Tensor, perm: Tensor, by_src: SourceCSR) -> Tensor | None:
    """``[E]`` (col's dtype): for each position of the CSR ``(rowptr, col)``, the position of the same edge in
    ``by_src`` (the inverse of :func:`build_source_csr`'s stable sort), built at the first call and kept in the
    graph's state. The segment backward's src pass stores each edge's dst-role term there, contiguously,
    and the sum per destination reads it back through this map. None where ``by_src`` leaves edges out (sources
    past its rows: their positions are never walked), and while a CUDA graph is captured before it was built (the
    check reads a count on the host)."""

    cache = graph_state.state_of(rowptr, col, perm).slot("csr_by_src")
    key = ("source_positions", by_src.rowptr.numel() - 1)
    if key not in cache and capturing(rowptr.device):
        return None

    def build():
        num_edges = col.numel()
        if int(by_src.rowptr[-1]) != num_edges:  # once per graph
            return None
        order = torch.sort(col, stable=True).indices  # build_source_csr's order
        positions = torch.empty(num_edges, dtype=col.dtype, device=col.device)
        positions[order] = torch.arange(num_edges, dtype=col.dtype, device=col.device)
        return positions
    return kept_outside_graph_pool(cache, key, build, rowptr.device)
