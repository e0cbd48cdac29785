"""GAT's feature GEMM with its attention-vector scores made in the GEMM's epilogue (``gnn_io::linear_scores``).

PyG's GATConv (DGL's likewise) projects the node features, then reduces the projection against each attention
vector (``R`` of them: ``att_src`` and ``att_dst``)::

    h = x @ W^T (+ b)                           # [N, H C]
    score[:, r] = (h.view(N, H, C) * att[r]).sum(-1)    # [N, H]

In float32 with TF32 off, where the GEMM runs in the 3xTF32 kernel (kernels/dense/gemm.py), this op makes both
in one launch: each output tile of ``h`` holds whole heads, and the kernel reduces the tile against ``att`` before
it stores it, so the pass of a separate reduction over ``h`` (0.19 ms at 2^20 nodes and 128 features on the
H100) is gone. The backward has no pass over ``[N, H C]`` either. With ``s = grad_score`` (``[N, R H]``)::

    dh = grad_h + sum_r s_r att_r            # never made
    dx = grad_h @ W + s @ M                   # M[r h] = sum_c att[r, h, c] W[h C + c]   ([R H, F], small)
    dW = grad_h^T x + E (s^T x)               # E[h C + c, r h] = att[r, h, c]
    datt[r, h, c] = (s^T x)[r h] . W[h C + c] (+ b[h C + c] sum_n s[n, r h])
    db = sum_n grad_h + sum_r att_r sum_n s_r

``dx`` is one tall launch with a second inner range of ``R H`` columns (``mm_extra``); ``dW`` and the small ``s^T
x`` come from one split launch that reads ``x`` once (``mm_side``). Eager's backward adds ``s att`` into the
gradient of ``h`` (a read and a write of ``[N, H C]``) and reduces ``s * h`` over the nodes (a read of ``h``).

Elsewhere (another device, a product below the kernel's thresholds, TF32 allowed) the same products run in ATen.
They reassociate eager's sums (``(s^T x) W^T`` for ``s^T (x W^T)``): within float32 rounding of eager,
``docs/dense.md`` has the measured error. The backward never reads ``h``, so the op does not keep it: the GEMM's
``[N, H C]`` output can be freed as soon as the attention's backward is done with it. (A version that kept ``h``
measured GATConv's step memory 0.2 GiB above the unfused graph's on the H100; this one is checked on the CPU and
under the interpreter, and its step memory on a GPU is not measured yet.)
Half-precision inputs take eager's formulas, with ``h`` made again in the backward.
"""
from __future__ import annotations

import torch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results, fresh_like

