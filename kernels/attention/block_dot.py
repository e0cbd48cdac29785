r"""Block-sparse attention (work in progress): the block format, the dot-product forward and backward.

**Block format.** Destination rows are taken in windows of ``WINDOW`` consecutive entries of a node
order (``order``, a permutation of the destination rows; the identity when none is given). In window
``w`` the distinct source columns of its edges are sorted, condensed and cut into tiles of ``TILE``
columns. A tile ``t`` holds

- ``tile_col[t, j]``: the source node of its ``j``-th column (int32, ``-1`` past the window's last column);
- ``tile_edge[t, r, j]``: the original edge id (the index edge features are read with, and the counter the
  attention dropout mask is regenerated from)
  of the edge ``tile_col[t, j] -> window_rows[w, r]``, ``-1`` where there is none: the cell mask.

``tile_ptr[w] : tile_ptr[w + 1]`` are the tiles of window ``w``. One edge id per cell cannot hold two
parallel edges, so a window whose rows have a duplicate ``(dst, src)`` pair is marked
``dense_ok[w] = False`` (its cells then hold one of the duplicates, unspecified which); a hybrid sends
those windows to the CSR kernel. The build is torch ops only, on the inputs' device, with no Python loop
over rows or edges (it syncs for sizes: the number of distinct (window, column) pairs and of tiles).

**Forward** (dot-product family: TransformerConv without edge features, optionally with PyG's attention
dropout, its mask ``w`` regenerated per cell from the call's seed and ``tile_edge``: ``kernels/runtime/rng.py``). One
program per (dense window, block of heads): every head by default, the tile's columns and edge ids read once and
the dots batched over the heads (``[H, WINDOW, C] x [H, C, TILE]``); :data:`BLOCK_LAUNCH` can set a program per
head:

.. math::
    S = \mathrm{scale} \cdot Q_W K_T^\top, \quad
    \mathrm{out}_{i,h} = \mathrm{message\_scale} \cdot
        \frac{\sum_j \exp(S_{ij} - m_i) \, w_{ij} \, V_j}{\sum_j \exp(S_{ij} - m_i) + \varepsilon}, \quad
    \mathrm{lse}_{i,h} = m_i + \log \sum_j \exp(S_{ij} - m_i)

over the cells with an edge, with ``S`` and ``P V`` as ``tl.dot`` of ``WINDOW x C`` by ``C x TILE`` and
``WINDOW x TILE`` by ``TILE x C`` tiles and an online softmax (running max ``m``, sum ``l``) across the
window's tiles. ``lse`` is 0 for rows without edges (as the CSR kernels); ``eps`` is PyG's 1e-16.
Rows of windows that are not ``dense_ok`` are left 0 (the hybrid fills them). The key and value terms
are summed into ``[N, H, C]`` node tensors before the launch (node-sized, not edge-sized). fp32 inputs
use IEEE products unless ``allow_tf32``; half inputs run the dots in their dtype with float32
accumulation.

**Transposed format** (:func:`transpose_block_format`): the same builder over ``A^T`` restricted to the
edges of the ``dense_ok`` windows, source nodes in windows and destination rows condensed into tiles, built
once per graph from the block format's cells.

**Backward** (:func:`dot_backward`, :class:`BlockSparseDotAttention`): ``P = exp(S - lse)`` recomputed per
tile from the saved ``lse``, ``D_i = <dO_i, O_i>`` computed once per (row, head); ``dQ`` per row window over
the block format, ``dK`` and ``dV`` per source window over the transposed one (each source row written by
one program: no atomics). The dropout factor ``w`` is regenerated from ``tile_edge`` as in the forward. Same
dot precisions as the forward, ``dO`` cast to the inputs' dtype for the dots.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl
from gnn_inductor.kernels.runtime.launch import cdiv, dot_precision, fast_launch, next_power_of_2
from gnn_inductor.kernels.attention import csr_delta
from gnn_inductor.kernels.attention.layout import dropout_slot, out_dtype, prepare, undo_view_grad
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_SRC
from gnn_inductor.kernels.runtime.rng import Dropout, dropped_triton
from gnn_inductor.plan.block_format import TILE, WINDOW, BlockFormat, covers_every_row
from torch import Tensor


# Launch options (``num_warps``, ``num_stages``) of each block-sparse attention kernel, by name, over the kernel's
# own (empty: Triton's defaults, 4 warps and 3 stages; GATv2's kernels take 8 warps for head dims of 64 and more),
# and for the dot kernels ``heads``: 1 (a program per (window, head)) or "all" (every head in one program, batched
# [H, 16, 16] dots; :func:`head_launch`). ``python -m benchmarks.probe --parts block_launch`` sweeps one kernel at a
# time (H200, bf16, 4 heads x 32, the block model in RCM order, forward+backward of the op). A program
# per head: the dot kernels took the op from 5.95 ms at 4 warps each to 4.17 on 1-2 warps (8 warps: 5.8-8.1);
# GAT's, one kernel at a time, 6.87 -> 6.54 (forward, 2 warps, 1 stage), 6.07 (row backward, 1 warp, 1 stage),
# 5.09 (source backward, 1 warp). Every head in one
# program, 2 warps, for all three dot kernels: 3.35 -> 2.53 ms (4 warps: 2.80). GATv2's (gatv2_*) are not measured.
# A ``name:fp32`` entry is the launch for float32 inputs (:func:`launch_entry`): in TF32 the same sweep
# took the op from 5.02 ms at 2 warps to 4.56 at 4 warps, every head per program.
# GAT (bf16, op 3.49 ms at the per-head launches above), one kernel at a time: forward with
# every head at 2 warps 3.18, row backward with every head at 1 warp 3.25; the source backward stays a program per
# head (3.44; every head: 3.59 at best). That combination was not timed as a whole; all three with every head at
# 1 warp measured 3.20.
BLOCK_LAUNCH = {"dot_forward": {"heads": "all", "num_warps": 2}, "dot_query": {"heads": "all", "num_warps": 2},
                "dot_source": {"heads": "all", "num_warps": 2},
                "dot_forward:fp32": {"heads": "all", "num_warps": 4}, "dot_query:fp32": {"heads": "all", "num_warps": 4},
                "dot_source:fp32": {"heads": "all", "num_warps": 4},
                "gat_forward": {"heads": "all", "num_warps": 2}, "gat_row": {"heads": "all", "num_warps": 1},
                "gat_source": {"num_warps": 1}, "gatv2_forward": {}, "gatv2_row": {}, "gatv2_source": {}}


# ---------------------------------------------------------------------------------------------
# Dot-product (TransformerConv) forward
# ---------------------------------------------------------------------------------------------

@triton.jit
def head_block(num_heads, BLOCK_H: tl.constexpr):
    """The heads of this program (``program_id(1)``'s block of ``BLOCK_H``), ``[BLOCK_H]``, and their mask."""
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    return heads, heads < num_heads


@triton.jit
def load_head_rows(ptr, rows, rmask, heads, hmask, chans, cmask, sr, sh, sc):
    """``[BLOCK_H, len(rows), BLOCK_C]`` of the ``[rows, H, C]`` tensor at ``ptr`` (strides ``sr, sh, sc``), 0 where
    masked, and the mask."""
    mask = hmask[:, None, None] & rmask[None, :, None] & cmask[None, None, :]
    offsets = rows[None, :, None] * sr + heads[:, None, None] * sh + chans[None, None, :] * sc
    return tl.load(ptr + offsets, mask=mask, other=0), mask


@triton.jit
def node_head_offsets(rows, heads, num_heads, head_dim, chans):
    """Offsets of ``[BLOCK_H, len(rows), BLOCK_C]`` in a contiguous ``[N, H, C]`` tensor."""
    return (rows[None, :, None] * num_heads + heads[:, None, None]) * head_dim + chans[None, None, :]


@triton.jit
def _row_offsets(rows, row_stride, heads, head_dim, chans):
    """Offsets of ``[BLOCK_H, len(rows), BLOCK_C]`` in an ``[N, H, C]`` tensor whose rows are ``row_stride``
    elements apart, heads and channels contiguous within a row (a contiguous tensor, or a column slice of a packed
    gradient)."""
    return rows[None, :, None] * row_stride + heads[:, None, None] * head_dim + chans[None, None, :]


@triton.jit
def _tile_scores(tile, query, tile_col_ptr, tile_edge_ptr, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, heads, hmask,
                 slots, lanes, chans, cmask, score_scale, PRECISION: tl.constexpr, WINDOW: tl.constexpr,
                 TILE: tl.constexpr):
    """One tile of a row window for the program's heads: key and value rows ``[BLOCK_H, TILE, C]``, edge ids
    ``[WINDOW, TILE]`` (-1: no edge, read once for all heads), and the scaled scores ``Q K^T`` ``[BLOCK_H, WINDOW,
    TILE]`` (unmasked), shared by the forward and the query backward."""
    cols = tl.load(tile_col_ptr + tile * TILE + lanes).to(tl.int64)
    key, _ = load_head_rows(k_ptr, cols, cols >= 0, heads, hmask, chans, cmask, kr, kh, kc)
    value, _ = load_head_rows(v_ptr, cols, cols >= 0, heads, hmask, chans, cmask, vr, vh, vc)
    eid = tl.load(tile_edge_ptr + (tile * WINDOW + slots[:, None]) * TILE + lanes[None, :])
    score = tl.dot(query, tl.permute(key, (0, 2, 1)), input_precision=PRECISION) * score_scale
    return key, value, eid, eid >= 0, score


@fast_launch
@triton.jit
def _dot_forward_kernel(
        dense_windows_ptr, window_rows_ptr, tile_ptr_ptr, tile_col_ptr, tile_edge_ptr,
        q_ptr, qr, qh, qc, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        out_ptr, lse_ptr, num_heads, head_dim, score_scale, message_scale, eps,
        DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
        WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr):
    """One (dense row window, block of ``BLOCK_H`` heads): batched ``[BLOCK_H, WINDOW, TILE]`` dots per tile."""
    window = tl.load(dense_windows_ptr + tl.program_id(0)).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0
    query, row_mask = load_head_rows(q_ptr, rows, rmask, heads, hmask, chans, cmask, qr, qh, qc)

    m = tl.full([BLOCK_H, WINDOW], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H, WINDOW], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        key, value, eid, has_edge, score = _tile_scores(
            tile, query, tile_col_ptr, tile_edge_ptr, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, heads, hmask, slots,
            lanes, chans, cmask, score_scale, PRECISION, WINDOW, TILE)
        score = tl.where(has_edge[None, :, :], score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=2))
        # a row with no edge so far keeps m = -inf: shift by 0 there so exp gives 0, never nan
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        correction = tl.exp(m - shift)
        p = tl.exp(score - shift[:, :, None])
        total = total * correction + tl.sum(p, axis=2)
        if DROPOUT:
            p = dropped_triton(p, seed_ptr, eid[None, :, :], heads[:, None, None], num_heads, dropout_p,
                               dropout_scale)
        acc = acc * correction[:, :, None] + tl.dot(p.to(value.dtype), value, input_precision=PRECISION)
        m = m_new

    out = acc * message_scale / (total + eps)[:, :, None]
    tl.store(out_ptr + node_head_offsets(rows, heads, num_heads, head_dim, chans), out.to(out_ptr.dtype.element_ty),
             mask=row_mask)
    lse = tl.where(total > 0, m + tl.log(tl.where(total > 0, total, 1.0)), 0.0)
    tl.store(lse_ptr + rows[None, :] * num_heads + heads[:, None], lse, mask=hmask[:, None] & rmask[None, :])


