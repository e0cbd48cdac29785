r"""SpMM family: ``out = A X`` for the sparse (optionally weighted, mean-normalised) adjacency.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} w_e \, x_j, \qquad \oplus \in \{\sum, \mathrm{mean}\}

Shapes: ``x [num_src, *F]``, ``edge_weight [E]`` or ``None`` (all ones), output ``[num_dst, *F]``
with ``num_dst = rowptr.numel() - 1``. dtype: that of ``x``; the CPU path is exact up to summation
order. Covers GCNConv, GraphConv (add/mean), SAGEConv (mean/sum), GINConv and any weighted copy.
Backward: ``dX = A^T dY`` and, when the weights need it, ``dw_e = <dY_i, x_j>`` (an SDDMM).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from gnn_inductor.kernels._common import check_reduce, recompute_grads, segment_reduce


def spmm_reference(x: Tensor, edge_weight: Optional[Tensor], rowptr: Tensor, col: Tensor, row: Tensor,
                   perm: Tensor, reduce: str) -> Tensor:
    messages = x.index_select(0, col)
    if edge_weight is not None:
        weight = edge_weight.index_select(0, perm).to(messages.dtype)
        messages = messages * weight.view(-1, *([1] * (messages.dim() - 1)))
    return segment_reduce(messages, row, rowptr, reduce)


def _check(x: Tensor, edge_weight: Optional[Tensor], col: Tensor, reduce: str) -> None:
    check_reduce(reduce)
    if reduce not in ("sum", "mean"):
        raise ValueError(f"spmm supports reduce 'sum' and 'mean', got {reduce!r}")
    if edge_weight is not None and (edge_weight.dim() != 1 or edge_weight.shape[0] != col.shape[0]):
        raise ValueError(f"edge_weight must have shape [{col.shape[0]}], got {tuple(edge_weight.shape)}")


@torch.library.custom_op("gnn_io::spmm", mutates_args=())
def spmm(x: Tensor, edge_weight: Optional[Tensor], rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
         reduce: str) -> Tensor:
    _check(x, edge_weight, col, reduce)
    return spmm_reference(x, edge_weight, rowptr, col, row, perm, reduce)


@spmm.register_fake
def _(x, edge_weight, rowptr, col, row, perm, reduce):
    return x.new_empty((rowptr.shape[0] - 1, *x.shape[1:]))


@torch.library.custom_op("gnn_io::spmm_backward", mutates_args=())
def spmm_backward(grad_out: Tensor, x: Tensor, edge_weight: Optional[Tensor], rowptr: Tensor, col: Tensor,
                  row: Tensor, perm: Tensor, reduce: str, needs_grad: list[bool]) -> list[Tensor]:
    """``[dX, dw]`` (an empty tensor where ``needs_grad`` is False)."""
    grads = recompute_grads(lambda x_, w_: spmm_reference(x_, w_, rowptr, col, row, perm, reduce),
                            [x, edge_weight], grad_out, needs_grad)
    return [g if g is not None else x.new_empty((0,)) for g in grads]


@spmm_backward.register_fake
def _(grad_out, x, edge_weight, rowptr, col, row, perm, reduce, needs_grad):
    return [torch.empty_like(t) if need and t is not None else x.new_empty((0,))
            for t, need in zip((x, edge_weight), needs_grad)]


def _setup(ctx, inputs, output):
    x, edge_weight, rowptr, col, row, perm, reduce = inputs
    ctx.save_for_backward(x, edge_weight, rowptr, col, row, perm)
    ctx.reduce = reduce


def _backward(ctx, grad_out):
    x, edge_weight, rowptr, col, row, perm = ctx.saved_tensors
    needs = [ctx.needs_input_grad[0], edge_weight is not None and ctx.needs_input_grad[1]]
    grad_x, grad_w = spmm_backward(grad_out, x, edge_weight, rowptr, col, row, perm, ctx.reduce, needs)
    return (grad_x if needs[0] else None, grad_w if needs[1] else None, None, None, None, None, None)


spmm.register_autograd(_backward, setup_context=_setup)
