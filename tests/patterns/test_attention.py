"""Attention dropout folded into the attention rewrite (patterns/attention.py): the graph handed to Inductor draws a
seed, not an ``[E, H]`` mask, in training; has no dropout at all in eval mode; and a node that reads the dropped-out
alpha besides the message (returned attention weights) reads the mask the op draws."""
import pytest
import torch
import torch.nn.functional as F
from gnn_inductor.kernels.runtime import rng
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

from gnn_inductor import backend, rewrite_report
from gnn_inductor.testing import random_graph
from tests.tiers import tiered, tiered_at

aten = torch.ops.aten
LAYERS = {"gat": GATConv, "gatv2": GATv2Conv, "transformer": TransformerConv}


@pytest.fixture
def graphs(monkeypatch):
    """The graphs the backend hands to Inductor, in compile order."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    seen = []
    inner = backend.inductor_compile

    def capture(gm, example_inputs, *args, **kwargs):
        seen.append(gm)
        return inner(gm, example_inputs, *args, **kwargs)
    monkeypatch.setattr(backend, "inductor_compile", capture)
    return seen


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def compile_layer(layer, training: bool):
    torch.manual_seed(0)
    model = LAYERS[layer](8, 4, heads=2, dropout=0.3).train(training)
    edge_index = random_graph(20, 60, seed=1, hub_degree=10)
    torch._dynamo.reset()
    first = len(rewrite_report.reports())
    torch.compile(model, backend="gnn_io")(torch.randn(20, 8), edge_index)
    (rewrite,) = [w for r in rewrite_report.reports()[first:] for w in r.rewrites if w.pattern == "attention"]
    return rewrite


@pytest.mark.parametrize("layer", tiered(list(LAYERS), ["gatv2"]))
def test_training_draws_a_seed_not_a_mask(layer, graphs):
    rewrite = compile_layer(layer, training=True)
    (gm,) = graphs
    found = targets(gm)
    assert aten.rand.default not in found and aten.gt.Scalar not in found, "the [E, H] keep-mask must be gone"
    assert torch.ops.gnn_io.dropout_keep.default not in found
    assert found.count(aten.randint.default) == 1
    (op,) = [n for n in gm.graph.nodes if n.target == torch.ops.gnn_io.attention.default]
    *_, seed, p = op.args
    assert seed.target == aten.randint.default and p == 0.3
    assert rewrite.details["dropout_p"] == 0.3 and rewrite.details["family"] is not None


@pytest.mark.parametrize("layer", list(LAYERS))
def test_eval_mode_has_no_dropout(layer, graphs):
    rewrite = compile_layer(layer, training=False)
    (gm,) = graphs
    assert not {aten.rand.default, aten.randint.default} & set(targets(gm))
    (op,) = [n for n in gm.graph.nodes if n.target == torch.ops.gnn_io.attention.default]
    assert len(op.args) == 11, "no dropout arguments"
    assert "dropout_p" not in rewrite.details


class ReturnsAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GATConv(8, 4, heads=2, dropout=0.3)

    def forward(self, x, edge_index):
        out, (edge_index, alpha) = self.conv(x, edge_index, return_attention_weights=True)
        return out, edge_index, alpha


def test_returned_attention_weights_read_the_ops_mask(graphs, monkeypatch):
    """PyG returns the dropped-out alpha: the graph recomputes it with ``gnn_io.dropout_keep`` from the op's seed,
    so the returned weights and the output agree with eager PyG given that mask."""
    seeds = []
    dropout_of = rng.dropout_of
    monkeypatch.setattr(rng, "dropout_of", lambda seed, p: (seeds.append(int(seed)), dropout_of(seed, p))[1])
    torch.manual_seed(0)
    model = ReturnsAttention().train()
    x, edge_index = torch.randn(20, 8), random_graph(20, 60, seed=1, hub_degree=10)
    torch._dynamo.reset()
    out, returned_index, alpha = torch.compile(model, backend="gnn_io")(x, edge_index)
    (gm,) = graphs
    assert targets(gm).count(torch.ops.gnn_io.dropout_keep.default) == 1
    assert aten.rand.default not in targets(gm)
    (seed,) = seeds

    def regenerated(input, p=0.5, training=True, inplace=False):
        return input * rng.dropout_keep(torch.tensor(seed), list(input.shape), p) * (1.0 / (1.0 - p))
    monkeypatch.setattr(F, "dropout", regenerated)
    expected_out, expected_index, expected_alpha = model(x, edge_index)
    assert torch.equal(returned_index, expected_index)
    torch.testing.assert_close(alpha, expected_alpha)
    torch.testing.assert_close(out, expected_out)
    assert (alpha == 0).any(), "dropout must drop some weights"


# the default tier: one folded bias and one kept apart (a mean over heads first)
@pytest.mark.parametrize("make, folded", tiered_at([
    (lambda: GATConv(8, 4, heads=2), True),
    (lambda: GATv2Conv(8, 4, heads=2, edge_dim=3), True),
    (lambda: GATConv(8, 4, heads=2, bias=False), False),
    (lambda: GATConv(8, 4, heads=2, concat=False), False),     # mean over heads first: not the op's output plus b
    (lambda: TransformerConv(8, 4, heads=2), False),           # a skip map, not a bias
], [1, 3]))
def test_bias_on_the_attention_output_is_folded_into_the_op(make, folded, graphs, monkeypatch):
    """PyG's bias on the concatenated heads becomes the op's ``bias`` argument (reported as ``attention_bias``);
    outputs and every gradient, the bias's included, stay eager PyG's."""
    from gnn_inductor.testing import check_rewrites

    torch.manual_seed(0)
    edge_index = random_graph(30, 120, seed=2, hub_degree=15, num_isolated=2)
    model = make()
    inputs = [torch.randn(30, 8), edge_index]
    if getattr(model, "edge_dim", None):
        inputs.append(torch.randn(edge_index.shape[1], 3))
    check_rewrites(model, *inputs, expect={"attention": 1, "attention_bias": int(folded)})
    ops = [n for gm in graphs for n in gm.graph.nodes if n.target == torch.ops.gnn_io.attention.default]
    assert ops and all((n.kwargs.get("bias") is not None) == folded for n in ops)
    monkeypatch.setenv("GNN_IO_ATTENTION_BIAS", "0")
    check_rewrites(make(), *inputs, expect={"attention": 1, "attention_bias": 0})