def dot_form_reason(layout) -> str | None:
    """Why the block-sparse forward cannot run this attention (None when it can)."""
    form, roles = layout.form, layout.roles
    if form.family != "dot":
        return f"{form.family} family: only the dot-product family has a block-sparse kernel yet"
    if roles[form.query] != ROLE_DST:
        return "the query is not a destination-row input"
    if any(roles[i] != ROLE_SRC for i in form.score_terms + form.value_terms):
        return "a key or value term is not a source-row input (edge features are not supported yet)"
    if form.score_factor is not None:
        return "a per-edge score factor (HGTConv's relation prior): the block-sparse kernel has no per-cell factor"
    return None


def _dot_operands(args, roles, perm: Tensor, score_key: str, message_key: str, dropout: Dropout | None) -> tuple:
    """``(layout, query, key, value)``: the attention's layout and its ``[rows, H, C]`` operands (key and value
    terms summed, all in the half dtype when any input is half precision); ``ValueError`` naming the reason
    when it is not of the supported dot-product form (see :func:`dot_form_reason`)."""
    layout = prepare(args, roles, perm, score_key, message_key, dropout)
    reason = layout if isinstance(layout, str) else dot_form_reason(layout)
    if reason is not None:
        raise ValueError(f"block-sparse attention cannot run this attention: {reason}")
    form = layout.form
    query = layout.views[form.query]
    key = summed_views(layout, form.score_terms)
    value = summed_views(layout, form.value_terms)
    half = out_dtype(layout.args)
    if half != torch.float32:
        query, key, value = (t.to(half) for t in (query, key, value))
    return layout, query, key, value


