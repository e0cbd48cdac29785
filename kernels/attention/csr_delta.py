"""``D = <dout, out>`` per (row, head) of an attention output: the softmax Jacobian's row term (FlashAttention's
delta) every backward variant reads, with the bias subtracted, GAT's dst score-term gradient from the forward's
mass and the bias gradient made from the same read of ``dout`` where asked (``gnn_io::attention_delta``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2


@fast_launch
@triton.jit
def delta_kernel(grad_out_ptr, out_ptr, bias_ptr, delta_ptr, mass_ptr, mass_grad_ptr, mass_scale, part_ptr, num_rows,
                  num_heads, head_dim, BIAS: tl.constexpr, MASS: tl.constexpr, BIAS_GRAD: tl.constexpr,
                  HEADS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """``delta[r] = sum_c grad_out[r, c] * out[r, c]`` over the (node, head) rows ``r`` of ``[N * H, C]``; with
    ``BIAS``, ``out`` is the biased output and the ``[H, C]`` bias at ``bias_ptr`` is subtracted first (no
    ``out - bias`` tensor: 0.45 ms per ``[2^20, 128]`` float32 step on the H100)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    chans = tl.arange(0, BLOCK_C)
    rmask = rows < num_rows
    mask = rmask[:, None] & (chans < head_dim)[None, :]
    offsets = rows.to(tl.int64)[:, None] * head_dim + chans[None, :]
    grad = tl.load(grad_out_ptr + offsets, mask=mask, other=0).to(tl.float32)
    out = tl.load(out_ptr + offsets, mask=mask, other=0).to(tl.float32)
    if BIAS:
        heads = rows % num_heads
        out -= tl.load(bias_ptr + heads[:, None] * head_dim + chans[None, :], mask=mask, other=0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(grad * out, axis=1), mask=rmask)
    if MASS:  # a dst-role GAT score term's gradient from the forward's mass (forward's ``mass``)
        mass = tl.load(mass_ptr + offsets, mask=mask, other=0)
        tl.store(mass_grad_ptr + rows, tl.sum(grad * mass, axis=1) * mass_scale, mask=rmask)
    if BIAS_GRAD:  # this block's column sums of dout per head (BLOCK_R is a multiple of HEADS: row r is head r % H)
        part = tl.sum(tl.reshape(grad, (BLOCK_R // HEADS, HEADS, BLOCK_C)), axis=0)
        heads = tl.arange(0, HEADS)
        tl.store(part_ptr + (tl.program_id(0) * HEADS + heads[:, None]).to(tl.int64) * head_dim + chans[None, :], part,
                 mask=(chans < head_dim)[None, :])


def delta(grad_out: Tensor, out: Tensor, bias: Tensor | None = None, mass: Tensor | None = None,
          score_scale: float = 1.0):
    """``D`` (and with ``mass``, ``(D, dst-term gradient)``): :func:`delta_parts`' without the bias gradient."""
    delta, mass_grad, _ = delta_parts(grad_out, out, bias, mass, score_scale)
    return delta if mass is None else (delta, mass_grad)


def delta_parts(grad_out: Tensor, out: Tensor, bias: Tensor | None = None, mass: Tensor | None = None,
                score_scale: float = 1.0, bias_grad: bool = False) -> tuple:
    """``D = <dout, out>`` over channels, float32 ``[N, H]``, from ``[N, H, C]`` tensors (one kernel, each read
    once); with ``bias`` (``[H, C]`` or its flat view), ``D = <dout, out - bias>``, the bias subtracted in the
    kernel (no ``out - bias`` tensor). With ``mass`` (:func:`csr_forward.forward`'s, float32 ``[N, H, C]``) returns
    ``score_scale * <dout, mass>`` too: GAT's dst-role score-term gradient, from the same read of ``dout``. With
    ``bias_grad``, also ``dout``'s column sum, float32 ``[H, C]`` (the bias gradient): each program stores its
    rows' sums, then those are summed (one read of ``dout`` less than a separate reduction: 512 MiB at
    ``[2^20, 128]`` float32), where a program's rows start at a head boundary (its row count a multiple of ``H``);
    else None. Returns ``(D, dst-term gradient or None, bias gradient or None)``."""
    grad_out, out = grad_out.contiguous(), out.contiguous()
    num_dst, heads, channels = out.shape
    block_c = max(16, next_power_of_2(channels))
    delta = torch.empty((num_dst, heads), dtype=torch.float32, device=out.device)
    mass_grad = None if mass is None else torch.empty_like(delta)
    if mass is not None and (tuple(mass.shape) != tuple(out.shape) or mass.dtype != torch.float32):
        raise ValueError(f"attention delta: a mass of shape {tuple(mass.shape)} ({mass.dtype}) for an output of "
                         f"shape {tuple(out.shape)} (float32 expected)")
    block_r = max(1, 2048 // block_c)
    programs = cdiv(delta.numel(), block_r)
    summed = bias_grad and delta.numel() > 0 and block_r % heads == 0 and heads == next_power_of_2(heads)
    parts = torch.empty((programs, heads, channels), dtype=torch.float32, device=out.device) if summed else delta
    if delta.numel():
        delta_kernel[(programs,)](
            grad_out, out, out if bias is None else bias.contiguous(), delta,
            delta if mass is None else mass.contiguous(), delta if mass_grad is None else mass_grad,
            float(score_scale), parts, delta.numel(), heads, channels, BIAS=bias is not None, MASS=mass is not None,
            BIAS_GRAD=summed, HEADS=heads if summed else 1, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return delta, mass_grad, (parts.sum(0) if summed else None)
