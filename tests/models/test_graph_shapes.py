"""One compiled layer called on a sequence of awkward graphs, against eager at every call.

The zoo (test_pyg_zoo.py) checks each layer on one graph. Here a single compiled model meets graphs of other sizes
and shapes in turn: no edges, one edge, only self loops, every edge into one node or out of one node, one edge
repeated, isolated nodes at the end of the node range, and a random graph with a hub, visited twice. So the
recompiles (a static graph, then dynamic shapes, Dynamo's specialisations of 0 and 1 edges) and the plan's
rebuilds are checked too, with ``dynamic=None`` (the default) and ``dynamic=True``, on CPU (the rewrites'
reference ops) and on CUDA where there is one (the kernels, every rewrite forced). Outputs and the gradients of
the input and of every parameter, float32 at 1e-5; every call must keep the layer's rewrite family (where a
graph is compiled at all) and no graph may be left to Inductor by a backend failure. Bipartite layers meet
bipartite graphs of the same kinds (more sources than destinations and the reverse, one of either), and layers with
an edge weight or edge features meet the graphs above with them, whose gradients are checked too.
"""
import copy

import pytest
import torch
from torch_geometric.nn import (
    EdgeConv, GATConv, GATv2Conv, GCNConv, GeneralConv, GINConv, GINEConv, GraphConv, SAGEConv, TransformerConv,
)

from gnn_inductor import rewrite_report
from gnn_inductor.testing import assert_close_to_reference, forward_backward, gradient_scale, random_graph
from tests.tiers import tiered

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


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "dynamic"), tiered(
    [(name, dynamic) for name in LAYERS for dynamic in (None, True)],
    [("gcn", None), ("gat", None)]))
def test_one_compiled_layer_across_awkward_graphs(name, dynamic, device, monkeypatch):
    make, family = LAYERS[name]
    _check_across(name, make, family, dynamic, device, _graph_calls(None), monkeypatch)


def _bipartite_graphs() -> list:
    """(name, edge_index, source count, destination count): more sources than destinations and the reverse, one
    destination with every edge, one source, no edges, one edge repeated, a graph visited twice."""
    generator = torch.Generator().manual_seed(0)

    def random(num_src, num_dst, num_edges):
        return torch.stack([torch.randint(0, num_src, (num_edges,), generator=generator),
                            torch.randint(0, num_dst, (num_edges,), generator=generator)])

    wide = random(50, 7, 80)
    return [
        ("many_sources", wide, 50, 7),
        ("one_destination", torch.stack([torch.arange(30), torch.zeros(30, dtype=torch.long)]), 30, 1),
        ("one_source", torch.stack([torch.zeros(9, dtype=torch.long), torch.arange(9)]), 1, 12),
        ("no_edges", torch.empty(2, 0, dtype=torch.long), 4, 6),
        ("many_destinations", random(6, 40, 60), 6, 40),
        ("duplicates_only", torch.tensor([[2] * 25, [1] * 25]), 3, 2),
        ("many_sources", wide, 50, 7),
    ]


EDGE_DIM = 3
# (make, family, extra input): "bipartite" takes (x_src, x_dst); "weight" an edge weight per edge, "edge_attr"
# EDGE_DIM features per edge (their gradients are checked too)
INPUT_LAYERS = {
    "sage_mean_bipartite": (lambda: SAGEConv((FEATURES, FEATURES), 6), "spmm", "bipartite"),
    "sage_max_bipartite": (lambda: SAGEConv((FEATURES, FEATURES), 6, aggr="max"), "gather_scatter", "bipartite"),
    "gat_bipartite": (lambda: GATConv((FEATURES, FEATURES), 3, heads=2, add_self_loops=False), "attention",
                      "bipartite"),
    "gatv2_bipartite": (lambda: GATv2Conv((FEATURES, FEATURES), 3, heads=2, add_self_loops=False), "attention",
                        "bipartite"),
    "transformer_bipartite": (lambda: TransformerConv((FEATURES, FEATURES), 3, heads=2), "attention", "bipartite"),
    "gcn_weight": (lambda: GCNConv(FEATURES, 6), "spmm", "weight"),
    "graphconv_weight": (lambda: GraphConv(FEATURES, 6), "spmm", "weight"),
    "gat_edge_attr": (lambda: GATConv(FEATURES, 3, heads=2, edge_dim=EDGE_DIM), "attention", "edge_attr"),
    "gatv2_edge_attr": (lambda: GATv2Conv(FEATURES, 3, heads=2, edge_dim=EDGE_DIM), "attention", "edge_attr"),
    "transformer_edge_attr": (lambda: TransformerConv(FEATURES, 3, heads=2, edge_dim=EDGE_DIM), "attention",
                              "edge_attr"),
    "gine_edge_attr": (lambda: GINEConv(torch.nn.Linear(FEATURES, 6), edge_dim=EDGE_DIM), "gather_scatter",
                       "edge_attr"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "dynamic"), tiered(
    [(name, dynamic) for name in INPUT_LAYERS for dynamic in (None, True)],
    [("gine_edge_attr", None)]))
