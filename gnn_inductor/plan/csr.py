"""CSR plan of a graph: the structure every gnn_io kernel walks.

``csr_plan(dst, src, num_dst, num_src) -> (rowptr, col, row, perm, t_rowptr, t_col, t_perm)``
sorts the edges ``src[e] -> dst[e]`` by destination (stable, so duplicate edges keep their order):

- ``rowptr[num_dst + 1]``: CSR offsets, ``rowptr[i+1] - rowptr[i]`` is the in-degree of ``i``;
- ``col[E]``: source of each CSR edge; ``row[E]``: destination of each CSR edge;
- ``perm[E]``: original edge id of each CSR edge (edge features and weights are read through it);
- ``t_rowptr[num_src + 1]``, ``t_col[E]``, ``t_perm[E]``: the transposed adjacency (CSR of ``A^T``,
  edges sorted by source): its offsets, the destination of each edge, and the CSR position of
  each edge (values of ``A^T`` are ``values[t_perm]``). Backward passes walk it instead of atomics.

It is pure structure work: the backend hoists it into the graph plan, so it runs once per graph.
Indices are validated here, with errors that name the bad values.
"""
from __future__ import annotations

import logging

import torch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results
from gnn_inductor.kernels.runtime.progress import timed

log = logging.getLogger(__name__)


def _check_index(name: str, index: Tensor, bound: int, bound_name: str, where: str = "") -> None:
    _check_indices([(name, index, bound, bound_name)], where)


def _check_indices(checks: list, where: str = "") -> None:
    """Each ``(name, index, bound, bound_name)`` of ``checks`` in ``[0, bound)``, with one device sync for all of
    them (each sync drains the GPU's queue: a plan is built per new graph, once per step in mini-batch
    training)."""
    ranges = []
    for name, index, _bound, _ in checks:
        if index.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be an int64 or int32 tensor, got {index.dtype}")
        if index.dim() != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(index.shape)}")
        if index.numel():
            ranges.append(torch.stack(torch.aminmax(index)).long())
    if not ranges:
        return
    values = iter(torch.cat(ranges).tolist())
    for name, index, bound, bound_name in checks:
        if not index.numel():
            continue
        lo, hi = next(values), next(values)
        if lo < 0:
            raise IndexError(f"{name} has negative values (min {lo}){where}")
        if hi >= bound:
            raise IndexError(f"{name} has values >= {bound_name} (max {hi}, {bound_name} {bound}){where}")


