"""What the attention path tests (tests/kernels/attention/test_attention_paths*.py) share: a fresh plan state and
path settings around every test, a graph of dense communities hidden by a random node order, and the dot family's
calibration without its fixed costs."""
import pytest
import torch
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.plan import state as graph_state


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    graph_state.clear()
    for var in (attention_paths.PATH_ENV, attention_paths.CALLS_ENV, "GNN_IO_REORDER"):
        monkeypatch.delenv(var, raising=False)
    yield
    graph_state.clear()


def community_graph(num_nodes=256, community=16, seed=0):
    """Dense communities hidden by a random node order, plus a few edges between them."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.arange(num_nodes // community).repeat_interleave(community * 8) * community
    a = base + torch.randint(0, community, base.shape, generator=generator)
    b = base + torch.randint(0, community, base.shape, generator=generator)
    a = torch.cat([a, torch.randint(0, num_nodes, (num_nodes // 4,), generator=generator)])
    b = torch.cat([b, torch.randint(0, num_nodes, (num_nodes // 4,), generator=generator)])
    scramble = torch.randperm(num_nodes, generator=generator)
    keys = torch.unique(torch.cat([scramble[a] * num_nodes + scramble[b], scramble[b] * num_nodes + scramble[a]]))
    return keys % num_nodes, keys // num_nodes  # src, dst


def without_fixed_costs(monkeypatch):
    """The dot family's costs by edges, rows and tiles alone: at the tests' sizes the fitted fixed costs (about 2 ms)
    would hide any order's gain under ORDER_MIN_GAIN."""
    for precision in ("ieee", "half"):
        monkeypatch.setitem(attention_paths.CALIBRATION["dot"], precision, {
            "csr_per_edge": 2.0, "csr_per_row": 1.0, "csr_fixed_ms": 0.0,
            "block_per_tile": 20.0, "block_per_row": 1.0, "block_fixed_ms": 0.0})
