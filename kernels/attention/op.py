r"""Attention aggregation: edge scores, edge softmax, attention dropout and weighted sum in one op.

.. math::
    s_e = \mathrm{score}(a_e), \quad
    \alpha_e = \mathrm{softmax}_{e \to i}(s_e) \cdot \frac{\mathrm{keep}(e)}{1 - p}, \quad
    \mathrm{out}_i = \sum_{e = (j \to i)} \mathrm{message}(\alpha_e, a_e)

``score`` (``score_key``) and ``message`` (``message_key``) are edge functions cut from the model:
GAT's ``leaky_relu(a_l x_j + a_r x_i)``, GATv2's ``a . leaky_relu(W_l x_j + W_r x_i)``,
TransformerConv's ``q_i . k_j / sqrt(d)``, HGTConv's ``(q_i . k_j) p_rel / sqrt(d)`` (a per-edge factor of
the score) and their ``alpha * v_j`` messages. Arguments reach the edge through their roles
(``kernels/runtime/roles.py``).

Ops:

- ``gnn_io::attention(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items=None,
  max_edges=0, dropout_seed=None, dropout_p=0.0) -> out`` is what the rewrite emits: ``out [N, *M]`` (``M`` the
  message's per-edge shape). ``items`` are the plan's work items (``gnn_io::work_items(rowptr, col, max_edges)``)
  for the degree split on CUDA; other devices ignore them. It is a composite: ``attention_forward(...)[0]``.
- Attention dropout (training): with an int64 scalar ``dropout_seed`` and ``0 < dropout_p < 1``, entry
  ``(e, h)`` of alpha is kept where ``u(seed, e * H + h) >= p`` and scaled by ``1 / (1 - p)``, else 0
  (``e`` the edge's position in the edge index the op's plan was built from, ``h`` the head; ``u`` the
  counter-based generator of ``kernels/runtime/rng.py``). The message function gets the dropped alpha. Forward,
  backward and the reference all regenerate the same mask from the seed: nothing edge-sized is stored.
- ``bias`` (optional, a tensor of the message's per-edge shape ``M`` or of ``prod(M)`` elements): ``out + bias``
  (PyG's GATConv and GATv2Conv add their bias to the concatenated heads; ``patterns/attention.py`` folds that
  addition into the op). The sum is made in the output's own memory, and the backward's
  ``D = <dout, out - bias>`` reads it back: the attention output and the layer's output are one tensor, not two
  (512 MiB less at the peak of GATConv on RMAT 2^20, 128 features, fp32, H100).
- ``gnn_io::attention_forward(...) -> (out, lse)`` also returns the per-(node, head) log-sum-exp of the
  scores (float32, ``[N, *H]``, 0 for nodes without edges), which its backward reads: the fused kernels
  recompute ``alpha_e = exp(s_e - lse_i)`` there instead of storing the attention matrix.
- Its backward is two ops: ``gnn_io::attention_delta(dout, out, lse, bias) -> (D, bias gradient)``, the softmax
  Jacobian's row term ``D = <dout, out - bias>`` per (row, head) (FlashAttention's delta), then
  ``gnn_io::attention_backward(..., D, lse, needs_grad)``, whose kernels read ``D`` and never ``out``. So ``out``'s
  last use in a compiled backward is the first op, and it is freed before the gradients are allocated: 512 MiB
  less at the peak of TransformerConv on RMAT 2^20 (128 features, fp32), whose attention output is not the
  layer's output (the skip map's sum is).

On CUDA (and on CPU under ``TRITON_INTERPRET=1``) the fused Triton kernels of
``kernels/attention/csr_*.py`` run when the edge functions are one of the GAT, GATv2 or dot-product
(TransformerConv, HGTConv) families; anything else, and every CPU call, runs the exact reference below
(backward: recompute it under autograd). dtype: float32 accumulation; ``out`` is half precision when
any input is. Which kernel runs for the dot-product family on CUDA (fused CSR, block-sparse
Tensor-Core, or a hybrid by row window; always CSR for a score with a factor) is decided per graph by
``kernels/attention/selector.py``; ``kernels/attention/dispatch.py`` runs the kernels of the path.
"""
from __future__ import annotations

