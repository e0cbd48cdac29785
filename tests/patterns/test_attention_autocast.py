"""Attention layers as CUDA autocast (bfloat16) runs them, on the CPU: the casts CUDA autocast inserts are written
out, so the canonical graph is the one the backend sees on a GPU (checked against ``make_fx`` of PyG's layers on
fake CUDA tensors under CUDA autocast):

- linear maps in bfloat16 (inputs, weights and biases cast, ``addmm`` / ``mm`` in bfloat16);
- ``sum`` on CUDA autocast's float32 list: ``sum(x, [-1], dtype=torch.float32)`` of a bfloat16 product
  (TransformerConv's ``q_i . k_j``, GATv2Conv's ``att . leaky_relu(x_i + x_j)``);
- a bfloat16 tensor times a float32 one promotes: GAT's ``x . att`` terms, and every message ``alpha * x_j`` with
  float32 ``alpha`` (the softmax of float32 scores), so the aggregation's result is float32.

Each must be recognised as its fused family (GPU: the fused kernels run it, not the reference), and the compiled
model must give eager's output dtype, output and gradients (within bfloat16's tolerance: the op takes the bfloat16
arguments and rounds its output to bfloat16, eager keeps the float32 aggregation)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter, softmax

from gnn_inductor import config, rewrite_report
from gnn_inductor.testing import TOLERANCES, gradient_scale, random_graph
from tests.tiers import tiered_at

HALF = torch.bfloat16
NODES, EDGES, IN, HEADS, CHANNELS = 24, 90, 8, 2, 4


def _linear(x, layer: torch.nn.Linear):
    """``layer(x)`` as autocast runs it: input, weight and bias cast to bfloat16."""
    bias = None if layer.bias is None else layer.bias.to(HALF)
    return F.linear(x.to(HALF), layer.weight.to(HALF), bias)


class Transformer(torch.nn.Module):
    """PyG's TransformerConv (root weight, no edge features)."""

    def __init__(self):
        super().__init__()
        width = HEADS * CHANNELS
        self.query, self.key, self.value = (torch.nn.Linear(IN, width) for _ in range(3))
        self.skip = torch.nn.Linear(IN, width)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        q, k, v = (_linear(x, lin).view(-1, HEADS, CHANNELS) for lin in (self.query, self.key, self.value))
        q_i, k_j, v_j = q.index_select(0, dst), k.index_select(0, src), v.index_select(0, src)
        score = (q_i * k_j).sum(dim=-1, dtype=torch.float32) / math.sqrt(CHANNELS)
        alpha = softmax(score, dst, num_nodes=x.shape[0])
        out = scatter(v_j * alpha.view(-1, HEADS, 1), dst, 0, dim_size=x.shape[0], reduce="sum")
        return out.view(-1, HEADS * CHANNELS) + _linear(x, self.skip)


class Gat(torch.nn.Module):
    """PyG's GATConv without a bias: its output is the aggregation's."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(IN, HEADS * CHANNELS, bias=False)
        self.att_src = torch.nn.Parameter(torch.randn(1, HEADS, CHANNELS) * 0.5)
        self.att_dst = torch.nn.Parameter(torch.randn(1, HEADS, CHANNELS) * 0.5)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        h = _linear(x, self.lin).view(-1, HEADS, CHANNELS)
        a_src = (h * self.att_src).sum(dim=-1, dtype=torch.float32)
        a_dst = (h * self.att_dst).sum(dim=-1, dtype=torch.float32)
        score = F.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), 0.2)
        alpha = softmax(score, dst, num_nodes=x.shape[0])
        out = scatter(alpha.unsqueeze(-1) * h.index_select(0, src), dst, 0, dim_size=x.shape[0], reduce="sum")
        return out.view(-1, HEADS * CHANNELS)


class GatV2(torch.nn.Module):
    """PyG's GATv2Conv (separate source and destination maps) with its bias."""

    def __init__(self):
        super().__init__()
        self.lin_l = torch.nn.Linear(IN, HEADS * CHANNELS)
        self.lin_r = torch.nn.Linear(IN, HEADS * CHANNELS)
        self.att = torch.nn.Parameter(torch.randn(1, HEADS, CHANNELS) * 0.5)
        self.bias = torch.nn.Parameter(torch.randn(HEADS * CHANNELS) * 0.1)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        x_l = _linear(x, self.lin_l).view(-1, HEADS, CHANNELS)
        x_r = _linear(x, self.lin_r).view(-1, HEADS, CHANNELS)
        x_j = x_l.index_select(0, src)
        hidden = F.leaky_relu(x_r.index_select(0, dst) + x_j, 0.2)
        score = (hidden * self.att).sum(dim=-1, dtype=torch.float32)
        alpha = softmax(score, dst, num_nodes=x.shape[0])
        out = scatter(x_j * alpha.unsqueeze(-1), dst, 0, dim_size=x.shape[0], reduce="sum")
        return out.view(-1, HEADS * CHANNELS) + self.bias


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, scale: float = 0.0) -> None:
    """Equal dtypes, and values within bfloat16's tolerance (plus that tolerance of the step's gradient scale)."""
    assert actual.dtype == expected.dtype, f"{name}: compiled {actual.dtype}, eager {expected.dtype}"
    rtol, atol_scale = TOLERANCES[HALF]
    atol = atol_scale * max(1.0, float(expected.abs().max()), scale)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _step(model, x, edge_index, weight):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = model(x, edge_index)
    (out.float() * weight).sum().backward()
    return out.detach(), [(n, p.grad) for n, p in model.named_parameters()] + [("x", x.grad)]


