"""Reliability of compiled models beyond one graph and one call: what a user's training loop does to them.

Six layers (GCNConv, SAGEConv max, GINConv, GATConv, GATv2Conv, TransformerConv with edge features) compiled and
compared with an eager copy by :func:`_compare`: outputs, every parameter gradient and the gradient of every floating
point input; float32 at ``TOLERANCES``, float64 to 1e-10, bf16 within twice eager's own bf16 error of float32.

1. graph shapes: no edges, one node, only self loops, 90% of the edges into one node, a complete graph, isolated
   nodes at the end, int32 and non-contiguous ``edge_index`` (one compiled model visits them all), and
   non-contiguous ``x``;
2. the plan cache: A-B-A, in-place edits the version counter sees, edits it does not see (``.data``, ``.numpy()``,
   GCNConv's edge weight), a new graph every step, graphs garbage collected and replaced;
3. modes: train/eval switching, ``no_grad``, ``inference_mode``; GATConv's attention dropout statistics;
4. bad input raises an exception that says what is wrong, and the model still works after it;
5. lifecycle: two models on one graph, deep copy, state dict, Adam steps, ``torch._dynamo.reset()``, two threads;
6. dtypes: float64 for every layer, bf16 for GCNConv and GATConv;
then RGCNConv, HGTConv, HeteroConv and ``to_hetero``, and the fake implementation of every gnn_io op the models call
against its real one on non-contiguous inputs.

To stay lean on CPU (each compile costs seconds there), the plan cache, mode, bad input and untracked edit tests run
a representative subset (``SUBSET``: GCNConv for the SpMM family, SAGEConv max for gather-scatter, GATConv for
attention, TransformerConv for attention with edge features), the lifecycle tests GCNConv, SAGEConv max and GATConv,
bf16 GCNConv and GATConv. Every test starts from ``torch._dynamo.reset()``; the graphs' sizes recur across tests, so
Inductor's compile cache serves most compiles after the first. On CUDA every rewrite is forced (``GNN_IO_FORCE=1``).
``GNN_IO_STRICT=1`` everywhere except where the default settings are the point (RGCNConv, HGTConv).
"""
import copy
import gc
import threading
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch_geometric.nn import (
    GATConv, GATv2Conv, GCNConv, GINConv, HeteroConv, HGTConv, RGCNConv, SAGEConv, TransformerConv, to_hetero,
)

from gnn_inductor import rewrite_report
from gnn_inductor.testing import _assert_close, _step, gradient_scale, random_graph, random_hetero_graph
from tests.tiers import covering, tiered

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


def _base_graph(seed: int = 0) -> torch.Tensor:
    """The graph most tests start on: 30 nodes, 86 edges, a hub, isolated nodes, self loops, duplicates."""
    return random_graph(NODES, 60, seed=seed, hub_degree=20)


def _inputs(name, edge_index, num_nodes, device, seed=0, x=None) -> list:
    """``[x, edge_index(, edge_attr)]`` on ``device``; ``edge_index`` is passed as given (its identity and layout
    matter to the plan cache)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, FEATURES, generator=generator) if x is None else x
    extra = [torch.randn(edge_index.shape[1], EDGE_DIM, generator=generator)] if name == "transformer" else []
    return [x.to(device), edge_index.to(device), *[e.to(device) for e in extra]]


def _setup(monkeypatch, device, strict=True) -> None:
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_FORCE", "1")  # small graphs the cost model would leave to Inductor
    if strict:
        monkeypatch.setenv("GNN_IO_STRICT", "1")  # a backend error raises instead of falling back to Inductor
    else:
        monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _no_silent_eager_fallback():
    """Past Dynamo's recompile limit a model runs eagerly, and a comparison with eager would prove nothing."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def _compiled(make, device, dtype=torch.float32, seed=0):
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


