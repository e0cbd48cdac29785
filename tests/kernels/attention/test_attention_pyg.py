"""Attention layers of PyG under the backend: the edge functions cut from GATConv, GATv2Conv and TransformerConv are
recognised as the fused families (on the CPU and, compiled on the fused kernels, under Triton's interpreter), and
attention dropout: the reference against PyG's own math with the mask drawn in the user's edge order, the same seed
giving the same mask, and compiled layers in training against eager PyG given the mask regenerated from the seed the
op drew.
"""

import pytest
import torch
import torch.nn.functional as F
from gnn_inductor.kernels.attention import csr_forward
from gnn_inductor.kernels.attention import csr_launch
from gnn_inductor.kernels.attention import forms as attention_forms
from gnn_inductor.kernels.runtime import edge_functions, rng
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.attention.op import attention_reference, kernel_name
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv
from torch_geometric.utils import softmax as pyg_softmax

from gnn_inductor import rewrite_report
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.kernels.attention.cases import (
    CASES,
    CHANNELS,
    DROPOUT_P,
    EPS,
    HEADS,
    NUM_NODES,
    OP_DEVICE,
    dropout_for,
    edge_fn,
    grads_of,
    make_args,
    plan,  # noqa: F401  (fixture)
)
from tests.tiers import INTERPRETED, tiered, tiered_at

aten = torch.ops.aten


@pytest.mark.parametrize("name", list(CASES))
def test_recognise_families(name):
    score_fn, message_fn, family, kinds = CASES[name]
    form = attention_forms.recognise(edge_fn(score_fn), edge_fn(message_fn), [r for r, _ in kinds])
    assert not isinstance(form, str), form
    assert form.family == family
    if family == "dot":
        assert form.score_scale == 0.5 and form.query is not None


def test_recognise_rejects_other_math():
    roles = [ROLE_SRC, ROLE_DST]
    message = edge_fn(lambda alpha, a0, a1: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0))
    tanh = edge_fn(lambda a0, a1: aten.tanh.default(aten.add.Tensor(a0, a1)))
    assert "neither" in attention_forms.recognise(tanh, message, roles)
    score = edge_fn(CASES["gat"][0])
    squared = edge_fn(lambda alpha, a0, a1, a2: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1),
                                                            aten.mul.Tensor(a0, a0)))
    assert isinstance(attention_forms.recognise(score, squared, [ROLE_SRC, ROLE_SRC, ROLE_DST]), str)
    # alpha times a tensor (an attention weight, or a keep-mask the rewrite did not fold): the reference runs it
    weighted = edge_fn(lambda alpha, a0, a1, a2, a3: aten.mul.Tensor(
        aten.unsqueeze.default(aten.mul.Tensor(alpha, a3), -1), a0))
    assert "alpha (times constants)" in attention_forms.recognise(
        edge_fn(lambda a0, a1, a2, a3: aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)), weighted,
        [ROLE_SRC, ROLE_SRC, ROLE_DST, ROLE_EDGE])


LAYERS = [
    ("gat", lambda edge_dim: GATConv(8, 4, heads=2, edge_dim=edge_dim), "gat"),
    ("gatv2", lambda edge_dim: GATv2Conv(8, 4, heads=2, edge_dim=edge_dim), "gatv2"),
    ("transformer", lambda edge_dim: TransformerConv(8, 4, heads=2, edge_dim=edge_dim), "dot"),
    ("gat_dropout", lambda edge_dim: GATConv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "gat"),
    ("gatv2_dropout", lambda edge_dim: GATv2Conv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "gatv2"),
    ("transformer_dropout", lambda edge_dim: TransformerConv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "dot"),
]


@pytest.mark.parametrize("name, make, family, with_edge_attr", tiered(
    [pytest.param(name, make, family, edge, id=f"{name}-{'edge_attr' if edge else 'no_edge_attr'}")
     for name, make, family in LAYERS for edge in (False, True)],
    [(LAYERS[0] + (True,)), (LAYERS[2] + (False,))]))
