"""What the reliability tests of compiled models share (tests/models/test_reliability*.py): the layers and their
inputs, the graph most tests start on, the settings each test runs under, and :func:`compare`, which checks a compiled
model against an eager copy: outputs, every parameter gradient and the gradient of every floating point input; float32
at ``TOLERANCES``, float64 to 1e-10, bf16 within twice eager's own bf16 error of float32."""
import copy

import pytest
import torch
from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GINConv, SAGEConv, TransformerConv

from gnn_inductor import rewrite_report
from gnn_inductor.testing import assert_close_to_reference, forward_backward, gradient_scale, random_graph

FEATURES = 8
EDGE_DIM = 4
NODES = 30
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))


# name -> (make, rewrite family); "transformer" takes edge features
LAYERS = {
    "gcn": (lambda: GCNConv(FEATURES, 6), "spmm"),
    "sage_max": (lambda: SAGEConv(FEATURES, 6, aggr="max"), "gather_scatter"),
    "gin": (lambda: GINConv(_mlp()), "spmm"),
    "gat": (lambda: GATConv(FEATURES, 3, heads=2), "attention"),
    "gatv2": (lambda: GATv2Conv(FEATURES, 3, heads=2), "attention"),
    "transformer": (lambda: TransformerConv(FEATURES, 3, heads=2, edge_dim=EDGE_DIM), "attention"),
}
# representative subset (docstring): the SpMM family, gather-scatter, attention, attention with edge features
SUBSET = ["gcn", "sage_max", "gat", "transformer"]
LIFECYCLE = ["gcn", "sage_max", "gat"]


def base_graph(seed: int = 0) -> torch.Tensor:
    """The graph most tests start on: 30 nodes, 86 edges, a hub, isolated nodes, self loops, duplicates."""
    return random_graph(NODES, 60, seed=seed, hub_degree=20)


def model_inputs(name, edge_index, num_nodes, device, seed=0, x=None) -> list:
    """``[x, edge_index(, edge_attr)]`` on ``device``; ``edge_index`` is passed as given (its identity and layout
    matter to the plan cache)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, FEATURES, generator=generator) if x is None else x
    extra = [torch.randn(edge_index.shape[1], EDGE_DIM, generator=generator)] if name == "transformer" else []
    return [x.to(device), edge_index.to(device), *[e.to(device) for e in extra]]


def setup_backend(monkeypatch, device, strict=True) -> None:
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_FORCE", "1")  # small graphs the cost model would leave to Inductor
    if strict:
        monkeypatch.setenv("GNN_IO_STRICT", "1")  # a backend error raises instead of falling back to Inductor
    else:
        monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def no_silent_eager_fallback():
    """Past Dynamo's recompile limit a model runs eagerly, and a comparison with eager would prove nothing."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def compiled_pair(make, device, dtype=torch.float32, seed=0):
    """``(compiled, eager copy)`` of ``make()`` in ``dtype``; ``make`` is a LAYERS name or a callable."""
    torch.manual_seed(seed)
    model = (LAYERS[make][0] if isinstance(make, str) else make)().to(device, dtype)
    reference = copy.deepcopy(model)
    return torch.compile(model, backend="gnn_io"), reference


class Fixed(tuple):
    """``Fixed((t,))``: an input every model gets as this very tensor ``t``, with no gradient (a structure input
    whose identity the plan cache keys on: GCNConv's edge weight)."""


def _copy_inputs(value, dtype, grad, leaves):
    """``value`` with each floating point tensor (also in dicts and lists) a fresh leaf in ``dtype``, of the same
    strides (``Tensor.to`` keeps a dense layout); integer tensors and :class:`Fixed` ones are passed as they are."""
    if isinstance(value, Fixed):
        return value[0]
    if isinstance(value, dict):
        return {k: _copy_inputs(v, dtype, grad, leaves) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_inputs(v, dtype, grad, leaves) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        leaf = value.detach().to(dtype=dtype, copy=True).requires_grad_(grad)
        assert value.is_contiguous() or not leaf.is_contiguous(), "the copy lost the input's layout"
        leaves.append(leaf)
        return leaf
    return value


def compare(what, compiled, reference, inputs, *, baseline=None, grad=True, seed=0, eager_inputs=None) -> list:
    """``compiled`` against eager ``reference`` on ``inputs``: outputs and, with ``grad``, the gradients of every
    parameter and floating point input (a backward of random weights drawn from ``seed``). Each model gets the
    inputs in its parameters' dtype. A compiled model of lower precision than ``reference`` is judged against
    ``baseline`` (eager in its own dtype): at most twice as far from ``reference`` as that
    (``assert_close_to_reference``). ``eager_inputs``: what the eager models get instead (the same values). Returns
    the compiled model's outputs."""
    runs = []
    for model in (compiled, reference, baseline):
        if model is None:
            runs.append(None)
            continue
        leaves = []
        given = inputs if model is compiled or eager_inputs is None else eager_inputs
        args = [_copy_inputs(v, next(model.parameters()).dtype, grad, leaves) for v in given]
        outputs, params, _ = forward_backward(model, args, grad, seed, {})
        runs.append((outputs, params, [leaf.grad for leaf in leaves]))
    (out, params, input_grads), (ref_out, ref_params, ref_input_grads) = runs[:2]
    base_out, base_params, base_input_grads = runs[2] or runs[1]
    assert len(out) == len(ref_out), f"{what}: compiled returned {len(out)} tensors, eager {len(ref_out)}"
    for i, (a, e, b) in enumerate(zip(out, ref_out, base_out)):
        assert_close_to_reference(f"{what}: output {i}", a, e, b)
    if grad:
        scale = gradient_scale([g for _, g in ref_params] + ref_input_grads)
        for (name, a), (_, e), (_, b) in zip(params, ref_params, base_params):
            if (a is None) != (e is None):
                raise AssertionError(f"{what}: grad of {name}: eager {e is not None}, compiled {a is not None}")
            if e is not None:
                assert_close_to_reference(f"{what}: grad of parameter {name}", a, e, b, scale)
        for i, (a, e, b) in enumerate(zip(input_grads, ref_input_grads, base_input_grads)):
            if e is None:  # no edge reads this input: none or zeros
                assert a is None or not a.any(), f"{what}: input {i} has a gradient eager does not give"
            else:
                assert_close_to_reference(f"{what}: grad of input {i}", a, e, b, scale)
    return out


def two_calls(name, compiled, reference, device, x=None, baseline=None) -> None:
    """Two calls on the base graph (the second reuses its plan) against eager; ``x``: these node features."""
    for call in range(2):
        inputs = model_inputs(name, base_graph(), NODES, device, call, x)
        compare(f"call {call}", compiled, reference, inputs, baseline=baseline, seed=call)


def assert_rewritten(first: int, family=None) -> None:
    """The reports since ``first`` hold no backend failure and (unless None) a ``family`` rewrite."""
    reports = rewrite_report.reports()[first:]
    text = "\n".join(rewrite_report.format_text_for(reports))
    assert not any(m.pattern == "backend" for r in reports for m in r.near_misses), text
    assert family is None or any(w.pattern == family for r in reports for w in r.rewrites), text

