"""The split backward one block of node rows at a time, for gradients packed into one ``[N, F]`` tensor whose
blocks are consumed as they are made (kernels/attention/op.py's ``attention_backward_projected``).
"""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from gnn_inductor import config as settings
from gnn_inductor.kernels.attention.csr_backward import grad_buffers, grad_outputs, kernel_arguments
from gnn_inductor.kernels.attention.csr_launch import SPLIT_BACKWARD_LAUNCH, all_heads_launch_config
from gnn_inductor.kernels.attention.csr_split_backward import MAX_GRAD_OUTPUTS, split_pass
from gnn_inductor.kernels.attention.layout import Layout, call_items, undo_view_grad
from gnn_inductor.kernels.runtime.cuda_graphs import capturing, kept_outside_graph_pool
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from gnn_inductor.kernels.runtime.launch import cdiv
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.plan.source_csr import SourceCSR
from gnn_inductor.plan.work_items import PADDING, hub_items


def chunk_bounds(num_rows: int, row_bytes: int, chunk_bytes: int) -> list:
    """Row boundaries ``[0, ..., num_rows]`` cutting ``num_rows`` rows of ``row_bytes`` each into chunks of at most
    ``chunk_bytes`` (even by rows; one chunk when all of them fit)."""
    count = max(1, cdiv(num_rows * row_bytes, max(1, chunk_bytes)))
    count = min(count, max(1, num_rows))
    return [num_rows * c // count for c in range(count + 1)]


def _item_bounds(items, bounds: list, cache: dict, key) -> list | None:
    """For each row boundary in ``bounds``, the index of the first work item of a row at or past it: the items of
    rows ``[bounds[c], bounds[c + 1])`` are then ``[result[c], result[c + 1])``. Items come in row order with any
    padding items last (:func:`gnn_inductor.plan.work_items.work_items`); one device sync, kept in ``cache``
    (the graph plan's) under ``key``. None where the items are not in that order, or while a CUDA graph is captured
    before they were counted (the count reads the device)."""
    item_row, shared = items[0], items[3]
    device = item_row.device
    if key not in cache and capturing(device):
        return None

    def build():
        real = shared != PADDING
        count = real.sum()
        rows = torch.where(real, item_row.long(), torch.iinfo(torch.int64).max)  # padding sorts last
        ordered = (rows[1:] >= rows[:-1]).all() if rows.numel() > 1 else torch.ones((), dtype=torch.bool,
                                                                                   device=device)
        found = torch.searchsorted(rows, torch.tensor(bounds, dtype=torch.int64, device=device))
        found[-1] = count
        values = torch.cat([ordered.reshape(1).long(), found]).tolist()  # the one sync
        return values[1:] if values[0] else None
    return kept_outside_graph_pool(cache, key, build, device)


CHUNK_STREAMS_ENV = settings.SETTINGS["grad_chunk_streams"].env  # 0: backward_chunked's two passes one after the other
_SIDE_STREAMS: dict = {}


def _side_stream(device) -> "torch.cuda.Stream | None":
    """A second stream on CUDA ``device`` (one per device, kept), None on other devices or with
    ``GNN_IO_GRAD_CHUNK_STREAMS=0``."""
    if getattr(device, "type", device) != "cuda":
        return None
    if not settings.get("grad_chunk_streams"):
        return None
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def backward_chunked(layout: Layout, grad_out: Tensor, delta: Tensor, lse: Tensor, rowptr: Tensor, col: Tensor,
                     perm: Tensor, needs_grad, items, max_edges: int, by_src: SourceCSR, pack_offsets: list,
                     pack_width: int, gaps: list, dtype: torch.dtype, bounds: list, consume,
                     cache: dict) -> list | None:
    """The split backward one block of node rows at a time, for gradients packed into one ``[N, pack_width]``
    tensor (kernels/attention/op.py's ``attention_backward_projected``): for each chunk ``[r0, r1)`` of ``bounds``,
    the packed gradient's rows ``r0 .. r1`` (``dtype``; argument ``i``'s gradient in columns
    ``pack_offsets[i] ..``, zeros in the column ranges ``gaps``) are computed by the dst pass over the items of
    destinations ``r0 .. r1`` and the src pass over the items of sources ``r0 .. r1``, then handed to
    ``consume(r0, r1, chunk)`` and dropped. Each packed gradient row is a row-role output of its own pass (a
    destination's sum over its CSR row, a source's over its transposed row), so it is complete once its chunk's
    two passes ran, and the whole ``[N, pack_width]`` tensor never exists. Unpacked gradients (edge-role, the
    dense ``att``) are accumulated over the chunks in their own buffers and returned as :func:`csr_backward.backward` does; the
    packed entries are None.

    None, with nothing computed, where the chunks cannot be cut so: a row-role gradient that is not packed (it
    would be stored at the chunk's row offset), a packed argument that is not such a row output, the GAT family
    (its one-pass backward writes destination gradients from the src pass), more than four outputs in a pass, or
    item boundaries unknown (:func:`_item_bounds`), or a score factor of the src or dst role needing a gradient
    (an edge-role one is stored by edge id in the dst passes)."""
    form = layout.form
    dst_outputs = grad_outputs(form, layout.roles, needs_grad, (ROLE_DST, ROLE_EDGE))
    src_outputs = grad_outputs(form, layout.roles, needs_grad, (ROLE_SRC,))
    num_rows = bounds[-1]
    row_outputs = {o[0] for o in dst_outputs if o[1] == ROLE_DST} | {o[0] for o in src_outputs if o[1] == ROLE_SRC}
    packed = {i for i, offset in enumerate(pack_offsets) if offset >= 0}
    rows_of = {ROLE_DST: rowptr.numel() - 1, ROLE_SRC: by_src.rowptr.numel() - 1}
    factor = form.score_factor if form.score_factor is not None and needs_grad[form.score_factor] else None
    if form.family == "gat" or max(len(dst_outputs), len(src_outputs)) > MAX_GRAD_OUTPUTS or \
            (factor is not None and layout.roles[factor] != ROLE_EDGE) or \
            row_outputs != packed or any(layout.views[i].shape[0] != num_rows or rows_of[layout.roles[i]] != num_rows
                                         or layout.views[i][0].numel() != layout.args[i][0].numel() for i in packed):
        return None
    dst_items, _ = call_items(rowptr, col, items, max_edges)
    dst_at = _item_bounds(dst_items, bounds, cache, ("chunk_items", "dst", max_edges, tuple(bounds)))
    src_at = _item_bounds(by_src.items, bounds, cache, ("chunk_items", "src", by_src.rowptr.numel(), tuple(bounds)))
    if dst_at is None or src_at is None:
        return None
    device = rowptr.device
    wanted = [i for i in kernel_arguments(form) if needs_grad[i]]
    buffers = grad_buffers(layout, [i for i in wanted if i not in packed], {}, device)
    hubs = hub_items(dst_items)
    splits = {i: (rowptr, hubs[1] if hubs else None) if layout.roles[i] == ROLE_DST else
              (by_src.rowptr, by_src.max_edges or None) for i in packed}
    dst_launch, src_launch = SPLIT_BACKWARD_LAUNCH[form.family]
    dst_config = all_heads_launch_config(layout.heads, layout.channels, dst_launch, min_block_c=16, min_block_e=1)
    src_config = all_heads_launch_config(layout.heads, layout.channels, src_launch, min_block_c=16, min_block_e=1)
    grad_out, delta = grad_out.contiguous(), delta.contiguous()
    att_grad = buffers.get(form.query) if form.family == "gatv2" else None
    direct = dtype == torch.float32  # the kernels store float32 rows into the block itself, else into their own
    stream = _side_stream(device)
    for c in range(len(bounds) - 1):
        r0, r1 = bounds[c], bounds[c + 1]
        chunk = torch.empty((r1 - r0, pack_width), dtype=dtype, device=device)
        for start, end in gaps:
            chunk[:, start:end].zero_()
        views, own = {}, {}
        for i in packed:
            view = chunk[:, pack_offsets[i]:pack_offsets[i] + layout.args[i][0].numel()]
            views[i] = view.view(r1 - r0, *layout.views[i].shape[1:])
            own[i] = views[i] if direct else \
                torch.empty((r1 - r0, *layout.views[i].shape[1:]), dtype=torch.float32, device=device)
            part, above = splits[i]
            if above is None:
                own[i].zero_()
            else:
                zero_rows_without_entries(own[i], part[r0:r1 + 1], above)
        this = {**buffers, **own}  # this block's buffers (the unpacked ones span every block)
        run_dst = dst_at[c + 1] > dst_at[c] and bool(dst_outputs or att_grad is not None or factor is not None)
        run_src = bool(src_outputs) and src_at[c + 1] > src_at[c]
        # the two passes write disjoint memory (the dst pass the dst-role, edge-role and att gradients, the src pass
        # the src-role ones): with a side stream they run side by side, each filling the other's ramp and tail
        side = stream if run_dst and run_src else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        if run_src:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                split_pass(layout, ROLE_SRC, src_outputs, this, None,
                            [t[src_at[c]:src_at[c + 1]] for t in by_src.items], by_src.dst, by_src.eid, grad_out,
                            lse, delta, src_config, row0=r0)
        if run_dst:
            split_pass(layout, ROLE_DST, dst_outputs, this, att_grad,
                        [t[dst_at[c]:dst_at[c + 1]] for t in dst_items], col, perm, grad_out, lse, delta,
                        dst_config, row0=r0)
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
        for i in packed:
            if own[i] is not views[i]:
                views[i].copy_(own[i])
        consume(r0, r1, chunk)
        # dropped before the next block is allocated (a rebinding would keep this one alive until then)
        del chunk, views, own, view, this
    result = [None] * len(layout.args)
    for i, grad in buffers.items():
        if i not in packed:
            result[i] = undo_view_grad(grad, layout.args[i], layout.roles[i]).to(layout.args[i].dtype)
    return result