def test_pyg_layers_are_recognised(name, make, family, with_edge_attr, monkeypatch):
    """The edge functions cut from the real layers are fused families (what the report says on CUDA)."""
    if INTERPRETED:
        pytest.skip("compiles on CPU: run by the main process")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(20, 60, seed=1, hub_degree=10)
    model = make(3 if with_edge_attr else None).train()
    inputs = (torch.randn(20, 8), edge_index) + ((torch.randn(edge_index.shape[1], 3),) if with_edge_attr else ())
    torch._dynamo.reset()
    first = len(rewrite_report.reports())
    torch.compile(model, backend="gnn_io")(*inputs)
    (rewrite,) = [w for r in rewrite_report.reports()[first:] for w in r.rewrites if w.pattern == "attention"]
    # the dot family also names the per-graph path choice (CSR, block-sparse or hybrid)
    assert kernel_name("cuda", rewrite.details).startswith(csr_launch.kernel_name(family)), \
        kernel_name("cuda", rewrite.details)
    if name.endswith("_dropout"):
        assert rewrite.details["dropout_p"] == 0.5 and "mask regenerated" in kernel_name("cuda", rewrite.details)
    else:
        assert "dropout_p" not in rewrite.details


@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
# the default tier: each layer once, with and without edge features between them (the other three with --slow)
@pytest.mark.parametrize("name, make, family, with_edge_attr", tiered(
    [pytest.param(name, make, family, edge, id=f"{name}-{'edge_attr' if edge else 'no_edge_attr'}")
     for name, make, family in LAYERS[:3] for edge in (False, True)],
    [("gat", LAYERS[0][1], "gat", True)]))
