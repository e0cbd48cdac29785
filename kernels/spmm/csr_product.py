"""The CSR product ``S A X`` of ``gnn_io::spmm`` on the binding ``GNN_IO_SPMM`` picks.

On CUDA: cuSPARSE through nvmath-python with descriptors, algorithm and workspace kept per graph
(``kernels/spmm/cusparse.py``, float32 only), cuSPARSE through ``torch.sparse`` CSR matmul, or the degree-split
Triton kernel (``kernels/spmm/csr_triton.py``) when the plan carries work items. Every other device runs the
segment-sum reference, exact up to summation order. The block-sparse path (``kernels/spmm/selector.py``) times
itself against this one.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.runtime.reference import segment_reduce
from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
from gnn_inductor.kernels.spmm.common import row_scale, spmm_state
from gnn_inductor.kernels.spmm.csr_triton import triton_spmm
from gnn_inductor.plan.state import GraphState
from gnn_inductor.plan.work_items import WorkItems

def spmm_binding() -> str:
    """The CUDA SpMM binding chosen by ``GNN_IO_SPMM``: ``cusparse`` (default: cuSPARSE through
    nvmath-python with cached descriptors, algorithm and workspace, ``kernels/spmm/cusparse.py``, or
    through ``torch.sparse`` when nvmath-python is missing), ``torch_sparse`` (always ``torch.sparse``)
    or ``triton`` (``kernels/spmm/csr_triton.py``); docs/spmm_binding.md."""
    return config.get("spmm")


def csr_matmul(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, row, items=(), reduce: str = "sum",
               state: GraphState | None = None) -> Tensor:
    """``S A X`` for the CSR matrix (rowptr, col, values) and the row scale of ``reduce``; x
    ``[num_cols, *F]`` (``row`` unused by a sum); ``items`` the Triton work items, if any; ``state`` the graph
    state of ``(rowptr, col)`` (:func:`~gnn_inductor.kernels.spmm.common.spmm_state`) when the caller has it."""
    if items and x.is_cuda:
        return triton_spmm(x, values, rowptr, col, WorkItems(*items), reduce)
    out = csr_matmul_sum(x, values, rowptr, col, row, state)
    scale = row_scale(rowptr, reduce, out)
    return out if scale is None else out * scale


def csr_matmul_sum(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, row,
                   state: GraphState | None = None) -> Tensor:
    """``A X`` (no row scale) on cuSPARSE where it runs, else the segment-sum reference; ``state`` as in
    :func:`csr_matmul`."""
    num_rows = rowptr.numel() - 1
    if x.is_cuda and cusparse_accepts(col.numel(), num_rows, x.shape[0]):
        if _native_cusparse(x):
            state = spmm_state(rowptr, col) if state is None else state
            return spmm_cusparse.cusparse_spmm(x, values, rowptr, col, state.slot("cusparse"))
        matrix = torch.sparse_csr_tensor(rowptr, col, values.to(x.dtype), size=(num_rows, x.shape[0]))
        return (matrix @ x.reshape(x.shape[0], -1)).view(num_rows, *x.shape[1:])
    messages = x.index_select(0, col) * values.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return segment_reduce(messages, row, rowptr, "sum")


def cusparse_accepts(nnz: int, num_rows: int, num_cols: int) -> bool:
    """False where cuSPARSE's ``cusparseCreateCsr`` refuses the matrix: it rejects more stored entries than
    ``num_rows * num_cols`` ("dimension mismatch"), which duplicate edges reach on a tiny graph (20 copies of one
    edge among 4 nodes, measured on the H100). Those graphs run the segment-sum reference instead."""
    return nnz <= num_rows * num_cols


def _native_cusparse(x: Tensor) -> bool:
    # float32 only: measured on the H100, cuSPARSE's CSR_ALG1/ALG2 with bfloat16 operands lose up to 18% on
    # a hub row even with a float32 compute type; half precision keeps the torch.sparse path
    return spmm_binding() == "cusparse" and x.dtype == torch.float32 and spmm_cusparse.available()
