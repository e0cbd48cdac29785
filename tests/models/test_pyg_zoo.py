"""End-to-end model zoo: PyG layers and small models compiled with ``gnn_io``.

Each case compiles the model afresh, checks outputs and all gradients (parameters and float
inputs) against eager at float32 tolerance, and asserts exactly which rewrites fired. The
rewrite counts are given for every pattern family (families a model should not trigger are
expected 0 times), so a wrong rewrite (e.g. a gather-scatter where an SpMM belongs) fails too.

The graph (``tests/conftest.py``) has isolated nodes, self loops, duplicate edges and a hub.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import (
    GATConv, GATv2Conv, GCNConv, GINConv, GINEConv, GraphConv, MessagePassing, PNAConv, SAGEConv, TransformerConv,
)
from torch_geometric.nn.aggr import MultiAggregation

from gnn_inductor import rewrite_report
from gnn_inductor.testing import check_rewrites, tolerance
from tests.tiers import covering, tiered, tiered_at

OUT_CHANNELS = 6
FAMILIES = ("spmm", "gather_scatter", "edge_softmax", "attention")


@pytest.fixture(autouse=True)
def strict_backend(monkeypatch):
    """A backend error fails the test with its traceback instead of a silent Inductor fallback."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")


def only(**counts) -> dict:
    """Exact counts for every pattern family: those named, and 0 for the others."""
    unknown = set(counts) - set(FAMILIES)
    assert not unknown, unknown
    return {family: counts.get(family, 0) for family in FAMILIES}


def rewrites(result, pattern: str) -> list:
    return [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == pattern]


def assert_reduce(result, pattern: str, reduce: str) -> None:
    found = [w["details"]["reduce"] for w in rewrites(result, pattern)]
    assert found and all(r == reduce for r in found), f"{pattern} reductions {found}, expected {reduce!r}"


# ---------------------------------------------------------------------------------------------
# GCNConv
# ---------------------------------------------------------------------------------------------

# PyG refuses add_self_loops=True with normalize=False (ValueError), so three valid combinations, each unweighted
# and with an edge weight
GCN_CASES = [pytest.param(n, s, w, id=f"{name}-{'edge_weight' if w else 'unweighted'}")
             for n, s, name in ((True, True, "normalize-selfloops"), (True, False, "normalize-noselfloops"),
                                (False, False, "raw-noselfloops"))
             for w in (False, True)]


@pytest.mark.parametrize("normalize,add_self_loops,weighted", tiered(
    GCN_CASES, [(True, True, False), (True, False, True)]))
def test_gcn_conv(graph, normalize, add_self_loops, weighted):
    torch.manual_seed(0)
    model = GCNConv(graph.in_channels, OUT_CHANNELS, normalize=normalize, add_self_loops=add_self_loops)
    inputs = (graph.x, graph.edge_index) + ((graph.edge_weight,) if weighted else ())
    result = check_rewrites(model, *inputs, expect=only(spmm=1))
    assert_reduce(result, "spmm", "sum")
    # The message is scaled by the normalisation and/or the user's weights, except a raw unweighted GCN.
    (rewrite,) = rewrites(result, "spmm")
    assert rewrite["details"]["weighted"] == (normalize or weighted)


# ---------------------------------------------------------------------------------------------
# GraphConv, SAGEConv, GINConv
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer,aggr,family,reduce", tiered_at([
    (GraphConv, "add", "spmm", "sum"),
    (GraphConv, "mean", "spmm", "mean"),
    (GraphConv, "max", "gather_scatter", "max"),
    (SAGEConv, "mean", "spmm", "mean"),
    (SAGEConv, "max", "gather_scatter", "max"),
    (SAGEConv, "sum", "spmm", "sum"),
], [0, 2, 3]), ids=["graph-add", "graph-mean", "graph-max", "sage-mean", "sage-max", "sage-sum"])
def test_graph_and_sage_conv(graph, layer, aggr, family, reduce):
    torch.manual_seed(0)
    model = layer(graph.in_channels, OUT_CHANNELS, aggr=aggr)
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(**{family: 1}))
    assert_reduce(result, family, reduce)