LAYERS = [pytest.param(Transformer, "dot", id="transformer"), pytest.param(Gat, "gat", id="gat"),
          pytest.param(GatV2, "gatv2", id="gatv2")]


def _check(make, family, calls: int) -> None:
    """Compile ``make()``, compare ``calls`` steps with eager, and assert one attention rewrite of ``family``."""
    torch.manual_seed(0)
    model = make()
    x = torch.randn(NODES, IN)
    edge_index = random_graph(NODES, EDGES, seed=3, hub_degree=12)
    torch._dynamo.reset()
    first = len(rewrite_report.reports())
    compiled = torch.compile(model, backend="gnn_io")
    with config.patch(cpu_rewrite=True, strict=True):
        for call in range(calls):
            weight = torch.randn(NODES, HEADS * CHANNELS, generator=torch.Generator().manual_seed(call))
            expected, expected_grads = _step(model, x, edge_index, weight)
            actual, grads = _step(compiled, x, edge_index, weight)
            _close(f"call {call} output", actual, expected)
            scale = gradient_scale([g for _, g in expected_grads])
            for (name, e), (_, a) in zip(expected_grads, grads):
                assert a is not None and e is not None, name
                _close(f"call {call} grad of {name}", a, e, scale)
    rewrites = [w for r in rewrite_report.reports()[first:] for w in r.rewrites if w.pattern == "attention"]
    near = [m for r in rewrite_report.reports()[first:] for m in r.near_misses]
    assert len(rewrites) == 1 and not near, (rewrites, near)
    assert rewrites[0].details["family"] == family, rewrites[0].details
    assert rewrites[0].details["dtype"] == "bfloat16", rewrites[0].details  # the kernels' precision


@pytest.mark.parametrize("make, family", tiered_at(LAYERS, [1]))
def test_cuda_autocast_casts_are_fused_and_match_eager(make, family):
    """The op's CPU reference, two calls (the second on the cached graph plan)."""
    _check(make, family, calls=2)


# a compiled layer through the interpreted kernels takes about a minute of CPU: --slow, and the GPU (the kernels' own
# tests stay in the default tier)
@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize("make, family", tiered_at(LAYERS, [2]))
def test_cuda_autocast_casts_on_the_fused_kernels_match_eager(make, family, monkeypatch):
    """The fused kernels (on CUDA, or interpreted on CPU tensors) with the mixed dtypes: bfloat16 terms and values,
    float32 ``att`` (GATv2Conv) and float32 score terms (GATConv)."""
    from gnn_inductor.kernels.attention import dispatch

    ran = []

    def recorded(name, inner):
        def call(*args, **kwargs):
            result = inner(*args, **kwargs)  # None where the reference runs instead
            ran.append((name, result is not None))
            return result
        return call
    for name in ("forward", "backward"):
        monkeypatch.setattr(dispatch, name, recorded(name, getattr(dispatch, name)))
    _check(make, family, calls=1)
    assert ran and all(fused for _, fused in ran) and {name for name, _ in ran} == {"forward", "backward"}, ran
