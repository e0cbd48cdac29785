"""The memory layout of every ``gnn_io`` op's outputs: contiguous, in the real and the fake implementation alike.

Inductor allocates and checks an extern op's outputs from its fake (shape) implementation: a compiled graph
asserts each output's sizes and strides (``assert_size_stride``) and lays out its consumers from them. A fake
implementation written ``torch.empty_like(x)`` keeps ``x``'s strides (a transposed ``x`` gives a transposed
gradient), while the kernels and CPU references return fresh contiguous tensors: the compiled backward of a layer
called on ``x = x_base.t()`` then failed that assertion. So the rule for every op is one layout, whatever the
inputs' layout: the fake implementations build their outputs with :func:`fresh_like` (or ``new_empty`` of a
shape), and the real implementations are wrapped in :func:`contiguous_results`, which makes any output a path
left strided (a gradient recomputed by autograd follows its input's layout) contiguous.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor


def fresh_like(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """An uninitialised contiguous tensor of ``t``'s shape, device and (unless given) dtype; unlike
    ``torch.empty_like`` it never copies ``t``'s strides."""
    return t.new_empty(t.shape, dtype=dtype or t.dtype)


def _contiguous(value):
    if isinstance(value, Tensor):
        return value if value.is_contiguous() else value.contiguous()
    if isinstance(value, (list, tuple)):
        return type(value)(_contiguous(v) for v in value)
    return value


def contiguous_results(fn):
    """``fn`` with every tensor it returns (alone, in a tuple or in a list) made contiguous; placed under
    ``@torch.library.custom_op`` so the op's schema still comes from ``fn``'s signature."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _contiguous(fn(*args, **kwargs))

    return wrapper
