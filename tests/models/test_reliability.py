"""Reliability of compiled models beyond one graph and one call: what a user's training loop does to them.

Six layers (GCNConv, SAGEConv max, GINConv, GATConv, GATv2Conv, TransformerConv with edge features) compiled and
compared with an eager copy by :func:`compare`: outputs, every parameter gradient and the gradient of every floating
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
the heterogeneous layers and the fake implementations of the ops: tests/models/test_reliability_hetero.py.

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
from torch_geometric.nn import GATConv

from gnn_inductor import rewrite_report
from gnn_inductor.testing import assert_close_to_reference, random_graph
from tests.models.reliability import (
    DEVICES,
    FEATURES,
    LAYERS,
    LIFECYCLE,
    NODES,
    SUBSET,
    Fixed,
    assert_rewritten,
    base_graph,
    compare,
    compiled_pair,
    model_inputs,
    no_silent_eager_fallback,  # noqa: F401  (autouse fixture)
    setup_backend,
    two_calls,
)
from tests.tiers import tiered


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
        ("base", base_graph(), NODES),
        ("tail_isolated", random_graph(10, 30, seed=1, num_isolated=1), 20),  # nodes 10-19 have no edges
        ("hub_90_percent", hub, NODES),
        ("complete", complete, 7),
        ("self_loops_only", torch.arange(6).repeat(2, 1), 6),
        ("no_edges", torch.empty(2, 0, dtype=torch.long), 5),
        ("single_node", torch.tensor([[0], [0]]), 1),
        ("int32", base_graph(1).int(), NODES),
        ("strided_edge_index", wide[:, ::2], NODES),  # strides (206, 2)
        ("column_major_edge_index", base_graph(2).t().contiguous().t(), NODES),  # strides (1, 2)
        ("base_again", base_graph(), NODES),
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
    setup_backend(monkeypatch, device)
    monkeypatch.setenv("GNN_IO_CHURN", "off")
    compiled, reference = compiled_pair(name, device)
    first = len(rewrite_report.reports())
    for i, (what, edge_index, num_nodes) in enumerate(_shape_graphs()):
        inputs = model_inputs(name, edge_index, num_nodes, device, seed=i)
        eager_inputs = [inputs[0], inputs[1].long(), *inputs[2:]]
        compare(what, compiled, reference, inputs, seed=i, eager_inputs=eager_inputs)
    assert_rewritten(first, LAYERS[name][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LAYERS, ["sage_max", "transformer"]))
def test_non_contiguous_x_backward(name, device, monkeypatch):
    """Node features that are a transposed view (``x_base.t()``): the gnn_io ops' fake implementations must give
    the strides the real ones return, or Inductor's ``assert_size_stride`` fails in the backward."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    x = torch.randn(FEATURES, NODES, generator=torch.Generator().manual_seed(5)).t()
    assert not x.is_contiguous()
    two_calls(name, compiled, reference, device, x=x)


# -------------------- 2. Plan-cache churn --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gcn"]))
def test_plan_cache_churn(name, device, monkeypatch):
    """Graphs alternating A-B-A, in-place edits the version counter sees (``ei[0, :5] = ...``, ``copy_``), graphs
    garbage collected and replaced by new ones of the same size (the dead graph's plan must not be reused, nor the
    graph kept alive), and a new graph of a new size at every step: equal to eager at every call."""
    setup_backend(monkeypatch, device)
    monkeypatch.delenv("GNN_IO_CHURN", raising=False)  # the default: the mini-batch switch after eight new graphs
    compiled, reference = compiled_pair(name, device)
    calls = iter(range(100))

    def check(what, edge_index, num_nodes=NODES):
        seed = next(calls)
        compare(what, compiled, reference, model_inputs(name, edge_index, num_nodes, device, seed=seed), seed=seed)

    a, b = base_graph().to(device), random_graph(20, 50, seed=7).to(device)
    check("A", a)
    check("B", b, 20)
    check("A again", a)
    a[0, :5] = (a[0, :5] + 1) % NODES
    check("A after a[0, :5] = ...", a)
    a.copy_(base_graph(3).to(device))
    check("A after copy_", a)
    for i in range(3):
        edge_index = base_graph(10 + i).to(device)
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
    setup_backend(monkeypatch, device)
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", "fingerprint")
    compiled, reference = compiled_pair(name, device)
    edge_index = base_graph().to(device)
    inputs = model_inputs(name, edge_index, NODES, device)
    compare("before the edits", compiled, reference, inputs)
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
        compare(f"after an edit through .{edit}", compiled, reference, inputs, seed=call)


