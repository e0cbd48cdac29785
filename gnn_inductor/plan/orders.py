"""Node reordering as a per-graph policy: candidate orders, kernel-aware scores, and the decision.

A graph arrives as its CSR by destination (``rowptr[N + 1]``, ``col[E]``, the ``csr_plan`` layout)
over one node set (sources and destinations are the same ``N`` nodes). An *order* is a permutation
``order[N]``: ``order[p]`` is the original id of the node placed at position ``p``; its inverse
``inverse[v]`` is the position of original node ``v``. A reordered graph has rows and columns
relabelled, ``A' = P A P^T`` with ``A'[p, q] = A[order[p], order[q]]``, so

    out = A x    <=>    out[order] = A' x[order]    <=>    out = (A' x[order])[inverse].

Candidates (:data:`CANDIDATES`): ``none`` (identity), ``degree`` (in-degree, descending, stable),
``rcm`` (reverse Cuthill-McKee of the symmetrised pattern, scipy, on the CPU) and, only when the
maintained ``pymetis`` binding is importable, ``partition`` (METIS parts, original order inside a
part). Scores and the policy are defined in ``docs/reordering.md``; :func:`choose_order` returns
a :class:`ReorderDecision` with every statistic, for the rewrite report.

``GNN_IO_REORDER=auto|off|<candidate>`` forces the policy (``off`` and ``none`` never reorder; a
candidate name always applies that order).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import Tensor
from gnn_inductor import config
from gnn_inductor.config import SettingError
from gnn_inductor.kernels.runtime import progress
from gnn_inductor.plan.decisions import sync

log = logging.getLogger(__name__)

# Block-sparse format: rows in windows of TILE_ROWS, each window's distinct source columns
# condensed and cut into tiles of TILE_COLS.
TILE_ROWS = 16
TILE_COLS = 16
# Neighbour-parallel CSR kernels: rows run concurrently in windows of CSR_ROW_WINDOW and source
# rows are counted by blocks of CSR_SOURCE_BLOCK consecutive ids (see docs/reordering.md).
CSR_ROW_WINDOW = 32
CSR_SOURCE_BLOCK = 32
# METIS parts of about this many nodes (dense communities of tens of nodes fit in one part).
PARTITION_NODES = 64

# Predicted-gain model, one line per kernel family: (statistic the kernel's time is assumed
# proportional to, nanoseconds per unit of it per call). ASSUMED, not measured: to be calibrated
# on the device (forward + backward, 128 features) and kept here.
GAIN_MODEL = {
    "block_sparse": ("tiles", 2.0),
    "csr": ("neighbour_blocks", 1.0),
}
# An order is kept only when it cuts the kernel's statistic by at least this fraction: below
# that the predicted gain is within the model's error and could be a loss.
MIN_RELATIVE_GAIN = 0.05

ENV_VAR = config.SETTINGS["reorder"].env


def _check_csr(rowptr: Tensor, col: Tensor) -> int:
    num_nodes = rowptr.numel() - 1
    if num_nodes < 0:
        raise ValueError("rowptr must have num_nodes + 1 entries, got an empty tensor")
    if int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr[-1] ({int(rowptr[-1])}) differs from the number of columns ({col.numel()})")
    if col.numel() and int(col.max()) >= num_nodes:
        raise ValueError(f"col has values >= num_nodes (max {int(col.max())}, num_nodes {num_nodes}); "
                         "reordering needs one node set for sources and destinations")
    return num_nodes


def _csr_rows(rowptr: Tensor) -> Tensor:
    """Destination row of each CSR edge."""
    num_nodes = rowptr.numel() - 1
    degree = (rowptr[1:] - rowptr[:-1]).long()
    return torch.repeat_interleave(torch.arange(num_nodes, device=rowptr.device), degree)


def inverse_order(order: Tensor) -> Tensor:
    """``inverse[order[p]] = p``."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device, dtype=order.dtype)
    return inverse


# ---------------------------------------------------------------------------------------------
# Candidate orders. Each returns ``order`` (new position -> original id), int64, on rowptr's device.

def identity_order(rowptr: Tensor, col: Tensor) -> Tensor:
    return torch.arange(rowptr.numel() - 1, device=rowptr.device)


def degree_order(rowptr: Tensor, col: Tensor) -> Tensor:
    """Nodes by in-degree, highest first; ties keep the original order."""
    degree = rowptr[1:] - rowptr[:-1]
    return torch.sort(degree, descending=True, stable=True).indices


def _scipy_sparse():
    """scipy.sparse with csgraph loaded (imported on first use: a one-time process cost that
    :func:`_build` keeps out of an order's build time)."""
    import scipy.sparse as sp
    import scipy.sparse.csgraph  # noqa: F401

    return sp


