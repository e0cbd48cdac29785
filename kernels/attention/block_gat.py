r"""Block-sparse attention for the GAT and GATv2 families: forward and backward over the block format of
``kernels/attention/block_dot.py`` (row windows of ``WINDOW`` destination rows, each window's source columns condensed
into tiles of ``TILE``, ``tile_edge`` the original edge id of each cell, -1 where there is none).

**Scores** (``kernels/attention/forms.py``'s families), per cell ``(i, j)`` of a tile and head ``h``, with
``t`` the sum of the score terms, each reaching the cell through its role (src: column ``j``, dst: row ``i``,
edge: the cell's edge id):

.. math::
    \text{gat:}\ S_{ij} = \mathrm{scale} \cdot \mathrm{lrelu}(t_{ij}), \quad
    \text{gatv2:}\ S_{ij} = \mathrm{scale} \sum_c \mathrm{att}_c \, \mathrm{lrelu}(t_{ijc})

built element-wise as a ``WINDOW x TILE`` (gat) or ``WINDOW x TILE x C`` (gatv2, reduced over channels in
registers) tile, masked by ``tile_edge >= 0``; then the dot kernel's online softmax across the window's tiles
and ``P V`` as a ``tl.dot`` of ``WINDOW x TILE`` by ``TILE x C`` (``V`` the sum of the value terms, gathered by
the tile's source columns). ``out = message_scale * acc / (total + eps)``, ``lse`` per (row, head), 0 for rows
without edges; PyG's attention dropout multiplies ``P`` by ``keep / (1 - p)`` before the dot, the mask
regenerated per cell from the call's seed and the cell's edge id (``kernels/runtime/rng.py``). One program per
(dense window, block of heads) (``block_sparse.head_launch``: a program per head, or every head in one program
with each per-tile tensor carrying a leading head axis: ``[H, WINDOW, TILE]`` scores, gatv2's ``[H, WINDOW, TILE,
C]`` terms, batched ``P V`` dots); rows of windows that are not ``dense_ok`` are left 0, as
:func:`block_sparse.dot_forward`.

Score terms of one role are summed before the launch when there are several (in float32, node- or edge-sized);
a single term is read in place, in its dtype. Every score product and sum is float32; the value (and ``P``
for the dot) is in the half dtype when any input is half precision, with float32 accumulation; fp32 dots use
IEEE products unless ``allow_tf32``.

**Backward** (:func:`gat_backward`): ``P = exp(S - lse)`` recomputed per tile, ``D_i = <dO_i, O_i>``,
``dS = scale * P (message_scale * w * dO V^T - D)`` (``w`` the dropout factor, regenerated as in the
forward, 1 without dropout), and the leaky ReLU's
slope ``lrelu'(t)`` per cell (per channel for gatv2):

- per row window over the block format: the dst-role terms' gradient (``sum_j dS lrelu'``, or
  ``sum_j dS att lrelu'`` per channel), the edge-role terms' gradient (stored per cell at its edge id: each edge
  of a dense window sits in exactly one cell, so plain stores), and gatv2's ``d att = sum_{ij} dS lrelu(t)``
  as one partial per (program, head), summed afterwards (no atomics);
- per source window over the transposed format (:func:`block_format.transpose_block_format`): the src-role
  terms' gradient and ``dV = message_scale (P w)^T dO`` (a ``tl.dot``), each source row written by one
  program, no atomics.

Not supported (:func:`gat_form_reason`, ``ValueError`` naming the reason, the caller runs the CSR kernel):
value terms that are not source-row inputs (an edge-role value is per cell, not a ``TILE x C`` operand of
``P V``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from gnn_inductor.kernels.runtime.launch import dot_precision, fast_launch, next_power_of_2
from gnn_inductor.kernels.attention.layout import dropout_slot, out_dtype, prepare, undo_view_grad
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.plan.block_format import TILE, WINDOW, BlockFormat, covers_every_row
from gnn_inductor.kernels.attention.block_dot import (
    head_block, load_head_rows, node_head_offsets, attention_function, gradient_buffer, head_launch, summed_views,
)
from gnn_inductor.kernels.runtime.rng import Dropout, dropped_triton
from torch import Tensor

FAMILIES = ("gat", "gatv2")


# ---------------------------------------------------------------------------------------------
# Per-tile scores (every tensor carries a leading axis of the program's BLOCK_H heads)
# ---------------------------------------------------------------------------------------------

@triton.jit
def _node_term(ptr, stride_r, stride_h, stride_c, nodes, valid, heads, hmask, chans, cmask, V2: tl.constexpr):
    """A score term of the ``nodes`` (int64, -1 invalid) for the program's heads: ``[BLOCK_H, N]`` (gat) or
    ``[BLOCK_H, N, BLOCK_C]`` (gatv2), float32."""
    if V2:
        term = tl.load(ptr + nodes[None, :, None] * stride_r + heads[:, None, None] * stride_h
                       + chans[None, None, :] * stride_c,
                       mask=hmask[:, None, None] & valid[None, :, None] & cmask[None, None, :], other=0)
    else:
        term = tl.load(ptr + nodes[None, :] * stride_r + heads[:, None] * stride_h,
                       mask=hmask[:, None] & valid[None, :], other=0)
    return term.to(tl.float32)


@triton.jit
def _tile_cells(tile, tile_col_ptr, tile_edge_ptr, row_term, c_ptr, cr, ch, cc, e_ptr, er, eh, ec, att, heads, hmask,
                slots, lanes, chans, cmask, slope, score_scale,
                HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, HAS_EDGE: tl.constexpr, V2: tl.constexpr,
                BLOCK_H: tl.constexpr, WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr):
    """One tile of a window: its columns ``[TILE]`` (int64, -1 padding), edge ids ``[WINDOW, TILE]`` (-1: no edge,
    read once for all heads), the pre-activation terms (``[BLOCK_H, WINDOW, TILE]``, gatv2 ``[BLOCK_H, WINDOW,
    TILE, BLOCK_C]``) and the scores ``[BLOCK_H, WINDOW, TILE]`` (unmasked). ``row_term`` is the window rows'
    term (loaded once), the column term is read at ``c_ptr``; shared by the forward and both backward kernels
    (which swap which role is the row and which the column)."""
    cols = tl.load(tile_col_ptr + tile * TILE + lanes).to(tl.int64)
    col_valid = cols >= 0
    eid = tl.load(tile_edge_ptr + (tile * WINDOW + slots[:, None]) * TILE + lanes[None, :])
    has_edge = eid >= 0
    if V2:
        terms = tl.zeros([BLOCK_H, WINDOW, TILE, BLOCK_C], dtype=tl.float32)
        if HAS_ROW:
            terms += row_term[:, :, None, :]
        if HAS_COL:
            terms += _node_term(c_ptr, cr, ch, cc, cols, col_valid, heads, hmask, chans, cmask, V2)[:, None, :, :]
        if HAS_EDGE:
            edge_offsets = (eid.to(tl.int64)[None, :, :, None] * er + heads[:, None, None, None] * eh
                            + chans[None, None, None, :] * ec)
            edge_mask = hmask[:, None, None, None] & has_edge[None, :, :, None] & cmask[None, None, None, :]
            terms += tl.load(e_ptr + edge_offsets, mask=edge_mask, other=0).to(tl.float32)
        activated = tl.where(terms > 0, terms, terms * slope)
        score = tl.sum(activated * att[:, None, None, :], axis=3) * score_scale
    else:
        terms = tl.zeros([BLOCK_H, WINDOW, TILE], dtype=tl.float32)
        if HAS_ROW:
            terms += row_term[:, :, None]
        if HAS_COL:
            terms += _node_term(c_ptr, cr, ch, cc, cols, col_valid, heads, hmask, chans, cmask, V2)[:, None, :]
        if HAS_EDGE:
            terms += tl.load(e_ptr + eid.to(tl.int64)[None, :, :] * er + heads[:, None, None] * eh,
                             mask=hmask[:, None, None] & has_edge[None, :, :], other=0).to(tl.float32)
        score = tl.where(terms > 0, terms, terms * slope) * score_scale
    return cols, col_valid, eid, has_edge, terms, score


@triton.jit
def _attention_vector(att_ptr, ah, ac, heads, hmask, chans, cmask, V2: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    """gatv2's ``att`` of the program's heads as ``[BLOCK_H, BLOCK_C]`` float32 (zeros for gat, whose pointer is a
    dummy)."""
    if V2:
        att = tl.load(att_ptr + heads[:, None] * ah + chans[None, :] * ac, mask=hmask[:, None] & cmask[None, :],
                      other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    return att


@triton.jit
def _row_term(ptr, sr, sh, sc, rows, rmask, heads, hmask, chans, cmask, att, HAS: tl.constexpr, V2: tl.constexpr):
    """The window rows' score term (``att``, unused, where the role has none)."""
    if HAS:
        term = _node_term(ptr, sr, sh, sc, rows, rmask, heads, hmask, chans, cmask, V2)
    else:
        term = att
    return term


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def _gat_forward_kernel(
        dense_windows_ptr, window_rows_ptr, tile_ptr_ptr, tile_col_ptr, tile_edge_ptr,
        s_ptr, sr, sh, sc, d_ptr, dr, dh, dc, e_ptr, er, eh, ec, att_ptr, ah, ac,
        v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        out_ptr, lse_ptr, num_heads, head_dim, slope, score_scale, message_scale, eps,
        HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr, HAS_EDGE: tl.constexpr, DROPOUT: tl.constexpr,
        V2: tl.constexpr, PRECISION: tl.constexpr, WINDOW: tl.constexpr, TILE: tl.constexpr,
        BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr):
    window = tl.load(dense_windows_ptr + tl.program_id(0)).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0
    att = _attention_vector(att_ptr, ah, ac, heads, hmask, chans, cmask, V2, BLOCK_H, BLOCK_C)
    row_term = _row_term(d_ptr, dr, dh, dc, rows, rmask, heads, hmask, chans, cmask, att, HAS_DST, V2)

    m = tl.full([BLOCK_H, WINDOW], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H, WINDOW], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        cols, col_valid, eid, has_edge, _terms, score = _tile_cells(
            tile, tile_col_ptr, tile_edge_ptr, row_term, s_ptr, sr, sh, sc, e_ptr, er, eh, ec, att, heads, hmask,
            slots, lanes, chans, cmask, slope, score_scale, HAS_DST, HAS_SRC, HAS_EDGE, V2, BLOCK_H, WINDOW, TILE,
            BLOCK_C)
        value, _ = load_head_rows(v_ptr, cols, col_valid, heads, hmask, chans, cmask, vr, vh, vc)
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
    out_mask = hmask[:, None, None] & rmask[None, :, None] & cmask[None, None, :]
    tl.store(out_ptr + node_head_offsets(rows, heads, num_heads, head_dim, chans), out.to(out_ptr.dtype.element_ty),
             mask=out_mask)
    lse = tl.where(total > 0, m + tl.log(tl.where(total > 0, total, 1.0)), 0.0)
    tl.store(lse_ptr + rows[None, :] * num_heads + heads[:, None], lse, mask=hmask[:, None] & rmask[None, :])


