"""The Triton helpers the fused CSR attention kernels share: loads of an argument's rows by role, the edge tile of
a CSR row, and the scores of a tile (one head, or every head at once on shaped indices).

Roles: 0 src, 1 dst, 2 edge (the argument is read at the edge's source, destination or edge id). A score's terms
and the dot query are loaded as ``[BLOCK_E]`` scalars (GAT) or ``[BLOCK_E, BLOCK_C]`` tiles; the all-heads forms
pass edge rows as ``[BLOCK_E, 1]`` and heads as ``[1, BLOCK_H]`` (per-head scalars) or ``[1, BLOCK_H, 1]``
(per-channel vectors), which broadcast to ``[BLOCK_E, BLOCK_H]`` and ``[BLOCK_E, BLOCK_H, BLOCK_C]`` tiles.

The dot family's per-edge score factor (``F`` its role, -1 without one; kernels/attention/forms.py) is loaded as a
per-head scalar and multiplies the score; the score functions return it and the unscaled dot product, from which
the backward kernels make its gradient.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def edge_rows(ROLE: tl.constexpr, src, dst, eid):
    if ROLE == 0:
        rows = src
    elif ROLE == 1:
        rows = dst
    else:
        rows = eid
    return rows.to(tl.int64)


@triton.jit
def load_scalar(ptr, ROLE: tl.constexpr, src, dst, eid, h, stride_r, stride_h, mask):
    rows = edge_rows(ROLE, src, dst, eid)
    return tl.load(ptr + rows * stride_r + h * stride_h, mask=mask, other=0).to(tl.float32)


@triton.jit
def load_vector(ptr, ROLE: tl.constexpr, src, dst, eid, h, stride_r, stride_h, stride_c, chans, mask):
    rows = edge_rows(ROLE, src, dst, eid)
    offsets = rows[:, None] * stride_r + h * stride_h + chans[None, :] * stride_c
    return tl.load(ptr + offsets, mask=mask, other=0).to(tl.float32)


@triton.jit
def scalar_terms(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0: tl.constexpr, S1: tl.constexpr,
                  S2: tl.constexpr, src, dst, eid, h, mask):
    total = load_scalar(s0, S0, src, dst, eid, h, s0r, s0h, mask)
    if S1 >= 0:
        total += load_scalar(s1, S1, src, dst, eid, h, s1r, s1h, mask)
    if S2 >= 0:
        total += load_scalar(s2, S2, src, dst, eid, h, s2r, s2h, mask)
    return total


@triton.jit
def vector_terms(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0: tl.constexpr, S1: tl.constexpr,
                  S2: tl.constexpr, src, dst, eid, h, chans, mask):
    total = load_vector(s0, S0, src, dst, eid, h, s0r, s0h, s0c, chans, mask)
    if S1 >= 0:
        total += load_vector(s1, S1, src, dst, eid, h, s1r, s1h, s1c, chans, mask)
    if S2 >= 0:
        total += load_vector(s2, S2, src, dst, eid, h, s2r, s2h, s2c, chans, mask)
    return total


@triton.jit
def edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID: tl.constexpr, BLOCK_E: tl.constexpr):
    edges = block_start + tl.arange(0, BLOCK_E)
    emask = edges < end
    src = tl.load(col_ptr + edges, mask=emask, other=0)
    if NEED_EID:
        eid = tl.load(perm_ptr + edges, mask=emask, other=0)
    else:
        eid = edges
    dst = tl.zeros_like(src) + row
    return emask, src, dst, eid


@triton.jit
def edge_scores(KIND: tl.constexpr, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c,
           S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, q, qr, qh, qc, Q: tl.constexpr, att,
           f, fr, fh, F: tl.constexpr, src, dst, eid, h, chans, emask, tile_mask, slope, scale):
    """(score [BLOCK_E], pre-activation terms, query tile, score factor, unscaled dot product): what backward needs
    to differentiate. The factor and the dot product are the score's stand-ins where the form has no factor."""
    if KIND == 0:
        terms = scalar_terms(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0, S1, S2, src, dst, eid, h, emask)
        score = tl.where(terms > 0, terms, terms * slope) * scale
        query = terms  # unused
        factor, dot = score, score  # unused
    else:
        terms = vector_terms(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                              src, dst, eid, h, chans, tile_mask)
        if KIND == 1:
            query = terms  # unused
            score = tl.sum(tl.where(terms > 0, terms, terms * slope) * att[None, :], axis=1) * scale
            factor, dot = score, score  # unused
        else:
            query = load_vector(q, Q, src, dst, eid, h, qr, qh, qc, chans, tile_mask)
            dot = tl.sum(query * terms, axis=1)
            if F >= 0:
                factor = load_scalar(f, F, src, dst, eid, h, fr, fh, emask)
                score = dot * factor * scale
            else:
                factor = dot  # unused
                score = dot * scale
    return score, terms, query, factor, dot


@triton.jit
def head_tile_scores(KIND: tl.constexpr, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c,
                 S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, q, qr, qh, qc, Q: tl.constexpr, att,
                 f, fr, fh, F: tl.constexpr, src, dst, eid, head_row, head_tile, chans, score_mask, tile_mask, slope,
                 scale):
    """(scores ``[BLOCK_E, BLOCK_H]`` of every head, pre-activation terms, query tile, score factor, unscaled dot
    product), as :func:`edge_scores`; ``src``/``dst``/``eid`` are ``[BLOCK_E, 1]``."""
    if KIND == 0:
        terms = scalar_terms(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0, S1, S2, src, dst, eid, head_row,
                              score_mask)
        score = tl.where(terms > 0, terms, terms * slope) * scale
        query = terms  # unused
        factor, dot = score, score  # unused
    else:
        terms = vector_terms(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                              src, dst, eid, head_tile, chans, tile_mask)
        if KIND == 1:
            query = terms  # unused
            score = tl.sum(tl.where(terms > 0, terms, terms * slope) * att[None, :, :], axis=2) * scale
            factor, dot = score, score  # unused
        else:
            query = load_vector(q, Q, src, dst, eid, head_tile, qr, qh, qc, chans, tile_mask)
            dot = tl.sum(query * terms, axis=2)
            if F >= 0:
                factor = load_scalar(f, F, src, dst, eid, head_row, fr, fh, score_mask)
                score = dot * factor * scale
            else:
                factor = dot  # unused
                score = dot * scale
    return score, terms, query, factor, dot