import math

import torch
from gnn_inductor.kernels.attention import csr_delta, csr_forward, csr_launch, dispatch
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.kernels.attention.dispatch import check_bias, check_pack, check_projection, chunked_grads, fused, \
    mass_terms, message_shaped, projection_blocks
from gnn_inductor.kernels.attention.forms import recognise
from gnn_inductor.kernels.attention.layout import out_dtype, prepare, undo_view_grad
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_NAMES, edge_values, fake_edge_values
from gnn_inductor.kernels.runtime.reference import (
    accumulation_dtype, column_sum, in_float32, recompute_grads, segment_reduce,
)
from gnn_inductor.kernels.attention.edge_softmax import softmax_csr
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results, fresh_like

from gnn_inductor.kernels.runtime import edge_functions


def attention_reference(args: list, roles: list, rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
                        score_key: str, message_key: str, eps: float, dropout: rng.Dropout | None = None) -> Tensor:
    return reference_with_lse(args, roles, rowptr, col, row, perm, score_key, message_key, eps, dropout)[0]


def reference_with_lse(args, roles, rowptr, col, row, perm, score_key, message_key, eps, dropout=None) -> tuple:
    args, half = in_float32(args)
    values = edge_values(args, roles, col, row, perm)
    scores = edge_functions.lookup(score_key)(*values)
    alpha = rng.dropout_reference(softmax_csr(scores, row, rowptr, eps), dropout, perm)
    messages = edge_functions.lookup(message_key)(alpha, *values)
    out = segment_reduce(messages, row, rowptr, "sum")
    with torch.no_grad():
        top = segment_reduce(scores.detach(), row, rowptr, "max")
        total = segment_reduce((scores.detach() - top.index_select(0, row)).exp(), row, rowptr, "sum")
        lse = torch.where(total > 0, top + total.log(), torch.zeros_like(top)).float()
    return (out if half is None else out.to(half)), lse


KERNEL = {"cuda": "fused CSR attention (Triton) for GAT / GATv2 / dot-product scores, else reference",
          "cpu": "segment reference"}


def kernel_name(device_type: str, details: dict) -> str:
    """The kernel an attention rewrite runs on ``device_type``, from its edge functions (for the report)."""
    name = _kernel_name(device_type, details)
    if details.get("dropout_p"):
        name += (f"; attention dropout p={details['dropout_p']}: Philox mask regenerated from a per-call seed in "
                 "forward and backward, no [E, H] mask stored")
    return name


def _kernel_name(device_type: str, details: dict) -> str:
    if device_type != "cuda" or "score" not in details:
        return KERNEL.get(device_type, KERNEL["cpu"])
    roles = [r if isinstance(r, int) else _ROLE_IDS[r] for r in details["roles"]]
    form = recognise(details["score"], details["message"], roles)
    if isinstance(form, str):
        return f"reference (torch segment ops): edge functions not fused ({form})"
    if form.family == "dot" and form.score_factor is None:
        return f"{csr_launch.kernel_name(form.family)}; {attention_paths.kernel_name()}"
    if form.family == "dot":
        return f"{csr_launch.kernel_name(form.family)}; per-edge score factor (no block-sparse kernel for it)"
    return csr_launch.kernel_name(form.family)


_ROLE_IDS = {name: role for role, name in ROLE_NAMES.items()}


_lib = torch.library.Library("gnn_io", "FRAGMENT")
_lib.define("attention(Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, "
            "str score_key, str message_key, float eps, Tensor[]? items=None, int max_edges=0, "
            "Tensor? dropout_seed=None, float dropout_p=0.0, Tensor? bias=None) -> Tensor")


def _attention(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items=None, max_edges=0,
               dropout_seed=None, dropout_p=0.0, bias=None):
    forward = attention_forward_mass if torch.is_grad_enabled() and mass_terms(
        args, roles, rowptr, perm, score_key, message_key) else attention_forward
    return forward(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items or [], max_edges,
                   dropout_seed, dropout_p, bias)[0]


_lib.impl("attention", _attention, "CompositeImplicitAutograd")


