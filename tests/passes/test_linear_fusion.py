"""One GEMM for the linear maps of a shared input (gnn_inductor/passes/linear_fusion.py): which maps are fused, the
fused graph computes the same values, and the layers that have such maps stay correct, gradients included."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_geometric.nn import GATConv, GATv2Conv, SAGEConv, TransformerConv

from gnn_inductor import config, pipeline
from gnn_inductor.passes import linear_fusion
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import tiered_at

aten = torch.ops.aten


def _maps(x, y, w1, w2, w3, w4, w5, w6, b1, b2, b3, w7):
    a = torch.nn.functional.linear(x, w1, b1)      # fused with b, c (same x, bias)
    b = torch.nn.functional.linear(x, w2, b2)
    c = torch.nn.functional.linear(x, w3, b3)
    d = torch.nn.functional.linear(x, w4)          # fused with e, f (same x, no bias)
    e = torch.nn.functional.linear(x, w5)
    f = torch.nn.functional.linear(x, w6)
    g = torch.nn.functional.linear(y, w7)          # alone: another input
    h = torch.nn.functional.linear(y, w7 * 2)      # same input as g, but its weight is computed: not a member
    return a, b, c, d, e, f, g, h


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(7, 5), torch.randn(7, 5), torch.randn(3, 5), torch.randn(4, 5), torch.randn(2, 5),
            torch.randn(6, 5), torch.randn(1, 5), torch.randn(2, 5), torch.randn(3), torch.randn(4), torch.randn(2),
            torch.randn(3, 5)]


def test_groups_by_input_and_bias_and_keeps_the_values():
    inputs = _inputs()
    gm = make_fx(_maps, tracing_mode="fake")(*inputs)
    expected = _maps(*inputs)
    groups = linear_fusion.fuse_shared_input_linears(gm, config.snapshot())
    assert sorted(g["widths"] for g in groups) == [[3, 4, 2], [6, 1, 2]]
    matmuls = [n for n in gm.graph.nodes if n.target in (aten.mm.default, aten.addmm.default)]
    assert len(matmuls) == 4  # two fused GEMMs, and the other input's two maps
    for got, want in zip(gm(*inputs), expected):
        torch.testing.assert_close(got, want, **tolerance(torch.float32, "reassociated"))


def test_groups_below_the_minimum_stay_apart():
    def two_maps(x, w1, w2):
        return torch.nn.functional.linear(x, w1), torch.nn.functional.linear(x, w2)

    gm = make_fx(two_maps, tracing_mode="fake")(torch.randn(4, 3), torch.randn(2, 3), torch.randn(5, 3))
    assert linear_fusion.MIN_GROUP == 3
    assert linear_fusion.fuse_shared_input_linears(gm, config.snapshot()) == []


@pytest.mark.parametrize("make, maps, setting", tiered_at([
    (lambda: TransformerConv(12, 5, heads=3), ["query", "key", "value"], "1"),  # skip: not saved, kept apart
    (lambda: TransformerConv(12, 5, heads=3), ["query", "key", "value", "skip"], "all"),
    (lambda: TransformerConv(12, 5, heads=2, root_weight=False), ["query", "key", "value"], "1"),
], [1]))
def test_layers_with_shared_input_maps_are_fused_and_correct(make, maps, setting, monkeypatch):
    monkeypatch.setenv(linear_fusion.ENV, setting)
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    x = torch.randn(40, 12, requires_grad=True)
    result = check_rewrites(make(), x, edge_index, expect={"attention": 1, "shared_input_linears": 1})
    fused = [r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "shared_input_linears"]
    assert fused[0]["details"]["weights"] == [f"lin_{m}.weight" for m in maps]


@pytest.mark.parametrize("make", tiered_at([lambda: GATConv(12, 5, heads=3), lambda: SAGEConv(12, 7, aggr="max")], [1]))
def test_layers_without_shared_input_maps_are_left_alone(make):
    torch.manual_seed(0)
    check_rewrites(make(), torch.randn(40, 12), random_graph(40, 200), expect={"shared_input_linears": 0})


def test_two_maps_feeding_attention_are_fused_and_their_gradients_packed(monkeypatch):
    """GATv2Conv's two maps both feed the attention op, whose backward then writes the packed gradient (no
    concatenation to pay for): fused from two maps (ATTENTION_MIN_GROUP), correct with every gradient; with packed
    gradients off, or a minimum of 3 set, they stay apart."""
    import gnn_inductor

    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    model = GATv2Conv(12, 5, heads=3)
    result = check_rewrites(model, torch.randn(40, 12), edge_index, expect={"attention": 1, "shared_input_linears": 1})
    fused = [r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "shared_input_linears"]
    assert fused[0]["details"]["weights"] == ["lin_l.weight", "lin_r.weight"]
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1
    for env, value in (("GNN_IO_PACKED_GRADS", "0"), (linear_fusion.MIN_GROUP_ENV, "3")):
        monkeypatch.setenv(env, value)
        check_rewrites(GATv2Conv(12, 5, heads=3), torch.randn(40, 12), edge_index,
                       expect={"attention": 1, "shared_input_linears": 0})
        monkeypatch.delenv(env)
    monkeypatch.setenv(linear_fusion.MIN_GROUP_ENV, "1")
    with pytest.raises(ValueError, match=linear_fusion.MIN_GROUP_ENV):
        linear_fusion.min_group([], config.snapshot())


def test_switched_off_by_its_environment_variable(monkeypatch):
    monkeypatch.setenv(linear_fusion.ENV, "0")
    torch.manual_seed(0)
    check_rewrites(TransformerConv(12, 5, heads=3), torch.randn(40, 12), random_graph(40, 200),
                   expect={"attention": 1, "shared_input_linears": 0})
    monkeypatch.setenv(linear_fusion.ENV, "yes")
    with pytest.raises(ValueError, match="GNN_IO_FUSE_LINEARS"):
        pipeline.switched_on("shared_input_linears", config.snapshot())
    monkeypatch.setenv(linear_fusion.ENV, "0")
    assert not pipeline.switched_on("shared_input_linears", config.snapshot())


def test_only_maps_read_by_a_gnn_io_op_are_fused_when_others_are_not():
    """Three maps feed a gnn_io op (saved for its backward), the fourth only an addition: the fourth stays a
    GEMM of its own, so its output is not kept alive by the fused buffer."""
    def layer(x, w1, w2, w3, w4):
        q, k, v = (torch.nn.functional.linear(x, w) for w in (w1, w2, w3))
        out = torch.zeros(q.shape)
        torch.ops.gnn_io.addmm_into(out, q, k.t())
        torch.ops.gnn_io.addmm_into(out, v, k.t())
        return out + torch.nn.functional.linear(x, w4)

    import gnn_inductor.kernels.dense.ops  # noqa: F401  (registers gnn_io::addmm_into)
    inputs = [torch.randn(6, 4)] + [torch.randn(6, 4) for _ in range(4)]
    gm = make_fx(layer, tracing_mode="fake")(*inputs)
    expected = layer(*inputs)
    (group,) = linear_fusion.fuse_shared_input_linears(gm, config.snapshot())
    assert group["widths"] == [6, 6, 6]
    torch.testing.assert_close(gm(*inputs), expected)