def _compare(what, compiled, reference, inputs, *, baseline=None, grad=True, seed=0, eager_inputs=None) -> list:
    """``compiled`` against eager ``reference`` on ``inputs``: outputs and, with ``grad``, the gradients of every
    parameter and floating point input (a backward of random weights drawn from ``seed``). Each model gets the
    inputs in its parameters' dtype. A compiled model of lower precision than ``reference`` is judged against
    ``baseline`` (eager in its own dtype): at most twice as far from ``reference`` as that (``_assert_close``).
    ``eager_inputs``: what the eager models get instead (the same values). Returns the compiled model's outputs."""
    runs = []
    for model in (compiled, reference, baseline):
        if model is None:
            runs.append(None)
            continue
        leaves = []
        given = inputs if model is compiled or eager_inputs is None else eager_inputs
        args = [_copy_inputs(v, next(model.parameters()).dtype, grad, leaves) for v in given]
        outputs, params, _ = _step(model, args, grad, seed, {})
        runs.append((outputs, params, [leaf.grad for leaf in leaves]))
    (out, params, input_grads), (ref_out, ref_params, ref_input_grads) = runs[:2]
    base_out, base_params, base_input_grads = runs[2] or runs[1]
    assert len(out) == len(ref_out), f"{what}: compiled returned {len(out)} tensors, eager {len(ref_out)}"
    for i, (a, e, b) in enumerate(zip(out, ref_out, base_out)):
        _assert_close(f"{what}: output {i}", a, e, b)
    if grad:
        scale = gradient_scale([g for _, g in ref_params] + ref_input_grads)
        for (name, a), (_, e), (_, b) in zip(params, ref_params, base_params):
            if (a is None) != (e is None):
                raise AssertionError(f"{what}: grad of {name}: eager {e is not None}, compiled {a is not None}")
            if e is not None:
                _assert_close(f"{what}: grad of parameter {name}", a, e, b, scale)
        for i, (a, e, b) in enumerate(zip(input_grads, ref_input_grads, base_input_grads)):
            if e is None:  # no edge reads this input: none or zeros
                assert a is None or not a.any(), f"{what}: input {i} has a gradient eager does not give"
            else:
                _assert_close(f"{what}: grad of input {i}", a, e, b, scale)
    return out


def _two_calls(name, compiled, reference, device, x=None, baseline=None) -> None:
    """Two calls on the base graph (the second reuses its plan) against eager; ``x``: these node features."""
    for call in range(2):
        inputs = _inputs(name, _base_graph(), NODES, device, call, x)
        _compare(f"call {call}", compiled, reference, inputs, baseline=baseline, seed=call)


def _assert_rewritten(first: int, family=None) -> None:
    """The reports since ``first`` hold no backend failure and (unless None) a ``family`` rewrite."""
    reports = rewrite_report.reports()[first:]
    text = "\n".join(rewrite_report.format_text_for(reports))
    assert not any(m.pattern == "backend" for r in reports for m in r.near_misses), text
    assert family is None or any(w.pattern == family for r in reports for w in r.rewrites), text


# -------------------- 1. Graph shapes ------------------------------------------------------------------------------

def _shape_graphs() -> list:
    """(what, edge_index, num_nodes). The second graph changes every size, so that one dynamic graph serves the
    rest, apart from Dynamo's specialisations (0 edges, 1 node), the int32 index and the strided layouts."""
    complete = torch.tensor([[i, j] for i in range(7) for j in range(7) if i != j]).t().contiguous()
    wide = random_graph(NODES, 200, seed=4)
    generator = torch.Generator().manual_seed(2)
    into_hub = torch.cat([torch.zeros(72, dtype=torch.long), torch.randint(1, NODES, (8,), generator=generator)])
    hub = torch.stack([torch.randint(0, NODES, (80,), generator=generator), into_hub])  # 72 of 80 edges into node 0
    return [
        ("base", _base_graph(), NODES),
        ("tail_isolated", random_graph(10, 30, seed=1, num_isolated=1), 20),  # nodes 10-19 have no edges
        ("hub_90_percent", hub, NODES),
        ("complete", complete, 7),
        ("self_loops_only", torch.arange(6).repeat(2, 1), 6),
        ("no_edges", torch.empty(2, 0, dtype=torch.long), 5),
        ("single_node", torch.tensor([[0], [0]]), 1),
        ("int32", _base_graph(1).int(), NODES),
        ("strided_edge_index", wide[:, ::2], NODES),  # strides (206, 2)
        ("column_major_edge_index", _base_graph(2).t().contiguous().t(), NODES),  # strides (1, 2)
        ("base_again", _base_graph(), NODES),
    ]