@torch.library.custom_op("gnn_io::attention_forward", mutates_args=())
@contiguous_results
def attention_forward(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
                      score_key: str, message_key: str, eps: float, items: list[Tensor], max_edges: int,
                      dropout_seed: Tensor | None = None, dropout_p: float = 0.0,
                      bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    out, lse, biased = _forward(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges,
                                dropout_seed, dropout_p, bias)
    if bias is not None and not biased:
        check_bias(bias, out.shape[1:], out.dtype, out.device)
        out.add_(bias.reshape(out.shape[1:]))  # a fresh tensor of the op's own: the layer's output in its memory
    return out, lse


def _forward(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed,
             dropout_p, bias) -> tuple:
    """``(out, lse, biased)``: ``biased`` when the CSR kernel added ``bias`` itself (its store's epilogue)."""
    dropout = rng.dropout_of(dropout_seed, dropout_p)
    result = dispatch.forward(args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges, dropout,
                              bias)
    if result is not None:
        return result
    return (*reference_with_lse(args, roles, rowptr, col, row, perm, score_key, message_key, eps, dropout), False)


@attention_forward.register_fake
def _(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed=None,
      dropout_p=0.0, bias=None):
    values = fake_edge_values(args, roles, col.shape[0])
    scores = edge_functions.lookup(score_key)(*values)
    messages = edge_functions.lookup(message_key)(scores, *values)
    dtype = next((a.dtype for a in args if a.dtype in (torch.float16, torch.bfloat16)), messages.dtype)
    num_dst = rowptr.shape[0] - 1
    return (messages.new_empty((num_dst, *messages.shape[1:]), dtype=dtype),
            scores.new_empty((num_dst, *scores.shape[1:]), dtype=torch.float32))


def _delta_shape(out: Tensor, lse: Tensor) -> tuple | None:
    """``(rows, heads, channels)`` of ``out`` seen per (row, head) of ``lse``, or None where ``out``'s rows do not
    split into ``lse``'s heads (only the reference backward runs there, and it does not read ``D``). An ``[N, F]``
    output with ``[N, H]`` statistics is a message flattened heads major (kernels/attention/forms.py's
    ``message_width``): ``F / H`` channels per head."""
    if lse.dim() < 1 or out.dim() < lse.dim() or out.shape[0] != lse.shape[0]:
        return None
    flattened = out.dim() == lse.dim() == 2
    if not flattened and tuple(out.shape[1:lse.dim()]) != tuple(lse.shape[1:]):
        return None
    heads = math.prod(lse.shape[1:])
    per_row = math.prod(out.shape[1:])
    if heads == 0 or per_row % heads:
        return None
    return out.shape[0], heads, per_row // heads


@torch.library.custom_op("gnn_io::attention_delta", mutates_args=())
@contiguous_results
def attention_delta(grad_out: Tensor, out: Tensor, lse: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(D, bias gradient)`` of an attention op's output: ``D = <dout, out - bias>`` per (row, head) over the
    channels, float32, shaped as ``lse`` (an empty tensor where ``out`` does not split into ``lse``'s heads), and
    the gradient of ``bias`` (its column sum of ``dout``; an empty tensor without a bias).

    The op's backward runs this before :func:`attention_backward`, which reads ``D`` instead of ``out``: the
    forward's output is then not read by the backward's kernels, and a compiled backward frees it (its last use)
    before the gradient buffers are allocated. TransformerConv's attention output, which its skip map's sum
    replaces as the layer's output, was alive at the step's peak only for ``D`` (512 MiB at 2^20 x 128 in
    float32). The bias gradient's reduction is made here too, before those buffers exist."""
    shape = _delta_shape(out, lse)
    summed = None
    if shape is None:
        delta = lse.new_empty((0,), dtype=torch.float32)
    elif fused([out], lse) and shape[0]:
        delta, _, summed = csr_delta.delta_parts(grad_out.reshape(shape), out.reshape(shape),
                                                 None if bias is None else bias.reshape(shape[1:]),
                                                 bias_grad=_kernel_bias_grad(grad_out, bias))
        delta = delta.view(lse.shape)
    else:
        centred = out.float() if bias is None else out.float() - bias.float().reshape(out.shape[1:])
        delta = (grad_out.float() * centred).reshape(shape).sum(-1).view(lse.shape)
    return delta, _bias_grad(grad_out, bias, summed)


def _kernel_bias_grad(grad_out: Tensor, bias: Tensor | None) -> bool:
    """Whether the D kernel sums the bias gradient: it accumulates in float32, so a float64 one is summed by
    :func:`column_sum` in float64 instead."""
    return bias is not None and grad_out.dtype != torch.float64


def _bias_grad(grad_out: Tensor, bias: Tensor | None, summed: Tensor | None) -> Tensor:
    """The bias gradient: ``dout``'s column sum (``summed`` where the D kernel made it), an empty tensor without
    a bias."""
    if bias is None:
        return grad_out.new_empty((0,))
    return (column_sum(grad_out) if summed is None else summed).to(bias.dtype).view(bias.shape)


@attention_delta.register_fake
def _(grad_out, out, lse, bias=None):
    delta = lse.new_empty(lse.shape if _delta_shape(out, lse) is not None else (0,), dtype=torch.float32)
    return delta, grad_out.new_empty((0,)) if bias is None else fresh_like(bias)


@torch.library.custom_op("gnn_io::attention_backward", mutates_args=())
@contiguous_results
def attention_backward(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                       row: Tensor, perm: Tensor, score_key: str, message_key: str, eps: float, items: list[Tensor],
                       max_edges: int, dropout_seed: Tensor | None, dropout_p: float, delta: Tensor, lse: Tensor,
                       needs_grad: list[bool]) -> list[Tensor]:
    """Gradients of the arguments flagged in ``needs_grad`` (empty tensors elsewhere); ``delta`` is
    :func:`attention_delta`'s ``D``."""
    return _backward_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items,
                           max_edges, dropout_seed, dropout_p, delta, lse, needs_grad)


def _backward_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges,
                    dropout_seed, dropout_p, delta, lse, needs_grad, pack=None) -> list:
    """:func:`attention_backward`'s list; ``pack`` (argument -> its gradient's place in a packed tensor) as
    :func:`dispatch.backward`'s."""
    dropout = rng.dropout_of(dropout_seed, dropout_p)
    grads = dispatch.backward(grad_out, args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges,
                              dropout, delta, lse, needs_grad, pack)
    if grads is None:
        grads = recompute_grads(
            lambda *a: attention_reference(list(a), roles, rowptr, col, row, perm, score_key, message_key, eps,
                                           dropout),
            list(args), grad_out, needs_grad)
    return [g if g is not None else grad_out.new_empty((0,)) for g in grads]


@attention_backward.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed,
      dropout_p, delta, lse, needs_grad):
    return [fresh_like(a) if need else grad_out.new_empty((0,)) for a, need in zip(args, needs_grad)]


