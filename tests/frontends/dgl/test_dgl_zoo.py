"""DGL layers compiled with ``gnn_io``: the same rewrites as their PyG twins (tests/models/test_pyg_zoo.py).

Each case compiles an unmodified ``dgl.nn.pytorch`` layer (or user code on ``update_all`` /
``apply_edges`` / ``dgl.ops``), compares outputs and all gradients with eager DGL at float32
tolerance (``check_rewrites``), and asserts exactly which rewrites fired.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.frontends.dgl.conftest import load_dgl
from tests.tiers import tiered

dgl = load_dgl()
from dgl import function as fn
from dgl.nn.pytorch import (
    DotGatConv,
    EdgeConv,
    GATConv,
    GATv2Conv,
    GINConv,
    GraphConv,
    SAGEConv,
)

from gnn_inductor.testing import check_rewrites, tolerance

OUT_CHANNELS = 6
FAMILIES = ("spmm", "gather_scatter", "edge_softmax", "attention")


def only(**counts) -> dict:
    """Exact counts for every pattern family: those named, and 0 for the others; no near misses."""
    return {family: counts.get(family, 0) for family in FAMILIES} | {"near_miss": 0}


def rewrites(result, pattern: str) -> list:
    return [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == pattern]


def reductions(result, pattern: str) -> list:
    return [w["details"]["reduce"] for w in rewrites(result, pattern)]


# ---------------------------------------------------------------------------------------------
# GraphConv, SAGEConv, GINConv
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "edge_weight"])
@pytest.mark.parametrize("norm", ["both", "right", "none"])
def test_graph_conv(graph, dgl_graph, norm, weighted):
    torch.manual_seed(0)
    # isolated nodes have in-degree 0: DGL refuses them unless told they are fine
    model = GraphConv(graph.in_channels, OUT_CHANNELS, norm=norm, allow_zero_in_degree=True)
    kwargs = {"edge_weight": graph.edge_weight} if weighted else {}
    result = check_rewrites(model, dgl_graph, graph.x, expect=only(spmm=1), **kwargs)
    (rewrite,) = rewrites(result, "spmm")
    assert rewrite["details"] == {"reduce": "sum", "weighted": weighted}
    # the report points at the DGL layer that holds the aggregation
    assert rewrite["layer"].endswith("dgl/nn/pytorch/conv/graphconv.py:" + rewrite["layer"].rsplit(":", 1)[1])


@pytest.mark.parametrize("aggregator,family,reduce", [
    ("mean", "spmm", "mean"),
    ("gcn", "spmm", "sum"),
    ("pool", "gather_scatter", "max"),
])
def test_sage_conv(graph, dgl_graph, aggregator, family, reduce):
    torch.manual_seed(0)
    model = SAGEConv(graph.in_channels, OUT_CHANNELS, aggregator)
    result = check_rewrites(model, dgl_graph, graph.x, expect=only(**{family: 1}))
    assert reductions(result, family) == [reduce]


@pytest.mark.parametrize("learn_eps", [True, False], ids=["learn_eps", "fixed_eps"])
@pytest.mark.parametrize("aggregator,family", [("sum", "spmm"), ("max", "gather_scatter")])
def test_gin_conv(graph, dgl_graph, aggregator, family, learn_eps):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(graph.in_channels, 16), nn.ReLU(), nn.Linear(16, OUT_CHANNELS))
    model = GINConv(mlp, aggregator, init_eps=0.25, learn_eps=learn_eps)
    result = check_rewrites(model, dgl_graph, graph.x, expect=only(**{family: 1}))
    assert reductions(result, family) == [aggregator]
    if family == "spmm":  # DGL writes (1 + eps) * feat_dst + neigh: the folded self term, unless eps learns
        (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "spmm"]
        assert rewrite["details"]["self_term"].startswith("self term not folded" if learn_eps else "folded")


def test_edge_conv(graph, dgl_graph):
    torch.manual_seed(0)
    model = EdgeConv(graph.in_channels, OUT_CHANNELS, allow_zero_in_degree=True)
    result = check_rewrites(model, dgl_graph, graph.x, expect=only(gather_scatter=1))
    assert reductions(result, "gather_scatter") == ["max"]


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 3], ids=["heads1", "heads3"])
def test_gat_conv(graph, dgl_graph, heads):
    torch.manual_seed(0)
    model = GATConv(graph.in_channels, 4, heads, allow_zero_in_degree=True).train()
    check_rewrites(model, dgl_graph, graph.x, expect=only(attention=1))


@pytest.mark.parametrize("layer", [GATConv, GATv2Conv], ids=["gat", "gatv2"])
def test_attention_dropout_is_part_of_the_op(graph, dgl_graph, layer, monkeypatch):
    """DGL's ``attn_drop`` in training: one attention rewrite that draws the mask itself (no mask tensor in
    the graph), and the output and every gradient are eager DGL's with its dropout given the mask regenerated
    from the seed the op read."""
    from gnn_inductor import rewrite_report
    from tests.kernels.attention.test_attention_pyg import compiled_and_regenerated_eager

    torch.manual_seed(0)
    model = layer(graph.in_channels, 4, 2, attn_drop=0.4, allow_zero_in_degree=True).train()
    x = graph.x.clone().requires_grad_(True)
    grad = torch.randn(graph.num_nodes, 2, 4, generator=torch.Generator().manual_seed(2))
    rewrite_report.clear()
    compiled, eager = compiled_and_regenerated_eager(model, [dgl_graph, x], grad, monkeypatch, leaf=1)
    (attention,) = [w for w in rewrite_report.as_json(model)["rewrites"] if w["pattern"] == "attention"]
    assert attention["details"]["dropout_p"] == 0.4
    for i, (got, want) in enumerate(zip(compiled, eager)):
        torch.testing.assert_close(got, want, **tolerance(torch.float32),
                                   msg=lambda m, i=i: f"{'out' if i == 0 else f'gradient {i - 1}'}: {m}")


@pytest.mark.parametrize("layer, folded", [(GATConv, 1), (GATv2Conv, 0)], ids=["gat", "gatv2"])
def test_attention_bias_is_folded_into_the_op(graph, dgl_graph, layer, folded):
    """GATConv's bias ``[1, H, C]``, added to the attention output (a view made after the op), becomes the op's
    ``bias`` (patterns/attention.py); GATv2Conv's biases are its linear maps', so nothing is folded. Outputs and
    gradients stay eager DGL's."""
    torch.manual_seed(0)
    model = layer(graph.in_channels, 4, 2, allow_zero_in_degree=True, bias=True).train()
    result = check_rewrites(model, dgl_graph, graph.x, expect=only(attention=1))
    assert len(rewrites(result, "attention_bias")) == folded