def summed_views(layout, indices) -> Tensor:
    """The sum of the layout's ``[rows, H, C]`` views of ``indices``; a single term is its view, not a copy (Python's
    ``sum`` starts from 0, which copied every key and value term at every call, forward and backward)."""
    views = [layout.views[i] for i in indices]
    total = views[0]
    for view in views[1:]:
        total = total + view
    return total


def dot_forward(args, roles, perm: Tensor, score_key: str, message_key: str, blocks: BlockFormat,
                num_dst: int, eps: float, allow_tf32: bool = False,
                dropout: Dropout | None = None) -> tuple[Tensor, Tensor]:
    """``(out [N, H, C], lse [N, H] float32)`` of ``gnn_io::attention`` (with ``dropout`` on alpha when given)
    for the rows of ``dense_ok`` windows (others 0); raises ``ValueError`` naming the reason when the attention
    is not of the supported dot-product form (see :func:`dot_form_reason`)."""
    layout, query, key, value = _dot_operands(args, roles, perm, score_key, message_key, dropout)
    form, heads, channels = layout.form, layout.heads, layout.channels
    device = blocks.tile_ptr.device
    new = torch.empty if covers_every_row(blocks, num_dst) else torch.zeros
    out = new((num_dst, heads, channels), dtype=query.dtype, device=device)
    lse = new((num_dst, heads), dtype=torch.float32, device=device)
    if blocks.dense_windows.shape[0] and heads:
        block_c = max(16, next_power_of_2(channels))
        programs, block_h, launch = head_launch("dot_forward", heads, query.dtype, block_c)
        _dot_forward_kernel[(blocks.dense_windows.shape[0], programs)](
            blocks.dense_windows, blocks.window_rows, blocks.tile_ptr, blocks.tile_col, blocks.tile_edge,
            query, *query.stride(), key, *key.stride(), value, *value.stride(), *dropout_slot(dropout, lse),
            out, lse, heads, channels, form.score_scale, form.message_scale, eps,
            DROPOUT=dropout is not None, PRECISION=dot_precision(allow_tf32, query.dtype),
            WINDOW=WINDOW, TILE=TILE, BLOCK_C=block_c, BLOCK_H=block_h, **launch)
    return out, lse


