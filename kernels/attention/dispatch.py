"""How an attention op's call runs where the fused kernels can run it (CUDA, or CPU under Triton's interpreter): the
path for the graph (CSR, block-sparse or hybrid, kernels/attention/selector.py) and the kernels of each, the
blocks of rows of a projected backward, the checks of a packed gradient's layout, and where GAT's forward makes
the score-term mass. kernels/attention/op.py defines the ops and falls back to its reference where these return
None.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.attention import csr_backward, csr_chunked, csr_delta, csr_forward
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.kernels.attention.csr_launch import MASS_VARIANTS, MAX_EDGES, SOURCE_CSR_VARIANTS, \
    backward_variant, heads_variant
from gnn_inductor.kernels.attention.layout import Layout, out_dtype, prepare
from gnn_inductor.kernels.runtime import launch, rng
from gnn_inductor.kernels.runtime.roles import ROLE_DST
from gnn_inductor.plan import decisions as plan_decisions
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan.work_items import work_items_op


def fused(args, rowptr: Tensor) -> bool:
    """Whether the fused kernels may run: CUDA tensors, or CPU ones under Triton's interpreter."""
    return rowptr.is_cuda or (launch.INTERPRETED and rowptr.device.type == "cpu")


def check_bias(bias: Tensor, row_shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """A bias has one output row's elements, the output's dtype and its device."""
    if bias.numel() != math.prod(row_shape) or bias.dtype != dtype or bias.device != device:
        raise ValueError(f"attention bias of shape {tuple(bias.shape)} ({bias.dtype}, {bias.device}) does not fit "
                         f"the output rows {tuple(row_shape)} ({dtype}, {device})")


def forward(args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges, dropout,
            bias) -> tuple | None:
    """``(out, lse, biased)`` of the fused kernels, ``biased`` when the CSR kernel added ``bias`` itself (its store's
    epilogue); None where they do not run this call (the reference does)."""
    if not fused(args, rowptr):
        return None
    layout = prepare(args, roles, perm, score_key, message_key, dropout)
    if isinstance(layout, str):
        return None
    decision, items, max_edges = path(layout, args, roles, rowptr, col, perm, score_key, message_key, eps, items,
                                      max_edges)
    if decision is not None and decision.path != "csr":
        out, lse = attention_paths.run_forward(decision, layout, args, roles, rowptr, col, perm, score_key,
                                               message_key, eps, max_edges)
        return message_shaped(layout, out), lse, False
    if bias is not None:
        check_bias(bias, (layout.heads, layout.channels), out_dtype(args), rowptr.device)
    rows = None if bias is None else bias.reshape(layout.heads, layout.channels)
    out, lse = csr_forward.forward(layout, rowptr, col, perm, eps, items, max_edges, bias=rows)
    return message_shaped(layout, out), lse, bias is not None


def message_shaped(layout: Layout, out: Tensor) -> Tensor:
    """The kernels' ``[N, H, C]`` output in the message's shape: ``[N, H * C]`` where the message flattens its
    heads and channels (kernels/attention/forms.py's ``message_width``)."""
    return out if layout.form.message_width is None else out.view(out.shape[0], layout.form.message_width)


def kernel_shaped(layout: Layout, grad_out: Tensor) -> Tensor:
    """An output gradient in the message's shape as the kernels' ``[N, H, C]``."""
    return grad_out if layout.form.message_width is None else \
        grad_out.reshape(grad_out.shape[0], layout.heads, layout.channels)


def csr_backward_of(layout: Layout, grad_out, delta, lse, rowptr, col, perm, needs_grad, items, max_edges,
                    pack=None) -> list:
    """The CSR kernels' backward, with the graph's source CSR where the backward variant reads it (the op's
    backward, and the first call's timing of the CSR path); ``pack`` as :func:`csr_backward.backward`'s."""
    by_src = csr_backward.source_csr(layout, rowptr, col, perm, max_edges) \
        if backward_variant() in SOURCE_CSR_VARIANTS else None
    return csr_backward.backward(layout, grad_out, delta, lse, rowptr, col, perm, needs_grad, items, max_edges,
                                 by_src=by_src, pack=pack)


# The path chooser runs for CUDA tensors (and forced paths anywhere); tests set this to run the automatic choice,
# its first-call timings included, under Triton's interpreter on CPU.
CHOOSE_ON_CPU = False


def path(layout: Layout, args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges) -> tuple:
    """``(decision or None, items, max_edges)``: the attention path for this graph (kernels/attention/selector.py);
    None where only the CSR kernel is considered (CPU under the interpreter unless a path is forced)."""
    if not rowptr.is_cuda and attention_paths.path_setting() == "auto" and not CHOOSE_ON_CPU:
        return None, items, max_edges
    if not items:
        items, max_edges = list(work_items_op(rowptr, col, MAX_EDGES)), MAX_EDGES
    dtype = out_dtype(args)

    needs_grad = [a.is_floating_point() for a in args]

    def forward_fn(candidate, backward=False):
        """The candidate path's forward, and with ``backward`` its backward too (every floating argument's
        gradient, the output as the output gradient, ``D`` computed as the op's backward does): the first call's
        timing of a training step."""
        if candidate.path == "csr":
            out, lse = csr_forward.forward(layout, rowptr, col, perm, eps, items, max_edges)
            if backward:
                csr_backward_of(layout, out, csr_delta.delta(out, out), lse, rowptr, col, perm, needs_grad, items,
                                max_edges)
            return out, lse
        out, lse = attention_paths.run_forward(candidate, layout, args, roles, rowptr, col, perm, score_key,
                                               message_key, eps, max_edges)
        if backward:
            attention_paths.run_backward(candidate, layout, out, csr_delta.delta(out, out), lse, args, roles,
                                         rowptr, col, perm, score_key, message_key, needs_grad, max_edges)
        return out, lse
    return attention_paths.decide(layout, rowptr, col, perm, list(items), dtype, forward_fn), items, max_edges


def backward_kernel(args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges, dropout, delta,
                    lse) -> tuple | None:
    """``(layout, path decision or None, items, max_edges)`` where the fused kernels run this backward, else None
    (the reference recomputes it). ``D`` must be shaped as ``lse`` there (ValueError)."""
    if not fused(args, rowptr):
        return None
    layout = prepare(args, roles, perm, score_key, message_key, dropout)
    if isinstance(layout, str):
        return None
    if tuple(delta.shape) != tuple(lse.shape):
        raise ValueError(f"attention_backward: D of shape {tuple(delta.shape)} for statistics of shape "
                         f"{tuple(lse.shape)}")
    decision, items, max_edges = path(layout, args, roles, rowptr, col, perm, score_key, message_key, eps, items,
                                      max_edges)
    return layout, decision, items, max_edges


def backward(grad_out, args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges, dropout, delta,
             lse, needs_grad, pack=None) -> list | None:
    """The fused kernels' gradients (``attention_backward``'s, None where a gradient is not asked), or None where
    they do not run this backward (the reference does). ``pack`` (argument -> its gradient's place in a packed
    tensor) is given to the CSR kernels and the block-sparse dot-product kernels, which write those gradients there
    where they can (the entry is then that place)."""
    kernel = backward_kernel(args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges, dropout,
                             delta, lse)
    if kernel is None:
        return None
    layout, decision, items, max_edges = kernel
    grad_out = kernel_shaped(layout, grad_out)
    if decision is not None and decision.path != "csr":
        return attention_paths.run_backward(decision, layout, grad_out, delta, lse, args, roles, rowptr, col, perm,
                                            score_key, message_key, needs_grad, max_edges, pack=pack)
    return csr_backward_of(layout, grad_out, delta, lse, rowptr, col, perm, needs_grad, items, max_edges, pack=pack)


def check_pack(args, needs_grad, pack_offsets, pack_width) -> tuple:
    """The packed arguments' indices and the column spans between them (zeroed), after checking that their spans
    lie in ``[0, pack_width)`` without overlapping, with gradients of the same rows and dtype (ValueError
    otherwise: a wrong call must not write an overlapping layout)."""
    if len(pack_offsets) != len(args):
        raise ValueError(f"attention_backward_packed: {len(pack_offsets)} pack offsets for {len(args)} arguments")
    packed = [i for i, offset in enumerate(pack_offsets) if offset >= 0]
    if not packed:
        raise ValueError("attention_backward_packed: no argument is packed")
    spans = sorted((pack_offsets[i], pack_offsets[i] + args[i][0].numel() if args[i].dim() else 1) for i in packed)
    gaps = span_gaps(spans, pack_width)
    if gaps is None:
        raise ValueError(f"attention_backward_packed: column spans {spans} overlap or leave [0, {pack_width})")
    first = args[packed[0]]
    for i in packed:
        if not needs_grad[i] or args[i].dim() < 2 or args[i].shape[0] != first.shape[0] or \
                args[i].dtype != first.dtype:
            raise ValueError(f"attention_backward_packed: argument {i} ({tuple(args[i].shape)}, {args[i].dtype}, "
                             f"needs grad: {needs_grad[i]}) cannot share the packed gradient of argument {packed[0]}")
    return packed, gaps


def span_gaps(spans: list, width: int) -> list | None:
    """The ``(start, end)`` column ranges of ``[0, width)`` that no span of ``spans`` (sorted ``(start, end)``
    pairs) covers, or None when spans overlap or leave ``[0, width)``."""
    gaps, at = [], 0
    for start, end in spans:
        if start < at or end <= start:
            return None
        if start > at:
            gaps.append((at, start))
        at = end
    if at > width:
        return None
    if at < width:
        gaps.append((at, width))
    return gaps


GRAD_CHUNK_ENV = config.SETTINGS["grad_chunk_kb"].env
# rows of the packed gradient per block of attention_backward_projected, in KiB
GRAD_CHUNK_KB = config.default("grad_chunk_kb")
# With the block size left at its default, a packed gradient under GRAD_WHOLE_KB, of a graph under
# GRAD_WHOLE_MAX_ROWS nodes, is made whole (one block): each block costs the host its two passes' launches, three
# products and a stream join, which a host-bound step pays in full. Measured on the H200 (TransformerConv on tu-batch,
# 458,590 nodes, CSR path, interleaved A/B, 100 rounds): TF32, a 672 MiB gradient in 3 blocks, 5.19 ms a step
# against 4.38 whole (1.19x, about 0.4 ms a block); bf16, 336 MiB in 2 blocks, 4.19 against 4.01 (1.05x, 0.18 ms).
# The graphs of 2^20 nodes, where the blocks keep the step's peak down (H100: TransformerConv's 1.5 GiB
# gradient, GATv2Conv's 1 GiB in float32) and the GPU-bound step hides their host cost, keep the 256 MiB blocks at
# every width and precision. The price, estimated, not measured: up to 512 MiB more at the step's peak for a
# gradient between 256 and 768 MiB of a graph under 2^19 nodes.
GRAD_WHOLE_ENV = config.SETTINGS["grad_whole_kb"].env
GRAD_WHOLE_KB = config.default("grad_whole_kb")
GRAD_WHOLE_MAX_ROWS = 1 << 19


def projection_blocks(rows: int, width: int, dtype: torch.dtype) -> list:
    """The row boundaries of ``attention_backward_projected``'s blocks for a packed gradient of ``rows`` x
    ``width`` in ``dtype``: ``[0, rows]``, one block, when it fits ``GNN_IO_GRAD_CHUNK_KB`` or that is 0, or when
    it is under ``GNN_IO_GRAD_WHOLE_KB`` and ``rows`` under :data:`GRAD_WHOLE_MAX_ROWS` (``GNN_IO_GRAD_WHOLE_KB``
    defaults to :data:`GRAD_WHOLE_KB` while ``GNN_IO_GRAD_CHUNK_KB`` is unset, else to 0: a block size set alone
    cuts at that size at any total)."""
    chunk_kb = config.get("grad_chunk_kb")
    chunk_alone = config.is_set("grad_chunk_kb") and not config.is_set("grad_whole_kb")
    whole_kb = 0 if chunk_alone else config.get("grad_whole_kb")
    row_bytes = width * torch.finfo(dtype).bits // 8
    if chunk_kb == 0 or (rows < GRAD_WHOLE_MAX_ROWS and rows * row_bytes < whole_kb << 10):
        return [0, rows]
    return csr_chunked.chunk_bounds(rows, row_bytes, chunk_kb << 10)


def check_projection(rows: int, width: int, dtype: torch.dtype, x: Tensor | None, weight: Tensor | None,
                     bias_dims: int) -> None:
    """The weight, input and bias layout of ``attention_backward_projected`` fit its packed gradient (else
    ValueError)."""
    if weight is not None and (weight.dim() != 2 or weight.shape[0] != width or weight.dtype != dtype):
        raise ValueError(f"attention_backward_projected: weight of shape {tuple(weight.shape)} ({weight.dtype}) for a "
                         f"packed gradient of {width} columns ({dtype})")
    if x is not None and (x.dim() != 2 or x.shape[0] != rows or x.dtype != dtype):
        raise ValueError(f"attention_backward_projected: input of shape {tuple(x.shape)} ({x.dtype}) for a packed "
                         f"gradient of {rows} rows ({dtype})")
    if bias_dims not in (-1, 0, 1):
        raise ValueError(f"attention_backward_projected: bias_dims {bias_dims} (set -1, 0 or 1)")


def chunked_grads(grad_out, args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges,
                  dropout_seed, dropout_p, delta, lse, needs_grad, pack_offsets, pack_width, gaps, dtype, bounds,
                  consume) -> list | None:
    """:func:`csr_chunked.backward_chunked`'s gradients over the blocks of rows ``bounds`` (the packed ones
    None, each block of the packed gradient handed to ``consume``), or None, with nothing computed, where it does
    not run: the kernels or the CSR path's split backward do not run here, or it declines."""
    kernel = backward_kernel(args, roles, rowptr, col, perm, score_key, message_key, eps, items, max_edges,
                             rng.dropout_of(dropout_seed, dropout_p), delta, lse)
    if kernel is None:
        return None
    layout, decision, items, max_edges = kernel
    if decision is not None and decision.path != "csr" or \
            backward_variant() not in SOURCE_CSR_VARIANTS:
        return None
    by_src = csr_backward.source_csr(layout, rowptr, col, perm, max_edges)
    if by_src is None:
        return None
    cache = graph_state.state_of(rowptr, col, perm).slot("csr_by_src")
    return csr_chunked.backward_chunked(layout, kernel_shaped(layout, grad_out), delta, lse, rowptr, col, perm,
                                        needs_grad, items, max_edges, by_src, pack_offsets, pack_width, gaps, dtype,
                                        bounds, consume, cache)


def mass_terms(args, roles, rowptr: Tensor, perm: Tensor, score_key: str, message_key: str) -> list:
    """The indices of the GAT dst-role score terms whose gradients ``attention_forward_mass`` (kernels/attention/op.py)
    gives, or ``[]`` where the plain op runs. It runs where the fused CSR kernels do (CUDA, or CPU under the
    interpreter), for the GAT family with float32 inputs and the all-heads kernel, with TF32 off (where it is on, the
    path chooser may pick the block-sparse kernel, which makes no mass) and the path not forced to another kernel,
    under ``GNN_IO_ATTENTION_BACKWARD`` ``auto`` (unset) or ``mass``; for the arguments that need a gradient, are only
    score terms of one row per destination. Shapes and flags only: the same answer at tracing and at run time."""
    if backward_variant() not in MASS_VARIANTS or not fused(args, rowptr) or \
            heads_variant() != "all" or out_dtype(args) != torch.float32 or \
            any(a.dtype != torch.float32 for a in args if a.is_floating_point()):
        return []
    setting = attention_paths.path_setting()
    if setting not in ("auto", "csr") or (setting == "auto" and plan_decisions.precision_of(torch.float32) != "ieee"):
        return []
    # the layout's checks are of shapes: no dropout needed for them (its seed may be a traced value here)
    layout = prepare(args, roles, perm, score_key, message_key)
    if isinstance(layout, str) or layout.form.family != "gat":
        return []
    form = layout.form
    others = set(form.value_terms) | ({form.query} if form.query is not None else set())
    return [i for i in dict.fromkeys(form.score_terms)
            if roles[i] == ROLE_DST and i not in others and args[i].requires_grad
            and args[i].shape[0] == rowptr.shape[0] - 1]