@pytest.mark.parametrize("device", DEVICES)
# GCNConv and SAGEConv max meet the same awkward graphs in tests/models/test_graph_shapes.py
@pytest.mark.parametrize("name", tiered(LAYERS, ["gat"]))
def test_graph_shapes(name, device, monkeypatch):
    """One compiled layer meets each awkward graph in turn (static, then dynamic shapes, Dynamo's 0/1
    specialisations, an int32 and non-contiguous edge_index): equal to eager at every call. Eager gets an int32
    graph as int64: torch 2.11's CPU ``gather`` with an expanded int32 index (the backward of PyG's scatter)
    reads wrong rows, so eager's own gradients are wrong there. ``GNN_IO_CHURN=off``: every call here takes the
    rewrites (a new graph at most calls would otherwise also compile the graph as torch.compile's default, the
    mini-batch switch that test_plan_cache_churn meets)."""
    _setup(monkeypatch, device)
    monkeypatch.setenv("GNN_IO_CHURN", "off")
    compiled, reference = _compiled(name, device)
    first = len(rewrite_report.reports())
    for i, (what, edge_index, num_nodes) in enumerate(_shape_graphs()):
        inputs = _inputs(name, edge_index, num_nodes, device, seed=i)
        eager_inputs = [inputs[0], inputs[1].long(), *inputs[2:]]
        _compare(what, compiled, reference, inputs, seed=i, eager_inputs=eager_inputs)
    _assert_rewritten(first, LAYERS[name][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LAYERS, ["sage_max", "transformer"]))
