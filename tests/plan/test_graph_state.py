"""The per-graph state store (gnn_inductor/plan/state.py): one key, one bound, one invalidation, one report entry."""
from __future__ import annotations

import gc

import pytest
import torch

from gnn_inductor import rewrite_report
from gnn_inductor.plan import state as graph_state


@pytest.fixture(autouse=True)
def _clean():
    graph_state.clear()
    yield
    graph_state.clear()


def _graph(n: int = 10):
    return torch.arange(n + 1), torch.randint(0, n, (3 * n,))


def test_a_state_is_found_again_by_its_tensors_and_by_views_of_them():
    rowptr, col = _graph()
    state = graph_state.state_of(rowptr, col)
    state.get("orders", dict)["rcm"] = 1
    assert graph_state.state_of(rowptr, col) is state
    assert graph_state.state_of(rowptr[:], col.view(-1)) is state  # the same memory, other wrappers
    assert graph_state.known_state(rowptr, col) is state
    other = graph_state.state_of(rowptr.clone(), col)
    assert other is not state and not other.slots


def test_slots_are_built_once():
    rowptr, col = _graph()
    state, built = graph_state.state_of(rowptr, col), []
    for _ in range(3):
        state.get("format", lambda: built.append(1) or "made")
    assert built == [1] and state.slot("per_width") is state.slot("per_width")


def test_an_in_place_change_gives_a_new_state():
    rowptr, col = _graph()
    state = graph_state.state_of(rowptr, col)
    col.add_(0)  # bumps the version counter
    assert graph_state.known_state(rowptr, col) is None
    assert graph_state.state_of(rowptr, col) is not state


def test_a_state_dies_with_its_tensors_and_keeps_no_memory_alive():
    rowptr, col = _graph()
    key = graph_state.key_of((rowptr, col))
    graph_state.state_of(rowptr, col).slots["x"] = torch.ones(4)
    assert key in graph_state._STATES
    del rowptr
    gc.collect()
    assert key not in graph_state._STATES


def test_the_store_is_bounded_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(graph_state, "MAX_GRAPHS", 3)
    graphs = [_graph() for _ in range(4)]
    states = [graph_state.state_of(*g) for g in graphs[:3]]
    graph_state.state_of(*graphs[0])  # used again: the second is now the oldest
    graph_state.state_of(*graphs[3])
    assert graph_state.known_state(*graphs[1]) is None
    assert graph_state.known_state(*graphs[0]) is states[0] and graph_state.known_state(*graphs[2]) is states[2]


def test_inference_tensors_get_a_state_that_is_not_kept():
    with torch.inference_mode():
        rowptr, col = _graph()
    first = graph_state.state_of(rowptr, col)
    assert graph_state.state_of(rowptr, col) is not first and graph_state.known_state(rowptr, col) is None


class _Decision:
    def __init__(self, path):
        self.path = path

    def as_dict(self):
        return {"path": self.path}


def test_decisions_and_the_summary_reach_the_report():
    rowptr, col = _graph()
    state = graph_state.state_of(rowptr, col)
    state.slot("decisions")["gat"] = _Decision("block")
    graph_state.record_decision(state.slots["decisions"]["gat"])
    assert graph_state.decisions() == [{"path": "block"}]
    assert graph_state.summary() == [{"tensors": [[11], [30]], "slots": ["decisions"]}]
    report = rewrite_report.as_json()
    assert report["attention_paths"] == [{"path": "block"}] and report["graph_state"] == graph_state.summary()
    graph_state.forget_decisions()
    assert graph_state.decisions() == [] and "decisions" not in state.slots