def _symmetric_pattern(rowptr: Tensor, col: Tensor):
    """``A + A^T`` as a scipy CSR matrix of ones (duplicates merged), on the CPU."""
    import numpy as np

    sp = _scipy_sparse()

    num_nodes = rowptr.numel() - 1
    indptr = rowptr.cpu().numpy().astype(np.int64)
    indices = col.cpu().numpy().astype(np.int64)
    adjacency = sp.csr_matrix((np.ones(indices.size, dtype=np.int32), indices, indptr),
                              shape=(num_nodes, num_nodes))
    pattern = (adjacency + adjacency.T).tocsr()
    pattern.sum_duplicates()
    pattern.data[:] = 1
    return pattern


def rcm_order(rowptr: Tensor, col: Tensor) -> Tensor:
    """Reverse Cuthill-McKee of the symmetrised pattern (scipy.sparse.csgraph), computed on the
    CPU and returned on rowptr's device."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    order = reverse_cuthill_mckee(_symmetric_pattern(rowptr, col), symmetric_mode=True)
    return torch.from_numpy(order.astype("int64")).to(rowptr.device)


def _pymetis():
    try:
        import pymetis
    except ImportError:
        return None
    return pymetis


def partition_order(rowptr: Tensor, col: Tensor) -> Tensor:
    """METIS parts of about :data:`PARTITION_NODES` nodes (``pymetis``), parts one after another,
    original order inside a part."""
    import numpy as np

    pymetis = _pymetis()
    if pymetis is None:
        raise ImportError("the 'partition' order needs pymetis (pip install pymetis)")
    num_nodes = rowptr.numel() - 1
    if num_nodes < 2 * PARTITION_NODES:
        return identity_order(rowptr, col)
    num_parts = math.ceil(num_nodes / PARTITION_NODES)
    pattern = _symmetric_pattern(rowptr, col)
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    _, membership = pymetis.part_graph(num_parts, xadj=pattern.indptr.astype(np.int64),
                                       adjncy=pattern.indices.astype(np.int64))
    part = torch.as_tensor(np.asarray(membership, dtype=np.int64))
    return torch.sort(part, stable=True).indices.to(rowptr.device)


CANDIDATES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "none": identity_order,
    "degree": degree_order,
    "rcm": rcm_order,
    "partition": partition_order,
}


def available_candidates() -> list[str]:
    """Candidate names whose dependencies are importable here."""
    return [name for name in CANDIDATES if name != "partition" or _pymetis() is not None]


# ---------------------------------------------------------------------------------------------
# Round trip.

def permute_csr(rowptr: Tensor, col: Tensor, order: Tensor,
                inverse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """CSR of ``A' = P A P^T``: rows and columns relabelled by ``order``.

    Returns ``(rowptr', col', edge_perm)``; ``edge_perm[e']`` is the CSR position in the input of
    edge ``e'`` of the output (per-edge values follow as ``values[edge_perm]``). Edges of a row
    keep their input order, so sums walk each row's edges in the same order as before."""
    if inverse is None:
        inverse = inverse_order(order)
    new_rows = inverse.index_select(0, _csr_rows(rowptr))
    edge_perm = torch.sort(new_rows, stable=True).indices
    new_col = inverse.index_select(0, col.long().index_select(0, edge_perm))
    degree = (rowptr[1:] - rowptr[:-1]).index_select(0, order)
    new_rowptr = torch.zeros_like(rowptr)
    torch.cumsum(degree, 0, out=new_rowptr[1:])
    return new_rowptr, new_col.to(col.dtype), edge_perm


def to_order(node_tensor: Tensor, order: Tensor) -> Tensor:
    """Node tensor (first dimension = original ids) in the reordered numbering."""
    return node_tensor.index_select(0, order)


def from_order(node_tensor: Tensor, inverse: Tensor) -> Tensor:
    """Node tensor in the reordered numbering back to the original ids."""
    return node_tensor.index_select(0, inverse)


# ---------------------------------------------------------------------------------------------
# Scores.

def _distinct_pairs(window: Tensor, column: Tensor, num_columns: int) -> Tensor:
    """Number of distinct ``column`` values per ``window``, over windows that have edges."""
    keys = torch.unique(window * num_columns + column)
    return torch.unique_consecutive(keys // num_columns, return_counts=True)[1]


def tile_stats(rowptr: Tensor, col: Tensor) -> dict:
    """Block-sparse statistics: rows in windows of TILE_ROWS; each window's distinct source columns
    condensed and cut into tiles of TILE_COLS. ``tiles = sum_w ceil(distinct_w / TILE_COLS)``;
    ``tile_fill = nonzeros / (tiles * TILE_ROWS * TILE_COLS)`` with ``nonzeros`` the distinct
    (row, column) pairs (duplicate edges share one tile cell)."""
    num_nodes = rowptr.numel() - 1
    col = col.long()
    if col.numel() == 0:
        return {"tiles": 0, "nonzeros": 0, "tile_fill": 0.0}
    rows = _csr_rows(rowptr)
    nonzeros = int(torch.unique(rows * num_nodes + col).numel())
    distinct = _distinct_pairs(rows // TILE_ROWS, col, num_nodes)
    tiles = int(((distinct + TILE_COLS - 1) // TILE_COLS).sum())
    return {"tiles": tiles, "nonzeros": nonzeros,
            "tile_fill": nonzeros / (tiles * TILE_ROWS * TILE_COLS)}


def locality_stats(rowptr: Tensor, col: Tensor) -> dict:
    """Neighbour locality for neighbour-parallel CSR kernels: rows in windows of CSR_ROW_WINDOW,
    sources in blocks of CSR_SOURCE_BLOCK consecutive ids. ``neighbour_blocks`` is the number of
    distinct (row window, source block) pairs, i.e. the source blocks each window of concurrently
    running rows has to fetch; ``block_ratio = neighbour_blocks / edges`` (lower is better, 1 when
    every edge reads its own block); ``source_reuse = distinct (window, source) / edges`` counts
    source rows read once per window (1 when no two rows of a window share a neighbour)."""
    num_nodes = rowptr.numel() - 1
    col = col.long()
    edges = col.numel()
    if edges == 0:
        return {"neighbour_blocks": 0, "block_ratio": 0.0, "source_reuse": 0.0}
    window = _csr_rows(rowptr) // CSR_ROW_WINDOW
    num_blocks = (num_nodes + CSR_SOURCE_BLOCK - 1) // CSR_SOURCE_BLOCK
    blocks = int(_distinct_pairs(window, col // CSR_SOURCE_BLOCK, num_blocks).sum())
    sources = int(_distinct_pairs(window, col, num_nodes).sum())
    return {"neighbour_blocks": blocks, "block_ratio": blocks / edges, "source_reuse": sources / edges}


def bandwidth(rowptr: Tensor, col: Tensor) -> int:
    """``max |row - col|`` over the edges (0 for a graph without edges)."""
    if col.numel() == 0:
        return 0
    return int((_csr_rows(rowptr) - col.long()).abs().max())


def kernel_stats(rowptr: Tensor, col: Tensor, kernel: str) -> dict:
    """The statistics that predict ``kernel``'s cost on this CSR (see :data:`GAIN_MODEL`)."""
    if kernel == "block_sparse":
        return tile_stats(rowptr, col)
    if kernel == "csr":
        return locality_stats(rowptr, col)
    raise ValueError(f"unknown kernel family {kernel!r}; expected one of {sorted(GAIN_MODEL)}")


# ---------------------------------------------------------------------------------------------
# Policy.

@dataclass
class ReorderDecision:
    """What :func:`choose_order` decided and why. ``name`` is the order applied ("none" when no
    reordering); ``candidate`` the best-scoring candidate considered; ``scores`` the kernel's cost
    statistic per candidate (lower is better), ``stats`` all statistics per candidate,
    ``build_ms`` the measured (or given) cost of building and applying each order,
    ``predicted_gain_ms`` the gain of ``candidate`` over ``expected_calls`` calls."""
    name: str
    kernel: str
    applied: bool
    reason: str
    expected_calls: int
    candidate: str = "none"
    scores: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    build_ms: dict = field(default_factory=dict)
    predicted_gain_ms: float = 0.0
    order: Optional[Tensor] = field(default=None, repr=False)
    inverse: Optional[Tensor] = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """JSON-ready summary for the rewrite report (no tensors)."""
        return {"name": self.name, "kernel": self.kernel, "applied": self.applied, "reason": self.reason,
                "expected_calls": self.expected_calls, "candidate": self.candidate,
                "scores": dict(self.scores), "stats": {k: dict(v) for k, v in self.stats.items()},
                "build_ms": {k: round(v, 3) for k, v in self.build_ms.items()},
                "predicted_gain_ms": round(self.predicted_gain_ms, 3)}


def load_libraries(name: str) -> None:
    """Import what the candidate ``name`` needs before its build is timed: a one-time process cost, not a
    per-graph one (scipy.sparse.csgraph took 0.7 s cold on a 2-core machine; on the H200 a plan's
    first RCM build timed 1272 ms with it against 358-374 ms for the next four plans; charged to the graph, that
    load made the policy take the degree order)."""
    if name in ("rcm", "partition"):
        _scipy_sparse()
    if name == "partition":
        _pymetis()


def _build(name: str, rowptr: Tensor, col: Tensor):
    """Order, inverse and permuted CSR of one candidate, with the milliseconds it took (library
    imports excluded: they are paid once per process, not per graph)."""
    load_libraries(name)
    sync(rowptr.device)
    start = time.perf_counter()
    order = CANDIDATES[name](rowptr, col)
    inverse = inverse_order(order)
    permuted = permute_csr(rowptr, col, order, inverse)
    sync(rowptr.device)
    seconds = time.perf_counter() - start
    progress.done(log, f"node order {name!r} ({col.numel():,} edges)", seconds)
    return order, inverse, permuted, seconds * 1e3


def forced_order() -> Optional[str]:
    value = config.get("reorder")
    if value == "partition" and _pymetis() is None:
        raise SettingError(f"{ENV_VAR}=partition needs pymetis (pip install pymetis), or choose one of "
                           f"{[v for v in config.SETTINGS['reorder'].choices if v != 'partition']}")
    return None if value == "auto" else value


def choose_order(rowptr: Tensor, col: Tensor, kernel: str, expected_calls: int,
                 build_cost_ms: Union[None, float, dict] = None) -> ReorderDecision:
    """Pick the node order for ``kernel`` ("block_sparse" or "csr") on the CSR ``(rowptr, col)``.

    Rule (``GNN_IO_REORDER=auto``): the best candidate by the kernel's statistic (GAIN_MODEL) is
    applied when it cuts that statistic by at least MIN_RELATIVE_GAIN and
    ``expected_calls * gain_per_call_ms > build_ms``; ``gain_per_call_ms`` is the statistic's drop
    against "none" times the model's nanoseconds per unit. ``build_cost_ms`` replaces the measured
    build cost (one number for all candidates, or a dict by name), e.g. a device measurement."""
    if kernel not in GAIN_MODEL:
        raise ValueError(f"unknown kernel family {kernel!r}; expected one of {sorted(GAIN_MODEL)}")
    _check_csr(rowptr, col)
    forced = forced_order()
    if forced in ("off", "none"):
        return ReorderDecision("none", kernel, False, f"{ENV_VAR}={forced}", expected_calls)
    if forced is None and expected_calls <= 1:
        return ReorderDecision("none", kernel, False,
                               f"expected_calls={expected_calls}: one call cannot repay building an order",
                               expected_calls)

    names = [forced] if forced else available_candidates()
    statistic, ns_per_unit = GAIN_MODEL[kernel]
    baseline = kernel_stats(rowptr, col, kernel)
    decision = ReorderDecision("none", kernel, False, "", expected_calls,
                               scores={"none": baseline[statistic]}, stats={"none": baseline},
                               build_ms={"none": 0.0})
    built = {}
    for name in names:
        if name == "none":
            continue
        order, inverse, (new_rowptr, new_col, _), elapsed = _build(name, rowptr, col)
        stats = kernel_stats(new_rowptr, new_col, kernel)
        built[name] = (order, inverse)
        decision.stats[name] = stats
        decision.scores[name] = stats[statistic]
        if isinstance(build_cost_ms, dict):
            elapsed = build_cost_ms.get(name, elapsed)
        elif build_cost_ms is not None:
            elapsed = float(build_cost_ms)
        decision.build_ms[name] = elapsed
    if not built:
        decision.reason = "no candidate besides 'none'"
        return decision

    best = min(built, key=lambda name: (decision.scores[name], decision.build_ms[name]))
    saved = baseline[statistic] - decision.scores[best]
    decision.candidate = best
    decision.predicted_gain_ms = expected_calls * saved * ns_per_unit * 1e-6
    build_ms = decision.build_ms[best]
    if forced:
        apply, reason = True, f"forced by {ENV_VAR}={forced}"
    elif baseline[statistic] == 0 or saved < MIN_RELATIVE_GAIN * baseline[statistic]:
        apply, reason = False, (f"best order '{best}' cuts {statistic} by {saved} of {baseline[statistic]}, "
                                f"less than {MIN_RELATIVE_GAIN:.0%}")
    elif decision.predicted_gain_ms <= build_ms:
        apply, reason = False, (f"predicted gain {decision.predicted_gain_ms:.3f} ms over {expected_calls} calls "
                                f"does not repay the build ({build_ms:.3f} ms) of '{best}'")
    else:
        apply, reason = True, (f"predicted gain {decision.predicted_gain_ms:.3f} ms over {expected_calls} calls "
                               f"beats the build ({build_ms:.3f} ms) of '{best}'")
    decision.applied, decision.reason = apply, reason
    if apply:
        decision.name = best
        decision.order, decision.inverse = built[best]
    return decision