def test_non_contiguous_x_backward(name, device, monkeypatch):
    """Node features that are a transposed view (``x_base.t()``): the gnn_io ops' fake implementations must give
    the strides the real ones return, or Inductor's ``assert_size_stride`` fails in the backward."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    x = torch.randn(FEATURES, NODES, generator=torch.Generator().manual_seed(5)).t()
    assert not x.is_contiguous()
    _two_calls(name, compiled, reference, device, x=x)


# -------------------- 2. Plan-cache churn --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gcn"]))
def test_plan_cache_churn(name, device, monkeypatch):
    """Graphs alternating A-B-A, in-place edits the version counter sees (``ei[0, :5] = ...``, ``copy_``), graphs
    garbage collected and replaced by new ones of the same size (the dead graph's plan must not be reused, nor the
    graph kept alive), and a new graph of a new size at every step: equal to eager at every call."""
    _setup(monkeypatch, device)
    monkeypatch.delenv("GNN_IO_CHURN", raising=False)  # the default: the mini-batch switch after eight new graphs
    compiled, reference = _compiled(name, device)
    calls = iter(range(100))

    def check(what, edge_index, num_nodes=NODES):
        seed = next(calls)
        _compare(what, compiled, reference, _inputs(name, edge_index, num_nodes, device, seed=seed), seed=seed)

    a, b = _base_graph().to(device), random_graph(20, 50, seed=7).to(device)
    check("A", a)
    check("B", b, 20)
    check("A again", a)
    a[0, :5] = (a[0, :5] + 1) % NODES
    check("A after a[0, :5] = ...", a)
    a.copy_(_base_graph(3).to(device))
    check("A after copy_", a)
    for i in range(3):
        edge_index = _base_graph(10 + i).to(device)
        check(f"collected graph {i}", edge_index)
        ref = weakref.ref(edge_index)
        del edge_index
        gc.collect()
        assert ref() is None, "the compiled model keeps a graph alive after the caller dropped it"
    generator = torch.Generator().manual_seed(11)
    for i in range(10):
        num_nodes = int(torch.randint(12, 40, (1,), generator=generator))
        num_edges = int(torch.randint(20, 120, (1,), generator=generator))
        check(f"new graph {i}", random_graph(num_nodes, num_edges, seed=100 + i).to(device), num_nodes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gcn", "gat"]))
def test_untracked_structure_edit_is_followed(name, device, monkeypatch):
    """``edge_index.data[0, :10] = ...``, then ``edge_index.numpy()[1, :10] = ...`` (CPU) change the graph without
    bumping its version counter: the compiled model must not reuse the old graph's plan. On CUDA the plan's
    fingerprint check is opt-in (docs/usage.md, "Editing a graph in place"): ``GNN_IO_PLAN_CHECK=fingerprint``."""
    _setup(monkeypatch, device)
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", "fingerprint")
    compiled, reference = _compiled(name, device)
    edge_index = _base_graph().to(device)
    inputs = _inputs(name, edge_index, NODES, device)
    _compare("before the edits", compiled, reference, inputs)
    for call, edit in enumerate(["data", "numpy"] if device == "cpu" else ["data"], 1):
        with torch.no_grad():
            before = reference(*inputs)
        version, new = edge_index._version, (edge_index[call - 1, :10] + 7) % NODES
        if edit == "data":
            edge_index.data[0, :10] = new
        else:
            edge_index.numpy()[1, :10] = new.numpy()
        assert edge_index._version == version, f".{edit}: the edit is tracked after all, this test proves nothing"
        with torch.no_grad():
            assert not torch.allclose(before, reference(*inputs)), f".{edit}: the edit leaves eager's output as it was"
        _compare(f"after an edit through .{edit}", compiled, reference, inputs, seed=call)


@pytest.mark.parametrize("device", DEVICES)
def test_untracked_gcn_edge_weight_edit_is_followed(device, monkeypatch):
    """GCNConv's edge weight (no gradient: structure, normalised once per graph in the plan) edited through
    ``.data``: the compiled model must renormalise (on CUDA with the opt-in check, as above)."""
    _setup(monkeypatch, device)
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", "fingerprint")
    compiled, reference = _compiled("gcn", device)
    edge_index = _base_graph().to(device)
    weight = (torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(3)) + 0.1).to(device)
    inputs = _inputs("gcn", edge_index, NODES, device) + [Fixed((weight,))]
    _compare("before the edit", compiled, reference, inputs)
    weight.data[:20] = weight[:20] * 3 + 1
    _compare("after an edit through .data", compiled, reference, inputs, seed=1)


# -------------------- 3. Modes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gcn", "gat"]))
def test_modes(name, device, monkeypatch):
    """eval, ``no_grad``, ``inference_mode`` (inference tensors have no version counter) and train/eval switching
    back and forth: each call equal to eager in the same mode."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    inputs = _inputs(name, _base_graph(), NODES, device)
    for i, mode in enumerate(["train", "eval", "train", "eval"]):
        for model in (compiled, reference):
            model.train(mode == "train")
        _compare(f"{mode} (call {i})", compiled, reference, inputs, seed=i)
    with torch.no_grad():
        _compare("no_grad", compiled, reference, inputs, grad=False)
    with torch.inference_mode():
        inference_inputs = _inputs(name, _base_graph().clone(), NODES, device, seed=1)
        _compare("inference_mode", compiled, reference, inference_inputs, grad=False)
        _compare("inference_mode, same graph", compiled, reference, inference_inputs, grad=False, seed=1)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_dropout_statistics(device, monkeypatch):
    """GATConv(dropout=0.5) in train mode. On a graph of self loops alone (GATConv keeps one per node) each
    (node, head) attends to itself with weight 1, so dropout leaves it at 0 or at 2x its eval value: every entry
    must be one of the two, about half of them dropped, a new mask each call. Eval equals eager on the base graph.
    Both graphs have the base graph's sizes, so each mode compiles one static graph."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(lambda: GATConv(FEATURES, 3, heads=2, dropout=0.5), device)
    loops = (torch.arange(_base_graph().shape[1]) % NODES).repeat(2, 1).to(device)
    x = torch.randn(NODES, FEATURES, generator=torch.Generator().manual_seed(0)).to(device)
    compiled.eval()
    reference.eval()
    _compare("eval, base graph", compiled, reference, _inputs("gat", _base_graph(), NODES, device))
    with torch.no_grad():
        kept = (reference(x, loops) - reference.bias).view(NODES, 2, 3) * 2
    compiled.train()
    dropped, masks = [], []
    for call in range(8):
        out = compiled(x, loops)
        out.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in compiled.parameters())
        out = (out.detach() - reference.bias).view(NODES, 2, 3)
        zero = out.abs().amax(-1) <= 1e-6
        twice = (out - kept).abs().amax(-1) <= 1e-5 * (1 + kept.abs().amax(-1))
        assert (zero | twice).all(), f"call {call}: entries neither dropped nor kept at 2x: {(~(zero | twice)).sum()}"
        dropped.append(zero.float().mean().item())
        masks.append(zero)
    assert 0.4 < sum(dropped) / len(dropped) < 0.6, f"dropped fractions {dropped} for p=0.5"
    assert not all(torch.equal(masks[0], m) for m in masks[1:]), "the same mask at every call"


# -------------------- 4. Bad input ---------------------------------------------------------------------------------

def _with(edge_index, row, value):
    bad = edge_index.clone()
    bad[row, :3] = value
    return bad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gat"]))
def test_bad_input_raises_then_model_still_works(name, device, monkeypatch):
    """Each bad input raises an exception with a message (naming edge_index or the offending value where the
    backend checks it), and the same compiled model is still right on a good graph after it."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    good = _inputs(name, _base_graph(), NODES, device)
    _compare("good graph", compiled, reference, good)
    x, edge_index, rest = good[0], good[1], good[2:]
    bad = {  # what -> (inputs, words of which the message must hold one; None: any message)
        "source index == num_nodes": ([x, _with(edge_index, 0, NODES), *rest], ["edge_index", str(NODES)]),
        "destination index == num_nodes": ([x, _with(edge_index, 1, NODES), *rest], ["edge_index", str(NODES)]),
        "negative index": ([x, _with(edge_index, 1, -1), *rest], ["edge_index", "negative", "-1"]),
        "float edge_index": ([x, edge_index.float(), *rest], None),
        "[3, E] edge_index": ([x, torch.cat([edge_index, edge_index[:1]]), *rest], None),
        "x of 5 features": ([x[:, :5], edge_index, *rest], None),
    }
    if name == "transformer":
        bad["edge_attr of E - 3 rows"] = ([x, edge_index, rest[0][:-3]], None)
    for i, (what, (args, words)) in enumerate(bad.items()):
        with pytest.raises(Exception) as info:
            compiled(*args)
        message = str(info.value)
        assert message.strip(), f"{what}: {type(info.value).__name__} with no message"
        assert words is None or any(w in message for w in words), f"{what}: unhelpful message: {message}"
        _compare(f"good graph after {what}", compiled, reference, good, seed=i)
    _compare("another good graph", compiled, reference, _inputs(name, _base_graph(5), NODES, device))


