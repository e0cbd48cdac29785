r"""SpMM family: ``Y = A X`` for the sparse, weighted adjacency of a graph plan.

.. math::
    Y_i = s_i \sum_{e = (j \to i)} a_e \, X_j, \qquad
    s_i = 1 \ (\text{reduce='sum'}) \ \text{or} \ 1/\max(1, \deg_i) \ (\text{reduce='mean'})

Shapes: ``x [num_src, *F]``; ``values [E]`` in CSR order (the per-edge weights ``a``; GCN's
``D^-1/2 A D^-1/2`` normalisation or ones, computed by structure nodes the backend hoists into the
graph plan, so once per graph); ``t_values [E]`` the same values in transposed (CSC) order; output
``[num_dst, *F]``. Covers GCNConv, GraphConv (add/mean), SAGEConv (mean/sum), GINConv and any
weighted copy-and-sum.

Backward: ``dX = A^T (s * dY)`` through the cached transposed CSR (no atomics), and when the weights
need it ``da_e = <s_i dY_i, X_j>`` (an SDDMM over the nonzeros).

Kernels: on CUDA, the CSR product of ``kernels/spmm/csr_product.py`` (cuSPARSE, the default, or the
degree-split Triton kernel of ``kernels/spmm/csr_triton.py`` when the plan carries work items,
``items``/``t_items``, built once per graph, ``GNN_IO_SPMM=triton``), or the block-sparse Tensor-Core kernel
where ``kernels/spmm/selector.py`` picks it for the graph; weight gradients use cuSPARSE SDDMM
(``torch.sparse.sampled_addmm``). Every other device runs the segment-sum reference, which is
exact up to summation order. dtype: that of ``x``; values are cast to it, accumulation is float32 on
the Triton path.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor.kernels.runtime.op_layout import contiguous_results, fresh_like
from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
from gnn_inductor.kernels.spmm import selector as spmm_paths
from gnn_inductor.kernels.spmm.common import SPMM_REDUCTIONS, row_scale, spmm_state
from gnn_inductor.kernels.spmm.csr_product import csr_matmul, cusparse_accepts, spmm_binding


def kernel_name(device_type: str, details: dict | None = None) -> str:
    """What the op runs on a device type, for the report."""
    if device_type != "cuda":
        return "segment-sum reference"
    binding = spmm_binding()
    if binding == "triton":
        return "degree-split Triton SpMM, transposed CSR backward"
    if binding == "cusparse" and spmm_cusparse.available():
        name = "cuSPARSE SpMM (nvmath-python: cached descriptors, timed algorithm), transposed CSR backward"
    else:
        name = "cuSPARSE SpMM (torch.sparse CSR), transposed CSR backward"
    return f"{name}; {spmm_paths.kernel_name()}"


def sddmm(left: Tensor, right: Tensor, rowptr: Tensor, col: Tensor, row: Tensor) -> Tensor:
    """``out_e = <left[row_e], right[col_e]>`` summed over all feature dims, in CSR order."""
    if (left.is_cuda and left.dtype in (torch.float32, torch.float64)
            and cusparse_accepts(col.numel(), left.shape[0], right.shape[0])):
        pattern = torch.sparse_csr_tensor(rowptr, col, torch.zeros_like(col, dtype=left.dtype),
                                          size=(left.shape[0], right.shape[0]))
        out = torch.sparse.sampled_addmm(pattern, left.reshape(left.shape[0], -1),
                                         right.reshape(right.shape[0], -1).t(), beta=0.0)
        return out.values()
    return (left.index_select(0, row) * right.index_select(0, col)).flatten(1).sum(1)


def _check(x: Tensor, values: Tensor, col: Tensor, reduce: str) -> None:
    if reduce not in SPMM_REDUCTIONS:
        raise ValueError(f"spmm supports reduce {SPMM_REDUCTIONS}, got {reduce!r}")
    if values.dim() != 1 or values.shape[0] != col.shape[0]:
        raise ValueError(f"values must have shape [{col.shape[0]}] (one per edge), got {tuple(values.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"spmm needs floating point features, got {x.dtype}")


@torch.library.custom_op("gnn_io::spmm", mutates_args=())
@contiguous_results
def spmm(x: Tensor, values: Tensor, t_values: Tensor, rowptr: Tensor, col: Tensor, row: Tensor, t_rowptr: Tensor,
         t_col: Tensor, items: list[Tensor], t_items: list[Tensor], reduce: str) -> Tensor:
    _check(x, values, col, reduce)
    state = _selector_state(x, rowptr, col, items)
    decision = _block_decision(state, x, values, rowptr, col, reduce, (t_values, t_rowptr, t_col))
    if decision is not None:
        return spmm_paths.forward(decision, x, values, rowptr, reduce)
    return csr_matmul(x, values, rowptr, col, row, items, reduce, state)


def _selector_state(x: Tensor, rowptr: Tensor, col: Tensor, items):
    """The graph state of ``(rowptr, col)`` where the selector (``kernels/spmm/selector.py``) picks this call's
    path: on CUDA with the default cuSPARSE binding and no Triton work items, or a forced path under the
    interpreter; else None. Looked up once per call: the cuSPARSE binding keeps its entries there too."""
    if items or spmm_binding() != "cusparse" or not spmm_paths.applies(x):
        return None
    return spmm_state(rowptr, col)


def _block_decision(state, x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str,
                    transposed: tuple | None = None):
    """The block-sparse decision of this plan when the block kernel runs it (``state`` from
    :func:`_selector_state`, None where no path is chosen). ``transposed`` (``(t_values, t_rowptr, t_col)``) lets
    a first decision time the backward too."""
    if state is None:
        return None
    decision = spmm_paths.decide(x, values, rowptr, col, reduce, transposed, state)
    return decision if decision.path == "block" else None


@spmm.register_fake
def _(x, values, t_values, rowptr, col, row, t_rowptr, t_col, items, t_items, reduce):
    return x.new_empty((rowptr.shape[0] - 1, *x.shape[1:]))


@torch.library.custom_op("gnn_io::spmm_backward", mutates_args=())
@contiguous_results
def spmm_backward(grad_out: Tensor, x: Tensor, values: Tensor, t_values: Tensor, rowptr: Tensor, col: Tensor,
                  row: Tensor, t_rowptr: Tensor, t_col: Tensor, t_items: list[Tensor], reduce: str,
                  needs_grad: list[bool]) -> list[Tensor]:
    """``[dX, dvalues]``, an empty tensor where ``needs_grad`` is False."""
    decision = _block_decision(_selector_state(x, rowptr, col, t_items), x, values, rowptr, col, reduce,
                               (t_values, t_rowptr, t_col))
    if decision is not None:
        grad_x, grad_values = spmm_paths.backward(decision, grad_out, x, values, rowptr, reduce, needs_grad)
        return [grad_x if needs_grad[0] else x.new_empty((0,)),
                grad_values.to(values.dtype) if needs_grad[1] else values.new_empty((0,))]
    scale = row_scale(rowptr, reduce, grad_out)
    grad = grad_out if scale is None else grad_out * scale
    grad_x = csr_matmul(grad, t_values, t_rowptr, t_col, None, t_items) if needs_grad[0] else x.new_empty((0,))
    grad_values = sddmm(grad, x, rowptr, col, row).to(values.dtype) if needs_grad[1] else values.new_empty((0,))
    return [grad_x, grad_values]


@spmm_backward.register_fake
def _(grad_out, x, values, t_values, rowptr, col, row, t_rowptr, t_col, t_items, reduce, needs_grad):
    return [fresh_like(x) if needs_grad[0] else x.new_empty((0,)),
            fresh_like(values) if needs_grad[1] else values.new_empty((0,))]


def _setup(ctx, inputs, output):
    x, values, t_values, rowptr, col, row, t_rowptr, t_col, items, t_items, reduce = inputs
    # the backward reads x's values only for the weights' gradient (the SDDMM); without it only x's shape, dtype and
    # device, so a stand-in of one zero row is kept instead, and x is freed when the forward is done with it (GCNConv's
    # ``x @ W``, which no other op saves)
    kept = x if values.requires_grad else _stand_in(x)
    ctx.save_for_backward(kept, values, t_values, rowptr, col, row, t_rowptr, t_col, *t_items)
    ctx.reduce, ctx.num_items = reduce, len(items)


def _stand_in(x: Tensor) -> Tensor:
    """A tensor of ``x``'s shape, dtype and device over one zero row (an expanded view): what the backward of an SpMM
    whose weights need no gradient reads of ``x``."""
    return x.new_zeros((1, *x.shape[1:])).expand(x.shape)


def _backward(ctx, grad_out):
    needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1]]
    x, values, t_values, rowptr, col, row, t_rowptr, t_col, *t_items = ctx.saved_tensors
    grad_x, grad_values = spmm_backward(grad_out, x, values, t_values, rowptr, col, row, t_rowptr, t_col, t_items,
                                        ctx.reduce, needs)
    return (grad_x if needs[0] else None, grad_values if needs[1] else None, *(None,) * 6, [None] * ctx.num_items,
            [None] * len(t_items), None)


spmm.register_autograd(_backward, setup_context=_setup)