def test_graph_conv_edge_weight(graph):
    torch.manual_seed(0)
    model = GraphConv(graph.in_channels, OUT_CHANNELS, aggr="add")
    result = check_rewrites(model, graph.x, graph.edge_index, graph.edge_weight, expect=only(spmm=1))
    assert_reduce(result, "spmm", "sum")
    assert rewrites(result, "spmm")[0]["details"]["weighted"] is True


@pytest.mark.parametrize("train_eps", tiered([False, True], [True]), ids=["fixed_eps", "train_eps"])
def test_gin_conv(graph, train_eps):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(graph.in_channels, 16), nn.ReLU(), nn.Linear(16, OUT_CHANNELS))
    model = GINConv(mlp, eps=0.25, train_eps=train_eps)
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(spmm=1))
    assert_reduce(result, "spmm", "sum")
    self_term = rewrites(result, "spmm")[0]["details"]["self_term"]
    # a fixed (1 + eps) x joins the SpMM as a diagonal of the cached CSR; a trained eps stays with Inductor,
    # whose eps gradient is one dot product instead of an SDDMM over every edge
    assert self_term.startswith("self term not folded: its scale needs a gradient" if train_eps else "folded")


def test_gin_conv_folded_eps_follows_the_buffer(graph):
    """The folded scale is read per call: changing GIN's eps buffer changes the output as in eager."""
    torch.manual_seed(0)
    model = GINConv(nn.Linear(graph.in_channels, OUT_CHANNELS), eps=0.5)
    compiled = torch.compile(model, backend="gnn_io")
    first = compiled(graph.x, graph.edge_index)
    torch.testing.assert_close(first, model(graph.x, graph.edge_index), **tolerance(torch.float32))
    model.eps.fill_(-0.75)
    second = compiled(graph.x, graph.edge_index)
    torch.testing.assert_close(second, model(graph.x, graph.edge_index), **tolerance(torch.float32))
    assert not torch.allclose(first, second)


# ---------------------------------------------------------------------------------------------
# Several aggregations over the same messages: one gnn_io::gather_scatter_multi
# ---------------------------------------------------------------------------------------------

def merged(result) -> dict:
    """The one merged gather-scatter rewrite of ``result``: its details."""
    (rewrite,) = rewrites(result, "gather_scatter")
    assert rewrite["op"] == "gnn_io.gather_scatter_multi", rewrite
    return rewrite["details"]


def member_reduces(details) -> list:
    return sorted(m["reduce"] for m in details["members"])


@pytest.mark.parametrize("aggr,reduces", tiered_at([
    (["mean", "max"], ["max", "mean"]),
    (["mean", "max", "min"], ["max", "mean", "min"]),
    (["sum", "std"], ["mean", "sum"]),  # std: mean(x * x) next to the shared sum (its mean divides that by Inductor)
], [1]), ids=["mean-max", "mean-max-min", "sum-std"])
def test_sage_conv_several_aggregations(graph, aggr, reduces):
    """The mean (an SpMM alone) joins the max: both read the same source rows, in one pass."""
    torch.manual_seed(0)
    model = SAGEConv(graph.in_channels, OUT_CHANNELS, aggr=aggr)
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(gather_scatter=1))
    details = merged(result)
    assert member_reduces(details) == reduces and details["roles"] == ["src"]


@pytest.mark.parametrize("aggr,family,op", tiered_at([
    ("softmax", "attention", "gnn_io.attention"),  # softmax(t * x_j) by destination weighting x_j, per feature
    ("powermean", "gather_scatter", "gnn_io.gather_scatter"),  # mean(clamp(x_j)^p), then ^(1/p) by Inductor
    ("var", "gather_scatter", "gnn_io.gather_scatter_multi"),  # mean(x_j * x_j) - mean(x_j)^2: one pass
], [2]), ids=["softmax", "powermean", "var"])
def test_learnable_and_moment_aggregations(graph, aggr, family, op):
    """PyG's SoftmaxAggregation and PowerMeanAggregation with a learnable ``t`` / ``p`` (gradients checked for
    them too) and VarianceAggregation: each rewritten, against eager."""
    torch.manual_seed(0)
    kwargs = {"learn": True} if aggr in ("softmax", "powermean") else {}
    model = SAGEConv(graph.in_channels, OUT_CHANNELS, aggr=aggr, aggr_kwargs=kwargs)
    x = graph.x.abs() + 0.1  # powermean raises to a learnt power: positive inputs, as PyG's clamp assumes
    result = check_rewrites(model, x, graph.edge_index, expect=only(**{family: 1}))
    assert [w["op"] for w in rewrites(result, family)] == [op]