# ---------------------------------------------------------------------------------------------
# Dot-product backward
# ---------------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def _dot_backward_query_kernel(
        dense_windows_ptr, window_rows_ptr, tile_ptr_ptr, tile_col_ptr, tile_edge_ptr,
        q_ptr, qr, qh, qc, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        grad_out_ptr, lse_ptr, delta_ptr, grad_q_ptr, grad_q_row, num_heads, head_dim, score_scale, message_scale,
        DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
        WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr):
    """dQ of one (row window, block of heads): ``scale * sum_tiles dS K``, stored ``grad_q_row`` elements apart
    from row to row (its heads and channels contiguous in a row)."""
    window = tl.load(dense_windows_ptr + tl.program_id(0)).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0
    query, row_mask = load_head_rows(q_ptr, rows, rmask, heads, hmask, chans, cmask, qr, qh, qc)
    node_offsets = node_head_offsets(rows, heads, num_heads, head_dim, chans)
    grad_out = tl.load(grad_out_ptr + node_offsets, mask=row_mask, other=0)
    stat_offsets = rows[None, :] * num_heads + heads[:, None]
    stat_mask = hmask[:, None] & rmask[None, :]
    lse = tl.load(lse_ptr + stat_offsets, mask=stat_mask, other=0)
    delta = tl.load(delta_ptr + stat_offsets, mask=stat_mask, other=0)

    grad_query = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        key, value, eid, has_edge, score = _tile_scores(
            tile, query, tile_col_ptr, tile_edge_ptr, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, heads, hmask, slots,
            lanes, chans, cmask, score_scale, PRECISION, WINDOW, TILE)
        p = tl.exp(tl.where(has_edge[None, :, :], score - lse[:, :, None], float("-inf")))
        grad_p = tl.dot(grad_out, tl.permute(value, (0, 2, 1)), input_precision=PRECISION) * message_scale
        if DROPOUT:
            grad_p = dropped_triton(grad_p, seed_ptr, eid[None, :, :], heads[:, None, None], num_heads, dropout_p,
                                    dropout_scale)
        grad_score = p * (grad_p - delta[:, :, None])
        grad_query += tl.dot(grad_score.to(key.dtype), key, input_precision=PRECISION)
    tl.store(grad_q_ptr + _row_offsets(rows, grad_q_row, heads, head_dim, chans),
             (grad_query * score_scale).to(grad_q_ptr.dtype.element_ty), mask=row_mask)