@torch.library.custom_op("gnn_io::attention_backward_packed", mutates_args=())
@contiguous_results
def attention_backward_packed(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                              row: Tensor, perm: Tensor, score_key: str, message_key: str, eps: float,
                              items: list[Tensor], max_edges: int, dropout_seed: Tensor | None, dropout_p: float,
                              delta: Tensor, lse: Tensor, needs_grad: list[bool], pack_offsets: list[int],
                              pack_width: int) -> list[Tensor]:
    """``[packed, *attention_backward's list]``: the gradient of each argument ``i`` with ``pack_offsets[i] >= 0``
    (``[rows, *F]``, ``prod(F)`` columns) sits in columns ``[pack_offsets[i], pack_offsets[i] + prod(F))`` of
    ``packed`` (``[rows, pack_width]``, the arguments' dtype), and its entry in the list is an empty tensor. The
    offsets' spans do not overlap; columns outside them are zeros.

    A backward graph pass (gnn_inductor/passes/packed_grads.py) calls it where the graph concatenates those gradients
    (TransformerConv's query, key and value maps fused into one GEMM, gnn_inductor/passes/linear_fusion.py): the split
    backward's kernels then write them in place, and the concatenated copy (a read and a write of 1.5 GiB at 2^20
    nodes and 384 columns in float32) and the separate gradients at the step's peak are gone."""
    packed_args, gaps = check_pack(args, needs_grad, pack_offsets, pack_width)
    return _packed_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges,
                         dropout_seed, dropout_p, delta, lse, needs_grad, pack_offsets, pack_width, packed_args, gaps)


