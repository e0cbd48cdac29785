"""A fingerprint of a graph's structure tensors, so that a cached graph plan is only reused for the graph it was
built from.

The plan cache (``gnn_inductor/plan/cache.py``) keys a plan by the identity and version counter of ``edge_index`` (and
the other structure tensors). The version counter misses writes that bypass autograd's bookkeeping: through
``tensor.data``, ``tensor.numpy()``, DLPack or another library's kernels. The fingerprint catches those: it is
computed when a plan is built and again at each reuse, and a different value rebuilds the plan.

On the CPU it is XXH3-128 of the tensor's bytes (the ``xxhash`` package, about 10 GB/s on one core here). On CUDA,
where the bytes should not travel to the host, it is one pass of a Triton kernel over the bytes read as 32-bit
words ``w_i`` (8- and 4-byte elements reinterpreted, 1- and 2-byte elements widened), for two odd constants ``k``::

    fingerprint_k = sum_i mix(w_i xor (i * k) mod 2^32)  mod 2^64,    mix = MurmurHash3's 32-bit finaliser

``mix`` is a bijection of 32-bit words, so a change of any one word always changes both sums; several changes
cancel in both only by chance (about 2^-64). Position enters each term, so swapping two edges changes it too.
The kernel writes per-block partial sums, summed by one more launch, and nothing waits for the device: the plan
cache compares two fingerprints with one sync.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
import xxhash
from torch import Tensor

KEYS = (0x9E3779B1, 0x7F4A7C15)
BLOCK = 4096


def words(t: Tensor) -> Tensor:
    """``t``'s elements as a flat int32 tensor of 32-bit words (a view where ``t`` is contiguous and its elements
    are 4 or 8 bytes wide; a strided ``t`` is copied first)."""
    flat = t.detach().reshape(-1).contiguous()  # a strided 1-D view stays strided through reshape
    if t.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if flat.element_size() >= 4:
        return flat.view(torch.int32)
    if flat.element_size() == 2:
        flat = flat.view(torch.int16)
    return flat.to(torch.int32)


@triton.jit
def _mix(x):
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _fingerprint_kernel(words_ptr, n, partial_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    w = tl.load(words_ptr + offsets, mask=mask, other=0).to(tl.uint32, bitcast=True)
    position = offsets.to(tl.uint32)
    a = tl.where(mask, _mix(w ^ (position * 0x9E3779B1)), 0).to(tl.int64)
    b = tl.where(mask, _mix(w ^ (position * 0x7F4A7C15)), 0).to(tl.int64)
    tl.store(partial_ptr + 2 * pid, tl.sum(a, axis=0))
    tl.store(partial_ptr + 2 * pid + 1, tl.sum(b, axis=0))


def _fingerprint_cpu(t: Tensor) -> Tensor:
    # the bytes of any dtype (NumPy has no bfloat16); a strided 1-D view stays strided through reshape
    raw = t.detach().reshape(-1).contiguous().view(torch.uint8)
    digest = xxhash.xxh3_128(memoryview(raw.numpy())).intdigest()
    halves = np.array([digest & (2**64 - 1), digest >> 64], dtype=np.uint64).view(np.int64)
    return torch.from_numpy(halves)


def fingerprint(t: Tensor, use_kernel: bool | None = None) -> Tensor:
    """``t``'s fingerprint as an int64 tensor ``[2]`` on its device (the module docstring), computed without a host
    sync on CUDA. ``use_kernel``: the Triton kernel's sums (default: on CUDA tensors; on CPU tensors under Triton's
    interpreter, for its tests), else XXH3-128 of the bytes (CPU tensors)."""
    if use_kernel is None:
        use_kernel = t.is_cuda
    if not use_kernel:
        return _fingerprint_cpu(t)
    w = words(t)
    n = w.numel()
    blocks = max(1, triton.cdiv(n, BLOCK))
    partial = torch.empty((blocks, 2), dtype=torch.int64, device=w.device)
    _fingerprint_kernel[(blocks,)](w, n, partial, BLOCK=BLOCK, num_warps=8)
    return partial.sum(0)


def fingerprints(tensors: list) -> Tensor | None:
    """The fingerprints of ``tensors`` (one ``[2]`` row each, stacked on the first tensor's device); None without
    tensors."""
    if not tensors:
        return None
    device = tensors[0].device
    return torch.stack([fingerprint(t).to(device) for t in tensors])