def test_gatv2_conv(graph, dgl_graph):
    torch.manual_seed(0)
    model = GATv2Conv(graph.in_channels, 4, 2, allow_zero_in_degree=True).train()
    check_rewrites(model, dgl_graph, graph.x, expect=only(attention=1))


def test_dot_gat_conv(graph, dgl_graph):
    """Fused into one attention op. DotGatConv scopes its data with ``local_var`` (a graph copy),
    after which Dynamo keeps the written attention weights alive as a graph output: that one
    stays an ``edge_softmax`` op of its own."""
    torch.manual_seed(0)
    model = DotGatConv(graph.in_channels, 4, 2, allow_zero_in_degree=True)
    check_rewrites(model, dgl_graph, graph.x, expect=only(attention=1, edge_softmax=1))


# ---------------------------------------------------------------------------------------------
# Two layers, user code on update_all / apply_edges / dgl.ops
# ---------------------------------------------------------------------------------------------

class TwoLayerGAT(nn.Module):
    def __init__(self, in_channels: int, hidden: int = 4, heads: int = 2):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden, heads, allow_zero_in_degree=True)
        self.conv2 = GATConv(hidden * heads, OUT_CHANNELS, 1, allow_zero_in_degree=True)

    def forward(self, graph, x):
        x = F.elu(self.conv1(graph, x).flatten(1))
        return self.conv2(graph, x).squeeze(1)