class SeveralAggregations(nn.Module):
    """``MultiAggregation`` of transformed source rows, concatenated (std is ``mean(x)`` and ``mean(x * x)``)."""

    def __init__(self, in_channels: int, aggrs: list):
        super().__init__()
        self.lin = nn.Linear(in_channels, OUT_CHANNELS)
        self.aggr = MultiAggregation(aggrs)

    def forward(self, x, edge_index):
        return self.aggr(self.lin(x)[edge_index[0]], edge_index[1], dim_size=x.shape[0])


def test_multi_aggregation(graph):
    torch.manual_seed(0)
    model = SeveralAggregations(graph.in_channels, ["sum", "mean", "max", "min", "std"])
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(gather_scatter=1))
    details = merged(result)
    assert member_reduces(details) == ["max", "mean", "min", "sum"]
    messages = {m["reduce"]: m["message"] for m in details["members"]}
    assert messages["mean"] != messages["sum"] == messages["max"] == messages["min"]  # mean(x * x), and x


def test_sum_and_mean_alone_stay_an_spmm(graph):
    """No max, min or other message next to them: nothing to share with the gather-scatter family."""
    torch.manual_seed(0)
    model = SeveralAggregations(graph.in_channels, ["sum", "mean"])
    check_rewrites(model, graph.x, graph.edge_index, expect=only(spmm=1))


@pytest.mark.parametrize(("towers", "with_edge_attr"), tiered(
    [pytest.param(t, e, id=f"towers{t}-{'edge_attr' if e else 'no_edge_attr'}") for t in (1, 2) for e in (False, True)],
    [(2, True)]))
def test_pna_conv(graph, towers, with_edge_attr):
    """PNA's messages are a linear map of ``[x_i, x_j(, e_ij)]``, an edge tensor the model computes; its mean,
    min, max and std (mean twice: its own and std's) read it in one pass."""
    torch.manual_seed(0)
    degree = torch.bincount(torch.bincount(graph.edge_index[1], minlength=graph.num_nodes))
    edge_dim = graph.edge_dim if with_edge_attr else None
    model = PNAConv(graph.in_channels, 8, aggregators=["mean", "min", "max", "std"],
                    scalers=["identity", "amplification", "attenuation"], deg=degree, towers=towers, edge_dim=edge_dim)
    inputs = (graph.x, graph.edge_index) + ((graph.edge_attr,) if edge_dim else ())
    first = len(rewrite_report.reports())
    result = check_rewrites(model, *inputs, expect=only(gather_scatter=1))
    details = merged(result)
    assert member_reduces(details) == ["max", "mean", "mean", "min"] and details["roles"] == ["edge"]
    assert details["merged_calls"] == 5
    text = "\n".join(rewrite_report.format_text_for(rewrite_report.reports()[first:]))
    assert "gnn_io.gather_scatter_multi" in text and text.count("      member ") == 4, text
    assert "aggr/basic.py" in text, text  # where each member's reduction was written


# ---------------------------------------------------------------------------------------------
# Attention layers (train mode, dropout off)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("heads", "concat", "with_edge_attr"), tiered(
    [pytest.param(h, c, e, id=f"heads{h}-{'concat' if c else 'mean_heads'}-{'edge_attr' if e else 'no_edge_attr'}")
     for h in (1, 3) for c in (True, False) for e in (False, True)],
    [(3, False, True)]))
def test_gat_conv(graph, heads, concat, with_edge_attr):
    torch.manual_seed(0)
    edge_dim = graph.edge_dim if with_edge_attr else None
    model = GATConv(graph.in_channels, 4, heads=heads, concat=concat, edge_dim=edge_dim, dropout=0.0).train()
    inputs = (graph.x, graph.edge_index) + ((graph.edge_attr,) if edge_dim else ())
    check_rewrites(model, *inputs, expect=only(attention=1))