# -------------------- 5. Lifecycle ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_two_models_share_a_graph(device, monkeypatch):
    """A GCNConv and a GATConv compiled side by side on one edge_index (each with its own plan of it), called in
    turn, then the graph edited in place: both follow."""
    _setup(monkeypatch, device)
    models = [_compiled("gcn", device), _compiled("gat", device)]
    edge_index = _base_graph().to(device)
    for step in range(4):
        if step == 2:
            edge_index[1, :8] = (edge_index[1, :8] + 3) % NODES
        for compiled, reference in models:
            _compare(f"step {step}", compiled, reference, _inputs("gcn", edge_index, NODES, device, step), seed=step)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gat"]))
def test_deepcopy_and_state_dict(name, device, monkeypatch):
    """A deep copy of a compiled module's original, its parameters then changed, compiled in turn: the copy and
    the original each equal to their own eager model. A state dict loaded into a fresh layer: compiled, it equals
    the original."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    inputs = _inputs(name, _base_graph(), NODES, device)
    _compare("original", compiled, reference, inputs)
    clone = copy.deepcopy(compiled._orig_mod)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.1)
    _compare("deep copy", torch.compile(clone, backend="gnn_io"), copy.deepcopy(clone), inputs, seed=1)
    _compare("original after the copy changed", compiled, reference, inputs, seed=2)
    fresh, _ = _compiled(name, device, seed=1)
    fresh._orig_mod.load_state_dict(compiled._orig_mod.state_dict())
    _compare("state dict loaded into a fresh layer", fresh, reference, inputs, seed=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["sage_max"]))
def test_optimizer_steps(name, device, monkeypatch):
    """Three Adam steps on the compiled model and on eager: gradients equal at each step, parameters after."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (compiled, reference)]
    for step in range(3):
        _compare(f"step {step}", compiled, reference, _inputs(name, _base_graph(), NODES, device, step), seed=step)
        for optimizer in optimizers:
            optimizer.step()
    for (param, a), (_, e) in zip(compiled.named_parameters(), reference.named_parameters()):
        _assert_close(f"{param} after 3 Adam steps", a.detach(), e.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gcn"]))
def test_dynamo_reset_then_recompile(name, device, monkeypatch):
    """``torch._dynamo.reset()`` between calls: the model recompiles and is still right, on the old graph and a
    new one."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(name, device)
    edge_index = _base_graph().to(device)
    _compare("before reset", compiled, reference, _inputs(name, edge_index, NODES, device))
    torch._dynamo.reset()
    _compare("after reset", compiled, reference, _inputs(name, edge_index, NODES, device, 1), seed=1)
    _compare("after reset, new graph", compiled, reference, _inputs(name, _base_graph(6), NODES, device, 2), seed=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gat"]))
def test_two_threads(name, device, monkeypatch):
    """Two threads, each with its own compiled copy of the layer (the same compiled graphs and plan caches) and
    two graphs of its own, forward and backward at the same time: each call equal to eager."""
    _setup(monkeypatch, device)
    pairs = [_compiled(name, device), _compiled(name, device, seed=1)]
    graphs = [[_base_graph(20 + 2 * t + g).to(device) for g in range(2)] for t in range(2)]
    for (compiled, reference), own in zip(pairs, graphs):  # compiled before the threads start
        _compare("warm up", compiled, reference, _inputs(name, own[0], NODES, device))
    errors = []

    def work(t):
        try:
            for call in range(4):
                _compare(f"thread {t} call {call}", *pairs[t], _inputs(name, graphs[t][call % 2], NODES, device, call),
                         seed=call)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


# -------------------- 6. Dtypes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(["gcn", "sage_max", "gin", "transformer"], ["gcn", "transformer"]))
def test_float64(name, device, monkeypatch):
    """float64 outputs and every gradient to 1e-10 relative (GATConv and GATv2Conv: the test below)."""
    _setup(monkeypatch, device)
    _two_calls(name, *_compiled(name, device, torch.float64), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(["gat", "gatv2"], ["gat"]))
def test_float64_attention_bias_gradient(name, device, monkeypatch):
    """float64 GATConv and GATv2Conv, outputs and every gradient to 1e-10 relative: the bias gradient must not be
    accumulated in float32."""
    _setup(monkeypatch, device)
    _two_calls(name, *_compiled(name, device, torch.float64), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_bfloat16(name, device, monkeypatch):
    """bf16 outputs and gradients within twice eager bf16's own error of an eager float32 copy."""
    _setup(monkeypatch, device)
    torch.manual_seed(0)
    model = LAYERS[name][0]().to(device)
    reference, baseline = copy.deepcopy(model), copy.deepcopy(model).to(torch.bfloat16)
    compiled = torch.compile(model.to(torch.bfloat16), backend="gnn_io")
    _two_calls(name, compiled, reference, device, baseline=baseline)


# -------------------- Heterogeneous models -------------------------------------------------------------------------

RGCN = {
    "plain": lambda: RGCNConv(FEATURES, 6, num_relations=3),
    "bases": lambda: RGCNConv(FEATURES, 6, num_relations=3, num_bases=2),
}


def _rgcn_inputs(device, seed=0) -> list:
    edge_index = _base_graph()
    edge_type = torch.randint(0, 3, (edge_index.shape[1],), generator=torch.Generator().manual_seed(seed))
    return _inputs("rgcn", edge_index, NODES, device, seed) + [edge_type.to(device)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("variant", "dtype"), covering(list(RGCN), [torch.float32, torch.float64]))
def test_rgcn_conv_matches_eager(variant, dtype, device, monkeypatch):
    """RGCNConv (per-relation masks: a graph whose structure work has no placeholder of its own) compiles with
    the default settings and equals eager, float32 and float64."""
    _setup(monkeypatch, device, strict=False)
    compiled, reference = _compiled(RGCN[variant], device, dtype)
    for call in range(2):
        _compare(f"call {call}", compiled, reference, _rgcn_inputs(device, call), seed=call)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(RGCN))