@fast_launch
@triton.jit
def _dot_backward_source_kernel(
        dense_windows_ptr, window_srcs_ptr, tile_ptr_ptr, tile_dst_ptr, tile_edge_ptr,
        q_ptr, qr, qh, qc, k_ptr, kr, kh, kc, v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        grad_out_ptr, lse_ptr, delta_ptr, grad_k_ptr, grad_k_row, grad_v_ptr, grad_v_row, num_heads, head_dim,
        score_scale, message_scale, DROPOUT: tl.constexpr, GRAD_KEY: tl.constexpr, GRAD_VALUE: tl.constexpr,
        PRECISION: tl.constexpr, WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr,
        BLOCK_H: tl.constexpr):
    """dK and dV of one (source window of the transposed format, block of heads), its tiles' columns destination
    rows: ``dV = message_scale (P * w)^T dO`` and ``dK = scale * dS^T Q``, as ``[sources, destinations]`` tiles;
    each stored its ``grad_*_row`` elements apart from row to row."""
    window = tl.load(dense_windows_ptr + tl.program_id(0)).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    srcs = tl.load(window_srcs_ptr + window * WINDOW + slots).to(tl.int64)
    key, src_mask = load_head_rows(k_ptr, srcs, srcs >= 0, heads, hmask, chans, cmask, kr, kh, kc)
    value, _ = load_head_rows(v_ptr, srcs, srcs >= 0, heads, hmask, chans, cmask, vr, vh, vc)

    grad_key = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    grad_value = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        dsts = tl.load(tile_dst_ptr + tile * TILE + lanes).to(tl.int64)
        dst_valid = dsts >= 0
        query, dst_mask = load_head_rows(q_ptr, dsts, dst_valid, heads, hmask, chans, cmask, qr, qh, qc)
        grad_out = tl.load(grad_out_ptr + node_head_offsets(dsts, heads, num_heads, head_dim, chans), mask=dst_mask,
                           other=0)
        stat_offsets = dsts[None, :] * num_heads + heads[:, None]
        stat_mask = hmask[:, None] & dst_valid[None, :]
        lse = tl.load(lse_ptr + stat_offsets, mask=stat_mask, other=0)
        eid = tl.load(tile_edge_ptr + (tile * WINDOW + slots[:, None]) * TILE + lanes[None, :])
        has_edge = eid >= 0
        score = tl.dot(key, tl.permute(query, (0, 2, 1)), input_precision=PRECISION) * score_scale
        p = tl.exp(tl.where(has_edge[None, :, :], score - lse[:, None, :], float("-inf")))
        p_weighted = p * message_scale
        if DROPOUT:
            p_weighted = dropped_triton(p_weighted, seed_ptr, eid[None, :, :], heads[:, None, None], num_heads,
                                        dropout_p, dropout_scale)
        if GRAD_VALUE:
            grad_value += tl.dot(p_weighted.to(grad_out.dtype), grad_out, input_precision=PRECISION)
        if GRAD_KEY:
            delta = tl.load(delta_ptr + stat_offsets, mask=stat_mask, other=0)
            # p * (message_scale * w * <dO, V> - D) = p_weighted * <dO, V> - p * D
            grad_p = tl.dot(value, tl.permute(grad_out, (0, 2, 1)), input_precision=PRECISION)
            grad_score = p_weighted * grad_p - p * delta[:, None, :]
            grad_key += tl.dot(grad_score.to(query.dtype), query, input_precision=PRECISION)
    if GRAD_KEY:
        tl.store(grad_k_ptr + _row_offsets(srcs, grad_k_row, heads, head_dim, chans),
                 (grad_key * score_scale).to(grad_k_ptr.dtype.element_ty), mask=src_mask)
    if GRAD_VALUE:
        tl.store(grad_v_ptr + _row_offsets(srcs, grad_v_row, heads, head_dim, chans),
                 grad_value.to(grad_v_ptr.dtype.element_ty), mask=src_mask)


