"""Linear maps of gathered rows moved before the gather (gnn_inductor/passes/gather_linear.py): which GEMMs move, the
moved graph computes the same values, and PyG layers whose messages start with a linear layer (GeneralConv,
CGConv, EdgeConv, PointNetConv, PNAConv) stay correct, gradients included, with their aggregation then fused."""
import pytest
import torch
import torch_geometric.nn as pyg
from torch.fx.experimental.proxy_tensor import make_fx

from gnn_inductor import config, pipeline
from gnn_inductor.passes import gather_linear
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import tiered

aten = torch.ops.aten
N, E, F_IN, F_OUT = 12, 50, 6, 5


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _gemm_rows(gm) -> list:
    return [n.meta["val"].shape[0] for n in gm.graph.nodes if n.op == "call_function"
            and n.target in (aten.mm.default, aten.addmm.default)]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, F_IN, generator=g), torch.randint(0, N, (E,), generator=g),
            torch.randint(0, N, (E,), generator=g), torch.randn(E, 3, generator=g))


CASES = {
    # (function of x, src, dst, e, W, b; GEMMs moved, how many node-level GEMMs afterwards)
    "gathered": (lambda x, s, d, e, w, b: torch.addmm(b, x.index_select(0, s), w.t()), 1),
    "cat_with_edge": (lambda x, s, d, e, w, b: torch.addmm(
        b, torch.cat([x.index_select(0, d), x.index_select(0, s), e], -1), w.t()), 2),
    "difference": (lambda x, s, d, e, w, b: torch.mm(
        torch.cat([x.index_select(0, d), x.index_select(0, s) - x.index_select(0, d)], -1), w.t()), 2),
}
WIDTHS = {"gathered": F_IN, "cat_with_edge": 2 * F_IN + 3, "difference": 2 * F_IN}


@pytest.mark.parametrize("name", list(CASES))
def test_moves_the_gemm_to_node_rows_and_keeps_the_value(name):
    fn, node_gemms = CASES[name]
    x, src, dst, e = _inputs()
    w, b = torch.randn(F_OUT, WIDTHS[name]), torch.randn(F_OUT)
    gm = make_fx(fn, tracing_mode="fake")(x, src, dst, e, w, b)
    moved = gather_linear.move_linears_before_gathers(gm)
    assert len(moved) == 1 and moved[0]["gathers"] == node_gemms
    rows = _gemm_rows(gm)
    assert rows.count(N) == node_gemms and rows.count(E) == (1 if name == "cat_with_edge" else 0), rows
    assert aten.cat.default not in _targets(gm)
    torch.testing.assert_close(gm(x, src, dst, e, w, b), fn(x, src, dst, e, w, b), **tolerance(torch.float32))


@pytest.mark.parametrize("case", ["fewer_edges", "half_split", "not_a_gather", "weight_computed"])
def test_leaves_gemms_it_should_not_move(case):
    """Fewer gathered rows than source rows, a half-precision GEMM that would be split into partial products,
    a GEMM of edge tensors alone and a weight computed in the graph stay as they are."""
    x, src, dst, e = _inputs()
    w, b = torch.randn(F_OUT, F_IN), torch.randn(F_OUT)
    if case == "fewer_edges":
        src = src[:N - 2]
        fn = lambda x, s, d, e, w, b: torch.addmm(b, x.index_select(0, s), w.t())  # noqa: E731
    elif case == "half_split":
        x, e, w, b = x.bfloat16(), e.bfloat16(), torch.randn(F_OUT, 2 * F_IN).bfloat16(), b.bfloat16()
        fn = lambda x, s, d, e, w, b: torch.mm(torch.cat([x.index_select(0, d), x.index_select(0, s)], -1), w.t())  # noqa: E731,E501
    elif case == "not_a_gather":
        w = torch.randn(F_OUT, 3)
        fn = lambda x, s, d, e, w, b: torch.addmm(b, e, w.t())  # noqa: E731
    else:
        fn = lambda x, s, d, e, w, b: torch.addmm(b, x.index_select(0, s), (w * 2).t())  # noqa: E731
    gm = make_fx(fn, tracing_mode="fake")(x, src, dst, e, w, b)
    kept = []
    assert gather_linear.move_linears_before_gathers(gm, kept) == []
    # only the size rule's GEMM is listed for the report (a near miss saying the graph is too small to move it)
    assert [(k["edges"], k["rows"]) for k in kept] == ([(N - 2, N)] if case == "fewer_edges" else [])


def test_switch(monkeypatch):
    monkeypatch.setenv(gather_linear.ENV, "0")
    assert not pipeline.switched_on("gather_linear", config.snapshot())
    monkeypatch.setenv(gather_linear.ENV, "yes")
    with pytest.raises(ValueError, match=gather_linear.ENV):
        config.snapshot()


DEGREE = torch.tensor([3, 10, 8, 5, 2])
LAYERS = {
    # name: (layer, needs edge_attr / pos, gather_linear moves, gather_scatter rewrites)
    "general_max": (lambda: pyg.GeneralConv(8, 8, aggr="max"), None, 1, 1),
    "general_add": (lambda: pyg.GeneralConv(8, 8, aggr="add"), None, 1, 1),
    "cg": (lambda: pyg.CGConv(8, dim=4), "edge", 2, 1),
    "edge_conv": (lambda: pyg.EdgeConv(torch.nn.Linear(16, 8), aggr="max"), None, 1, 1),
    "edge_conv_mlp": (lambda: pyg.EdgeConv(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                                               torch.nn.Linear(8, 8)), aggr="max"), None, 1, 0),
    "point_net": (lambda: pyg.PointNetConv(torch.nn.Sequential(torch.nn.Linear(11, 8), torch.nn.ReLU())), "pos",
                  1, 1),
    "pna": (lambda: pyg.PNAConv(8, 8, ["mean", "min", "max", "std"], ["identity", "amplification"], DEGREE,
                                edge_dim=4), "edge", 1, 1),
}


@pytest.mark.parametrize("name", tiered(list(LAYERS), ["edge_conv"]))
def test_pyg_layers_move_their_message_linear(name, monkeypatch):
    """Outputs and every gradient against eager PyG on a graph with a hub, self loops, duplicate edges and
    isolated nodes; with the move the per-edge math left is fused with its aggregation where one follows."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    make, extra, moves, fused = LAYERS[name]
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    x = torch.randn(40, 8)
    args = (x, edge_index)
    if extra == "edge":
        args = (x, edge_index, torch.randn(edge_index.shape[1], 4))
    elif extra == "pos":
        args = (x, torch.randn(40, 3), edge_index)
    check_rewrites(make(), *args, expect={"gather_linear": moves, "gather_scatter": fused})
    monkeypatch.setenv(gather_linear.ENV, "0")
    check_rewrites(make(), *args, expect={"gather_linear": 0})
