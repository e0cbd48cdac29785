"""DGL fixtures: the shared test graph (isolated nodes, self loops, duplicate edges, a hub) as a
DGLGraph. Every test here is skipped when DGL is not installed (``pip install -e .[dgl]``)."""
import pytest

from gnn_inductor.frontends.dgl import import_dgl


def load_dgl():
    """``dgl`` through the frontend's import, or skip the calling module when it is not installed."""
    try:
        return import_dgl()
    except ImportError as exc:
        pytest.skip(f"dgl is not installed ({exc})", allow_module_level=True)


@pytest.fixture(autouse=True)
def strict_backend(monkeypatch):
    """A backend error fails the test with its traceback instead of a silent Inductor fallback."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")


@pytest.fixture
def dgl_graph(graph):
    """A fresh DGLGraph per test (tests write node and edge data into it)."""
    dgl = load_dgl()
    src, dst = graph.edge_index
    return dgl.graph((src, dst), num_nodes=graph.num_nodes)