@torch.library.custom_op("gnn_io::csr_plan", mutates_args=())
@contiguous_results
def csr_plan(dst: Tensor, src: Tensor, num_dst: int,
             num_src: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    with timed(log, f"CSR build ({dst.numel():,} edges, {num_dst:,} rows)"):
        _check_indices([("edge_index (destination row)", dst, num_dst, "num_nodes"),
                        ("edge_index (source row)", src, num_src, "num_nodes")])
        if dst.numel() != src.numel():
            raise ValueError(f"source and destination index differ in length ({src.numel()} vs {dst.numel()})")
        if dst.is_cuda and dst.numel() >= 2**31 - 1:
            raise ValueError(f"graphs with 2^31 or more edges are not supported on CUDA yet (got {dst.numel()})")
        return build_csr(dst, src, num_dst, num_src, index_dtype(dst.device))


def build_csr(dst: Tensor, src: Tensor, num_dst: int, num_src: int, dtype: torch.dtype) -> tuple:
    """:func:`csr_plan`'s arrays in ``dtype``, each made in ``dtype`` as soon as it exists: in int32 (CUDA) a
    billion-edge build holds six 4-byte arrays of E and one 8-byte sort permutation at a time, where sorting in
    int64 and converting at the end held every array twice over."""
    def narrow(index: Tensor) -> Tensor:
        return index if index.dtype == dtype else index.to(dtype)

    row, perm = torch.sort(narrow(dst), stable=True)
    perm = narrow(perm)  # torch.sort's permutation is int64
    col = narrow(src).index_select(0, perm)
    col_sorted, t_perm = torch.sort(col, stable=True)
    t_perm = narrow(t_perm)
    t_col = row.index_select(0, t_perm)
    t_rowptr = narrow(_offsets(col_sorted, num_src))
    del col_sorted
    return narrow(_offsets(row, num_dst)), col, row, perm, t_rowptr, t_col, t_perm


def index_dtype(device) -> torch.dtype:
    """int32 on CUDA (cuSPARSE and the GPU kernels read half the index bytes), int64 elsewhere."""
    return torch.int32 if torch.device(device).type == "cuda" else torch.int64


def _offsets(sorted_index: Tensor, num: int) -> Tensor:
    """CSR offsets of an ascending index: ``offsets[i]`` = how many entries are below ``i``. A binary search
    per row, without the device sync of ``bincount`` (which reads the maximum on the host to size its
    output)."""
    return torch.searchsorted(sorted_index, torch.arange(num + 1, device=sorted_index.device,
                                                         dtype=sorted_index.dtype))


@csr_plan.register_fake
def _(dst, src, num_dst, num_src):
    dtype = index_dtype(dst.device)

    def edges():
        return dst.new_empty((dst.shape[0],), dtype=dtype)

    rowptr = dst.new_empty((num_dst + 1,), dtype=dtype)
    t_rowptr = dst.new_empty((num_src + 1,), dtype=dtype)
    return rowptr, edges(), edges(), edges(), t_rowptr, edges(), edges()


@torch.library.custom_op("gnn_io::self_loop_csr", mutates_args=())
@contiguous_results
def self_loop_csr(rowptr: Tensor, col: Tensor, values: Tensor, t_rowptr: Tensor, t_col: Tensor,
                  t_values: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""The CSR of ``A + s I`` (and of its transpose) for a square plan, with ``s`` left open.

    Each row ``i`` gets one more entry, first in the row, in column ``i`` (kept apart from any self
    loop the graph already has, so duplicates add up as a sum should). Returns ``(rowptr, col, row,
    diag, base, t_rowptr, t_col, t_row, t_diag, t_base)``: the offsets, columns and rows of the new CSR
    (``E + n`` entries), ``diag`` marks the added entries, ``base`` holds ``values`` at the old
    entries and 0 at the added ones; ``t_*`` the same for ``A^T + s I`` from ``t_values``. The values of
    ``A + s I`` are then ``where(diag, s, base)``: one elementwise op per call for a scale that
    changes (GIN's ``1 + eps``), nothing when it is structure. Built once per graph (the plan)."""
    if rowptr.numel() != t_rowptr.numel():
        raise ValueError(f"self_loop_csr needs a square plan, got {rowptr.numel() - 1} rows and "
                         f"{t_rowptr.numel() - 1} columns")
    parts = _with_diagonal(rowptr, col, values) + _with_diagonal(t_rowptr, t_col, t_values)
    return tuple(p.to(rowptr.dtype) if i % 5 < 3 else p for i, p in enumerate(parts))


def _with_diagonal(rowptr: Tensor, col: Tensor, values: Tensor) -> tuple:
    n, device = rowptr.numel() - 1, rowptr.device
    rowptr = rowptr.long()
    nodes = torch.arange(n, device=device)
    row = torch.repeat_interleave(nodes, rowptr[1:] - rowptr[:-1], output_size=col.numel())
    new_rowptr = rowptr + torch.arange(n + 1, device=device)
    slot = torch.arange(col.numel(), device=device) + row + 1   # every row up to this one gained an entry
    first = new_rowptr[:-1]
    new_col = torch.empty(col.numel() + n, dtype=torch.long, device=device)
    new_col[slot], new_col[first] = col.long(), nodes
    new_row = torch.empty_like(new_col)
    new_row[slot], new_row[first] = row, nodes
    diag = torch.ones(col.numel() + n, dtype=torch.bool, device=device)
    diag[slot] = False
    base = values.new_zeros(col.numel() + n)
    base[slot] = values
    return new_rowptr, new_col, new_row, diag, base


@self_loop_csr.register_fake
def _(rowptr, col, values, t_rowptr, t_col, t_values):
    size = col.shape[0] + rowptr.shape[0] - 1

    def part(ptr, vals):
        return (ptr.new_empty(ptr.shape), ptr.new_empty((size,)), ptr.new_empty((size,)),
                ptr.new_empty((size,), dtype=torch.bool), vals.new_empty((size,)))

    return part(rowptr, values) + part(t_rowptr, t_values)


DEGREE_BUCKETS = 42  # of the in-degree histogram: 0, 1, 2-3, 4-7, ..., the last from 2^40


def degree_stats(rowptr: Tensor) -> dict:
    """Node/edge counts and in-degree profile of a plan, for the rewrite report. ``degree_histogram``: nodes per
    in-degree bucket, bucket 0 degree 0 and bucket k degrees 2^(k-1) to 2^k - 1, trailing empty buckets dropped."""
    deg = (rowptr[1:] - rowptr[:-1]).long()
    num_nodes = int(deg.numel())
    if not num_nodes:
        return {"nodes": 0, "edges": int(rowptr[-1]), "max_degree": 0, "mean_degree": 0.0, "isolated_nodes": 0,
                "degree_histogram": []}
    bounds = torch.tensor([1 << k for k in range(DEGREE_BUCKETS - 1)], device=deg.device)
    buckets = torch.bucketize(deg, bounds, right=True)  # no device sync, unlike bincount
    histogram = torch.zeros(DEGREE_BUCKETS, dtype=torch.long, device=deg.device).index_add_(
        0, buckets, torch.ones_like(buckets))
    values = torch.cat([torch.stack([rowptr[-1].long(), deg.max(), (deg == 0).sum()]), histogram]).tolist()  # one sync
    edges, max_degree, isolated, counts = values[0], values[1], values[2], values[3:]
    while counts and counts[-1] == 0:
        counts.pop()
    return {"nodes": num_nodes, "edges": edges, "max_degree": max_degree,
            "mean_degree": round(edges / num_nodes, 3), "isolated_nodes": isolated, "degree_histogram": counts}


@torch.library.custom_op("gnn_io::check_index", mutates_args=())
def check_index(index: Tensor, bound: int, where: str) -> None:
    """Raise a clear error when a structure index leaves ``[0, bound)``. The backend inserts one
    before each remaining gather/scatter whose index is graph structure (so it runs once per graph,
    in the plan), where the plain op would fail with a bare message on CPU or a device assert on GPU."""
    _check_index("edge_index", index.reshape(-1), bound, "num_nodes", f"; used by {where}")


@check_index.register_fake
def _(index, bound, where):
    return None


torch.fx.node.has_side_effect(torch.ops.gnn_io.check_index.default)