@pytest.mark.parametrize("with_edge_attr", tiered([False, True], [True]), ids=["no_edge_attr", "edge_attr"])
def test_gatv2_conv(graph, with_edge_attr):
    torch.manual_seed(0)
    edge_dim = graph.edge_dim if with_edge_attr else None
    model = GATv2Conv(graph.in_channels, 4, heads=2, edge_dim=edge_dim, dropout=0.0).train()
    inputs = (graph.x, graph.edge_index) + ((graph.edge_attr,) if edge_dim else ())
    check_rewrites(model, *inputs, expect=only(attention=1))


@pytest.mark.parametrize(("with_edge_attr", "root_weight"), covering([False, True], [True, False]))
def test_transformer_conv(graph, with_edge_attr, root_weight):
    torch.manual_seed(0)
    edge_dim = graph.edge_dim if with_edge_attr else None
    model = TransformerConv(graph.in_channels, 4, heads=2, edge_dim=edge_dim, root_weight=root_weight,
                            dropout=0.0).train()
    inputs = (graph.x, graph.edge_index) + ((graph.edge_attr,) if edge_dim else ())
    check_rewrites(model, *inputs, expect=only(attention=1))


# ---------------------------------------------------------------------------------------------
# Two-layer models
# ---------------------------------------------------------------------------------------------

class TwoLayerGCN(nn.Module):
    def __init__(self, in_channels: int, hidden: int = 16):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, OUT_CHANNELS)

    def forward(self, x, edge_index):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.0, training=self.training)
        return self.conv2(x, edge_index)


class TwoLayerGAT(nn.Module):
    def __init__(self, in_channels: int, hidden: int = 4, heads: int = 2):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=0.0)
        self.conv2 = GATConv(hidden * heads, OUT_CHANNELS, heads=1, concat=False, dropout=0.0)

    def forward(self, x, edge_index):
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.0, training=self.training)
        return self.conv2(x, edge_index)


def test_two_layer_gcn(graph):
    torch.manual_seed(0)
    model = TwoLayerGCN(graph.in_channels).train()
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(spmm=2))
    assert_reduce(result, "spmm", "sum")


# one GATConv layer per configuration runs in the default tier; two stacked with --slow
@pytest.mark.slow
def test_two_layer_gat(graph):
    torch.manual_seed(0)
    model = TwoLayerGAT(graph.in_channels).train()
    check_rewrites(model, graph.x, graph.edge_index, expect=only(attention=2))


# ---------------------------------------------------------------------------------------------
# Attention dropout: random, so not comparable with eager call by call (tests/kernels/attention/test_attention_pyg.py
# compares with eager given the same mask). It stays fused: the attention op draws the mask from a seed the
# graph takes from torch's generator (patterns/attention.py, kernels/runtime/rng.py).
# ---------------------------------------------------------------------------------------------

DROPOUT_LAYERS = {"gat": GATConv, "gatv2": GATv2Conv, "transformer": TransformerConv}


@pytest.mark.parametrize("layer", tiered(DROPOUT_LAYERS, ["gat"]))
def test_attention_dropout_stays_fused_and_unbiased(graph, layer):
    torch.manual_seed(0)
    model = DROPOUT_LAYERS[layer](graph.in_channels, 4, heads=2, dropout=0.5).train()
    torch._dynamo.reset()
    first = len(rewrite_report.reports())
    compiled = torch.compile(model, backend="gnn_io")
    x = graph.x.clone().requires_grad_(True)
    out = compiled(x, graph.edge_index)
    assert out.shape == (graph.num_nodes, 8)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    new = rewrite_report.reports()[first:]
    patterns = [w.pattern for r in new for w in r.rewrites if w.pattern in FAMILIES]
    text = "\n".join(rewrite_report.format_text_for(new))
    assert patterns == ["attention"], text
    assert not [m for r in new for m in r.near_misses], text

    # Inverted dropout is unbiased: the mean over many draws approaches the no-dropout output,
    # and different draws differ.
    with torch.no_grad():
        samples = torch.stack([compiled(graph.x, graph.edge_index) for _ in range(200)])
        expected = model.eval()(graph.x, graph.edge_index)
    assert not torch.equal(samples[0], samples[1])
    error = (samples.mean(0) - expected).norm() / expected.norm()
    assert error < 0.1, f"mean of dropout samples is off by {error:.3f} (relative)"


