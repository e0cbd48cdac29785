"""The fused CSR attention forward: scores, online softmax and the weighted sum of values in one pass over each
destination's edges (kernels/attention/forms.py for what it computes).

No ``[E, H, C]`` tensor is ever built: each program keeps a ``BLOCK_E x BLOCK_C`` (per head) or ``BLOCK_E x BLOCK_H x
BLOCK_C`` (all heads) tile of the neighbourhood in registers. Attention dropout reads the call's mask as a bitset of
``E * H / 8`` bytes drawn once per forward (:meth:`Layout.keep_bits_slot`); no ``[E, H]`` tensor is stored.

Degree split: the forward runs one program per work item for every head (default; one per (work item, head) with
``GNN_IO_ATTENTION_HEADS=per_head``: :func:`csr_launch.heads_variant`, docs/attention.md); items from
:func:`gnn_inductor.plan.work_items.work_items` (at most ``max_edges`` edges each; the plan builds them once per
graph). A light row's single item writes ``out`` and ``lse``; the items of a hub write their partial ``(m, l, acc)``
to a compact slot buffer (at most ``2 * ceil(E / max_edges)`` slots, a size-only bound) and :func:`combine_kernel`
merges each hub's slots.

All heads in one program: one program per work item walks the row's edges once for every head: the CSR indices are
read once, each neighbour's H x C features come in as one [BLOCK_E, BLOCK_H, BLOCK_C] tile (contiguous for a
contiguous [rows, H, C] input), per-head scores are sums over the channel axis, and the online softmax keeps one
running max per head.

dtypes: float32, float16, bfloat16 inputs, every product and sum in float32; ``out`` in the half dtype when any input
is half precision (as the reference), ``lse`` float32. Runs on CUDA tensors, and on CPU tensors when
``TRITON_INTERPRET=1`` was set before import.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor.kernels.attention.csr_launch import ALL_HEADS_FORWARD_LAUNCH, all_heads_launch_config, \
    heads_variant, launch_config
from gnn_inductor.kernels.attention.csr_tiles import edge_scores, edge_tile, head_tile_scores, load_vector
from gnn_inductor.kernels.attention.layout import Layout, call_items, common_slots, out_dtype
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch
from gnn_inductor.kernels.runtime.rng import packed_dropped_triton
from gnn_inductor.plan.work_items import hub_item_count, items_memo, listed_fill_rows


@fast_launch
@triton.jit
def forward_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, slot_of_item_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale, f, fr, fh,
        out_ptr, lse_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
        num_heads, head_dim, slope, score_scale, message_scale, eps,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, F: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    item = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    shared = tl.load(item_shared_ptr + item)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    if KIND == 1:
        att = tl.load(q + h * qh + chans * qc, mask=cmask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_C], dtype=tl.float32)

    m = tl.max(tl.full([BLOCK_E], float("-inf"), tl.float32), axis=0)
    l_vec = tl.zeros([BLOCK_E], dtype=tl.float32)
    acc = tl.zeros([BLOCK_E, BLOCK_C], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        tile_mask = emask[:, None] & cmask[None, :]
        score, _terms, _query, _factor, _dot = edge_scores(
            KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2, q, qr, qh, qc, Q, att, f, fr, fh,
            F, src, dst, eid, h, chans, emask, tile_mask, slope, score_scale)
        score = tl.where(emask, score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=0))
        correction = tl.exp(m - m_new)
        p = tl.exp(score - m_new)
        l_vec = l_vec * correction + p
        weight = p * message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, h, num_heads, dropout_scale)
        value = load_vector(v0, V0, src, dst, eid, h, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += load_vector(v1, V1, src, dst, eid, h, v1r, v1h, v1c, chans, tile_mask)
        acc = acc * correction + weight[:, None] * value
        m = m_new

    total = tl.sum(l_vec, axis=0)
    acc_row = tl.sum(acc, axis=0)
    if shared == 0:
        out_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
        tl.store(out_ptr + out_offsets, acc_row / (total + eps), mask=cmask)
        tl.store(lse_ptr + row.to(tl.int64) * num_heads + h, m + tl.log(total))
    elif shared == 1:
        slot = tl.load(slot_of_item_ptr + item).to(tl.int64)
        tl.store(part_m_ptr + slot * num_heads + h, m)
        tl.store(part_l_ptr + slot * num_heads + h, total)
        tl.store(part_acc_ptr + (slot * num_heads + h) * head_dim + chans, acc_row, mask=cmask)


@fast_launch
@triton.jit
def combine_kernel(slot_row_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, lse_ptr, bias_ptr, num_slots,
                    num_heads, head_dim, eps, mass_ptr, part_mass_acc_ptr, part_mass_l_ptr, BIAS: tl.constexpr,
                    MASS: tl.constexpr, BLOCK_C: tl.constexpr):
    """Merge the partial (max, sum, acc) of a hub's items; the program of a hub's first slot does it. ``BIAS``: the
    ``[H, C]`` bias at ``bias_ptr`` is added to the stored row. ``MASS``: the partial sums of the score-term mass
    are merged alike and the row's mass stored (:func:`forward`)."""
    slot = tl.program_id(0)
    h = tl.program_id(1)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    row = tl.load(slot_row_ptr + slot)
    previous = tl.load(slot_row_ptr + tl.maximum(slot - 1, 0))
    if (row >= 0) & ((slot == 0) | (previous != row)):
        m = tl.load(part_m_ptr + slot * num_heads + h)
        total = tl.load(part_l_ptr + slot * num_heads + h)
        acc = tl.load(part_acc_ptr + (slot.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
        if MASS:
            mass_l = tl.load(part_mass_l_ptr + slot * num_heads + h)
            mass_acc = tl.load(part_mass_acc_ptr + (slot.to(tl.int64) * num_heads + h) * head_dim + chans,
                               mask=cmask, other=0)
        k = slot + 1
        same = tl.load(slot_row_ptr + k, mask=k < num_slots, other=-1) == row
        while same:
            m_k = tl.load(part_m_ptr + k * num_heads + h)
            l_k = tl.load(part_l_ptr + k * num_heads + h)
            acc_k = tl.load(part_acc_ptr + (k.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
            m_new = tl.maximum(m, m_k)
            scale_old, scale_k = tl.exp(m - m_new), tl.exp(m_k - m_new)
            total = total * scale_old + l_k * scale_k
            acc = acc * scale_old + acc_k * scale_k
            if MASS:
                mass_l = mass_l * scale_old + tl.load(part_mass_l_ptr + k * num_heads + h) * scale_k
                mass_acc = mass_acc * scale_old + scale_k * tl.load(
                    part_mass_acc_ptr + (k.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
            m = m_new
            k += 1
            same = tl.load(slot_row_ptr + k, mask=k < num_slots, other=-1) == row
        out_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
        result = acc / (total + eps)
        if MASS:
            tl.store(mass_ptr + out_offsets, (mass_acc - mass_l * result) / total, mask=cmask)
        if BIAS:
            result += tl.load(bias_ptr + h * head_dim + chans, mask=cmask, other=0).to(tl.float32)
        tl.store(out_ptr + out_offsets, result, mask=cmask)
        tl.store(lse_ptr + row.to(tl.int64) * num_heads + h, m + tl.log(total))


@fast_launch
@triton.jit
def forward_all_heads_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, slot_of_item_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale, f, fr, fh,
        out_ptr, lse_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
        num_heads, head_dim, slope, score_scale, message_scale, eps, bias_ptr,
        mass_ptr, part_mass_acc_ptr, part_mass_l_ptr,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, F: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        BIAS: tl.constexpr,
        MASS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """The all-heads forward of one work item (module docstring); ``BIAS``: the ``[H, C]`` bias at
    ``bias_ptr`` is added to a row this item stores (hub rows: by :func:`combine_kernel`). ``MASS`` (GAT only):
    the row's score-term mass (:func:`forward`'s ``mass``) is stored at ``mass_ptr`` too, hub items keeping its
    two partial sums next to their (max, sum, acc)."""
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
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)

    # padded heads (h >= num_heads) load zeros and get finite scores: no inf - inf, stores mask them out
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_tile = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    if MASS:
        mass_l = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
        mass_acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        score, terms, _query, _factor, _dot = head_tile_scores(
            KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2, q, qr, qh, qc, Q, att, f, fr, fh,
            F, src, dst, eid, head_row, head_tile, chans, score_mask, tile_mask, slope, score_scale)
        score = tl.where(emask[:, None], score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=0))
        correction = tl.exp(m - m_new)
        p = tl.exp(score - m_new[None, :])
        l_tile = l_tile * correction[None, :] + p
        weight = p * message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = load_vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += load_vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)
        acc = acc * correction[None, :, None] + weight[:, :, None] * value
        if MASS:  # the same sums, each edge's term scaled by LeakyReLU's slope where its pre-activation is negative
            factor = tl.where(terms > 0, 1.0, slope)
            mass_l = mass_l * correction[None, :] + p * factor
            mass_acc = mass_acc * correction[None, :, None] + (weight * factor)[:, :, None] * value
        m = m_new

    total = tl.sum(l_tile, axis=0)
    acc_rows = tl.sum(acc, axis=0)
    node_heads = row.to(tl.int64) * num_heads + heads
    if MASS:
        mass_l_rows = tl.sum(mass_l, axis=0)
        mass_acc_rows = tl.sum(mass_acc, axis=0)
    if shared == 0:
        result = acc_rows / (total[:, None] + eps)
        if MASS:
            mass = (mass_acc_rows - mass_l_rows[:, None] * result) / total[:, None]
            tl.store(mass_ptr + node_heads[:, None] * head_dim + chans[None, :], mass, mask=node_mask)
        if BIAS:
            result += tl.load(bias_ptr + heads[:, None] * head_dim + chans[None, :], mask=node_mask,
                              other=0).to(tl.float32)
        tl.store(out_ptr + node_heads[:, None] * head_dim + chans[None, :], result, mask=node_mask)
        tl.store(lse_ptr + node_heads, m + tl.log(total), mask=hmask)
    elif shared == 1:
        slot_heads = tl.load(slot_of_item_ptr + item).to(tl.int64) * num_heads + heads
        tl.store(part_m_ptr + slot_heads, m, mask=hmask)
        tl.store(part_l_ptr + slot_heads, total, mask=hmask)
        tl.store(part_acc_ptr + slot_heads[:, None] * head_dim + chans[None, :], acc_rows, mask=node_mask)
        if MASS:
            tl.store(part_mass_l_ptr + slot_heads, mass_l_rows, mask=hmask)
            tl.store(part_mass_acc_ptr + slot_heads[:, None] * head_dim + chans[None, :], mass_acc_rows,
                     mask=node_mask)


def _hub_slots(item_row: Tensor, item_shared: Tensor, num_slots: int) -> tuple:
    """``(slot_of_item, slot_row)``: each item's hub slot (-1 for an item that has its row alone) and each slot's
    row (-1 past the hub items), int32; structure of the items alone, kept with a plan's items (items_memo)."""
    is_shared = item_shared == 1
    rank = torch.cumsum(is_shared.to(torch.int32), 0) - 1
    slot_of_item = torch.where(is_shared, rank, -1).to(torch.int32)
    slot_row = torch.full((num_slots + 1,), -1, dtype=torch.int32, device=item_row.device)
    slot_row.scatter_(0, torch.where(is_shared, rank, num_slots).long(), item_row.to(torch.int32))
    return slot_of_item, slot_row[:num_slots]


def forward(layout: Layout, rowptr: Tensor, col: Tensor, perm: Tensor, eps: float, items=(), max_edges: int = 0,
            config: dict | None = None, variant: str | None = None, bias: Tensor | None = None,
            mass: bool = False) -> tuple:
    """``(out [N, H, C], lse [N, H] float32)`` of the fused forward (module docstring); ``variant`` picks
    the per-head or all-heads kernel (default: :func:`csr_launch.heads_variant`). With ``bias`` (``[H, C]``, the output's
    dtype) ``out`` is the attention output plus ``bias``: added by the all-heads kernel and the hub combine as they
    store a row, written into the rows without edges, or (per-head kernel, items without a known hub count) added
    to the whole output afterwards.

    ``mass`` (the GAT family, all-heads kernel): also return GAT's score-term mass, float32 ``[N, H, C]``,
    ``M_i = sum_j alpha_ij s'_ij (w_ij v_j - out_i)`` (``s'`` LeakyReLU's slope at the edge's pre-activation,
    ``w`` the message scale and dropout, ``out`` without bias). A dst-role score term's gradient is then
    ``score_scale * <dout_i, M_i>`` per head (:func:`csr_delta.delta`'s ``mass``), a row sum, where the backward would
    otherwise sum a term per edge over each destination's edges (``backward``'s segment form)."""
    form, heads, channels = layout.form, layout.heads, layout.channels
    all_heads = (variant or heads_variant()) == "all"
    if mass and (form.family != "gat" or not all_heads):
        raise ValueError(f"attention forward: the score-term mass is made by the all-heads GAT kernel, not for "
                         f"family {form.family!r} with the {'all-heads' if all_heads else 'per-head'} kernel")
    defaults = all_heads_launch_config(heads, channels, ALL_HEADS_FORWARD_LAUNCH[form.family]) if all_heads else \
        launch_config(form.family, channels)
    config = {**defaults, **(config or {})}
    (item_row, item_start, item_end, item_shared), max_edges = call_items(rowptr, col, items, max_edges)
    num_dst, device = rowptr.shape[0] - 1, rowptr.device
    # with a plan's own items (every row with edges has one: the item op remembered them, hub_item_count) each
    # such row is stored (light rows by their item, hub rows by the combine kernel) and only the rows without edges
    # are zeroed, no memset of the whole output; other items may cover some rows only (the hybrid path's CSR
    # part), whose other rows must stay 0
    hubs = hub_item_count((item_row, item_start, item_end, item_shared))
    allocate = torch.zeros if hubs is None else torch.empty
    out = allocate((num_dst, heads, channels), dtype=out_dtype(layout.args), device=device)
    lse = allocate((num_dst, heads), dtype=torch.float32, device=device)
    masses = allocate((num_dst, heads, channels), dtype=torch.float32, device=device) if mass else lse
    epilogue = bias is not None and all_heads and hubs is not None
    if epilogue:
        bias = bias.contiguous()
    if hubs is not None:
        empty = listed_fill_rows((item_row, item_start, item_end, item_shared))
        zero_rows_without_entries(out, rowptr, fill=bias if epilogue else None, rows=empty)
        zero_rows_without_entries(lse, rowptr, rows=empty)
        if mass:
            zero_rows_without_entries(masses, rowptr, rows=empty)

    # hub items keep partial results in compact slots, one per hub item: as many as the plan's items hold where
    # that is known (hub_item_count), else a size-only bound (no sync): rows with d > max_edges have
    # ceil(d / max_edges) < 2 d / max_edges items, so 2 * ceil(E / max_edges) slots always suffice. The combine
    # kernel is launched over the slots: over the bound, at 2^20 rows and 15M edges ~120k programs per head
    # that mostly end at once (a launch floor of a few tenths of a ms on the H100)
    num_slots = max(hubs, 1) if hubs is not None else 2 * cdiv(col.shape[0], max_edges) + 1
    slot_of_item, slot_row = items_memo((item_row, item_start, item_end, item_shared), ("hub_slots", num_slots),
                                        lambda: _hub_slots(item_row, item_shared, num_slots))
    part_m = torch.empty((num_slots, heads), dtype=torch.float32, device=device)
    part_l = torch.empty((num_slots, heads), dtype=torch.float32, device=device)
    part_acc = torch.empty((num_slots, heads, channels), dtype=torch.float32, device=device)
    part_mass_acc = torch.empty_like(part_acc) if mass else part_acc
    part_mass_l = torch.empty_like(part_l) if mass else part_l

    pointers, constexprs = common_slots(layout)
    if item_row.shape[0]:
        kernel_args = (item_row, item_start, item_end, item_shared, slot_of_item, col, perm, *pointers,
                       out, lse, part_m, part_l, part_acc, heads, channels, form.negative_slope, form.score_scale,
                       form.message_scale, eps)
        if all_heads:
            forward_all_heads_kernel[(item_row.shape[0],)](
                *kernel_args, bias if epilogue else lse, masses, part_mass_acc, part_mass_l, **constexprs,
                BIAS=epilogue, MASS=mass, BLOCK_E=config["block_e"], BLOCK_H=config["block_h"], BLOCK_C=config["block_c"],
                num_warps=config["num_warps"], **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {}))
        else:
            forward_kernel[(item_row.shape[0], heads)](
                *kernel_args, **constexprs, BLOCK_E=config["block_e"], BLOCK_C=config["block_c"],
                num_warps=config["num_warps"])
        combine_kernel[(num_slots, heads)](slot_row, part_m, part_l, part_acc, out, lse, bias if epilogue else lse,
                                            num_slots, heads, channels, eps, masses, part_mass_acc, part_mass_l,
                                            BIAS=epilogue, MASS=mass, BLOCK_C=config["block_c"], num_warps=1)
    if bias is not None and not epilogue:
        out.add_(bias)
    return (out, lse, masses) if mass else (out, lse)
