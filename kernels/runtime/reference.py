"""The CPU reference path shared by the kernel families: segment reductions, float32 evaluation of half-precision
inputs, accumulation dtypes, and the recompute backward of the fused ops."""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor

_HALF = (torch.float16, torch.bfloat16)


def in_float32(args: list):
    """Half-precision tensors of ``args`` as float32 (the ops accumulate in float32), and the dtype
    to cast the result back to (None when nothing was half precision)."""
    half = next((a.dtype for a in args if isinstance(a, Tensor) and a.dtype in _HALF), None)
    if half is None:
        return list(args), None
    return [a.float() if isinstance(a, Tensor) and a.dtype in _HALF else a for a in args], half


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over many elements of ``dtype`` accumulate in: float64 for float64 (its inputs are exact to
    1e-16 and a float32 sum would cut them to 1e-7), float32 for everything else (half precision included)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# rows per first-stage chunk of :func:`column_sum` (below twice this a single reduction runs)
COLUMN_SUM_CHUNKS = 256


def column_sum(t: Tensor) -> Tensor:
    """``t.sum(0)`` accumulated in :func:`accumulation_dtype` (a bias gradient over every node), in two stages: the
    rows cut into :data:`COLUMN_SUM_CHUNKS` slabs summed in parallel, then the slabs' sums. ATen's single reduction over the
    outer dimension of a ``[2^20, 128]`` tensor ran at 0.31 ms (float32) and 0.25 ms (bf16) on an H200 against
    0.15 and 0.09 for the two stages (each timed alone), with a smaller error than either ATen's
    reduction or a cuBLAS GEMV against ones. Returns the accumulation dtype, shape ``t.shape[1:]``."""
    rows, acc = t.shape[0], accumulation_dtype(t.dtype)
    if rows < 2 * COLUMN_SUM_CHUNKS:
        return t.sum(0, dtype=acc)
    flat = t.reshape(rows, -1)
    per_chunk = rows // COLUMN_SUM_CHUNKS
    main = COLUMN_SUM_CHUNKS * per_chunk
    total = flat[:main].view(COLUMN_SUM_CHUNKS, per_chunk, -1).sum(1, dtype=acc).sum(0)
    if main < rows:
        total = total + flat[main:].sum(0, dtype=acc)
    return total.view(t.shape[1:])


def segment_reduce(messages: Tensor, row, rowptr: Tensor, reduce: str) -> Tensor:
    """``out[i] = reduce(messages[rowptr[i]:rowptr[i+1]])``; empty rows give 0, as PyG's scatter.

    Ties of max/min share the gradient equally, which is what ``scatter_reduce`` (PyG eager) does.
    """
    num_dst = rowptr.numel() - 1
    if reduce in ("sum", "mean"):
        out = torch.segment_reduce(messages, "sum", offsets=rowptr.long(), axis=0, initial=0)
        if reduce == "mean":
            deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(messages.dtype)
            out = out / deg.view(-1, *([1] * (messages.dim() - 1)))
        return out
    index = row.long().view(-1, *([1] * (messages.dim() - 1))).expand_as(messages)
    base = messages.new_zeros((num_dst, *messages.shape[1:]))
    return base.scatter_reduce(0, index, messages, reduce="a" + reduce, include_self=False)


@contextlib.contextmanager
def autograd_dispatch():
    """Custom-op implementations run with the autograd dispatch keys excluded; the recompute
    backward needs them back for the duration of its own differentiation."""
    keys = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther)
    before = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in keys]
    try:
        for k in keys:
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)
        yield
    finally:
        for k, excluded in zip(keys, before):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, excluded)


def recompute_grads(reference, args: list, grad_out: Tensor, needs_grad: list) -> list:
    """Gradients of ``reference(*args)`` with respect to the arguments flagged in ``needs_grad``.

    CPU backward of the fused ops: recompute the forward with autograd on and differentiate it.
    Arguments that are not floating point or not flagged get ``None``.
    """
    leaves = []
    for a, need in zip(args, needs_grad):
        if isinstance(a, Tensor) and need and a.is_floating_point():
            leaves.append(a.detach().requires_grad_(True))
        else:
            leaves.append(a)
    wanted = [leaf for leaf, need in zip(leaves, needs_grad) if isinstance(leaf, Tensor) and leaf.requires_grad]
    if not wanted:
        return [None] * len(args)
    with torch.enable_grad(), autograd_dispatch():
        out = reference(*leaves)
        grads = torch.autograd.grad(out, wanted, grad_out, allow_unused=True)
    it = iter(grads)
    result = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.requires_grad:
            g = next(it)
            result.append(torch.zeros_like(leaf) if g is None else g)
        else:
            result.append(None)
    return result