class TwoLayerGCN(nn.Module):
    def __init__(self, in_channels: int, hidden: int = 16):
        super().__init__()
        self.conv1 = GraphConv(in_channels, hidden, allow_zero_in_degree=True)
        self.conv2 = GraphConv(hidden, OUT_CHANNELS, allow_zero_in_degree=True)

    def forward(self, graph, x):
        return self.conv2(graph, F.relu(self.conv1(graph, x)))


def test_two_layer_gcn(graph, dgl_graph):
    torch.manual_seed(0)
    check_rewrites(TwoLayerGCN(graph.in_channels).train(), dgl_graph, graph.x, expect=only(spmm=2))


def test_two_layer_gat(graph, dgl_graph):
    torch.manual_seed(0)
    check_rewrites(TwoLayerGAT(graph.in_channels).train(), dgl_graph, graph.x, expect=only(attention=2))


class UserMessage(nn.Module):
    """Python message function (a DGL UDF) with a built-in reduce: ``sum_j relu(W x_j + e_ij)``."""

    def __init__(self, in_channels: int, reduce: str):
        super().__init__()
        self.lin = nn.Linear(in_channels, in_channels)
        self.reduce = reduce

    def forward(self, graph, x, edge_attr):
        with graph.local_scope():
            graph.ndata["h"] = self.lin(x)
            graph.edata["e"] = edge_attr
            graph.update_all(lambda edges: {"m": F.relu(edges.src["h"] + edges.data["e"])},
                             getattr(fn, self.reduce)("m", "out"))
            return graph.ndata["out"]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_user_defined_message(graph, dgl_graph, reduce):
    torch.manual_seed(0)
    result = check_rewrites(UserMessage(graph.in_channels, reduce), dgl_graph, graph.x, graph.edge_attr_x,
                            expect=only(gather_scatter=1))
    assert reductions(result, "gather_scatter") == [reduce]