from gnn_inductor.kernels.dense import gemm as dense_triton


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, att: Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_scores: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply")
    if att.dim() != 3 or att.shape[1] * att.shape[2] != weight.shape[0]:
        raise ValueError(f"linear_scores: att must be [R, H, C] with H C = {weight.shape[0]}, got {tuple(att.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear_scores: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if len({t.dtype for t in (x, weight, att, *(() if bias is None else (bias,)))}) != 1:
        raise TypeError("linear_scores: x, weight, bias and att must share one dtype")


def runs_fused(rows: int, features: int, width: int, count: int, heads: int, dtype: torch.dtype,
               device_type: str) -> bool:
    """Whether the 3xTF32 kernel with the score epilogue runs ``[rows, features] -> [rows, width]`` with ``count``
    vectors of ``heads`` heads: float32 on the kernels' device with TF32 off, a tall product by the kernel's
    thresholds, heads of a power-of-two width, at most ``MAX_SCORES`` scores per row. The op asks at each call, the
    graph pass (gnn_inductor/passes/score_fold.py) at compile time with the graph's sizes."""
    return (dtype == torch.float32 and dense_triton.shape_kind(rows, features, width) == "tall"
            and count * heads <= dense_triton.MAX_SCORES and width % heads == 0
            and dense_triton.score_launch(width, width // heads) is not None
            and dense_triton.kernel_device(device_type) and dense_triton.float32_exact()
            and dense_triton.setting() == "x3")


def fused(x: Tensor, weight: Tensor, att: Tensor) -> bool:
    """:func:`runs_fused` for these operands (one dtype and device)."""
    return (x.dim() == 2 and x.dtype == weight.dtype and x.device == weight.device
            and runs_fused(x.shape[0], x.shape[1], weight.shape[0], att.shape[0], att.shape[1], x.dtype,
                           x.device.type))


def reference_scores(h: Tensor, att: Tensor) -> Tensor:
    """``[N, R, H]``: each ``att[r]`` against ``h`` per head, as eager reduces it."""
    heads, channels = att.shape[1], att.shape[2]
    by_head = h.view(h.shape[0], heads, channels)
    return torch.stack([(by_head * a).sum(-1) for a in att], dim=1)


@torch.library.custom_op("gnn_io::linear_scores", mutates_args=())
@contiguous_results
def linear_scores(x: Tensor, weight: Tensor, bias: Tensor | None, att: Tensor) -> tuple[Tensor, Tensor]:
    """``(h, score)``: ``h = x @ weight^T (+ bias)`` (``[N, H C]``) and ``score[:, r] = (h.view(N, H, C) *
    att[r]).sum(-1)`` (``[N, R, H]``)."""
    _check(x, weight, bias, att)
    if fused(x, weight, att):
        return dense_triton.linear_scores(x, weight, bias, att)
    h = torch.nn.functional.linear(x, weight, bias)
    return h, reference_scores(h, att)


@linear_scores.register_fake
def _(x, weight, bias, att):
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty((x.shape[0], att.shape[0], att.shape[1]))


@torch.library.custom_op("gnn_io::linear_scores_backward", mutates_args=())
@contiguous_results
def linear_scores_backward(grad_h: Tensor, grad_score: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None,
                           att: Tensor) -> list[Tensor]:
    """``[dx, dW, db, datt]`` (``db`` empty without a bias). In float32 and float64, by the products of the module
    docstring (the 3xTF32 kernels where they take them, else ATen), which never read ``h``: the forward's features
    are not kept for this backward. In half precision as eager does, ``h`` made again (the graph pass never puts
    the op there: the reassociated sums would round further from float32 than eager's)."""
    rows, features = x.shape
    count, heads, channels = att.shape
    width = heads * channels
    scores = grad_score.reshape(rows, count * heads)
    if x.dtype in (torch.float32, torch.float64):
        extra = torch.einsum("rhc,hcf->rhf", att, weight.view(heads, channels, features)).reshape(count * heads,
                                                                                                  features)
        grad_x = dense_triton.mm_extra(grad_h, weight, scores, extra)
        grad_w, side = dense_triton.mm_side(grad_h.t(), x, scores.t())
        side = side.view(count, heads, features)
        grad_w = (grad_w + torch.einsum("rhc,rhf->hcf", att, side).reshape(width, features)).contiguous()
        grad_att = torch.einsum("rhf,hcf->rhc", side, weight.view(heads, channels, features)).contiguous()
        if bias is None:
            return [grad_x, grad_w, x.new_empty((0,)), grad_att]
        score_sums = grad_score.sum(0)  # [R, H]
        grad_att += score_sums[..., None] * bias.view(1, heads, channels)
        grad_b = grad_h.sum(0) + (score_sums[..., None] * att).sum(0).reshape(width)
        return [grad_x, grad_w, grad_b, grad_att]
    h = torch.nn.functional.linear(x, weight, bias)
    grad = grad_h + torch.einsum("nrh,rhc->nhc", grad_score, att).reshape(rows, width)
    grad_att = torch.einsum("nrh,nhc->rhc", grad_score, h.view(rows, heads, channels)).contiguous()
    # contiguous, as the fake kernel says
    return [grad @ weight, (grad.t() @ x).contiguous(), grad.sum(0) if bias is not None else x.new_empty((0,)),
            grad_att]


@linear_scores_backward.register_fake
def _(grad_h, grad_score, x, weight, bias, att):
    return [fresh_like(x), fresh_like(weight),
            fresh_like(bias) if bias is not None else x.new_empty((0,)), fresh_like(att)]


def _setup(ctx, inputs, output):
    x, weight, bias, att = inputs
    ctx.save_for_backward(x, weight, bias, att)  # not h: the backward's products never read it


def _backward(ctx, grad_h, grad_score):
    x, weight, bias, att = ctx.saved_tensors
    if grad_h is None:
        grad_h = x.new_zeros((x.shape[0], weight.shape[0]))
    if grad_score is None:
        grad_score = x.new_zeros((x.shape[0], att.shape[0], att.shape[1]))
    grad_x, grad_w, grad_b, grad_att = linear_scores_backward(grad_h.contiguous(), grad_score.contiguous(), x, weight,
                                                              bias, att)
    needs = ctx.needs_input_grad
    return (grad_x if needs[0] else None, grad_w if needs[1] else None,
            grad_b if bias is not None and needs[2] else None, grad_att if needs[3] else None)


linear_scores.register_autograd(_backward, setup_context=_setup)
