r"""Gather-scatter family: reductions of arbitrary per-edge messages.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} \phi(a^{(1)}_e, \dots, a^{(k)}_e),
    \qquad \oplus \in \{\sum, \mathrm{mean}, \max, \min\}

``phi`` is an edge function cut from the model (registered under ``fn_key``, see
``gnn_inductor.edge_functions``); each argument reaches the edge through its role (source row,
destination row, edge row or dense, see ``kernels/_common.py``). Output ``[num_dst, *M]`` where
``phi`` returns ``[E, *M]``; empty rows are 0, as PyG's ``scatter``. Max/min ties share the
gradient equally (``scatter_reduce`` semantics). Covers SAGEConv/GraphConv max, GINEConv-style
``relu(x_j + e_ij)`` messages and any pointwise chain PyG or users write.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor import edge_functions
from gnn_inductor.kernels._common import (
    check_reduce, edge_values, fake_edge_values, in_float32, recompute_grads, segment_reduce,
)


def gather_scatter_reference(args: list, roles: list, rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
                             fn_key: str, reduce: str) -> Tensor:
    args, half = in_float32(args)
    messages = edge_functions.lookup(fn_key)(*edge_values(args, roles, col, row, perm))
    out = segment_reduce(messages, row, rowptr, reduce)
    return out if half is None else out.to(half)


KERNEL = {"cuda": "reference (torch segment ops; Triton kernel: issue 4)", "cpu": "segment reference"}


@torch.library.custom_op("gnn_io::gather_scatter", mutates_args=())
def gather_scatter(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor,
                   perm: Tensor, fn_key: str, reduce: str) -> Tensor:
    check_reduce(reduce)
    return gather_scatter_reference(args, roles, rowptr, col, row, perm, fn_key, reduce)


@gather_scatter.register_fake
def _(args, roles, rowptr, col, row, perm, fn_key, reduce):
    messages = edge_functions.lookup(fn_key)(*fake_edge_values(args, roles, col.shape[0]))
    return messages.new_empty((rowptr.shape[0] - 1, *messages.shape[1:]))


@torch.library.custom_op("gnn_io::gather_scatter_backward", mutates_args=())
def gather_scatter_backward(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                            row: Tensor, perm: Tensor, fn_key: str, reduce: str,
                            needs_grad: list[bool]) -> list[Tensor]:
    """Gradient for each argument (an empty tensor where ``needs_grad`` is False)."""
    grads = recompute_grads(
        lambda *a: gather_scatter_reference(list(a), roles, rowptr, col, row, perm, fn_key, reduce),
        list(args), grad_out, needs_grad)
    return [g if g is not None else grad_out.new_empty((0,)) for g in grads]


@gather_scatter_backward.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad):
    return [torch.empty_like(a) if need else grad_out.new_empty((0,)) for a, need in zip(args, needs_grad)]


def _setup(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, fn_key, reduce = inputs
    ctx.save_for_backward(*args, rowptr, col, row, perm)
    ctx.meta = (len(args), roles, fn_key, reduce)
    ctx.needs = [bool(a.requires_grad) for a in args]


def _backward(ctx, grad_out):
    num_args, roles, fn_key, reduce = ctx.meta
    saved = ctx.saved_tensors
    args, (rowptr, col, row, perm) = list(saved[:num_args]), saved[num_args:]
    grads = gather_scatter_backward(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, ctx.needs)
    return [g if need else None for g, need in zip(grads, ctx.needs)], None, None, None, None, None, None, None


gather_scatter.register_autograd(_backward, setup_context=_setup)