class ScoredEdges(nn.Module):
    """``apply_edges`` with a built-in, ``dgl.nn.functional.edge_softmax`` and the ``dgl.ops``
    SpMM: a hand-written attention layer."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.query = nn.Linear(in_channels, OUT_CHANNELS)
        self.key = nn.Linear(in_channels, OUT_CHANNELS)

    def forward(self, graph, x):
        with graph.local_scope():
            graph.srcdata["k"] = self.key(x)
            graph.dstdata["q"] = self.query(x)
            graph.apply_edges(fn.u_dot_v("k", "q", "s"))
            alpha = dgl.nn.functional.edge_softmax(graph, graph.edata.pop("s"))
            return dgl.ops.u_mul_e_sum(graph, self.key(x), alpha)


def test_apply_edges_edge_softmax_and_ops(graph, dgl_graph):
    torch.manual_seed(0)
    check_rewrites(ScoredEdges(graph.in_channels), dgl_graph, graph.x, expect=only(attention=1))


# ---------------------------------------------------------------------------------------------
# Graph structure: eager behaviour, mutation
# ---------------------------------------------------------------------------------------------

def test_eager_is_dgl_own(graph, dgl_graph):
    """Outside compilation the patched methods are DGL's: the same results, DGL's dtypes."""
    assert dgl_graph.in_degrees().dtype == dgl_graph.idtype
    expected = torch.bincount(graph.edge_index[1], minlength=graph.num_nodes)
    assert torch.equal(dgl_graph.in_degrees(), expected)
    with dgl_graph.local_scope():
        dgl_graph.ndata["h"] = graph.x
        dgl_graph.update_all(fn.copy_u("h", "m"), fn.max("m", "out"))
        out = dgl_graph.ndata["out"]
    assert out.shape == graph.x.shape


def test_mutated_graph_gets_new_structure(graph, dgl_graph):
    """``add_edges`` gives the graph a new index: the compiled model sees the new edges."""
    torch.manual_seed(0)
    model = GraphConv(graph.in_channels, OUT_CHANNELS, allow_zero_in_degree=True)
    compiled = torch.compile(model, backend="gnn_io")
    torch.testing.assert_close(compiled(dgl_graph, graph.x), model(dgl_graph, graph.x))
    isolated = graph.num_nodes - 1
    dgl_graph.add_edges(torch.tensor([0, 1]), torch.tensor([isolated, isolated]))
    out, expected = compiled(dgl_graph, graph.x), model(dgl_graph, graph.x)
    assert expected[isolated].abs().sum() > 0
    torch.testing.assert_close(out, expected)


class GCNThenGAT(nn.Module):
    """Two pattern families on one graph: the attention family (matched first) builds the CSR plan
    for the later layer, the SpMM family of the earlier layer must reuse it without a use before
    its definition."""

    def __init__(self, in_channels: int, hidden: int = 8):
        super().__init__()
        self.conv1 = GraphConv(in_channels, hidden, allow_zero_in_degree=True)
        self.conv2 = GATConv(hidden, OUT_CHANNELS, 1, allow_zero_in_degree=True)

    def forward(self, graph, x):
        return self.conv2(graph, F.relu(self.conv1(graph, x))).squeeze(1)


def test_two_families_share_one_plan(graph, dgl_graph, monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")  # a rewrite-pass error must fail, not fall back
    torch.manual_seed(0)
    check_rewrites(GCNThenGAT(graph.in_channels).train(), dgl_graph, graph.x, expect=only(spmm=1, attention=1))


def check_sampled_blocks(model, conv, graph, dgl_graph, seed_counts) -> None:
    """One step per entry of ``seed_counts``: a block sampled around that many seeds (4 in-neighbours each, seeded
    draws), ``model``'s output and input gradient on it against ``conv``'s (eager DGL)."""
    generator = torch.Generator().manual_seed(0)
    dgl.seed(0)  # the neighbour draws
    for count in seed_counts:
        seeds = torch.randperm(graph.num_nodes, generator=generator)[:count]
        block = dgl.to_block(dgl.sampling.sample_neighbors(dgl_graph, seeds, 4), seeds)
        x = graph.x[block.srcdata[dgl.NID]].clone().requires_grad_(True)
        out, expected = model(block, x), conv(block, x)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(torch.autograd.grad(out.square().sum(), x)[0],
                                   torch.autograd.grad(expected.square().sum(), x)[0])


@pytest.mark.parametrize("layer", tiered(["sage_mean", "gat"], ["sage_mean"]))
def test_sampled_blocks_of_changing_sizes(graph, dgl_graph, layer):
    """Mini-batch training as DGL's samplers feed it: a new block (bipartite, sources then destinations) of a
    new size every step. From the second block Dynamo traces with symbolic sizes, where the frontend's
    ``graph.num_edges()`` is a symbol (it used to crash Dynamo there: an identity test against the decline
    sentinel)."""
    from gnn_inductor import rewrite_report

    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = SAGEConv(graph.in_channels, OUT_CHANNELS, "mean") if layer == "sage_mean" else \
        GATConv(graph.in_channels, 3, num_heads=2, allow_zero_in_degree=True)
    model = torch.compile(conv, backend="gnn_io")
    check_sampled_blocks(model, conv, graph, dgl_graph, [8, 11, 14])
    report = rewrite_report.reports()[-1]
    assert [w.pattern for w in report.rewrites][:1] == ["spmm" if layer == "sage_mean" else "attention"]


def test_sampled_blocks_switch_to_the_plain_compile(graph, dgl_graph, monkeypatch):
    """A new small block every step (gnn_inductor/churn.py, on by default for CUDA; forced here): after the switch the
    compiled layer runs torch.compile's code of the traced DGL graph, results unchanged."""
    from gnn_inductor import rewrite_report

    monkeypatch.setenv("GNN_IO_CHURN", "on")
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = SAGEConv(graph.in_channels, OUT_CHANNELS, "mean")
    model = torch.compile(conv, backend="gnn_io")
    check_sampled_blocks(model, conv, graph, dgl_graph, range(6, 18))
    reasons = [m.reason for r in rewrite_report.reports(conv) for m in r.near_misses if m.pattern == "mini_batch"]
    assert any("later calls run" in reason for reason in reasons), reasons
