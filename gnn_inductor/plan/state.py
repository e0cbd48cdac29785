"""The run-time half of a graph plan: everything kernels derive from a graph's structure, in one store.

The structure function of a plan (:mod:`gnn_inductor.plan.cache`) builds the tensors a compiled graph gets (CSR,
transposed CSR, work items). What the kernels then derive from those tensors at their first call (hub item
counts and the rows to fill, block formats and node orders, attention path decisions and their timings, the
transposed CSR of the split attention backward, cuSPARSE descriptors and algorithms, measured degree splits) lives
here, in one :class:`GraphState` per graph, under named slots. Kernels receive the state (or a slot of it) as an
argument from their op's selector and keep no per-graph state of their own.

- **One key**: the data pointers, sizes and devices of the structure tensors the state is derived from
  (:func:`state_of`).
- **One invalidation**: a state is valid while the tensors it was built from are alive (weak references: the state
  never keeps a graph's memory alive, and dies with it) and their version counters are unchanged (an in-place
  change of ``edge_index`` builds a new state). Inference tensors have no version counter:
  their state is rebuilt at every call (a plan of them is built anew at every call anyway).
- **One bound**: at most :data:`MAX_GRAPHS` states, least recently used dropped.
- **One place in the report**: :func:`summary` and :func:`decisions` (the path decisions taken, newest last).
"""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from typing import Any, Callable

from torch import Tensor

MAX_GRAPHS = 64   # states alive at once: per graph one for its CSR and one per work-item split; each dies with its tensors
MAX_DECISIONS = 256
# Path decisions logged at INFO: the first few of the process (a model's layers on its graph); later ones, a new graph
# each step in mini-batch training, at DEBUG.
INFO_DECISIONS = 8

log = logging.getLogger(__name__)


def version_of(t: Tensor) -> int | None:
    """``t``'s version counter; None for an inference tensor, which has none (never cache what it derives)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _versions(tensors) -> tuple | None:
    """The version counters of ``tensors``; None where one is an inference tensor."""
    versions = tuple(version_of(t) for t in tensors)
    return None if None in versions else versions


def key_of(tensors) -> tuple:
    """The store's key of the structure tensors ``tensors``: their data pointers, sizes and devices."""
    return tuple((t.data_ptr(), t.numel(), t.device) for t in tensors)


class GraphState:
    """The derived structure of one graph: named slots, each built once by its first user."""

    def __init__(self, tensors: tuple, on_death: Callable | None = None):
        self.refs = tuple(weakref.ref(t, on_death) for t in tensors)
        self.versions = _versions(tensors)
        self.slots: dict = {}

    @property
    def tensors(self) -> tuple:
        """The structure tensors (all alive while the state is in the store)."""
        return tuple(ref() for ref in self.refs)

    def valid(self) -> bool:
        """Whether the tensors it was built from are alive and unchanged. A tensor of the same key is then the same
        memory (the originals hold it), so the state holds for it too (a view, or another wrapper of it)."""
        tensors = self.tensors
        return (self.versions is not None and all(t is not None for t in tensors)
                and _versions(tensors) == self.versions)

    def get(self, name: str, build: Callable[[], Any]):
        """The slot ``name``, built by ``build()`` at its first use."""
        if name not in self.slots:
            self.slots[name] = build()
        return self.slots[name]

    def slot(self, name: str) -> dict:
        """The dict slot ``name`` (created empty at its first use), for state kept per feature width, dtype, ..."""
        return self.get(name, dict)


_STATES: "OrderedDict[tuple, GraphState]" = OrderedDict()
_DECISIONS: list = []
_LOGGED = [0]  # decisions recorded in the process, for INFO_DECISIONS


def state_of(*tensors: Tensor) -> GraphState:
    """The state of the graph whose structure tensors are ``tensors`` (created empty at the first call)."""
    key = key_of(tensors)
    state = _STATES.get(key)
    if state is None or not state.valid():
        state = GraphState(tensors, lambda _ref, key=key: _drop(key))
        if state.versions is None:
            return state  # inference tensors: not kept
        _STATES[key] = state
        while len(_STATES) > MAX_GRAPHS:
            _STATES.popitem(last=False)
    _STATES.move_to_end(key)
    return state


def known_state(*tensors: Tensor) -> GraphState | None:
    """The state of ``tensors`` if one was made for them and is still valid, else None (nothing created)."""
    state = _STATES.get(key_of(tensors))
    return state if state is not None and state.valid() else None


def _drop(key) -> None:
    _STATES.pop(key, None)


def record_decision(decision) -> None:
    """Keep a kernel path decision (an object with ``as_dict()``) for the report."""
    _DECISIONS.append(decision)
    del _DECISIONS[:-MAX_DECISIONS]
    _LOGGED[0] += 1
    level = logging.INFO if _LOGGED[0] <= INFO_DECISIONS else logging.DEBUG
    if log.isEnabledFor(level):
        d = decision.as_dict()
        log.log(level, "%s path (%s): %s, node order %s: %s", d.get("family"), d.get("precision"), d.get("path"),
                d.get("order"), d.get("reason"))


def recorded() -> list:
    """Every decision kept, newest last."""
    return list(_DECISIONS)


def decisions() -> list:
    """Every decision kept, newest last, as dicts (for the report)."""
    return [d.as_dict() for d in _DECISIONS]


def forget_decisions() -> None:
    """Forget the decisions taken (kept formats and orders stay): the next call of each op decides again."""
    for state in _STATES.values():
        state.slots.pop("decisions", None)
    _DECISIONS.clear()


def summary() -> list:
    """One line of facts per graph state alive: its sizes and the slots built (for the report)."""
    return [{"tensors": [list(t.shape) for t in state.tensors if t is not None], "slots": sorted(state.slots)}
            for state in _STATES.values()]


def clear() -> None:
    """Forget every state and decision (tests; a process that wants its memory back)."""
    _STATES.clear()
    _DECISIONS.clear()
