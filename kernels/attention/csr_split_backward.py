"""The split backward of the fused CSR attention (FlashAttention-2's split, no atomics outside hub rows): one
kernel, launched as a dst pass over the CSR's work items and a src pass over the transposed CSR's
(:class:`gnn_inductor.plan.source_csr.SourceCSR`), every head in one program. kernels/attention/csr_backward.py
picks the outputs of each pass.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor.kernels.attention.csr_launch import DENSE_GRAD_SLOTS
from gnn_inductor.kernels.attention.csr_tiles import edge_tile, head_tile_scores, load_vector
from gnn_inductor.kernels.attention.layout import NO_ROLE, Layout, common_slots, padded
from gnn_inductor.kernels.runtime.launch import fast_launch
from gnn_inductor.kernels.runtime.rng import packed_dropped_triton
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_EDGE

MAX_GRAD_OUTPUTS = 4    # arguments one pass of the split backward writes gradients of (the kernel's slots G0..G3)
# role of a per-edge output the src pass stores at the edge's position in the transposed CSR (contiguous stores),
# not at its edge id: the segment backward's dst-role score terms, summed per destination afterwards
BY_SOURCE_POSITION = 4


# One kernel, two passes: MAJOR = ROLE_DST walks the CSR's work items (rows are destinations), MAJOR = ROLE_SRC
# the work items of the transposed CSR (:class:`SourceCSR`, rows are sources). One program takes a work item
# for every head, on [BLOCK_E, BLOCK_H(, BLOCK_C)] tiles (the shaped indices of kernels/attention/csr_tiles.py).
# Either pass recomputes each edge's score, alpha and ds exactly as the atomic backward's kernel
# (kernels/attention/csr_atomic_backward.py), and writes the gradients of up to four arguments (G0..G3: a buffer,
# its role, and how often the argument is a score term (T), a value term (V) and the dot query (Q): an argument in
# two places, such as GATv2's x_l or TransformerConv's edge embedding, gets the sum once). Arguments of the pass's
# row role (dst, resp. src) are summed in registers over the whole item and written once for every head (an atomic
# only for an item of a hub row: ``shared == 1``); edge-role arguments (dst pass only) are plain stores, every edge
# id being its own address.

@triton.jit
def _combine_grads(T: tl.constexpr, V: tl.constexpr, Q: tl.constexpr, grad_terms, grad_value, grad_query):
    """``T * grad_terms + V * grad_value + Q * grad_query`` without the zero terms."""
    if T > 0:
        total = grad_terms * T
        if V > 0:
            total += grad_value * V
        if Q > 0:
            total += grad_query * Q
    elif V > 0:
        total = grad_value * V
        if Q > 0:
            total += grad_query * Q
    else:
        total = grad_query * Q
    return total


@triton.jit
def _store_edge_grad_heads(ptr, R: tl.constexpr, T: tl.constexpr, V: tl.constexpr, Q: tl.constexpr,
                           KIND: tl.constexpr, eid, pos, heads, num_heads, head_dim, chans, score_mask, tile_mask,
                           grad_terms, grad_value, grad_query):
    """An edge-role gradient of one block of edges, every head: plain stores (each edge id is written by one
    program); ``eid`` is ``[BLOCK_E, 1]``, the gradients ``[BLOCK_E, BLOCK_H(, BLOCK_C)]``. Role
    ``BY_SOURCE_POSITION`` (4): stored at ``pos``, the edges' positions in the CSR this pass walks."""
    if R == 2 or R == 4:
        if R == 2:
            rows = eid.to(tl.int64) * num_heads + heads[None, :]
        else:
            rows = pos.to(tl.int64) * num_heads + heads[None, :]
        total = _combine_grads(T, V, Q, grad_terms, grad_value, grad_query)
        if KIND == 0 and T > 0:
            tl.store(ptr + rows, total, mask=score_mask)
        else:
            tl.store(ptr + rows[:, :, None] * head_dim + chans[None, None, :], total, mask=tile_mask)


