r"""Edge softmax: PyG's ``softmax(src, index)`` over each destination's incoming edges.

.. math::
    \alpha_e = \frac{\exp(s_e - m_i)}{\sum_{e' \to i} \exp(s_{e'} - m_i) + \varepsilon},
    \qquad m_i = \max_{e' \to i} s_{e'} \ \text{(no gradient, as PyG's ``src.detach()``)}

Shapes: ``scores [E, *H]`` in original edge order, output the same. ``eps`` is PyG's ``1e-16``
taken from the matched graph. Backward: ``ds = alpha * (g - sum_{e' -> i} g_{e'} alpha_{e'})``.
"""
from __future__ import annotations

import torch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results, fresh_like

from gnn_inductor.kernels.runtime.reference import in_float32, recompute_grads, segment_reduce


def softmax_csr(scores: Tensor, row: Tensor, rowptr: Tensor, eps: float) -> Tensor:
    """Edge softmax of CSR-ordered scores (the shared core of this op and of attention)."""
    top = segment_reduce(scores.detach(), row, rowptr, "max")
    exp = (scores - top.index_select(0, row)).exp()
    total = segment_reduce(exp, row, rowptr, "sum") + eps
    return exp / total.index_select(0, row)


def edge_softmax_reference(scores: Tensor, rowptr: Tensor, row: Tensor, perm: Tensor, eps: float) -> Tensor:
    (scores32,), half = in_float32([scores])
    perm = perm.long()  # index_copy takes int64 indices only on CUDA
    alpha = softmax_csr(scores32.index_select(0, perm), row, rowptr, eps)
    out = torch.zeros_like(alpha).index_copy(0, perm, alpha)
    return out if half is None else out.to(half)


def _check(scores: Tensor, perm: Tensor) -> None:
    if scores.dim() == 0 or scores.shape[0] != perm.shape[0]:
        raise ValueError(f"scores must have {perm.shape[0]} rows (one per edge), got shape {tuple(scores.shape)}")


KERNEL = {"cuda": "reference (torch segment ops)", "cpu": "segment reference"}


@torch.library.custom_op("gnn_io::edge_softmax", mutates_args=())
@contiguous_results
def edge_softmax(scores: Tensor, rowptr: Tensor, row: Tensor, perm: Tensor, eps: float) -> Tensor:
    _check(scores, perm)
    return edge_softmax_reference(scores, rowptr, row, perm, eps)


@edge_softmax.register_fake
def _(scores, rowptr, row, perm, eps):
    return fresh_like(scores)


@torch.library.custom_op("gnn_io::edge_softmax_backward", mutates_args=())
@contiguous_results
def edge_softmax_backward(grad_out: Tensor, scores: Tensor, rowptr: Tensor, row: Tensor, perm: Tensor,
                          eps: float) -> Tensor:
    (grad,) = recompute_grads(lambda s: edge_softmax_reference(s, rowptr, row, perm, eps), [scores], grad_out, [True])
    return grad


@edge_softmax_backward.register_fake
def _(grad_out, scores, rowptr, row, perm, eps):
    return fresh_like(scores)


def _setup(ctx, inputs, output):
    scores, rowptr, row, perm, eps = inputs
    ctx.save_for_backward(scores, rowptr, row, perm)
    ctx.eps = eps


def _backward(ctx, grad_out):
    scores, rowptr, row, perm = ctx.saved_tensors
    return edge_softmax_backward(grad_out, scores, rowptr, row, perm, ctx.eps), None, None, None, None


edge_softmax.register_autograd(_backward, setup_context=_setup)