def _packed_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges,
                  dropout_seed, dropout_p, delta, lse, needs_grad, pack_offsets, pack_width, packed_args,
                  gaps) -> list:
    """:func:`attention_backward_packed`'s result, its layout checked (:func:`dispatch.check_pack`)."""
    first = args[packed_args[0]]
    packed = torch.empty((first.shape[0], pack_width), dtype=first.dtype, device=first.device)
    for start, end in gaps:
        packed[:, start:end].zero_()
    places = {i: packed[:, pack_offsets[i]:pack_offsets[i] + args[i][0].numel()].view(args[i].shape)
              for i in packed_args}
    grads = _backward_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items,
                            max_edges, dropout_seed, dropout_p, delta, lse, needs_grad, pack=places)
    for i in packed_args:
        if grads[i] is not places[i]:
            places[i].copy_(grads[i])
        grads[i] = grad_out.new_empty((0,))
    return [packed] + grads


@attention_backward_packed.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed,
      dropout_p, delta, lse, needs_grad, pack_offsets, pack_width):
    first = args[next(i for i, offset in enumerate(pack_offsets) if offset >= 0)]
    grads = [fresh_like(a) if need and offset < 0 else grad_out.new_empty((0,))
             for a, need, offset in zip(args, needs_grad, pack_offsets)]
    return [first.new_empty((first.shape[0], pack_width))] + grads