def gat_form_reason(layout) -> str | None:
    """Why the block-sparse GAT / GATv2 kernels cannot run this attention (None when they can)."""
    form, roles = layout.form, layout.roles
    if form.family not in FAMILIES:
        return f"{form.family} family: the block-sparse GAT kernels run the gat and gatv2 families only"
    if any(roles[i] != ROLE_SRC for i in form.value_terms):
        return "a value term is not a source-row input (edge-role values are not supported)"
    if any(roles[i] not in (ROLE_SRC, ROLE_DST, ROLE_EDGE) for i in form.score_terms):
        return "a score term is not a source, destination or edge input"
    if form.family == "gatv2" and roles[form.query] != ROLE_DENSE:
        return "the gatv2 attention vector is not dense"
    return None


class _Operands(NamedTuple):
    layout: object
    terms: dict          # role -> (argument indices, summed term view or None)
    value: Tensor        # [num_src, H, C], the half dtype when any input is half precision
    att: Tensor | None   # gatv2: [1, H, C] view


def _operands(args, roles, perm: Tensor, score_key: str, message_key: str, dropout: Dropout | None) -> _Operands:
    """The attention's layout (with the call's dropout) and operands; ``ValueError`` naming the reason when it is
    not of a supported form (see :func:`gat_form_reason`)."""
    layout = prepare(args, roles, perm, score_key, message_key, dropout)
    reason = layout if isinstance(layout, str) else gat_form_reason(layout)
    if reason is not None:
        raise ValueError(f"block-sparse attention cannot run this attention: {reason}")
    form = layout.form
    terms = {}
    for role in (ROLE_SRC, ROLE_DST, ROLE_EDGE):
        indices = [i for i in form.score_terms if layout.roles[i] == role]
        if not indices:
            term = None
        elif len(indices) == 1:
            term = layout.views[indices[0]]
        else:
            term = sum(layout.views[i].float() for i in indices)
        terms[role] = (indices, term)
    value = summed_views(layout, form.value_terms)
    half = out_dtype(layout.args)
    if half != torch.float32:
        value = value.to(half)
    att = layout.views[form.query] if form.family == "gatv2" else None
    return _Operands(layout, terms, value, att)


