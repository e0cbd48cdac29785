"""One compiled layer called on a sequence of awkward graphs, against eager at every call.

The zoo (test_pyg_zoo.py) checks each layer on one graph. Here a single compiled model meets graphs of other sizes
and shapes in turn: no edges, one edge, only self loops, every edge into one node or out of one node, one edge
repeated, isolated nodes at the end of the node range, and a random graph with a hub, visited twice. So the
recompiles (a static graph, then dynamic shapes, Dynamo's specialisations of 0 and 1 edges) and the plan's
rebuilds are checked too, with ``dynamic=None`` (the default) and ``dynamic=True``, on CPU (the rewrites'
reference ops) and on CUDA where there is one (the kernels, every rewrite forced). Outputs and the gradients of
the input and of every parameter, float32 at 1e-5; every call must keep the layer's rewrite family (where a
graph is compiled at all) and no graph may be left to Inductor by a backend failure.
"""
import copy

import pytest
import torch
from torch_geometric.nn import (
    EdgeConv, GATConv, GATv2Conv, GCNConv, GeneralConv, GINConv, GraphConv, SAGEConv, TransformerConv,
)

from gnn_inductor import rewrite_report
from gnn_inductor.testing import _assert_close, _step, random_graph

FEATURES = 8


def _graphs() -> list:
    star = 40
    return [
        ("random_hub", random_graph(30, 80, seed=5, hub_degree=30, num_isolated=3), 30),
        ("star_in", torch.stack([torch.arange(1, star), torch.zeros(star - 1, dtype=torch.long)]), star),
        ("no_edges", torch.empty(2, 0, dtype=torch.long), 5),
        ("tail_isolated", random_graph(10, 30, seed=1, num_isolated=1), 20),  # nodes 10-19 have no edges
        ("random_hub", random_graph(30, 80, seed=5, hub_degree=30, num_isolated=3), 30),
        ("duplicates_only", torch.tensor([[1] * 20, [2] * 20]), 4),
        ("star_out", torch.stack([torch.zeros(star - 1, dtype=torch.long), torch.arange(1, star)]), star),
        ("self_loops_only", torch.arange(6).repeat(2, 1), 6),
        ("one_edge", torch.tensor([[0], [1]]), 4),
    ]


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))


LAYERS = {
    "gcn": (lambda: GCNConv(FEATURES, 6), "spmm"),
    "sage_mean": (lambda: SAGEConv(FEATURES, 6), "spmm"),
    "sage_max": (lambda: SAGEConv(FEATURES, 6, aggr="max"), "gather_scatter"),
    "sage_multi": (lambda: SAGEConv(FEATURES, 6, aggr=["mean", "max", "min"]), "gather_scatter"),
    "graphconv_max": (lambda: GraphConv(FEATURES, 6, aggr="max"), "gather_scatter"),
    "gin": (lambda: GINConv(_mlp()), "spmm"),
    "gat": (lambda: GATConv(FEATURES, 3, heads=2), "attention"),
    "gatv2": (lambda: GATv2Conv(FEATURES, 3, heads=2), "attention"),
    "transformer": (lambda: TransformerConv(FEATURES, 3, heads=2), "attention"),
    # gathered rows times a weight: the GEMM moves before the gather where edges outnumber nodes at the compiled
    # example's sizes, so the graphs compiled for 0 and 1 edge (Dynamo specialises both), and the dynamic graph
    # when the 39-edge star with 40 nodes triggered it, keep the edge GEMM: their max reduces a computed edge
    # tensor alone, left to Inductor, and the report's gather_linear near miss says why
    "edge_conv": (lambda: EdgeConv(torch.nn.Linear(2 * FEATURES, 6), aggr="max"), "gather_scatter"),
    "general_max": (lambda: GeneralConv(FEATURES, 6, aggr="max"), "gather_scatter"),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU"))])
@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_one_compiled_layer_across_awkward_graphs(name, dynamic, device, monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")  # the rewrites on CPU (their reference ops), not Inductor's
    monkeypatch.setenv("GNN_IO_FORCE", "1")  # CUDA: small graphs the cost model would leave to Inductor
    make, family = LAYERS[name]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="gnn_io", dynamic=dynamic)
    first = len(rewrite_report.reports())
    for call, (graph, edge_index, num_nodes) in enumerate(_graphs()):
        edge_index = edge_index.to(device)
        x = torch.randn(num_nodes, FEATURES, device=device)
        got = _step(compiled, [x.clone().requires_grad_(), edge_index], True, call, {})
        want = _step(reference, [x.clone().requires_grad_(), edge_index], True, call, {})
        _assert_close(f"{graph}: output", got[0][0], want[0][0])
        for (param, a), (_, e) in zip(got[1], want[1]):
            if a is not None or e is not None:
                _assert_close(f"{graph}: grad of {param}", a, e)
        _assert_close(f"{graph}: grad of x", got[2][0], want[2][0])
    reports = rewrite_report.reports()[first:]
    text = "\n".join(rewrite_report.format_text_for(reports))
    assert not any(m.pattern == "backend" for r in reports for m in r.near_misses), text
    assert len(reports) >= 2, text  # the static graph, then at least one more
    assert any(w.pattern == family for w in reports[0].rewrites), text
    for report in reports[1:]:  # the family, or (edge-GEMM layers, see LAYERS) the report's reason it is not there
        assert any(w.pattern == family for w in report.rewrites) or (
            name in ("edge_conv", "general_max")
            and any(m.pattern == "gather_linear" and "stays one GEMM over the edges" in m.reason
                    for m in report.near_misses)), text