@triton.jit
def _write_row_grad_heads(ptr, row_stride, row0, R: tl.constexpr, T: tl.constexpr, V: tl.constexpr,
                          Q: tl.constexpr, KIND: tl.constexpr, MAJOR: tl.constexpr, row, shared, heads, hmask,
                          num_heads, head_dim, chans, node_mask, sum_terms, sum_value, sum_query):
    """A row-role gradient, summed over the whole item (``[BLOCK_H(, BLOCK_C)]``): stored by a row's only item,
    added by a hub's items, one atomic for every head; padding items (``shared == 2``) write nothing. Rows are
    ``row_stride`` elements apart (the heads' values of a row contiguous): a buffer of its own, or a column slice
    of a packed gradient (:func:`csr_backward.backward`'s ``pack``). Row ``row`` is stored at ``row - row0``: a buffer of the
    rows from ``row0`` on (:func:`csr_chunked.backward_chunked`), 0 for a buffer of every row."""
    if R == MAJOR:
        total = _combine_grads(T, V, Q, sum_terms, sum_value, sum_query)
        row_base = (row - row0).to(tl.int64) * row_stride
        if KIND == 0 and T > 0:
            if shared == 0:
                tl.store(ptr + row_base + heads, total, mask=hmask)
            elif shared == 1:
                tl.atomic_add(ptr + row_base + heads, total, mask=hmask)
        else:
            offsets = row_base + heads[:, None] * head_dim + chans[None, :]
            if shared == 0:
                tl.store(ptr + offsets, total, mask=node_mask)
            elif shared == 1:
                tl.atomic_add(ptr + offsets, total, mask=node_mask)


