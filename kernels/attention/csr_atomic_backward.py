"""The atomic backward of the fused CSR attention: one pass over the CSR's work items, per head or for every head
at once (``GNN_IO_ATTENTION_BACKWARD=atomic``, and wherever the split backward cannot run).

Backward recomputes the scores from the saved ``lse`` (``alpha_e = exp(s_e - lse_i)``) and ``D_i = <dout_i,
out_i>`` (kernels/attention/csr_delta.py): ``ds_e = alpha_e (w_e <dout_i, v_e> - D_i)``. Dst-role gradients are
reduced in registers per block, src- and edge-role gradients are float32 ``atomic_add`` of a ``BLOCK_E x BLOCK_C``
tile per edge block into per-argument buffers (the dot family's per-edge score factor, a per-head scalar, by its
role as GAT's score terms), the dense ``att`` gradient goes to 32 slots to keep atomics off one
address. It runs for the hybrid block/CSR path (its CSR part covers a subset of rows: a src pass over all of a
source's edges would count those into block rows twice), when the backward gets no source CSR, and when one pass
of the split backward would write the gradients of more than four distinct arguments.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gnn_inductor.kernels.attention.csr_launch import DENSE_GRAD_SLOTS, all_heads_launch_config, heads_variant, \
    launch_config
from gnn_inductor.kernels.attention.csr_tiles import edge_rows, edge_scores, edge_tile, head_tile_scores, load_vector
from gnn_inductor.kernels.attention.forms import MAX_SCORE_TERMS, MAX_VALUE_TERMS
from gnn_inductor.kernels.attention.layout import Layout, common_slots, padded
from gnn_inductor.kernels.runtime.launch import fast_launch
from gnn_inductor.kernels.runtime.rng import packed_dropped_triton
from torch import Tensor


@triton.jit
def _add_scalar_grad(ptr, ROLE: tl.constexpr, src, dst, eid, h, num_heads, grad, mask):
    if ROLE == 1:  # one destination for the whole block: reduce first, one atomic
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + row * num_heads + h, tl.sum(grad, axis=0))
    else:
        rows = edge_rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + rows * num_heads + h, grad, mask=mask)


@triton.jit
def _add_vector_grad(ptr, ROLE: tl.constexpr, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad, mask):
    if ROLE == 1:
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + (row * num_heads + h) * head_dim + chans, tl.sum(grad, axis=0), mask=cmask)
    else:
        rows = edge_rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + (rows[:, None] * num_heads + h) * head_dim + chans[None, :], grad, mask=mask)


@triton.jit
def _weight_and_value(keep_bits_ptr, dropout_scale, DROPOUT: tl.constexpr, v0, v0r, v0h, v0c,
                      V0: tl.constexpr, v1, v1r, v1h, v1c, V1: tl.constexpr, src, dst, eid, h, num_heads, chans,
                      tile_mask, message_scale, BLOCK_E: tl.constexpr):
    """Backward's per-edge factor of alpha (``message_scale`` times the dropout factor) and value tile."""
    weight = tl.zeros([BLOCK_E], dtype=tl.float32) + message_scale
    if DROPOUT:
        weight = packed_dropped_triton(weight, keep_bits_ptr, eid, h, num_heads, dropout_scale)
    value = load_vector(v0, V0, src, dst, eid, h, v0r, v0h, v0c, chans, tile_mask)
    if V1 >= 0:
        value += load_vector(v1, V1, src, dst, eid, h, v1r, v1h, v1c, chans, tile_mask)
    return weight, value