def _slot(t: Tensor | None, dummy: Tensor, vector: bool) -> list:
    """Pointer and (row, head, channel) strides of a term, a dummy with zero strides when absent."""
    if t is None:
        return [dummy, 0, 0, 0]
    return [t, t.stride(0), t.stride(1), t.stride(2) if vector else 0]


def _launch_prefix(ops: _Operands) -> str:
    """``block_sparse.BLOCK_LAUNCH``'s key prefix of this attention's kernels: GAT's and GATv2's are measured apart."""
    return "gatv2" if ops.layout.form.family == "gatv2" else "gat"


def _kernel_operands(ops: _Operands) -> tuple:
    """The pointer/stride arguments shared by the three kernels and their common constexprs."""
    layout = ops.layout
    v2 = layout.form.family == "gatv2"
    value = ops.value
    src, dst, edge = (ops.terms[r][1] for r in (ROLE_SRC, ROLE_DST, ROLE_EDGE))
    att = [value, 0, 0] if ops.att is None else [ops.att, ops.att.stride(1), ops.att.stride(2)]
    pointers = [*_slot(src, value, v2), *_slot(dst, value, v2), *_slot(edge, value, v2), *att,
                value, *value.stride(), *dropout_slot(layout.dropout, value)]
    channels = layout.channels
    block_c = max(16, next_power_of_2(channels))
    constexprs = {"HAS_SRC": src is not None, "HAS_DST": dst is not None, "HAS_EDGE": edge is not None,
                  "DROPOUT": layout.dropout is not None, "V2": v2, "WINDOW": WINDOW, "TILE": TILE,
                  "BLOCK_C": block_c,
                  # gatv2 holds WINDOW x TILE x BLOCK_C tiles in registers: more warps for wide heads (unmeasured)
                  "num_warps": 8 if v2 and block_c >= 64 else 4}
    return pointers, constexprs