@pytest.mark.parametrize("device", DEVICES)
def test_untracked_gcn_edge_weight_edit_is_followed(device, monkeypatch):
    """GCNConv's edge weight (no gradient: structure, normalised once per graph in the plan) edited through
    ``.data``: the compiled model must renormalise (on CUDA with the opt-in check, as above)."""
    setup_backend(monkeypatch, device)
    if device == "cuda":
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", "fingerprint")
    compiled, reference = compiled_pair("gcn", device)
    edge_index = base_graph().to(device)
    weight = (torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(3)) + 0.1).to(device)
    inputs = model_inputs("gcn", edge_index, NODES, device) + [Fixed((weight,))]
    compare("before the edit", compiled, reference, inputs)
    weight.data[:20] = weight[:20] * 3 + 1
    compare("after an edit through .data", compiled, reference, inputs, seed=1)


# -------------------- 3. Modes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(SUBSET, ["gcn", "gat"]))
def test_modes(name, device, monkeypatch):
    """eval, ``no_grad``, ``inference_mode`` (inference tensors have no version counter) and train/eval switching
    back and forth: each call equal to eager in the same mode."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    inputs = model_inputs(name, base_graph(), NODES, device)
    for i, mode in enumerate(["train", "eval", "train", "eval"]):
        for model in (compiled, reference):
            model.train(mode == "train")
        compare(f"{mode} (call {i})", compiled, reference, inputs, seed=i)
    with torch.no_grad():
        compare("no_grad", compiled, reference, inputs, grad=False)
    with torch.inference_mode():
        inference_inputs = model_inputs(name, base_graph().clone(), NODES, device, seed=1)
        compare("inference_mode", compiled, reference, inference_inputs, grad=False)
        compare("inference_mode, same graph", compiled, reference, inference_inputs, grad=False, seed=1)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_dropout_statistics(device, monkeypatch):
    """GATConv(dropout=0.5) in train mode. On a graph of self loops alone (GATConv keeps one per node) each
    (node, head) attends to itself with weight 1, so dropout leaves it at 0 or at 2x its eval value: every entry
    must be one of the two, about half of them dropped, a new mask each call. Eval equals eager on the base graph.
    Both graphs have the base graph's sizes, so each mode compiles one static graph."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(lambda: GATConv(FEATURES, 3, heads=2, dropout=0.5), device)
    loops = (torch.arange(base_graph().shape[1]) % NODES).repeat(2, 1).to(device)
    x = torch.randn(NODES, FEATURES, generator=torch.Generator().manual_seed(0)).to(device)
    compiled.eval()
    reference.eval()
    compare("eval, base graph", compiled, reference, model_inputs("gat", base_graph(), NODES, device))
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
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    good = model_inputs(name, base_graph(), NODES, device)
    compare("good graph", compiled, reference, good)
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
        compare(f"good graph after {what}", compiled, reference, good, seed=i)
    compare("another good graph", compiled, reference, model_inputs(name, base_graph(5), NODES, device))


# -------------------- 5. Lifecycle ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_two_models_share_a_graph(device, monkeypatch):
    """A GCNConv and a GATConv compiled side by side on one edge_index (each with its own plan of it), called in
    turn, then the graph edited in place: both follow."""
    setup_backend(monkeypatch, device)
    models = [compiled_pair("gcn", device), compiled_pair("gat", device)]
    edge_index = base_graph().to(device)
    for step in range(4):
        if step == 2:
            edge_index[1, :8] = (edge_index[1, :8] + 3) % NODES
        for compiled, reference in models:
            inputs = model_inputs("gcn", edge_index, NODES, device, step)
            compare(f"step {step}", compiled, reference, inputs, seed=step)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gat"]))