def test_rgcn_conv_compiles_strict(variant, device, monkeypatch):
    """The same under ``GNN_IO_STRICT=1``: no backend error to hide."""
    _setup(monkeypatch, device)
    compiled, reference = _compiled(RGCN[variant], device)
    first = len(rewrite_report.reports())
    _compare("strict", compiled, reference, _rgcn_inputs(device))
    _assert_rewritten(first)


def _hetero_graph(device) -> tuple:
    """``(x_dict, edge_index_dict, metadata)``: papers and authors, three edge types, 8 features."""
    return random_hetero_graph({"paper": 12, "author": 9}, {("author", "writes", "paper"): 30,
                                                           ("paper", "cites", "paper"): 25,
                                                           ("paper", "rev_writes", "author"): 30},
                               FEATURES, device=device)


class _Sage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = SAGEConv((FEATURES, FEATURES), 8)
        self.conv2 = SAGEConv((8, 8), 6)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


HETERO = {
    "hgt": lambda metadata: HGTConv(FEATURES, 8, metadata, heads=2),
    "hetero_conv": lambda metadata: HeteroConv({
        ("author", "writes", "paper"): SAGEConv((FEATURES, FEATURES), 6),
        ("paper", "cites", "paper"): GATConv(FEATURES, 3, heads=2, add_self_loops=False),
        ("paper", "rev_writes", "author"): SAGEConv((FEATURES, FEATURES), 6)}),
    "to_hetero": lambda metadata: to_hetero(_Sage(), metadata),
}