def test_compiled_pyg_layers_on_the_fused_kernels_match_eager(name, make, family, with_edge_attr, monkeypatch):
    """The CUDA tests' matrix (tests/kernels/attention/test_attention_cuda.py) on the fused kernels, interpreted: GATConv,
    GATv2Conv and TransformerConv compiled with ``gnn_io``, with and without edge features, against eager PyG,
    forward and the gradients of every input (edge features included, as ``check_rewrites`` makes them leaves
    that need one) and parameter. Here the trace-time rules that only look at arguments the fused kernels take
    run on CPU too: GATConv and GATv2Conv mask the edge index and the edge features by two nonzero calls, two
    unbacked sizes at tracing that the rules must not guard on (a rule that did made the CUDA tests fail to
    compile with "Could not guard on data-dependent expression", which no CPU test saw)."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    torch.manual_seed(0)
    edge_index = random_graph(30, 90, seed=2, hub_degree=15, num_isolated=2)
    model = make(3 if with_edge_attr else None).train()
    inputs = (torch.randn(30, 8), edge_index) + ((torch.randn(edge_index.shape[1], 3),) if with_edge_attr else ())
    result = check_rewrites(model, *inputs, expect={"attention": 1, "near_miss": 0}, calls=1)
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "attention"]
    # the report names the CPU reference on CPU; the CUDA name from the same details is the fused family's
    assert kernel_name("cuda", rewrite["details"]).startswith(csr_launch.kernel_name(family)), rewrite


# ---- attention dropout ----

def pyg_attention(args, roles, plan, score, message, dropout):
    """What PyG computes, in the user's edge order: scores, softmax by destination (``torch_geometric.utils``),
    ``F.dropout`` of the ``[E, H]`` alpha with the mask of kernels/runtime/rng.py (counter ``e * H + h``), messages summed
    by destination."""
    rowptr, col, row, perm = plan[:4]
    src = torch.empty_like(col).scatter_(0, perm.long(), col)
    dst = torch.empty_like(row).scatter_(0, perm.long(), row).long()
    values = [a.index_select(0, src) if r == ROLE_SRC else a.index_select(0, dst) if r == ROLE_DST else a
              for a, r in zip(args, roles)]
    scores = edge_functions.lookup(score)(*values)
    alpha = pyg_softmax(scores, dst, num_nodes=rowptr.numel() - 1)
    if dropout is not None:
        alpha = alpha * rng.dropout_keep(dropout.seed, list(alpha.shape), dropout.p) * (1.0 / (1.0 - dropout.p))
    messages = edge_functions.lookup(message)(alpha, *values)
    return messages.new_zeros((rowptr.numel() - 1, *messages.shape[1:])).index_add_(0, dst, messages)


@pytest.mark.parametrize("name", ["gat_dropout", "gatv2_dropout", "transformer_dropout"])
def test_reference_dropout_is_pyg_dropout(plan, name):
    """The op's reference with a seed is PyG's layer math with the mask of that seed drawn in the user's edge
    order: output and every gradient (float64)."""
    score_fn, message_fn, _, kinds = CASES[name]
    score, message, roles = edge_fn(score_fn), edge_fn(message_fn), [role for role, _ in kinds]
    args = [a.double() for a in make_args(kinds, plan[1].numel())]
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).double()
    dropout = dropout_for(name)
    out, grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS, dropout), args, grad)
    expected, expected_grads = grads_of(lambda a: pyg_attention(a, roles, plan, score, message, dropout), args, grad)
    no_dropout = attention_reference(args, roles, *plan[:4], score, message, EPS)
    assert (out - no_dropout).abs().max() > 0.1, "dropout must change the output"
    torch.testing.assert_close(out, expected)
    for i, (g, e) in enumerate(zip(grads, expected_grads)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"grad of argument {i}: {m}")


def _op_output(plan, name, dropout_seed, dropout_p, device=OP_DEVICE):
    score_fn, message_fn, _, kinds = CASES[name]
    args = [a.to(device) for a in make_args(kinds, plan[1].numel())]
    seed = None if dropout_seed is None else torch.tensor(dropout_seed, device=device)
    return torch.ops.gnn_io.attention(args, [r for r, _ in kinds], *[t.to(device) for t in plan[:4]], edge_fn(score_fn),
                                      edge_fn(message_fn), EPS, None, 0, seed, dropout_p)


@pytest.mark.parametrize("name", ["gat_dropout", "gatv2_dropout", "transformer_dropout"])
def test_same_seed_same_mask(plan, name):
    """The mask is a function of the seed: the same seed gives the same output bit for bit, another seed
    another output; no seed, or p = 0, is no dropout."""
    first = _op_output(plan, name, 11, DROPOUT_P)
    assert torch.equal(first, _op_output(plan, name, 11, DROPOUT_P))
    assert (first - _op_output(plan, name, 12, DROPOUT_P)).abs().max() > 0.1
    plain = _op_output(plan, name, None, 0.0)
    assert (first - plain).abs().max() > 0.1
    assert torch.equal(_op_output(plan, name, 11, 0.0), plain)


def test_dropout_arguments_are_checked(plan):
    with pytest.raises(ValueError, match="dropout_p must be in"):
        _op_output(plan, "gat_dropout", 11, 1.0, torch.device("cpu"))
    with pytest.raises(ValueError, match="dropout_seed must be one int64"):
        rng.dropout_of(torch.tensor(1.5), 0.3)


def test_dropout_keep_rate():
    """Uniform alpha (zero scores) over values of 1: ``out[i, h] * deg_i * (1 - p)`` counts the kept edges of
    node ``i`` and head ``h``. Exactly the counts of the mask regenerated for the user's edge order, and the kept
    fraction within 5 sigma of ``1 - p``."""
    num_nodes, heads, p = 200, 4, 0.3
    src, dst = random_graph(num_nodes, 3000, seed=5, hub_degree=60)
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    zeros = torch.zeros(num_nodes, heads)
    args = [torch.ones(num_nodes, heads, 1), zeros, zeros]
    seed = torch.tensor(99, device=OP_DEVICE)
    score, message = edge_fn(CASES["gat"][0]), edge_fn(CASES["gat"][1])
    out = torch.ops.gnn_io.attention([a.to(OP_DEVICE) for a in args], [ROLE_SRC, ROLE_SRC, ROLE_DST],
                                     *[t.to(OP_DEVICE) for t in plan[:4]], score, message, EPS, None, 0, seed, p).cpu()
    degree = (plan[0][1:] - plan[0][:-1]).double()
    counts = (out[:, :, 0].double() * degree[:, None] * (1 - p)).round().long()
    keep = rng.dropout_keep(seed.cpu(), [src.numel(), heads], p)
    expected = torch.zeros(num_nodes, heads, dtype=torch.long).index_add_(0, dst, keep.long())
    assert torch.equal(counts, expected)
    rate, sigma = float(keep.double().mean()), (p * (1 - p) / keep.numel()) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma, f"kept {rate:.4f}, expected {1 - p} +- {5 * sigma:.4f}"


DROPOUT_LAYERS = [
    ("gat", lambda: GATConv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
    ("gatv2", lambda: GATv2Conv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
    ("transformer", lambda: TransformerConv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
]


def compiled_and_regenerated_eager(model, inputs: list, grad, monkeypatch, leaf: int = 0) -> tuple:
    """``model`` (in training, with attention dropout) compiled with ``gnn_io`` and run forward and backward on
    ``inputs`` (``inputs[leaf]`` requires grad), then eagerly with ``F.dropout`` given the mask regenerated from
    the seed the op read: ``(compiled, eager)``, each ``[out, inputs[leaf].grad, *parameter grads]``. Asserts
    that forward and backward read one seed."""
    seeds = []
    dropout_of = rng.dropout_of

    def recording(seed, p):
        if seed is not None:
            seeds.append(int(seed))
        return dropout_of(seed, p)
    monkeypatch.setattr(rng, "dropout_of", recording)
    torch._dynamo.reset()
    out = torch.compile(model, backend="gnn_io")(*inputs)
    out.backward(grad)
    compiled = [out, inputs[leaf].grad] + [p.grad for p in model.parameters()]
    assert len(seeds) == 2 and seeds[0] == seeds[1], f"forward and backward must read one seed, got {seeds}"

    def regenerated(input, p=0.5, training=True, inplace=False):
        mask = rng.dropout_keep(torch.tensor(seeds[0], device=input.device), list(input.shape), p)
        return input * mask * (1.0 / (1.0 - p)) if training else input
    monkeypatch.setattr(F, "dropout", regenerated)
    inputs[leaf].grad = None
    model.zero_grad()
    expected = model(*inputs)
    expected.backward(grad)
    return compiled, [expected, inputs[leaf].grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("name, make", tiered_at(DROPOUT_LAYERS, [0]), ids=[name for name, _ in DROPOUT_LAYERS])
def test_compiled_layer_dropout_is_eager_with_the_regenerated_mask(name, make, monkeypatch):
    """A compiled PyG layer with attention dropout in training (the fused kernels under the interpreter, the
    reference in the main process): forward and backward read the seed drawn once per call, and the output and
    every gradient are eager PyG's with its ``F.dropout`` given the mask regenerated from that seed."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = make().train()
    edge_index = random_graph(20, 60, seed=1, hub_degree=10)
    x = torch.randn(20, 8, requires_grad=True)
    edge_attr = torch.randn(edge_index.shape[1], 3)
    compiled, eager = compiled_and_regenerated_eager(model, [x, edge_index, edge_attr], torch.randn(20, 8),
                                                     monkeypatch)
    for i, (got, want) in enumerate(zip(compiled, eager)):
        torch.testing.assert_close(got, want, **tolerance(torch.float32),
                                   msg=lambda m, i=i: f"{'out' if i == 0 else f'gradient {i - 1}'}: {m}")


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(csr_forward.forward_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.attention.csr_forward is imported"