def test_deepcopy_and_state_dict(name, device, monkeypatch):
    """A deep copy of a compiled module's original, its parameters then changed, compiled in turn: the copy and
    the original each equal to their own eager model. A state dict loaded into a fresh layer: compiled, it equals
    the original."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    inputs = model_inputs(name, base_graph(), NODES, device)
    compare("original", compiled, reference, inputs)
    clone = copy.deepcopy(compiled._orig_mod)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.1)
    compare("deep copy", torch.compile(clone, backend="gnn_io"), copy.deepcopy(clone), inputs, seed=1)
    compare("original after the copy changed", compiled, reference, inputs, seed=2)
    fresh, _ = compiled_pair(name, device, seed=1)
    fresh._orig_mod.load_state_dict(compiled._orig_mod.state_dict())
    compare("state dict loaded into a fresh layer", fresh, reference, inputs, seed=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["sage_max"]))
def test_optimizer_steps(name, device, monkeypatch):
    """Three Adam steps on the compiled model and on eager: gradients equal at each step, parameters after."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (compiled, reference)]
    for step in range(3):
        compare(f"step {step}", compiled, reference, model_inputs(name, base_graph(), NODES, device, step), seed=step)
        for optimizer in optimizers:
            optimizer.step()
    for (param, a), (_, e) in zip(compiled.named_parameters(), reference.named_parameters()):
        assert_close_to_reference(f"{param} after 3 Adam steps", a.detach(), e.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gcn"]))
def test_dynamo_reset_then_recompile(name, device, monkeypatch):
    """``torch._dynamo.reset()`` between calls: the model recompiles and is still right, on the old graph and a
    new one."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(name, device)
    edge_index = base_graph().to(device)
    compare("before reset", compiled, reference, model_inputs(name, edge_index, NODES, device))
    torch._dynamo.reset()
    compare("after reset", compiled, reference, model_inputs(name, edge_index, NODES, device, 1), seed=1)
    compare("after reset, new graph", compiled, reference, model_inputs(name, base_graph(6), NODES, device, 2), seed=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(LIFECYCLE, ["gat"]))
def test_two_threads(name, device, monkeypatch):
    """Two threads, each with its own compiled copy of the layer (the same compiled graphs and plan caches) and
    two graphs of its own, forward and backward at the same time: each call equal to eager."""
    setup_backend(monkeypatch, device)
    pairs = [compiled_pair(name, device), compiled_pair(name, device, seed=1)]
    graphs = [[base_graph(20 + 2 * t + g).to(device) for g in range(2)] for t in range(2)]
    for (compiled, reference), own in zip(pairs, graphs):  # compiled before the threads start
        compare("warm up", compiled, reference, model_inputs(name, own[0], NODES, device))
    errors = []

    def work(t):
        try:
            for call in range(4):
                inputs = model_inputs(name, graphs[t][call % 2], NODES, device, call)
                compare(f"thread {t} call {call}", *pairs[t], inputs, seed=call)
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
    setup_backend(monkeypatch, device)
    two_calls(name, *compiled_pair(name, device, torch.float64), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(["gat", "gatv2"], ["gat"]))
def test_float64_attention_bias_gradient(name, device, monkeypatch):
    """float64 GATConv and GATv2Conv, outputs and every gradient to 1e-10 relative: the bias gradient must not be
    accumulated in float32."""
    setup_backend(monkeypatch, device)
    two_calls(name, *compiled_pair(name, device, torch.float64), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_bfloat16(name, device, monkeypatch):
    """bf16 outputs and gradients within twice eager bf16's own error of an eager float32 copy."""
    setup_backend(monkeypatch, device)
    torch.manual_seed(0)
    model = LAYERS[name][0]().to(device)
    reference, baseline = copy.deepcopy(model), copy.deepcopy(model).to(torch.bfloat16)
    compiled = torch.compile(model.to(torch.bfloat16), backend="gnn_io")
    two_calls(name, compiled, reference, device, baseline=baseline)