def _check_hetero(name, device):
    x, edge_index, metadata = _hetero_graph(device)
    compiled, reference = _compiled(lambda: HETERO[name](metadata), device)
    for call in range(2):
        _compare(f"call {call}", compiled, reference, [x, edge_index], seed=call)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(["hetero_conv", "to_hetero"], ["hetero_conv"]))
def test_heterogeneous_models(name, device, monkeypatch):
    """HeteroConv (SAGEConv and GATConv by edge type) and ``to_hetero`` of a two-layer GraphSAGE on a graph of two
    node types and three edge types: forward and gradients equal to eager."""
    _setup(monkeypatch, device)
    _check_hetero(name, device)


# HGTConv against eager runs in the default tier in tests/frontends/test_pyg_frontend.py
@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_hgt_conv_matches_eager(device, monkeypatch):
    """HGTConv with the default settings: forward and backward run (no stride assertion in the attention
    backward) and equal eager."""
    _setup(monkeypatch, device, strict=False)
    _check_hetero("hgt", device)


# -------------------- Fake implementations against real ones -------------------------------------------------------

class _Recorder(TorchDispatchMode):
    """Records every gnn_io op call: ``(op, args, kwargs)``. ``ignore_compile_internals``: Dynamo compiles with
    the mode off (otherwise it skips the frame and runs it eagerly, where no gnn_io op is called) and turns it
    on again while the compiled forward and backward run, so the ops their wrappers call are seen."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "gnn_io":
            self.calls.append((func, tree_map(_snapshot, args), tree_map(_snapshot, kwargs)))
        return func(*args, **kwargs)


def _snapshot(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _non_contiguous(value):
    """A floating point tensor as a same-valued copy of other strides: a strided slice (1-D), the reverse dim
    order (2-D and up)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() == 0:
        return value
    if value.dim() == 1:
        return torch.zeros(2 * value.numel(), dtype=value.dtype, device=value.device)[::2].copy_(value)
    order = list(reversed(range(value.dim())))
    return value.permute(order).contiguous().permute(order)


