"""Segment matmul in two Triton kernels: every segment's product (and its weight gradient) in one launch, where the
op's loop (kernels/dense/segment.py) launches a GEMM per segment and reads the bounds on the host.

HGTConv multiplies its keys and values by a map per (head, relation): 28 segments per map on an ogbn-mag-shaped graph
with 4 heads, so a training step of two layers runs 336 GEMMs of ``[rows, 16] x [16, 16]`` through the loop, each
launched from Python. On mini-batches of 1024 seeds of that graph the kernels took the step from 21.22 to 13.05 ms
(H200; docs/dense.md).

- :func:`segment_mm`: ``out[r] = x[r] @ weight[s]`` for the rows ``r`` of segment ``s`` (``type_ptr[s]`` to
  ``type_ptr[s + 1]``). A program takes ``BLOCK_M`` rows and ``BLOCK_N`` output columns and runs one tile product per
  segment its rows meet (the segments of its first and last row, found in a vector compare with the bounds).
- :func:`segment_weight_grad`: ``grad_w[s] = x[rows of s].T @ grad[rows of s]``. A program takes ``BLOCK_M`` rows
  and one ``BLOCK_K x BLOCK_N`` tile of the gradient, and adds each segment's partial product into it atomically,
  in float32 (the sum's order varies between runs, within float32's rounding).

Rows after ``type_ptr[-1]`` are in no segment and left as they are, as by the loop; bounds past the last row
address no row. Float32 products are IEEE unless
TF32 is allowed (``torch.backends.cuda.matmul.allow_tf32``, what ``torch.mm`` follows); half precision accumulates
in float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor.kernels.runtime.launch import cdiv, dot_precision, fast_launch, next_power_of_2

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (BLOCK_M, largest BLOCK_N, largest BLOCK_K, warps) of each kernel: first choices, not tuned on a GPU yet
FORWARD_LAUNCH = (64, 64, 32, 4)
WEIGHT_GRAD_LAUNCH = (128, 64, 64, 4)


@triton.jit
def _block_rows(ptr_ptr, M, S, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    """This program's ``BLOCK_M`` rows and the first and last segment they meet (how many segments end at or before
    its first and last row)."""
    first = tl.program_id(0).to(tl.int64) * BLOCK_M
    last = tl.minimum(first + BLOCK_M, M) - 1
    segments = tl.arange(0, BLOCK_S)
    ends = tl.load(ptr_ptr + 1 + segments, mask=segments < S, other=first + last + 1).to(tl.int64)
    lo = tl.sum((ends <= first).to(tl.int32), axis=0)
    hi = tl.minimum(tl.sum((ends <= last).to(tl.int32), axis=0), S - 1)
    return first + tl.arange(0, BLOCK_M), lo, hi


@triton.jit
def _in_segment(ptr_ptr, s, rows, M):
    """Which of ``rows`` segment ``s`` holds (none past the last row)."""
    start = tl.load(ptr_ptr + s).to(tl.int64)
    end = tl.load(ptr_ptr + s + 1).to(tl.int64)
    return (rows >= start) & (rows < end) & (rows < M)


@fast_launch
@triton.jit
def _segment_mm_kernel(x_ptr, ptr_ptr, w_ptr, out_ptr, M, K, N, S,
                       stride_xm, stride_xk, stride_ws, stride_wk, stride_wn, stride_om, stride_on,
                       PRECISION: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    rows, lo, hi = _block_rows(ptr_ptr, M, S, BLOCK_M, BLOCK_S)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    for s in range(lo, hi + 1):
        in_segment = _in_segment(ptr_ptr, s, rows, M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                        mask=in_segment[:, None] & (ks[None, :] < K), other=0.0)
            b = tl.load(w_ptr + s * stride_ws + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                        mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc += tl.dot(a, b, input_precision=PRECISION)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=in_segment[:, None] & (cols[None, :] < N))


@fast_launch
@triton.jit
def _segment_weight_grad_kernel(x_ptr, ptr_ptr, g_ptr, out_ptr, M, K, N, S,
                                stride_xm, stride_xk, stride_gm, stride_gn, stride_os, stride_ok, stride_on,
                                PRECISION: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows, lo, hi = _block_rows(ptr_ptr, M, S, BLOCK_M, BLOCK_S)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    for s in range(lo, hi + 1):
        in_segment = _in_segment(ptr_ptr, s, rows, M)
        a = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=in_segment[:, None] & (ks[None, :] < K), other=0.0)
        b = tl.load(g_ptr + rows[:, None] * stride_gm + cols[None, :] * stride_gn,
                    mask=in_segment[:, None] & (cols[None, :] < N), other=0.0)
        part = tl.dot(tl.trans(a), b, input_precision=PRECISION)
        tl.atomic_add(out_ptr + s * stride_os + ks[:, None] * stride_ok + cols[None, :] * stride_on, part,
                      mask=(ks[:, None] < K) & (cols[None, :] < N))


def _bounds_on(type_ptr: Tensor, device: torch.device) -> Tensor:
    """``type_ptr`` where the kernels read it: a copy of a few integers when it is on the host (HGTConv builds its
    type vector there), issued without waiting for the GPU (a blocking copy to CUDA synchronises the stream; from
    pageable memory the driver stages the bytes before the call returns)."""
    return type_ptr if type_ptr.device == device else type_ptr.to(device, non_blocking=True)


def _block(size: int, largest: int) -> int:
    return min(largest, max(16, next_power_of_2(size)))  # tl.dot's operands are at least 16 wide


def segment_mm(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
    """``x [M, K]`` by segments times ``weight [S, K, N]`` (``S = type_ptr.numel() - 1``), as ``[M, N]``."""
    m, k = x.shape
    n, segments = weight.shape[-1], type_ptr.numel() - 1
    out = x.new_empty(m, n)
    if m == 0 or n == 0 or segments <= 0:
        return out
    block_m, largest_n, largest_k, warps = FORWARD_LAUNCH
    block_n, block_k = _block(n, largest_n), _block(k, largest_k)
    _segment_mm_kernel[(cdiv(m, block_m), cdiv(n, block_n))](
        x, _bounds_on(type_ptr, x.device), weight, out, m, k, n, segments,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), weight.stride(2), out.stride(0), out.stride(1),
        PRECISION=dot_precision(torch.backends.cuda.matmul.allow_tf32, x.dtype),
        BLOCK_S=max(2, next_power_of_2(segments)), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps)
    return out


def segment_weight_grad(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
    """Per segment ``x[rows].T @ grad[rows]``, as ``[types, K, N]`` in ``x``'s dtype (zero for an empty segment)."""
    m, k = x.shape
    n, segments = grad.shape[1], type_ptr.numel() - 1
    out = torch.zeros(types, k, n, dtype=torch.float32, device=x.device)
    if m and k and n and segments > 0:
        block_m, largest_n, largest_k, warps = WEIGHT_GRAD_LAUNCH
        block_n, block_k = _block(n, largest_n), _block(k, largest_k)
        _segment_weight_grad_kernel[(cdiv(m, block_m), cdiv(k, block_k), cdiv(n, block_n))](
            x, _bounds_on(type_ptr, x.device), grad, out, m, k, n, segments,
            x.stride(0), x.stride(1), grad.stride(0), grad.stride(1), out.stride(0), out.stride(1), out.stride(2),
            PRECISION=dot_precision(torch.backends.cuda.matmul.allow_tf32, x.dtype),
            BLOCK_S=max(2, next_power_of_2(segments)), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps)
    return out if x.dtype == torch.float32 else out.to(x.dtype)