@fast_launch
@triton.jit
def split_backward_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, other_ptr, eid_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale, f, fr, fh,
        lse_ptr, delta_ptr, grad_out_ptr, g0, g1, g2, g3, gatt, gfac, g0s, g1s, g2s, g3s, row0,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, F: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        MAJOR: tl.constexpr,
        G0R: tl.constexpr, G0T: tl.constexpr, G0V: tl.constexpr, G0Q: tl.constexpr,
        G1R: tl.constexpr, G1T: tl.constexpr, G1V: tl.constexpr, G1Q: tl.constexpr,
        G2R: tl.constexpr, G2T: tl.constexpr, G2V: tl.constexpr, G2Q: tl.constexpr,
        G3R: tl.constexpr, G3T: tl.constexpr, G3V: tl.constexpr, G3Q: tl.constexpr,
        ROW_T: tl.constexpr, ROW_V: tl.constexpr, ROW_Q: tl.constexpr, EDGE_Q: tl.constexpr, GATT: tl.constexpr,
        GFAC: tl.constexpr, DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_C: tl.constexpr):
    """One work item of one pass of the split backward (see above), every head at once: the item's CSR indices,
    and in the dst pass its row's ``dout``, ``D`` and ``lse``, are read once for all heads, and a row gradient is
    one store (or one hub atomic) for all heads. That beat one program per (item, head) on the H100 by 1.2-1.5x
    (:data:`csr_launch.SPLIT_BACKWARD_LAUNCH`). ``other_ptr`` holds the edges' other endpoint (sources in the dst pass,
    destinations in the src pass) and ``eid_ptr`` their edge ids; ``ROW_*`` say which gradient kinds a row-role
    output needs summed, ``EDGE_Q`` whether the dot query's is needed at all, ``GATT`` whether GATv2's ``att``
    gradient is (dst pass only), ``GFAC`` whether the dot family's edge-role score factor's is (dst pass only:
    ``[E, H]`` at ``gfac``, stored by edge id). Padded heads load zeros, get ``alpha = 0`` and are masked out at
    every store. ``delta_ptr`` holds ``D = <dout, out>`` per (row, head), computed before the backward
    (``attention_delta``)."""
    item = tl.program_id(0)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    shared = tl.load(item_shared_ptr + item)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    head_row = heads[None, :]
    head_tile = heads[None, :, None]
    node_mask = hmask[:, None] & cmask[None, :]
    if MAJOR == 1:  # one destination per item: its dout, D and lse once, for every head
        node_heads = row.to(tl.int64) * num_heads + heads
        grad_node = tl.load(grad_out_ptr + node_heads[:, None] * head_dim + chans[None, :], mask=node_mask,
                            other=0).to(tl.float32)
        grad_row = grad_node[None, :, :]
        delta_row = tl.load(delta_ptr + node_heads, mask=hmask, other=0)[None, :]
        lse_row = tl.load(lse_ptr + node_heads, mask=hmask, other=0)[None, :]
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    if KIND == 0:
        acc_terms = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    else:
        acc_terms = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    acc_value = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    acc_query = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        if MAJOR == 1:
            emask, src, dst, eid = edge_tile(block_start, end, other_ptr, eid_ptr, row, NEED_EID, BLOCK_E)
        else:
            emask, dst, src, eid = edge_tile(block_start, end, other_ptr, eid_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        pos = (block_start + tl.arange(0, BLOCK_E))[:, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        if MAJOR == 1:
            grad_rows = grad_row
            delta = delta_row
            lse = lse_row
        else:  # every edge its own destination
            dst_heads = dst.to(tl.int64) * num_heads + head_row
            grad_rows = tl.load(grad_out_ptr + dst_heads[:, :, None] * head_dim + chans[None, None, :],
                                mask=tile_mask, other=0).to(tl.float32)
            delta = tl.load(delta_ptr + dst_heads, mask=score_mask, other=0)
            lse = tl.load(lse_ptr + dst_heads, mask=score_mask, other=0)
        score, terms, query, factor, dot = head_tile_scores(
            KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2, q, qr, qh, qc, Q, att, f, fr, fh,
            F, src, dst, eid, head_row, head_tile, chans, score_mask, tile_mask, slope, score_scale)
        alpha = tl.where(score_mask, tl.exp(score - lse), 0.0)
        weight = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32) + message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = load_vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += load_vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)

        grad_value = (alpha * weight)[:, :, None] * grad_rows
        grad_score = alpha * (weight * tl.sum(value * grad_rows, axis=2) - delta) * score_scale
        if F >= 0:  # s = scale * f * dot: df = ds * scale * dot, and the dot's own gradient scaled by f
            if GFAC:
                tl.store(gfac + eid.to(tl.int64) * num_heads + head_row, grad_score * dot, mask=score_mask)
            grad_score = grad_score * factor
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
        elif KIND == 1:
            grad_terms = grad_score[:, :, None] * att[None, :, :] * tl.where(terms > 0, 1.0, slope)
            if GATT:
                grad_att += tl.sum(grad_score[:, :, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
        else:
            grad_terms = grad_score[:, :, None] * query
        if EDGE_Q:
            grad_query = grad_score[:, :, None] * terms
        else:
            grad_query = grad_value  # no output reads it

        if ROW_T:
            acc_terms += grad_terms
        if ROW_V:
            acc_value += grad_value
        if ROW_Q:
            acc_query += grad_query
        _store_edge_grad_heads(g0, G0R, G0T, G0V, G0Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g1, G1R, G1T, G1V, G1Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g2, G2R, G2T, G2V, G2Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g3, G3R, G3T, G3V, G3Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)

    sum_terms = tl.sum(acc_terms, axis=0)
    sum_value = tl.sum(acc_value, axis=0)
    sum_query = tl.sum(acc_query, axis=0)
    _write_row_grad_heads(g0, g0s, row0, G0R, G0T, G0V, G0Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g1, g1s, row0, G1R, G1T, G1V, G1Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g2, g2s, row0, G2R, G2T, G2V, G2Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g3, g3s, row0, G3R, G3T, G3V, G3Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    if GATT:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gatt + (dense_slot * num_heads + heads[:, None]) * head_dim + chans[None, :], grad_att,
                      mask=node_mask)


def split_pass(layout: Layout, major: int, outputs: list, buffers: dict, att_grad, items, other: Tensor,
                eid: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor, config: dict, row0: int = 0) -> None:
    """One launch of :func:`split_backward_kernel`: the dst pass (``major == ROLE_DST``) or the src
    pass; its row-role outputs hold the rows from ``row0`` on. The dst pass also writes the score factor's
    gradient where ``buffers`` has one (an edge-role factor: float32 ``[E, H]``, by edge id)."""
    form = layout.form
    factor_grad = buffers.get(form.score_factor) if major == ROLE_DST and form.score_factor is not None else None
    pointers, constexprs = common_slots(layout)
    # an edge-role output is stored by edge id (the segment variant's per-edge dst score terms too)
    constexprs["NEED_EID"] = constexprs["NEED_EID"] or any(o[1] == ROLE_EDGE for o in outputs)
    slots = padded(outputs, MAX_GRAD_OUTPUTS)
    grads, strides, specs = [], [], {}
    for k, output in enumerate(slots):
        i, role, t, v, q = output if output is not None else (None, NO_ROLE, 0, 0, 0)
        grads.append(lse if i is None else buffers[i])
        strides.append(0 if i is None else buffers[i].stride(0))
        specs.update({f"G{k}R": role, f"G{k}T": t, f"G{k}V": v, f"G{k}Q": q})
    row_outputs = [o for o in outputs if o[1] == major]
    flags = {"ROW_T": any(o[2] for o in row_outputs), "ROW_V": any(o[3] for o in row_outputs),
             "ROW_Q": any(o[4] for o in row_outputs), "EDGE_Q": any(o[4] for o in outputs),
             "GATT": att_grad is not None, "GFAC": factor_grad is not None}
    if not items[0].shape[0]:
        return
    args = (*items, other, eid, *pointers, lse, delta, grad_out, *grads,
            lse if att_grad is None else att_grad, lse if factor_grad is None else factor_grad, *strides, row0,
            layout.heads, layout.channels, form.negative_slope, form.score_scale, form.message_scale)
    split_backward_kernel[(items[0].shape[0],)](
        *args, **constexprs, MAJOR=major, **specs, **flags,
        DENSE_SLOTS=DENSE_GRAD_SLOTS,
        BLOCK_E=config["block_e"], BLOCK_H=config["block_h"], BLOCK_C=config["block_c"], num_warps=config["num_warps"],
        **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {}))
