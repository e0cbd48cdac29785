"""Argument roles of the edge-function ops and the CSR-ordered gathers they define.

An *edge function* argument carries a role saying how it reaches an edge ``e = (src -> dst)``:

========== ============================== ==========================================
role       tensor shape                   value seen by edge ``e``
========== ============================== ==========================================
SRC        ``[num_src, *F]``              ``arg[src[e]]``
DST        ``[num_dst, *F]``              ``arg[dst[e]]``
EDGE       ``[num_edges, *F]``            ``arg[e]`` (original edge order)
DENSE      anything broadcastable         ``arg`` (parameters, constants)
========== ============================== ==========================================

Kernels walk edges in CSR order (sorted by destination, stable), given by the plan tensors
``rowptr``, ``col`` (source of each CSR edge), ``row`` (destination of each CSR edge) and
``perm`` (original edge id of each CSR edge).
"""
from __future__ import annotations

from torch import Tensor

ROLE_SRC, ROLE_DST, ROLE_EDGE, ROLE_DENSE = 0, 1, 2, 3


ROLE_NAMES = {ROLE_SRC: "src", ROLE_DST: "dst", ROLE_EDGE: "edge", ROLE_DENSE: "dense"}


REDUCTIONS = ("sum", "mean", "max", "min")


def check_reduce(reduce: str) -> None:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")


def edge_values(args, roles, col: Tensor, row: Tensor, perm: Tensor) -> list:
    """Per-edge values of each argument, in CSR order (see the module docstring)."""
    if len(args) != len(roles):
        raise ValueError(f"got {len(args)} arguments but {len(roles)} roles")
    gathered = []
    for arg, role in zip(args, roles):
        if role == ROLE_SRC:
            gathered.append(arg.index_select(0, col))
        elif role == ROLE_DST:
            gathered.append(arg.index_select(0, row))
        elif role == ROLE_EDGE:
            gathered.append(arg.index_select(0, perm))
        elif role == ROLE_DENSE:
            gathered.append(arg)
        else:
            raise ValueError(f"unknown argument role {role}")
    return gathered


def fake_edge_values(args, roles, num_edges) -> list:
    """Fake-mode counterpart of :func:`edge_values`: right shapes, no data."""
    return [a if r == ROLE_DENSE else a.new_empty((num_edges, *a.shape[1:])) for a, r in zip(args, roles)]