@torch.library.custom_op("gnn_io::attention_backward_projected", mutates_args=())
@contiguous_results
def attention_backward_projected(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                                 row: Tensor, perm: Tensor, score_key: str, message_key: str, eps: float,
                                 items: list[Tensor], max_edges: int, dropout_seed: Tensor | None, dropout_p: float,
                                 delta: Tensor, lse: Tensor, needs_grad: list[bool], pack_offsets: list[int],
                                 pack_width: int, x: Tensor | None, weight: Tensor | None,
                                 bias_dims: int) -> list[Tensor]:
    """``[packed @ weight, packed^T @ x, packed summed over rows, *attention_backward's list]``, where ``packed`` is
    :func:`attention_backward_packed`'s packed gradient: the input, weight and bias gradients of the fused linear
    map whose output the attention read (``weight`` is that map's ``[pack_width, F]`` weight, ``x`` its input
    ``[N, F']``). A missing ``weight`` or ``x`` gives an empty tensor in its place, and so does the row sum with
    ``bias_dims`` -1; it is ``[pack_width]`` with 0 and ``[1, pack_width]`` with 1.

    On the fused kernels' CSR path with the split backward, the packed gradient is made one block of rows at a time
    (:func:`csr_chunked.backward_chunked`; at most ``GNN_IO_GRAD_CHUNK_KB`` KiB a block, 256 MiB by default,
    0 for one block) and each block goes through the three products before the next: the whole packed gradient
    never exists. TransformerConv's is ``[N, 3F]`` (1.5 GiB at 2^20 nodes and ``3F = 384`` in float32), alive at
    the step's peak next to the query, key and value it is the gradient of. Elsewhere (another path, the
    reference, a CUDA graph captured before the blocks were counted) it is made whole, then multiplied.
    A backward graph pass (gnn_inductor/passes/packed_grads.py) calls this op where the packed gradient's only readers
    are those products."""
    packed_args, gaps = check_pack(args, needs_grad, pack_offsets, pack_width)
    first = args[packed_args[0]]
    rows, dtype = first.shape[0], first.dtype
    check_projection(rows, pack_width, dtype, x, weight, bias_dims)
    grad_x = None if weight is None else torch.empty((rows, weight.shape[1]), dtype=dtype, device=first.device)
    grad_w = None if x is None else torch.empty((pack_width, x.shape[1]), dtype=dtype, device=first.device)
    full_precision = dtype in (torch.float32, torch.float64)  # else half precision, whose sums run in float32
    sums = [] if bias_dims < 0 else [torch.zeros(pack_width, dtype=accumulation_dtype(dtype), device=first.device)]
    # the bias gradient as a GEMV against ones: ATen's column reduction of a block (column_sum's too) kept a
    # staging buffer of 160 MiB at GATv2Conv's step peak on RMAT 2^20 (H100)
    ones = torch.ones(rows, dtype=dtype, device=first.device) if sums else None
    whole = []  # half precision over several blocks: the weight gradient's float32 sum of the blocks' products

    def empty():  # a fresh one each: a custom op's outputs must not alias each other
        return grad_out.new_empty((0,))

    def consume(r0: int, r1: int, chunk: Tensor) -> None:
        if grad_x is not None:
            dense_triton.matmul(chunk, weight, out=grad_x[r0:r1])
        if grad_w is not None:
            if r0 == 0 and r1 == rows:
                dense_triton.matmul(chunk.t(), x, out=grad_w)
            elif full_precision:
                if r0 == 0:
                    dense_triton.matmul(chunk.t(), x[r0:r1], out=grad_w)
                else:
                    dense_triton.matmul(chunk.t(), x[r0:r1], out=grad_w, accumulate=True)
            else:  # half precision: the blocks' products summed in float32
                part = torch.mm(chunk.t(), x[r0:r1]).float()
                if whole:
                    whole[0].add_(part)
                else:
                    whole.append(part)
        if sums:
            if full_precision:
                sums[0].addmv_(chunk.t(), ones[:r1 - r0])
            else:
                sums[0].add_(torch.mv(chunk.t(), ones[:r1 - r0]).float())

    bounds = projection_blocks(rows, pack_width, dtype)
    grads = None if len(bounds) <= 2 else \
        chunked_grads(grad_out, args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges,
                      dropout_seed, dropout_p, delta, lse, needs_grad, pack_offsets, pack_width, gaps, dtype, bounds,
                      consume)
    if grads is None:
        full = _packed_grads(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items,
                             max_edges, dropout_seed, dropout_p, delta, lse, needs_grad, pack_offsets, pack_width,
                             packed_args, gaps)
        consume(0, rows, full[0])
        grads = full[1:]
    else:
        grads = [g if g is not None and offset < 0 else empty() for g, offset in zip(grads, pack_offsets)]
    if whole:
        grad_w.copy_(whole[0])
    bias_grad = empty() if bias_dims < 0 else sums[0].to(dtype).view((1, pack_width) if bias_dims else (pack_width,))
    return [empty() if grad_x is None else grad_x, empty() if grad_w is None else grad_w, bias_grad] + grads


@attention_backward_projected.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed,
      dropout_p, delta, lse, needs_grad, pack_offsets, pack_width, x, weight, bias_dims):
    first = args[next(i for i, offset in enumerate(pack_offsets) if offset >= 0)]
    grads = [fresh_like(a) if need and offset < 0 else grad_out.new_empty((0,))
             for a, need, offset in zip(args, needs_grad, pack_offsets)]
    grad_x = grad_out.new_empty((0,)) if weight is None else first.new_empty((first.shape[0], weight.shape[1]))
    grad_w = grad_out.new_empty((0,)) if x is None else first.new_empty((pack_width, x.shape[1]))
    bias_grad = grad_out.new_empty((0,)) if bias_dims < 0 else \
        first.new_empty((1, pack_width) if bias_dims else (pack_width,))
    return [grad_x, grad_w, bias_grad] + grads