def gradient_buffer(layout, indices, shape, full: bool) -> Tensor:
    """The kernel's gradient buffer for the terms ``indices`` (``[rows, H(, C)]``): in the argument's own dtype
    when it is one term (its gradient then needs no cast afterwards; the kernels accumulate in float32 and cast at
    the store), float32 when several terms share it; uninitialised when the kernel writes every row (``full``)."""
    dtype = layout.args[indices[0]].dtype if len(indices) == 1 else torch.float32
    return (torch.empty if full else torch.zeros)(shape, dtype=dtype, device=layout.args[indices[0]].device)


def _packed_place(layout, indices, shape, full: bool, pack: dict | None) -> Tensor:
    """The kernel's gradient buffer for the terms ``indices``: ``pack``'s tensor for their argument where there
    is one term and that tensor fits the kernels' store (the argument's shape and dtype, ``[rows, H, C]`` with
    heads and channels contiguous in a row; zeroed first unless the kernel writes every row), else
    :func:`gradient_buffer`'s."""
    place = pack.get(indices[0]) if pack and len(indices) == 1 else None
    arg = layout.args[indices[0]]
    if place is None or place.dtype != arg.dtype or tuple(place.shape) != tuple(shape) or \
            tuple(arg.shape) != tuple(shape) or len(shape) != 3 or place.stride(2) != 1 or \
            place.stride(1) != shape[2] or place.stride(0) < shape[1] * shape[2]:
        return gradient_buffer(layout, indices, shape, full)
    return place if full else place.zero_()


def launch_entry(name: str, dtype: torch.dtype | None = None) -> dict:
    """``BLOCK_LAUNCH[name]``, or for float32 inputs (TF32 or IEEE dots) its ``name + ":fp32"`` entry where there is
    one: fp32 tiles move twice the bytes of half ones, so they may want another launch."""
    if dtype == torch.float32 and f"{name}:fp32" in BLOCK_LAUNCH:
        return BLOCK_LAUNCH[f"{name}:fp32"]
    return BLOCK_LAUNCH[name]


