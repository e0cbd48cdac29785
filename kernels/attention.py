r"""Attention aggregation: edge scores, edge softmax and weighted sum in one op.

.. math::
    s_e = \mathrm{score}(a_e), \quad
    \alpha_e = \mathrm{softmax}_{e \to i}(s_e), \quad
    \mathrm{out}_i = \sum_{e = (j \to i)} \mathrm{message}(\alpha_e, a_e)

``score`` (``score_key``) and ``message`` (``message_key``) are edge functions cut from the model:
GAT's ``leaky_relu(a_l x_j + a_r x_i)``, GATv2's ``a . leaky_relu(W_l x_j + W_r x_i)``,
TransformerConv's ``q_i . k_j / sqrt(d)`` and their ``alpha * v_j`` messages. Arguments reach the
edge through their roles (``kernels/_common.py``). The fused GPU kernels (online softmax, saved
log-sum-exp, recompute in backward) plug in behind this op; the CPU path is the exact reference.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor import edge_functions
from gnn_inductor.kernels._common import edge_values, fake_edge_values, in_float32, recompute_grads, segment_reduce
from gnn_inductor.kernels.edge_softmax import softmax_csr


def attention_reference(args: list, roles: list, rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
                        score_key: str, message_key: str, eps: float) -> Tensor:
    args, half = in_float32(args)
    values = edge_values(args, roles, col, row, perm)
    alpha = softmax_csr(edge_functions.lookup(score_key)(*values), row, rowptr, eps)
    messages = edge_functions.lookup(message_key)(alpha, *values)
    out = segment_reduce(messages, row, rowptr, "sum")
    return out if half is None else out.to(half)


KERNEL = {"cuda": "reference (torch segment ops; fused Triton kernel: issue 5)", "cpu": "segment reference"}


@torch.library.custom_op("gnn_io::attention", mutates_args=())
def attention(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
              score_key: str, message_key: str, eps: float) -> Tensor:
    return attention_reference(args, roles, rowptr, col, row, perm, score_key, message_key, eps)


@attention.register_fake
def _(args, roles, rowptr, col, row, perm, score_key, message_key, eps):
    values = fake_edge_values(args, roles, col.shape[0])
    alpha = edge_functions.lookup(score_key)(*values)
    messages = edge_functions.lookup(message_key)(alpha, *values)
    return messages.new_empty((rowptr.shape[0] - 1, *messages.shape[1:]))


@torch.library.custom_op("gnn_io::attention_backward", mutates_args=())
def attention_backward(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                       row: Tensor, perm: Tensor, score_key: str, message_key: str, eps: float,
                       needs_grad: list[bool]) -> list[Tensor]:
    grads = recompute_grads(
        lambda *a: attention_reference(list(a), roles, rowptr, col, row, perm, score_key, message_key, eps),
        list(args), grad_out, needs_grad)
    return [g if g is not None else grad_out.new_empty((0,)) for g in grads]


@attention_backward.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, needs_grad):
    return [torch.empty_like(a) if need else grad_out.new_empty((0,)) for a, need in zip(args, needs_grad)]


def _setup(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, score_key, message_key, eps = inputs
    ctx.save_for_backward(*args, rowptr, col, row, perm)
    ctx.meta = (len(args), roles, score_key, message_key, eps)
    ctx.needs = [bool(a.requires_grad) for a in args]


def _backward(ctx, grad_out):
    num_args, roles, score_key, message_key, eps = ctx.meta
    saved = ctx.saved_tensors
    args, (rowptr, col, row, perm) = list(saved[:num_args]), saved[num_args:]
    grads = attention_backward(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps,
                               ctx.needs)
    return [g if need else None for g, need in zip(grads, ctx.needs)], None, None, None, None, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup)