def _setup(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed, dropout_p, \
        bias = (*inputs, None)[:14]
    out, lse = output
    ctx.mark_non_differentiable(lse)
    # the seed, not the mask: backward regenerates the forward's mask from it
    ctx.save_for_backward(*args, rowptr, col, row, perm, out, lse, dropout_seed, bias, *items)
    ctx.meta = (len(args), roles, score_key, message_key, eps, max_edges, dropout_p)
    ctx.needs = [bool(a.requires_grad) for a in args]


def _backward(ctx, grad_out, _grad_lse):
    num_args, roles, score_key, message_key, eps, max_edges, dropout_p = ctx.meta
    saved = ctx.saved_tensors
    args, (rowptr, col, row, perm, out, lse, dropout_seed, bias), items = \
        list(saved[:num_args]), saved[num_args:num_args + 8], list(saved[num_args + 8:])
    # D (and the bias gradient) first: out's last use, so a compiled backward frees it before the gradients exist
    delta, bias_grad = attention_delta(grad_out, out, lse, bias)
    grads = attention_backward(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items,
                               max_edges, dropout_seed, dropout_p, delta, lse, ctx.needs)
    bias_grad = bias_grad if bias is not None and ctx.needs_input_grad[-1] else None
    # a call may omit the trailing dropout and bias arguments
    return ([g if need else None for g, need in zip(grads, ctx.needs)], None, None, None, None, None, None, None,
            None, [None] * len(items), None, None, None, bias_grad)[:len(ctx.needs_input_grad)]


attention_forward.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------------------------------------
# GAT's dst score terms from the forward's mass
# ---------------------------------------------------------------------------------------------
# GAT's score is LeakyReLU(a_s.x_j + a_d.x_i (+ a_e.e_ij)). The gradient of a dst-role term (a_d.x_i) is the sum of
# the per-edge score gradients over the destination's edges:
#     g_i = sum_j alpha_ij s'_ij (w_ij <dout_i, v_j> - D_i) = <dout_i, M_i>,
#     M_i = sum_j alpha_ij s'_ij (w_ij v_j - out_i),
# with s' the LeakyReLU slope at the edge's pre-activation (1 or the negative slope), w the message scale and
# dropout, D_i = <dout_i, out_i> and out without bias. M is made in the forward, where each edge's v_j is in
# registers anyway (a second accumulator next to the output's); the backward's D kernel, which reads dout once per
# row, also returns <dout_i, M_i>. So the src pass stores no per-edge term and the per-destination sum over the
# edges does not run: on the H100 (RMAT 2^20, 15.4M edges, 4 x 32) that sum took 0.73 ms and the per-edge store
# about 0.7 ms of the src pass, against one [N, H, C] float32 write and read here.


@torch.library.custom_op("gnn_io::attention_forward_mass", mutates_args=())
@contiguous_results
def attention_forward_mass(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor,
                           perm: Tensor, score_key: str, message_key: str, eps: float, items: list[Tensor],
                           max_edges: int, dropout_seed: Tensor | None = None, dropout_p: float = 0.0,
                           bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`attention_forward`'s ``(out, lse)`` and GAT's score-term mass ``M`` (float32, shaped as ``out``; the
    section comment above), from the fused CSR kernel (always that kernel: :func:`dispatch.mass_terms` says where the op
    is used)."""
    layout = prepare(args, roles, perm, score_key, message_key,
                                      rng.dropout_of(dropout_seed, dropout_p))
    if isinstance(layout, str) or layout.form.family != "gat" or not fused(args, rowptr):
        raise ValueError(f"attention_forward_mass: the GAT family's fused CSR kernel does not run these arguments "
                         f"({layout if isinstance(layout, str) else layout.form.family})")
    if bias is not None:
        check_bias(bias, (layout.heads, layout.channels), out_dtype(args), rowptr.device)
    rows = None if bias is None else bias.reshape(layout.heads, layout.channels)
    out, lse, mass = csr_forward.forward(layout, rowptr, col, perm, eps, items, max_edges, bias=rows,
                                         variant="all", mass=True)
    return message_shaped(layout, out), lse, message_shaped(layout, mass)


@attention_forward_mass.register_fake
def _(args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed=None,
      dropout_p=0.0, bias=None):
    out, lse = attention_forward._abstract_fn(args, roles, rowptr, col, row, perm, score_key, message_key, eps,
                                              items, max_edges, dropout_seed, dropout_p, bias)
    return out, lse, out.new_empty(out.shape, dtype=torch.float32)


@torch.library.custom_op("gnn_io::attention_delta_mass", mutates_args=())
@contiguous_results
def attention_delta_mass(grad_out: Tensor, out: Tensor, mass: Tensor, lse: Tensor, bias: Tensor | None,
                         score_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(D, dst-term gradient, bias gradient)``: :func:`attention_delta`'s two, and ``score_scale * <dout, M>`` per
    (row, head), float32 shaped as ``lse``, from one read of ``dout`` (``M`` :func:`attention_forward_mass`'s)."""
    shape = _delta_shape(out, lse)
    if shape is None or tuple(mass.shape) != tuple(out.shape):
        raise ValueError(f"attention_delta_mass: output {tuple(out.shape)}, mass {tuple(mass.shape)} and statistics "
                         f"{tuple(lse.shape)} do not fit")
    summed = None
    if fused([out], lse) and shape[0]:
        delta, mass_grad, summed = csr_delta.delta_parts(grad_out.reshape(shape), out.reshape(shape),
                                                         None if bias is None else bias.reshape(shape[1:]),
                                                         mass.reshape(shape), score_scale,
                                                         _kernel_bias_grad(grad_out, bias))
        delta, mass_grad = delta.view(lse.shape), mass_grad.view(lse.shape)
    else:
        centred = out.float() if bias is None else out.float() - bias.float().reshape(out.shape[1:])
        delta = (grad_out.float() * centred).reshape(shape).sum(-1).view(lse.shape)
        mass_grad = ((grad_out.float() * mass).reshape(shape).sum(-1) * score_scale).view(lse.shape)
    return delta, mass_grad, _bias_grad(grad_out, bias, summed)


@attention_delta_mass.register_fake
def _(grad_out, out, mass, lse, bias, score_scale):
    return (lse.new_empty(lse.shape, dtype=torch.float32), lse.new_empty(lse.shape, dtype=torch.float32),
            grad_out.new_empty((0,)) if bias is None else fresh_like(bias))


def _setup_mass(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, score_key, message_key, eps, items, max_edges, dropout_seed, dropout_p, \
        bias = (*inputs, None)[:14]
    out, lse, mass = output
    ctx.mark_non_differentiable(lse, mass)
    ctx.save_for_backward(*args, rowptr, col, row, perm, out, lse, mass, dropout_seed, bias, *items)
    form = recognise(score_key, message_key, roles)
    ctx.meta = (len(args), roles, score_key, message_key, eps, max_edges, dropout_p, form.score_scale)
    ctx.needs = [bool(a.requires_grad) for a in args]
    ctx.terms = mass_terms(args, roles, rowptr, perm, score_key, message_key)


def _backward_mass(ctx, grad_out, _grad_lse, _grad_mass):
    num_args, roles, score_key, message_key, eps, max_edges, dropout_p, score_scale = ctx.meta
    saved = ctx.saved_tensors
    args, (rowptr, col, row, perm, out, lse, mass, dropout_seed, bias), items = \
        list(saved[:num_args]), saved[num_args:num_args + 9], list(saved[num_args + 9:])
    # D, the dst terms' gradient and the bias gradient first: out's and the mass's last use
    delta, mass_grad, bias_grad = attention_delta_mass(grad_out, out, mass, lse, bias, score_scale)
    needs = [need and i not in ctx.terms for i, need in enumerate(ctx.needs)]
    grads = attention_backward(grad_out, args, roles, rowptr, col, row, perm, score_key, message_key, eps, items,
                               max_edges, dropout_seed, dropout_p, delta, lse, needs) if any(needs) else \
        [None] * num_args
    grads = [undo_view_grad(mass_grad, args[i], ROLE_DST).to(args[i].dtype) if i in ctx.terms else g
             for i, g in enumerate(grads)]
    bias_grad = bias_grad if bias is not None and ctx.needs_input_grad[-1] else None
    return ([g if need else None for g, need in zip(grads, ctx.needs)], None, None, None, None, None, None, None,
            None, [None] * len(items), None, None, None, bias_grad)[:len(ctx.needs_input_grad)]


attention_forward_mass.register_autograd(_backward_mass, setup_context=_setup_mass)