# The most channels (heads x padded head width) one program holds when it takes every head: the all-heads
# launches were measured at 4 heads x 32 (H200, bf16 and TF32); wider programs hold more
# accumulators than those launches were tuned for (8 heads x 64 would be 4x the registers), so "all" takes as
# many heads as fit and the grid covers the rest.
MAX_PROGRAM_CHANNELS = 128


def head_launch(name: str, heads: int, dtype: torch.dtype | None, block_c: int) -> tuple:
    """``(programs per window, BLOCK_H, launch options)`` of block-sparse kernel ``name`` for ``heads`` heads of
    ``dtype`` inputs (:func:`launch_entry`) padded to ``block_c`` channels: the entry's ``"heads"`` is ``"all"``
    (every head in one program, its tile columns and edge-id mask read once; at most
    :data:`MAX_PROGRAM_CHANNELS` channels per program) or 1 (a program per head); the rest goes to the launch."""
    options = dict(launch_entry(name, dtype))
    per_program = options.pop("heads", 1)
    if per_program not in (1, "all"):
        raise ValueError(f"BLOCK_LAUNCH[{name!r}]['heads'] must be 1 or 'all', got {per_program!r}")
    block_h = 1
    if per_program == "all":
        block_h = min(next_power_of_2(heads), max(1, MAX_PROGRAM_CHANNELS // block_c))
    return cdiv(heads, block_h), block_h, options


def dot_backward(grad_out: Tensor, delta: Tensor, lse: Tensor, args, roles, perm: Tensor, score_key: str,
                 message_key: str, blocks: BlockFormat, transposed: BlockFormat, needs_grad,
                 allow_tf32: bool = False, dropout: Dropout | None = None, pack: dict | None = None) -> list:
    r"""Gradients of :func:`dot_forward`'s arguments flagged in ``needs_grad`` (None elsewhere), in each
    argument's dtype, through the edges of ``blocks``' ``dense_ok`` windows only (the rest is the CSR
    backward's, as in the forward). ``transposed`` is ``transpose_block_format(blocks, num_src)``.

    ``pack`` (argument -> a tensor of the argument's shape and dtype, a column slice of one packed ``[N, F]``
    gradient: kernels/attention/op.py's ``attention_backward_packed``): the kernels store the gradient of such an
    argument, when it is the only term of its query, key or value and not both the key and the value, straight
    into that tensor (:func:`_packed_place`), which is then its entry of the result; the caller copies the others.

    Per head, with ``P = exp(S - lse)`` recomputed per tile (0 off the edges), ``w`` the dropout factor
    (``keep / (1 - p)`` regenerated from the seed, 1 without dropout), ``s`` the score scale, ``m`` the
    message scale and ``D_i = <dO_i, O_i>``:

    .. math::
        dS = P \circ (m \, w \circ (dO\, V^\top) - D \mathbf{1}^\top), \quad
        dQ = s \, dS\, K, \quad dK = s \, dS^\top Q, \quad dV = m \, (P \circ w)^\top dO

    ``dQ`` per row window over ``blocks``; ``dK`` and ``dV`` per source window over ``transposed``, each
    source row written by one program (no atomics). Every key term gets ``dK``, every value term ``dV``."""
    layout, query, key, value = _dot_operands(args, roles, perm, score_key, message_key, dropout)
    form, heads, channels = layout.form, layout.heads, layout.channels
    need_query = bool(needs_grad[form.query])
    need_key = any(needs_grad[i] for i in form.score_terms)
    need_value = any(needs_grad[i] for i in form.value_terms)
    device = blocks.tile_ptr.device
    delta = delta.contiguous()  # D = <dO, O> per (row, head), csr_delta.delta
    grad_out = grad_out.to(query.dtype).contiguous()
    common = {"DROPOUT": dropout is not None, "PRECISION": dot_precision(allow_tf32, query.dtype),
              "WINDOW": WINDOW, "TILE": TILE, "BLOCK_C": max(16, next_power_of_2(channels))}
    operands = [query, *query.stride(), key, *key.stride(), value, *value.stride(), *dropout_slot(dropout, lse)]

    # an input that is both the key and the value gets two gradients, summed below: no place for it
    shared = set(form.score_terms) & set(form.value_terms)
    pack = {i: place for i, place in (pack or {}).items() if i not in shared}
    full = covers_every_row(blocks, query.shape[0])
    grad_query = _packed_place(layout, (form.query,), query.shape, full, pack) if need_query else None
    if need_query and blocks.dense_windows.shape[0] and heads:
        programs, block_h, launch = head_launch("dot_query", heads, query.dtype, common["BLOCK_C"])
        _dot_backward_query_kernel[(blocks.dense_windows.shape[0], programs)](
            blocks.dense_windows, blocks.window_rows, blocks.tile_ptr, blocks.tile_col, blocks.tile_edge,
            *operands, grad_out, lse, delta, grad_query, grad_query.stride(0), heads, channels, form.score_scale,
            form.message_scale, **common, BLOCK_H=block_h, **launch)
    full = covers_every_row(transposed, key.shape[0])
    grad_key = _packed_place(layout, form.score_terms, key.shape, full, pack) if need_key else None
    grad_value = _packed_place(layout, form.value_terms, value.shape, full, pack) if need_value else None
    if (need_key or need_value) and transposed.dense_windows.shape[0] and heads:
        programs, block_h, launch = head_launch("dot_source", heads, query.dtype, common["BLOCK_C"])
        _dot_backward_source_kernel[(transposed.dense_windows.shape[0], programs)](
            transposed.dense_windows, transposed.window_rows, transposed.tile_ptr, transposed.tile_col,
            transposed.tile_edge, *operands, grad_out, lse, delta,
            lse if grad_key is None else grad_key, 0 if grad_key is None else grad_key.stride(0),
            lse if grad_value is None else grad_value, 0 if grad_value is None else grad_value.stride(0),
            heads, channels, form.score_scale, form.message_scale, GRAD_KEY=need_key, GRAD_VALUE=need_value,
            **common, BLOCK_H=block_h, **launch)

    grads = [None] * len(layout.args)
    for terms, grad in ((form.score_terms, grad_key), (form.value_terms, grad_value), ((form.query,), grad_query)):
        for i in terms:
            if needs_grad[i]:
                part = undo_view_grad(grad, layout.args[i], layout.roles[i])
                grads[i] = part if grads[i] is None else grads[i] + part
    return [g if g is None else g.to(a.dtype) for g, a in zip(grads, layout.args)]


def attention_function(name: str, forward_fn, backward_fn, doc: str) -> type:
    """An autograd Function ``(out, lse) = apply(blocks, transposed, perm, roles, score_key, message_key, num_dst,
    eps, allow_tf32, dropout, *args)`` over a block-sparse forward and backward pair (``lse`` not differentiable;
    ``dropout`` a :class:`rng.Dropout` or None, the same mask regenerated in backward). Only the rows of
    ``blocks``' ``dense_ok`` windows are computed, forward and backward."""

    def forward(ctx, blocks, transposed, perm, roles, score_key, message_key, num_dst, eps, allow_tf32, dropout,
                *args):
        out, lse = forward_fn(list(args), roles, perm, score_key, message_key, blocks, num_dst, eps, allow_tf32,
                              dropout)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(perm, out, lse, *args)
        ctx.meta = (blocks, transposed, roles, score_key, message_key, allow_tf32, dropout)
        return out, lse

    def backward(ctx, grad_out, _grad_lse):
        blocks, transposed, roles, score_key, message_key, allow_tf32, dropout = ctx.meta
        perm, out, lse, *args = ctx.saved_tensors
        needs_grad = list(ctx.needs_input_grad[10:])
        grads = backward_fn(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm, score_key, message_key, blocks, transposed,
                            needs_grad, allow_tf32, dropout)
        return (None,) * 10 + tuple(grads)

    return type(name, (torch.autograd.Function,), {"__doc__": doc, "forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


BlockSparseDotAttention = attention_function(
    "BlockSparseDotAttention", dot_forward, dot_backward,
    ":func:`dot_forward` with :func:`dot_backward` as its backward (see :func:`attention_function`).")