def gat_forward(args, roles, perm: Tensor, score_key: str, message_key: str, blocks: BlockFormat,
                num_dst: int, eps: float, allow_tf32: bool = False,
                dropout: Dropout | None = None) -> tuple[Tensor, Tensor]:
    """``(out [N, H, C], lse [N, H] float32)`` of ``gnn_io::attention`` (gat or gatv2 family, by the layout's
    form; with ``dropout`` on alpha when given) for the rows of ``dense_ok`` windows (others 0); raises
    ``ValueError`` naming the reason when the attention is not of a supported form (see :func:`gat_form_reason`)."""
    ops = _operands(args, roles, perm, score_key, message_key, dropout)
    layout = ops.layout
    form, heads, channels = layout.form, layout.heads, layout.channels
    device = blocks.tile_ptr.device
    new = torch.empty if covers_every_row(blocks, num_dst) else torch.zeros
    out = new((num_dst, heads, channels), dtype=ops.value.dtype, device=device)
    lse = new((num_dst, heads), dtype=torch.float32, device=device)
    pointers, constexprs = _kernel_operands(ops)
    if blocks.dense_windows.shape[0] and heads:
        programs, block_h, launch = head_launch(f"{_launch_prefix(ops)}_forward", heads, ops.value.dtype,
                                                constexprs["BLOCK_C"])
        _gat_forward_kernel[(blocks.dense_windows.shape[0], programs)](
            blocks.dense_windows, blocks.window_rows, blocks.tile_ptr, blocks.tile_col, blocks.tile_edge,
            *pointers, out, lse, heads, channels, form.negative_slope, form.score_scale, form.message_scale, eps,
            PRECISION=dot_precision(allow_tf32, ops.value.dtype),
            BLOCK_H=block_h, **{**constexprs, **launch})
    return out, lse


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def _gat_backward_row_kernel(
        dense_windows_ptr, window_rows_ptr, tile_ptr_ptr, tile_col_ptr, tile_edge_ptr,
        s_ptr, sr, sh, sc, d_ptr, dr, dh, dc, e_ptr, er, eh, ec, att_ptr, ah, ac,
        v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        grad_out_ptr, lse_ptr, delta_ptr, grad_dst_ptr, grad_edge_ptr, grad_att_ptr,
        num_heads, head_dim, slope, score_scale, message_scale,
        HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr, HAS_EDGE: tl.constexpr, DROPOUT: tl.constexpr,
        V2: tl.constexpr, GRAD_DST: tl.constexpr, GRAD_EDGE: tl.constexpr, GRAD_ATT: tl.constexpr,
        PRECISION: tl.constexpr, WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr,
        BLOCK_H: tl.constexpr):
    """Per (row window, block of heads): the dst-role terms' gradient, the edge-role terms' gradient (stored at the
    cells' edge ids) and gatv2's partial ``d att`` (one ``[BLOCK_C]`` row per window and head)."""
    window_index = tl.program_id(0)
    window = tl.load(dense_windows_ptr + window_index).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0
    att = _attention_vector(att_ptr, ah, ac, heads, hmask, chans, cmask, V2, BLOCK_H, BLOCK_C)
    row_term = _row_term(d_ptr, dr, dh, dc, rows, rmask, heads, hmask, chans, cmask, att, HAS_DST, V2)
    node_offsets = node_head_offsets(rows, heads, num_heads, head_dim, chans)
    row_mask = hmask[:, None, None] & rmask[None, :, None] & cmask[None, None, :]
    grad_out = tl.load(grad_out_ptr + node_offsets, mask=row_mask, other=0)
    stat_offsets = rows[None, :] * num_heads + heads[:, None]
    stat_mask = hmask[:, None] & rmask[None, :]
    lse = tl.load(lse_ptr + stat_offsets, mask=stat_mask, other=0)
    delta = tl.load(delta_ptr + stat_offsets, mask=stat_mask, other=0)

    if V2:
        grad_dst = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    else:
        grad_dst = tl.zeros([BLOCK_H, WINDOW], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        cols, col_valid, eid, has_edge, terms, score = _tile_cells(
            tile, tile_col_ptr, tile_edge_ptr, row_term, s_ptr, sr, sh, sc, e_ptr, er, eh, ec, att, heads, hmask,
            slots, lanes, chans, cmask, slope, score_scale, HAS_DST, HAS_SRC, HAS_EDGE, V2, BLOCK_H, WINDOW, TILE,
            BLOCK_C)
        value, _ = load_head_rows(v_ptr, cols, col_valid, heads, hmask, chans, cmask, vr, vh, vc)
        p = tl.exp(tl.where(has_edge[None, :, :], score - lse[:, :, None], float("-inf")))
        grad_p = tl.dot(grad_out, tl.permute(value, (0, 2, 1)), input_precision=PRECISION) * message_scale
        if DROPOUT:
            grad_p = dropped_triton(grad_p, seed_ptr, eid[None, :, :], heads[:, None, None], num_heads, dropout_p,
                                    dropout_scale)
        grad_score = p * (grad_p - delta[:, :, None]) * score_scale
        if V2:
            slope_of = tl.where(terms > 0, 1.0, slope)
            grad_terms = grad_score[:, :, :, None] * att[:, None, None, :] * slope_of
            if GRAD_ATT:
                grad_att += tl.sum(tl.sum(grad_score[:, :, :, None] * terms * slope_of, axis=2), axis=1)
            if GRAD_DST:
                grad_dst += tl.sum(grad_terms, axis=2)
            if GRAD_EDGE:
                edge_offsets = ((eid.to(tl.int64)[None, :, :, None] * num_heads + heads[:, None, None, None])
                                * head_dim + chans[None, None, None, :])
                edge_mask = hmask[:, None, None, None] & has_edge[None, :, :, None] & cmask[None, None, None, :]
                tl.store(grad_edge_ptr + edge_offsets, grad_terms, mask=edge_mask)
        else:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
            if GRAD_DST:
                grad_dst += tl.sum(grad_terms, axis=2)
            if GRAD_EDGE:
                tl.store(grad_edge_ptr + eid.to(tl.int64)[None, :, :] * num_heads + heads[:, None, None], grad_terms,
                         mask=hmask[:, None, None] & has_edge[None, :, :])
    if GRAD_DST:
        if V2:
            tl.store(grad_dst_ptr + node_offsets, grad_dst, mask=row_mask)
        else:
            tl.store(grad_dst_ptr + stat_offsets, grad_dst, mask=stat_mask)
    if GRAD_ATT:
        tl.store(grad_att_ptr + (window_index.to(tl.int64) * num_heads + heads[:, None]) * head_dim + chans[None, :],
                 grad_att, mask=hmask[:, None] & cmask[None, :])


@fast_launch
@triton.jit
def _gat_backward_source_kernel(
        dense_windows_ptr, window_srcs_ptr, tile_ptr_ptr, tile_dst_ptr, tile_edge_ptr,
        s_ptr, sr, sh, sc, d_ptr, dr, dh, dc, e_ptr, er, eh, ec, att_ptr, ah, ac,
        v_ptr, vr, vh, vc, seed_ptr, dropout_p, dropout_scale,
        grad_out_ptr, lse_ptr, delta_ptr, grad_src_ptr, grad_value_ptr,
        num_heads, head_dim, slope, score_scale, message_scale,
        HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr, HAS_EDGE: tl.constexpr, DROPOUT: tl.constexpr,
        V2: tl.constexpr, GRAD_SRC: tl.constexpr, GRAD_VALUE: tl.constexpr,
        PRECISION: tl.constexpr, WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_C: tl.constexpr,
        BLOCK_H: tl.constexpr):
    """Per (source window of the transposed format, block of heads), its tiles' columns destination rows, cells
    ``[sources, destinations]``: the src-role terms' gradient and ``dV = message_scale (P w)^T dO``."""
    window = tl.load(dense_windows_ptr + tl.program_id(0)).to(tl.int64)
    heads, hmask = head_block(num_heads, BLOCK_H)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    srcs = tl.load(window_srcs_ptr + window * WINDOW + slots).to(tl.int64)
    smask = srcs >= 0
    att = _attention_vector(att_ptr, ah, ac, heads, hmask, chans, cmask, V2, BLOCK_H, BLOCK_C)
    row_term = _row_term(s_ptr, sr, sh, sc, srcs, smask, heads, hmask, chans, cmask, att, HAS_SRC, V2)
    value, src_mask = load_head_rows(v_ptr, srcs, smask, heads, hmask, chans, cmask, vr, vh, vc)

    if V2:
        grad_src = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    else:
        grad_src = tl.zeros([BLOCK_H, WINDOW], dtype=tl.float32)
    grad_value = tl.zeros([BLOCK_H, WINDOW, BLOCK_C], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        dsts, dst_valid, eid, has_edge, terms, score = _tile_cells(
            tile, tile_dst_ptr, tile_edge_ptr, row_term, d_ptr, dr, dh, dc, e_ptr, er, eh, ec, att, heads, hmask,
            slots, lanes, chans, cmask, slope, score_scale, HAS_SRC, HAS_DST, HAS_EDGE, V2, BLOCK_H, WINDOW, TILE,
            BLOCK_C)
        stat_offsets = dsts[None, :] * num_heads + heads[:, None]
        stat_mask = hmask[:, None] & dst_valid[None, :]
        lse = tl.load(lse_ptr + stat_offsets, mask=stat_mask, other=0)
        grad_out = tl.load(grad_out_ptr + node_head_offsets(dsts, heads, num_heads, head_dim, chans),
                           mask=hmask[:, None, None] & dst_valid[None, :, None] & cmask[None, None, :], other=0)
        p = tl.exp(tl.where(has_edge[None, :, :], score - lse[:, None, :], float("-inf")))
        p_weighted = p * message_scale
        if DROPOUT:
            p_weighted = dropped_triton(p_weighted, seed_ptr, eid[None, :, :], heads[:, None, None], num_heads,
                                        dropout_p, dropout_scale)
        if GRAD_VALUE:
            grad_value += tl.dot(p_weighted.to(grad_out.dtype), grad_out, input_precision=PRECISION)
        if GRAD_SRC:
            delta = tl.load(delta_ptr + stat_offsets, mask=stat_mask, other=0)
            # p * (message_scale * w * <V, dO> - D) = p_weighted * <V, dO> - p * D
            grad_p = tl.dot(value, tl.permute(grad_out, (0, 2, 1)), input_precision=PRECISION)
            grad_score = (p_weighted * grad_p - p * delta[:, None, :]) * score_scale
            if V2:
                grad_src += tl.sum(grad_score[:, :, :, None] * att[:, None, None, :]
                                   * tl.where(terms > 0, 1.0, slope), axis=2)
            else:
                grad_src += tl.sum(grad_score * tl.where(terms > 0, 1.0, slope), axis=2)
    offsets = node_head_offsets(srcs, heads, num_heads, head_dim, chans)
    if GRAD_SRC:
        if V2:
            tl.store(grad_src_ptr + offsets, grad_src, mask=src_mask)
        else:
            tl.store(grad_src_ptr + srcs[None, :] * num_heads + heads[:, None], grad_src,
                     mask=hmask[:, None] & smask[None, :])
    if GRAD_VALUE:
        tl.store(grad_value_ptr + offsets, grad_value, mask=src_mask)


def gat_backward(grad_out: Tensor, delta: Tensor, lse: Tensor, args, roles, perm: Tensor, score_key: str,
                 message_key: str, blocks: BlockFormat, transposed: BlockFormat, needs_grad,
                 allow_tf32: bool = False, dropout: Dropout | None = None) -> list:
    """Gradients of :func:`gat_forward`'s arguments flagged in ``needs_grad`` (None elsewhere), in each
    argument's dtype, through the edges of ``blocks``' ``dense_ok`` windows only (the rest is the CSR backward's,
    as in the forward). ``transposed`` is ``transpose_block_format(blocks, num_src)``. Every score term of a role
    gets that role's gradient, every value term ``dV`` (module docstring); ``dropout`` is the forward's."""
    ops = _operands(args, roles, perm, score_key, message_key, dropout)
    layout = ops.layout
    form, heads, channels = layout.form, layout.heads, layout.channels
    v2 = form.family == "gatv2"

    def needed(indices) -> bool:
        return any(needs_grad[i] for i in indices)

    need = {role: needed(ops.terms[role][0]) for role in (ROLE_SRC, ROLE_DST, ROLE_EDGE)}
    need_value = needed(form.value_terms)
    need_att = v2 and bool(needs_grad[form.query])
    device = blocks.tile_ptr.device
    delta = delta.contiguous()  # D = <dO, O> per (row, head), csr_delta.delta
    grad_out = grad_out.to(ops.value.dtype).contiguous()
    pointers, constexprs = _kernel_operands(ops)
    precision = dot_precision(allow_tf32, ops.value.dtype)

    # the row kernel writes every row and every edge when all windows are dense; the source kernel every source
    full = {ROLE_DST: covers_every_row(blocks, grad_out.shape[0]), ROLE_SRC: True}
    full[ROLE_EDGE] = full[ROLE_DST]

    def buffer(role):
        if not need[role]:
            return None
        indices = ops.terms[role][0]
        return gradient_buffer(layout, indices, layout.views[indices[0]].shape, full[role])

    grad_terms = {role: buffer(role) for role in (ROLE_SRC, ROLE_DST, ROLE_EDGE)}
    num_windows = blocks.dense_windows.shape[0]
    grad_att = torch.zeros((max(num_windows, 1), heads, channels), dtype=torch.float32, device=device) \
        if need_att else None
    if (need[ROLE_DST] or need[ROLE_EDGE] or need_att) and num_windows and heads:
        programs, block_h, launch = head_launch(f"{_launch_prefix(ops)}_row", heads, ops.value.dtype,
                                                constexprs["BLOCK_C"])
        _gat_backward_row_kernel[(num_windows, programs)](
            blocks.dense_windows, blocks.window_rows, blocks.tile_ptr, blocks.tile_col, blocks.tile_edge,
            *pointers, grad_out, lse, delta,
            *[lse if g is None else g for g in (grad_terms[ROLE_DST], grad_terms[ROLE_EDGE], grad_att)],
            heads, channels, form.negative_slope, form.score_scale, form.message_scale,
            GRAD_DST=need[ROLE_DST], GRAD_EDGE=need[ROLE_EDGE], GRAD_ATT=need_att, PRECISION=precision,
            BLOCK_H=block_h, **{**constexprs, **launch})
    grad_value = gradient_buffer(layout, form.value_terms, ops.value.shape, True) if need_value else None
    if (need[ROLE_SRC] or need_value) and transposed.dense_windows.shape[0] and heads:
        programs, block_h, launch = head_launch(f"{_launch_prefix(ops)}_source", heads, ops.value.dtype,
                                                constexprs["BLOCK_C"])
        _gat_backward_source_kernel[(transposed.dense_windows.shape[0], programs)](
            transposed.dense_windows, transposed.window_rows, transposed.tile_ptr, transposed.tile_col,
            transposed.tile_edge, *pointers, grad_out, lse, delta,
            *[lse if g is None else g for g in (grad_terms[ROLE_SRC], grad_value)],
            heads, channels, form.negative_slope, form.score_scale, form.message_scale,
            GRAD_SRC=need[ROLE_SRC], GRAD_VALUE=need_value, PRECISION=precision,
            BLOCK_H=block_h, **{**constexprs, **launch})

    parts = [(ops.terms[role][0], grad_terms[role]) for role in (ROLE_SRC, ROLE_DST, ROLE_EDGE)]
    parts += [(form.value_terms, grad_value)]
    if v2:
        parts += [((form.query,), grad_att)]
    grads = [None] * len(layout.args)
    for indices, grad in parts:
        for i in indices:
            if needs_grad[i]:
                part = undo_view_grad(grad, layout.args[i], layout.roles[i])
                grads[i] = part if grads[i] is None else grads[i] + part
    return [g if g is None else g.to(a.dtype) for g, a in zip(grads, layout.args)]


BlockSparseGatAttention = attention_function(
    "BlockSparseGatAttention", gat_forward, gat_backward,
    ":func:`gat_forward` with :func:`gat_backward` as its backward, for the gat and gatv2 families "
    "(see :func:`block_sparse.attention_function`).")