def test_bipartite_and_edge_input_layers_across_awkward_graphs(name, dynamic, device, monkeypatch):
    """The same for bipartite layers (source and destination features of their own sizes) and for layers with an
    edge weight or edge features, whose gradients are compared too."""
    make, family, extra = INPUT_LAYERS[name]
    if extra == "bipartite":
        generator = torch.Generator().manual_seed(1)
        calls = [(graph, [torch.randn(num_src, FEATURES, generator=generator),
                          torch.randn(num_dst, FEATURES, generator=generator)], edge_index, [])
                 for graph, edge_index, num_src, num_dst in _bipartite_graphs()]
    else:
        calls = _graph_calls(extra)
    _check_across(name, make, family, dynamic, device, calls, monkeypatch)


def _layer(name: str) -> tuple:
    """(make, family, extra input) of a layer of LAYERS (no extra input) or INPUT_LAYERS."""
    return LAYERS[name] + (None,) if name in LAYERS else INPUT_LAYERS[name]


def _graph_calls(extra) -> list:
    """_check_across's calls over _graphs(), with an edge weight or edge features where ``extra`` asks for them.
    The inputs come from their own seeded generator, so a test's inputs do not depend on the tests run before it."""
    generator = torch.Generator().manual_seed(1)

    def edge_inputs(num_edges):
        if extra == "weight":
            return [torch.rand(num_edges, generator=generator) + 0.1]
        return [torch.randn(num_edges, EDGE_DIM, generator=generator)] if extra == "edge_attr" else []
    return [(graph, [torch.randn(num_nodes, FEATURES, generator=generator)], edge_index,
             edge_inputs(edge_index.shape[1])) for graph, edge_index, num_nodes in _graphs()]


HALF_LAYERS = ["gcn", "sage_max", "gin", "gat", "gatv2", "transformer", "gat_edge_attr", "transformer_edge_attr",
               "gine_edge_attr"]