@fast_launch
@triton.jit
def atomic_backward_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale, f, fr, fh,
        delta_ptr, lse_ptr, grad_out_ptr,
        gs0, gs1, gs2, gq, gv0, gv1, gf,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, F: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        GS0: tl.constexpr, GS1: tl.constexpr, GS2: tl.constexpr, GQ: tl.constexpr, GV0: tl.constexpr,
        GV1: tl.constexpr, GF: tl.constexpr, DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr,
        BLOCK_C: tl.constexpr):
    item = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    node_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
    grad_row = tl.load(grad_out_ptr + node_offsets, mask=cmask, other=0).to(tl.float32)
    delta = tl.load(delta_ptr + row.to(tl.int64) * num_heads + h)
    lse = tl.load(lse_ptr + row.to(tl.int64) * num_heads + h)
    if KIND == 1:
        att = tl.load(q + h * qh + chans * qc, mask=cmask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        tile_mask = emask[:, None] & cmask[None, :]
        score, terms, query, factor, dot = edge_scores(
            KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2, q, qr, qh, qc, Q, att, f, fr, fh,
            F, src, dst, eid, h, chans, emask, tile_mask, slope, score_scale)
        alpha = tl.where(emask, tl.exp(score - lse), 0.0)
        weight, value = _weight_and_value(keep_bits_ptr, dropout_scale, DROPOUT, v0, v0r, v0h, v0c, V0,
                                          v1, v1r, v1h, v1c, V1, src, dst, eid, h, num_heads, chans, tile_mask,
                                          message_scale, BLOCK_E)

        grad_value = (alpha * weight)[:, None] * grad_row[None, :]
        if GV0:
            _add_vector_grad(gv0, V0, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_value, tile_mask)
        if GV1:
            _add_vector_grad(gv1, V1, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_value, tile_mask)

        grad_alpha = weight * tl.sum(value * grad_row[None, :], axis=1)
        grad_score = alpha * (grad_alpha - delta) * score_scale
        if F >= 0:  # s = scale * f * dot: df = ds * scale * dot, and the dot's own gradient scaled by f
            if GF:
                _add_scalar_grad(gf, F, src, dst, eid, h, num_heads, grad_score * dot, emask)
            grad_score = grad_score * factor
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
            if GS0:
                _add_scalar_grad(gs0, S0, src, dst, eid, h, num_heads, grad_terms, emask)
            if GS1:
                _add_scalar_grad(gs1, S1, src, dst, eid, h, num_heads, grad_terms, emask)
            if GS2:
                _add_scalar_grad(gs2, S2, src, dst, eid, h, num_heads, grad_terms, emask)
        else:
            if KIND == 1:
                grad_terms = grad_score[:, None] * att[None, :] * tl.where(terms > 0, 1.0, slope)
                grad_att += tl.sum(grad_score[:, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
            else:
                grad_terms = grad_score[:, None] * query
                if GQ:
                    _add_vector_grad(gq, Q, src, dst, eid, h, num_heads, head_dim, chans, cmask,
                                     grad_score[:, None] * terms, tile_mask)
            if GS0:
                _add_vector_grad(gs0, S0, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
            if GS1:
                _add_vector_grad(gs1, S1, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
            if GS2:
                _add_vector_grad(gs2, S2, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
    if GQ and KIND == 1:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gq + (dense_slot * num_heads + h) * head_dim + chans, grad_att, mask=cmask)


@triton.jit
def _add_head_grad(ptr, ROLE: tl.constexpr, src, dst, eid, inner, row_width, grad, mask, row_mask):
    """Add a ``[BLOCK_E, BLOCK_H(, BLOCK_C)]`` gradient tile into a ``[rows, row_width]`` buffer at
    ``row * row_width + inner``; the edge rows have the tile's rank (``[BLOCK_E, 1(, 1)]``)."""
    if ROLE == 1:  # one destination for the whole block: reduce first, one atomic per element
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + row * row_width + inner, tl.sum(grad, axis=0, keep_dims=True), mask=row_mask)
    else:
        rows = edge_rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + rows * row_width + inner, grad, mask=mask)


@fast_launch
@triton.jit
def atomic_backward_all_heads_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale, f, fr, fh,
        delta_ptr, lse_ptr, grad_out_ptr,
        gs0, gs1, gs2, gq, gv0, gv1, gf,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, F: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        GS0: tl.constexpr, GS1: tl.constexpr, GS2: tl.constexpr, GQ: tl.constexpr, GV0: tl.constexpr,
        GV1: tl.constexpr, GF: tl.constexpr, DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """:func:`atomic_backward_kernel` for every head of a work item at once (same formulas, per-head ``[H]`` rows)."""
    item = tl.program_id(0)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    head_row = heads[None, :]
    head_tile = heads[None, :, None]
    head_chan = head_tile * head_dim + chans[None, None, :]   # offset of (h, c) inside a [H, C] row
    node_mask = hmask[:, None] & cmask[None, :]
    row_width = num_heads * head_dim
    node_offsets = row.to(tl.int64) * row_width + heads[:, None] * head_dim + chans[None, :]
    grad_rows = tl.load(grad_out_ptr + node_offsets, mask=node_mask, other=0).to(tl.float32)
    delta = tl.load(delta_ptr + row.to(tl.int64) * num_heads + heads, mask=hmask, other=0)
    lse = tl.load(lse_ptr + row.to(tl.int64) * num_heads + heads, mask=hmask, other=0)
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        src_t, dst_t, eid_t = src[:, :, None], dst[:, :, None], eid[:, :, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        score, terms, query, factor, dot = head_tile_scores(
            KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2, q, qr, qh, qc, Q, att, f, fr, fh,
            F, src, dst, eid, head_row, head_tile, chans, score_mask, tile_mask, slope, score_scale)
        alpha = tl.where(score_mask, tl.exp(score - lse[None, :]), 0.0)
        weight = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32) + message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = load_vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += load_vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)

        grad_value = (alpha * weight)[:, :, None] * grad_rows[None, :, :]
        if GV0:
            _add_head_grad(gv0, V0, src_t, dst, eid_t, head_chan, row_width, grad_value, tile_mask,
                           node_mask[None, :, :])
        if GV1:
            _add_head_grad(gv1, V1, src_t, dst, eid_t, head_chan, row_width, grad_value, tile_mask,
                           node_mask[None, :, :])

        grad_alpha = weight * tl.sum(value * grad_rows[None, :, :], axis=2)
        grad_score = alpha * (grad_alpha - delta[None, :]) * score_scale
        if F >= 0:  # as in atomic_backward_kernel
            if GF:
                _add_head_grad(gf, F, src, dst, eid, head_row, num_heads, grad_score * dot, score_mask, hmask[None, :])
            grad_score = grad_score * factor
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
            if GS0:
                _add_head_grad(gs0, S0, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
            if GS1:
                _add_head_grad(gs1, S1, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
            if GS2:
                _add_head_grad(gs2, S2, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
        else:
            if KIND == 1:
                grad_terms = grad_score[:, :, None] * att[None, :, :] * tl.where(terms > 0, 1.0, slope)
                grad_att += tl.sum(grad_score[:, :, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
            else:
                grad_terms = grad_score[:, :, None] * query
                if GQ:
                    _add_head_grad(gq, Q, src_t, dst, eid_t, head_chan, row_width, grad_score[:, :, None] * terms,
                                   tile_mask, node_mask[None, :, :])
            if GS0:
                _add_head_grad(gs0, S0, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
            if GS1:
                _add_head_grad(gs1, S1, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
            if GS2:
                _add_head_grad(gs2, S2, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
    if GQ and KIND == 1:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gq + dense_slot * row_width + heads[:, None] * head_dim + chans[None, :], grad_att,
                      mask=node_mask)


def atomic_backward(layout: Layout, buffers: dict, grad_out: Tensor, delta: Tensor, lse: Tensor, col: Tensor,
                     perm: Tensor, items, config: dict | None, variant: str | None) -> None:
    """The one-pass backward: src- and edge-role gradients are float32 atomics of every edge block."""
    form, heads, channels = layout.form, layout.heads, layout.channels
    all_heads = (variant or heads_variant(default="per_head")) == "all"
    defaults = all_heads_launch_config(heads, channels) if all_heads else launch_config(form.family, channels, "atomic")
    config = {**defaults, **(config or {})}
    item_row, item_start, item_end = items
    s = padded(form.score_terms, MAX_SCORE_TERMS)
    v = padded(form.value_terms, MAX_VALUE_TERMS)
    grads = [buffers.get(i) for i in (s[0], s[1], s[2], form.query, v[0], v[1], form.score_factor)]
    flags = {"GS0": grads[0] is not None, "GS1": grads[1] is not None, "GS2": grads[2] is not None,
             "GQ": grads[3] is not None, "GV0": grads[4] is not None, "GV1": grads[5] is not None,
             "GF": grads[6] is not None}
    pointers, constexprs = common_slots(layout)
    if item_row.shape[0]:
        kernel_args = (item_row, item_start, item_end, col, perm, *pointers, delta, lse, grad_out.contiguous(),
                       *[lse if g is None else g for g in grads], heads, channels, form.negative_slope,
                       form.score_scale, form.message_scale)
        if all_heads:
            atomic_backward_all_heads_kernel[(item_row.shape[0],)](
                *kernel_args, **constexprs, **flags, DENSE_SLOTS=DENSE_GRAD_SLOTS, BLOCK_E=config["block_e"],
                BLOCK_H=config["block_h"], BLOCK_C=config["block_c"], num_warps=config["num_warps"])
        else:
            atomic_backward_kernel[(item_row.shape[0], heads)](
                *kernel_args, **constexprs, **flags, DENSE_SLOTS=DENSE_GRAD_SLOTS, BLOCK_E=config["block_e"],
                BLOCK_C=config["block_c"], num_warps=config["num_warps"])
