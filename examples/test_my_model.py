"""Guard your own model's rewrites in its tests: ``pytest examples/test_my_model.py``.

``gnn_inductor.testing.check_rewrites`` compiles the model with ``backend="gnn_io"``, runs it and an eager copy
twice (the second call reuses the graph plan), compares outputs and gradients within the dtype's tolerance, and
asserts how many times each pattern was rewritten. A change to the model (or to PyG, or to torch) that stops a
rewrite, or makes it compute something else, fails here rather than showing up as a slow or wrong training run.

``random_graph`` makes a small graph with the cases kernels get wrong: isolated nodes, self loops, duplicate
edges and, with ``hub_degree``, a node of high in-degree. On the CPU the cost model leaves every aggregation to
Inductor, so the tests set ``GNN_IO_CPU_REWRITE=1`` to take the rewrites (the ops' exact reference code) and
``GNN_IO_STRICT=1`` to raise where the backend would otherwise fall back to Inductor quietly.
"""
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, SAGEConv

from gnn_inductor.testing import check_rewrites, random_graph


class MyModel(torch.nn.Module):
    """Your model: here a GAT layer, then a max-aggregating GraphSAGE layer."""

    def __init__(self, in_channels: int, hidden: int = 8, heads: int = 2, out_channels: int = 4):
        super().__init__()
        self.attend = GATConv(in_channels, hidden, heads=heads)
        self.pool = SAGEConv(hidden * heads, out_channels, aggr="max")

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.pool(F.elu(self.attend(x, edge_index)), edge_index)


@pytest.fixture(autouse=True)
def take_the_rewrites(monkeypatch):
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")


def test_my_model_is_rewritten_and_matches_eager():
    torch.manual_seed(0)
    edge_index = random_graph(50, 200, hub_degree=20)
    x = torch.randn(50, 16)
    result = check_rewrites(MyModel(16), x, edge_index, expect={"attention": 1, "gather_scatter": 1, "near_miss": 0})
    assert result.counts["attention"] == 1  # result.counts, .near_misses and .report say what happened


def test_my_model_in_eval_mode_without_gradients():
    torch.manual_seed(0)
    edge_index = random_graph(50, 200)
    check_rewrites(MyModel(16).eval(), torch.randn(50, 16), edge_index, grad=False,
                   expect={"attention": 1, "gather_scatter": 1})
