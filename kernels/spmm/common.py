"""What the SpMM family's op, kernels and selector share: the reductions, the row scale of ``reduce='mean'`` and
the per-graph state the family keeps its decisions and cuSPARSE entries in."""
from __future__ import annotations

from torch import Tensor

from gnn_inductor.plan import state as graph_state

SPMM_REDUCTIONS = ("sum", "mean")


def row_scale(rowptr: Tensor, reduce: str, like: Tensor) -> Tensor | None:
    """``s_i`` of ``Y_i = s_i sum_e a_e X_j``: None for a sum, ``1 / max(1, deg_i)`` for a mean, in ``like``'s
    dtype and shaped to broadcast over ``like``'s trailing dims."""
    if reduce == "sum":
        return None
    deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(like.dtype)
    return deg.reciprocal().view(-1, *([1] * (like.dim() - 1)))


def spmm_state(rowptr: Tensor, col: Tensor) -> graph_state.GraphState:
    """The graph state (gnn_inductor/plan/state.py) of the CSR ``(rowptr, col)``: the selector's path decisions
    (slot ``decisions``) and the cuSPARSE binding's descriptors (slot ``cusparse``)."""
    return graph_state.state_of(rowptr, col, col)