@pytest.mark.parametrize("layer", tiered(DROPOUT_LAYERS, ["transformer"]))
def test_attention_dropout_follows_manual_seed(graph, layer):
    """``torch.manual_seed`` decides the mask: the same seed gives the same output and gradients, the next
    call (the generator moved on) another mask."""
    torch.manual_seed(0)
    model = DROPOUT_LAYERS[layer](graph.in_channels, 4, heads=2, dropout=0.3).train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gnn_io")

    def step(seed):
        if seed is not None:
            torch.manual_seed(seed)
        x = graph.x.clone().requires_grad_(True)
        out = compiled(x, graph.edge_index)
        out.sum().backward()
        return out.detach(), x.grad
    first, first_grad = step(5)
    again, again_grad = step(5)
    following, _ = step(None)
    assert torch.equal(first, again) and torch.equal(first_grad, again_grad)
    assert not torch.equal(again, following)


@pytest.mark.parametrize("layer", tiered(DROPOUT_LAYERS, ["gatv2"]))
def test_attention_dropout_eval_mode(graph, layer):
    """The same layer in eval mode has no dropout: a plain attention rewrite, exact against eager."""
    torch.manual_seed(0)
    model = DROPOUT_LAYERS[layer](graph.in_channels, 4, heads=2, dropout=0.5).eval()
    result = check_rewrites(model, graph.x, graph.edge_index, expect=only(attention=1))
    assert all("dropout_p" not in w["details"] for w in rewrites(result, "attention"))


# ---------------------------------------------------------------------------------------------
# Other message forms through a custom MessagePassing layer, and GINEConv
# ---------------------------------------------------------------------------------------------

class EdgeReluConv(MessagePassing):
    """GINE-like: ``aggr_j relu(W x_j + edge_attr)``."""

    def __init__(self, in_channels: int, aggr: str):
        super().__init__(aggr=aggr)
        self.lin = nn.Linear(in_channels, in_channels)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=self.lin(x), edge_attr=edge_attr)

    def message(self, x_j, edge_attr):
        return F.relu(x_j + edge_attr)


class WeightedCopyConv(MessagePassing):
    """``sum_j w_ij W x_j``."""

    def __init__(self, in_channels: int):
        super().__init__(aggr="add")
        self.lin = nn.Linear(in_channels, OUT_CHANNELS)

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight)

    def message(self, x_j, edge_weight):
        return x_j * edge_weight.view(-1, 1)


AGGRS = [("sum", "sum"), ("mean", "mean"), ("max", "max"), ("min", "min")]


@pytest.mark.parametrize("aggr,reduce", tiered(AGGRS, [("mean", "mean"), ("min", "min")]),
                         ids=[a for a, _ in AGGRS])
def test_edge_relu_message(graph, aggr, reduce):
    torch.manual_seed(0)
    model = EdgeReluConv(graph.in_channels, aggr)
    result = check_rewrites(model, graph.x, graph.edge_index, graph.edge_attr_x, expect=only(gather_scatter=1))
    assert_reduce(result, "gather_scatter", reduce)


@pytest.mark.parametrize("aggr,reduce", tiered(AGGRS, [("sum", "sum"), ("max", "max")]), ids=[a for a, _ in AGGRS])
def test_gine_conv(graph, aggr, reduce):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(graph.in_channels, 16), nn.ReLU(), nn.Linear(16, OUT_CHANNELS))
    model = GINEConv(mlp, train_eps=True, edge_dim=graph.edge_dim, aggr=aggr)
    result = check_rewrites(model, graph.x, graph.edge_index, graph.edge_attr, expect=only(gather_scatter=1))
    assert_reduce(result, "gather_scatter", reduce)


def test_weighted_copy_message(graph):
    torch.manual_seed(0)
    model = WeightedCopyConv(graph.in_channels)
    result = check_rewrites(model, graph.x, graph.edge_index, graph.edge_weight, expect=only(spmm=1))
    assert_reduce(result, "spmm", "sum")
    assert rewrites(result, "spmm")[0]["details"]["weighted"] is True