HALF_CASES = [("bfloat16", "cpu")] + [
    pytest.param(dtype, "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))
    for dtype in ("bfloat16", "float16")]


@pytest.mark.parametrize(("dtype", "device"), HALF_CASES)
@pytest.mark.parametrize("name", tiered(HALF_LAYERS, ["gcn"]))
def test_half_precision_layers_across_awkward_graphs(name, dtype, device, monkeypatch):
    """The awkward graphs in bfloat16 and float16 (the precision where ``torch.compile`` default crashed on
    GATConv): each call's outputs and gradients within twice eager's own half-precision error of float32.

    GATConv's LeakyReLU has a kink at score 0: a score within rounding of 0 can take the other slope in the compiled
    model (whose scores are float32 sums of half-precision projections) or in eager (half-precision sums), and the
    gradients then differ by that edge's whole contribution. About 1 of 30 random draws of the hub
    graph's inputs did that to GATConv with edge features in bfloat16 (a 10% error in its weight gradient, eager
    under 1%). The inputs here are seeded (``_graph_calls``), so the test is deterministic, but a change in how the
    scores round can flip one such score and fail it: check the scores near 0 before suspecting the kernels."""
    make, family, extra = _layer(name)
    _check_across(name, make, family, None, device, _graph_calls(extra), monkeypatch, getattr(torch, dtype))


CUDA_GRAPH_LAYERS = ["gcn", "sage_mean", "sage_max", "gin", "gat", "gatv2", "transformer", "gat_edge_attr",
                     "gcn_weight"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(CUDA_GRAPH_LAYERS, ["sage_max"]))
def test_cuda_graphs_across_awkward_graphs(name, device, monkeypatch):
    """The awkward graphs under ``GNN_IO_CUDAGRAPHS=1``: every new graph is a plan met while Inductor's CUDA graph
    trees record (or skip) a graph, with sizes that change from call to call. On CPU there is no recording, but
    graphs whose plan has data-dependent sizes take the same path: compiled at each graph's concrete sizes."""
    make, family, extra = _layer(name)
    _check_across(name, make, family, None, device, _graph_calls(extra), monkeypatch, cuda_graphs=True)


def _check_across(name, make, family, dynamic, device, calls, monkeypatch, dtype=torch.float32, cuda_graphs=False):
    """Compile ``make()`` once and call it on each ``(graph, node features, edge_index, edge inputs)`` of ``calls``
    (two node feature tensors: a bipartite ``(x_src, x_dst)``), against eager: outputs, parameter gradients and
    the gradients of every node and edge input; then the report's rewrites (module docstring). A half precision
    ``dtype`` runs the compiled model and an eager copy in it, against an eager float32 copy: the compiled results
    may be at most twice as far from float32 as eager's own (``assert_close_to_reference``). ``cuda_graphs``
    compiles with ``GNN_IO_CUDAGRAPHS=1`` and marks a step's start before each compiled call, as a training loop
    would."""
    if cuda_graphs:
        monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")  # the rewrites on CPU (their reference ops), not Inductor's
    monkeypatch.setenv("GNN_IO_FORCE", "1")  # CUDA: small graphs the cost model would leave to Inductor
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device)
    reference = copy.deepcopy(model)
    baseline = copy.deepcopy(model).to(dtype) if dtype != torch.float32 else None
    model = model.to(dtype)
    compiled = torch.compile(model, backend="gnn_io", dynamic=dynamic)
    first = len(rewrite_report.reports())
    for call, (graph, nodes, edge_index, edge_inputs) in enumerate(calls):
        results = []
        for module, module_dtype in ((compiled, dtype), (reference, torch.float32), (baseline, dtype)):
            if module is None:
                results.append((None, [], []))
                continue
            leaves = [t.detach().to(device, module_dtype).requires_grad_() for t in (*nodes, *edge_inputs)]
            x = leaves[0] if len(nodes) == 1 else tuple(leaves[:2])
            if cuda_graphs and module is compiled:
                torch.compiler.cudagraph_mark_step_begin()
            step_inputs = [x, edge_index.to(device), *leaves[len(nodes):]]
            outputs, params, _ = forward_backward(module, step_inputs, True, call, {})
            results.append((outputs[0], params, [leaf.grad for leaf in leaves]))
        (got, got_params, got_inputs), (want, want_params, want_inputs), (base, base_params, base_inputs) = results
        base_params = base_params or [(None, None)] * len(got_params)
        base_inputs = base_inputs or [None] * len(got_inputs)
        assert_close_to_reference(f"{graph}: output", got, want, base)
        scale = gradient_scale([e for _, e in want_params] + want_inputs)
        for (param, a), (_, e), (_, b) in zip(got_params, want_params, base_params):
            if a is not None or e is not None:
                assert_close_to_reference(f"{graph}: grad of {param}", a, e, b, scale)
        for i, (a, e, b) in enumerate(zip(got_inputs, want_inputs, base_inputs)):
            if e is None:  # an input eager gives no gradient (no edges use it): none or zeros here
                assert a is None or not a.any(), f"{graph}: input {i} has a gradient eager does not give"
            else:
                assert_close_to_reference(f"{graph}: grad of input {i}", a, e, b, scale)
    reports = rewrite_report.reports()[first:]
    text = "\n".join(rewrite_report.format_text_for(reports))
    assert not any(m.pattern == "backend" for r in reports for m in r.near_misses), text
    assert len(reports) >= 2, text  # the static graph, then at least one more
    assert any(w.pattern == family for w in reports[0].rewrites), text
    for report in reports[1:]:  # the family, or (edge-GEMM layers, see LAYERS) the report's reason it is not there
        if {e.pattern for e in (*report.rewrites, *report.near_misses)} == {"buckets"}:
            continue  # the padding decision for a graph of changing sizes (CUDA graphs on CUDA): the graph it pads
            # or declines to pad has its own report
        # PyG's GATConv returns its scores unnormalised where there are no edges (no softmax to match): a graph
        # compiled for 0 edges (Dynamo specialises them) holds a plain aggregation
        edgeless = bool(report.rewrites) and all((w.graph_stats or {}).get("edges") == 0 for w in report.rewrites)
        assert any(w.pattern == family for w in report.rewrites) or (family == "attention" and edgeless) or (
            name in ("edge_conv", "general_max")
            and any(m.pattern == "gather_linear" and "stays one GEMM over the edges" in m.reason
                    for m in report.near_misses)), text