def _layout_mismatch(real, fake):
    """Why ``fake`` does not describe ``real`` (shape, dtype, the strides of dims longer than 1), or None. Sizes
    the fake left symbolic (data dependent) are not compared."""
    if real.dtype != fake.dtype:
        return f"dtype {fake.dtype} != real {real.dtype}"
    sizes = [s if isinstance(s, int) else None for s in fake.shape]
    if len(sizes) != real.dim() or any(s is not None and s != r for s, r in zip(sizes, real.shape)):
        return f"shape {tuple(fake.shape)} != real {tuple(real.shape)}"
    if real.numel() > 1:
        for dim, size in enumerate(real.shape):
            fake_stride = fake.stride(dim)
            if size > 1 and isinstance(fake_stride, int) and fake_stride != real.stride(dim):
                return f"strides {fake.stride()} != real {real.stride()} (shape {tuple(real.shape)})"
    return None


def test_fake_implementations_match_real_on_non_contiguous_inputs(monkeypatch):
    """Every gnn_io op the compiled models call (forward, backward and the plan's structure ops; recorded while
    compiled SAGEConv max, GINConv, GATConv, TransformerConv with edge features and GCNConv run on CPU) called again
    with each floating point tensor argument non-contiguous: the fake implementation, which Inductor plans buffers
    and its ``assert_size_stride`` checks by, must give each output's shape, dtype and strides as the real one
    does. Ops that mutate or return nothing are skipped."""
    _setup(monkeypatch, "cpu")
    recorder = _Recorder()
    for name in ["sage_max", "gin", "gat", "transformer", "gcn"]:
        compiled, reference = _compiled(name, "cpu")
        _compare(name, compiled, reference, _inputs(name, _base_graph(), NODES, "cpu"))
        with recorder:  # a new graph: its plan is built while recording
            _compare(name, compiled, reference, _inputs(name, _base_graph(1), NODES, "cpu", 1), seed=1)
    seen, failures = {}, []
    for func, args, kwargs in recorder.calls:
        schema = func._schema
        if schema.is_mutable or not schema.returns or seen.get(func, 0) >= 2:
            continue
        seen[func] = seen.get(func, 0) + 1
        args, kwargs = tree_map(_non_contiguous, args), tree_map(_non_contiguous, kwargs)
        real = func(*args, **kwargs)
        mode = FakeTensorMode(shape_env=ShapeEnv())  # a shape env: data-dependent sizes become unbacked symbols
        fake_args, fake_kwargs = tree_map(
            lambda v: mode.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v, (args, kwargs))
        with mode:
            fake = func(*fake_args, **fake_kwargs)
        reals, fakes = tree_flatten(real)[0], tree_flatten(fake)[0]
        if len(reals) != len(fakes):
            failures.append(f"{func}: {len(fakes)} fake outputs, {len(reals)} real")
        for i, (r, f) in enumerate(zip(reals, fakes)):
            if isinstance(r, torch.Tensor) and (why := _layout_mismatch(r, f)):
                failures.append(f"{func} output {i}: {why}")
    assert any("backward" in str(func) for func in seen), f"no backward op among the recorded calls: {list(seen)}"
    assert not failures, "fake implementations disagree with real ones:\n" + "\n".join(failures)
