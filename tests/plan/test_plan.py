"""Graph plans: structure work once per graph, invalidation on in-place change, no strong
references to dead graphs, mini-batches with a new graph each step."""
import gc
import weakref
from collections import Counter

import pytest
import torch
from torch_geometric.nn import GCNConv

import gnn_inductor  # noqa: F401
from gnn_inductor.passes import direct_ops
from gnn_inductor import rewrite_report
from gnn_inductor.testing import random_graph
from tests.tiers import tiered, tiered_at


def op_counts(fn) -> Counter:
    """How many times each op ran during ``fn()`` (profiler events: compiled code included; a gnn_io op's direct
    twin, which compiled graphs call, counts as the op)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    counts = Counter()
    for event in prof.key_averages():
        name = event.key
        if name.startswith(f"{direct_ops.NAMESPACE}::"):
            name = name.removesuffix(direct_ops.SUFFIX)
        counts[name] += event.count
    return counts


def compiled_gcn():
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(8, 4)
    return conv, torch.compile(conv, backend="gnn_io")


def cache_of(compiled):
    for report in reversed(rewrite_report.reports()):
        return report
    raise AssertionError("nothing compiled")


def test_structure_work_runs_once_per_graph():
    conv, model = compiled_gcn()
    edge_index, x = random_graph(50, 200, hub_degree=40), torch.randn(50, 8)
    model(x, random_graph(50, 200, seed=1, hub_degree=40))  # compile on another graph of the same shape first
    outs = []
    first = op_counts(lambda: outs.append(model(x, edge_index)))
    second = op_counts(lambda: outs.append(model(x, edge_index)))
    structure_ops = ("gnn_io::csr_plan", "aten::nonzero", "aten::scatter_add", "aten::pow")
    assert all(first[op] > 0 for op in structure_ops), first
    assert {op: second[op] for op in structure_ops} == {op: 0 for op in structure_ops}
    assert first["gnn_io::spmm"] > 0 and second["gnn_io::spmm"] == first["gnn_io::spmm"]
    torch.testing.assert_close(outs[0], conv(x, edge_index))
    torch.testing.assert_close(outs[1], outs[0])
    report = cache_of(model)
    assert (report.plan_builds, report.plan_hits) == (2, 1)


def test_in_place_change_of_edge_index_invalidates_the_plan():
    conv, model = compiled_gcn()
    edge_index, x = random_graph(50, 200), torch.randn(50, 8)
    model(x, edge_index)
    edge_index[1, :20] = 7  # same tensor, new structure
    torch.testing.assert_close(model(x, edge_index), conv(x, edge_index))
    assert cache_of(model).plan_builds == 2


@pytest.mark.parametrize("setting", [None, "fingerprint"], ids=["default", "fingerprint"])
@pytest.mark.parametrize("edit", ["data", "numpy", "edge_weight_data"])
def test_an_edit_behind_the_version_counter_rebuilds_the_plan(edit, setting, monkeypatch):
    """Writes through ``.data`` or ``.numpy()`` leave the version counter as it was; the structure fingerprint
    still finds them (CPU graphs are checked by default): the plan is rebuilt, the result is eager's on the edited
    graph, the report counts it."""
    if setting:
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", setting)
    conv, model = compiled_gcn()
    edge_index, x = random_graph(50, 200), torch.randn(50, 8)
    edge_weight = torch.rand(edge_index.shape[1]) + 0.1
    model(x, edge_index, edge_weight)
    model(x, edge_index, edge_weight)
    if edit == "data":
        edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 50
    elif edit == "numpy":
        edge_index.numpy()[1, :10] = (edge_index.numpy()[1, :10] + 3) % 50
    else:
        edge_weight.data[:20] *= 3
    torch.testing.assert_close(model(x, edge_index, edge_weight), conv(x, edge_index, edge_weight))
    report = cache_of(model)
    assert (report.plan_builds, report.plan_hits, report.plan_stale) == (2, 1, 1)
    text = "\n".join(rewrite_report.format_text_for([report]))
    assert "plan rebuilt 1x" in text and "plan reuse: each reuse compares the structure tensors' fingerprint" in text


def test_plan_check_version_trusts_the_version_counter(monkeypatch):
    """``GNN_IO_PLAN_CHECK=version``: the documented contract, a write through ``.data`` is not followed."""
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", "version")
    conv, model = compiled_gcn()
    edge_index, x = random_graph(50, 200), torch.randn(50, 8)
    before = model(x, edge_index)
    edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 50
    torch.testing.assert_close(model(x, edge_index), before)
    assert cache_of(model).plan_stale == 0
    assert "writes through .data or DLPack are not followed" in cache_of(model).plan_check
    assert not torch.allclose(before, conv(x, edge_index))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
@pytest.mark.parametrize("setting", [None, "fingerprint"], ids=["default", "fingerprint"])
def test_plan_check_on_cuda(setting, monkeypatch):
    """On CUDA the default trusts version counters (the documented contract: the check's sync costs more than its
    budget there); ``GNN_IO_PLAN_CHECK=fingerprint`` follows a write through ``.data``."""
    if setting:
        monkeypatch.setenv("GNN_IO_PLAN_CHECK", setting)
    conv, model = compiled_gcn()
    conv = conv.cuda()
    edge_index, x = random_graph(50, 200).cuda(), torch.randn(50, 8, device="cuda")
    before = model(x, edge_index)
    edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 50
    after = model(x, edge_index)
    if setting:
        torch.testing.assert_close(after, conv(x, edge_index))
        assert cache_of(model).plan_stale == 1
    else:
        torch.testing.assert_close(after, before)
        assert cache_of(model).plan_stale == 0


def test_an_unknown_plan_check_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", "sometimes")
    _, model = compiled_gcn()
    with pytest.raises(Exception, match="GNN_IO_PLAN_CHECK"):
        model(torch.randn(50, 8), random_graph(50, 200))


def test_plan_cache_does_not_keep_a_dead_graph_alive():
    _, model = compiled_gcn()
    x = torch.randn(50, 8)
    edge_index = random_graph(50, 200)
    alive = weakref.ref(edge_index)
    model(x, edge_index)
    del edge_index
    gc.collect()
    assert alive() is None
    # the entry went with it: a new graph with equal values is built afresh, never served stale
    model(x, random_graph(50, 200))
    assert cache_of(model).plan_builds == 2


def test_mini_batches_with_a_new_graph_each_step():
    conv, model = compiled_gcn()
    for step in range(4):
        n = 30 + 9 * step
        edge_index, x = random_graph(n, 4 * n, seed=step, hub_degree=n), torch.randn(n, 8)
        torch.testing.assert_close(model(x, edge_index), conv(x, edge_index))
    builds = sum(r.plan_builds for r in rewrite_report.reports()[-2:])
    assert builds == 4


def test_data_dependent_size_used_by_both_plan_and_model():
    """A size found by nonzero feeds both structure work and learned edge math (regression:
    the size node must be computed in both the plan and the main graph)."""
    from torch_geometric.utils import scatter

    def f(x, edge_index, edge_attr):
        mask = edge_index[0] != edge_index[1]
        edge_index, kept = edge_index[:, mask], edge_attr[mask]
        w = kept.reshape(edge_index.size(1), 4).sum(-1)
        return scatter(x[edge_index[0]] * w.view(-1, 1), edge_index[1], 0, dim_size=x.size(0), reduce="max")

    edge_index = random_graph(30, 100, hub_degree=20)
    x, attr = torch.randn(30, 4), torch.randn(edge_index.shape[1], 4, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="gnn_io")
    out = compiled(x, edge_index, attr)
    torch.testing.assert_close(out, f(x, edge_index, attr))
    assert [w.pattern for w in rewrite_report.reports()[-1].rewrites] == ["gather_scatter"]
    assert not rewrite_report.reports()[-1].near_misses


class TwoGCNLayers(torch.nn.Module):
    """Each layer adds self loops and normalises on its own: the plan holds that work once."""

    def __init__(self):
        super().__init__()
        self.first, self.second = GCNConv(8, 8), GCNConv(8, 4)

    def forward(self, x, edge_index):
        return self.second(torch.relu(self.first(x, edge_index)), edge_index)


def test_structure_repeated_by_layers_runs_once_per_graph():
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TwoGCNLayers()
    model = torch.compile(eager, backend="gnn_io")
    x = torch.randn(50, 8, requires_grad=True)
    model(x, random_graph(50, 200, seed=1, hub_degree=40))
    edge_index = random_graph(50, 200, hub_degree=40)
    outs = []
    counts = op_counts(lambda: outs.append(model(x, edge_index)))
    assert counts["gnn_io::csr_plan"] == 1 and counts["aten::nonzero"] == 1, counts
    assert counts["gnn_io::spmm"] == 2
    expected = eager(x, edge_index)
    torch.testing.assert_close(outs[0], expected)
    (grad,) = torch.autograd.grad(outs[0].square().sum(), x)
    (grad_eager,) = torch.autograd.grad(expected.square().sum(), x)
    torch.testing.assert_close(grad, grad_eager)
    with torch.no_grad():  # out-of-range indices still meet a clear error, once for both layers
        bad = edge_index.clone()
        bad[0, 3] = 50
        try:
            model(x, bad)
        except Exception as exc:  # raised inside the plan, possibly wrapped by Dynamo
            assert "num_nodes" in str(exc) and "50" in str(exc), exc
        else:
            raise AssertionError("an out-of-range index passed")


def test_dedupe_keeps_random_and_in_place_calls():
    from torch.fx import Graph

    from gnn_inductor.passes.structure import dedupe_structure

    graph = Graph()
    a = graph.placeholder("a")
    same = [graph.call_function(torch.ops.aten.mul.Tensor, (a, a)) for _ in range(2)]
    draws = [graph.call_function(torch.ops.aten.rand_like.default, (a,)) for _ in range(2)]
    writes = [graph.call_function(torch.ops.aten.add_.Tensor, (a, 1)) for _ in range(2)]
    checks = [graph.call_function(torch.ops.gnn_io.check_index.default, (a, 5, f"site {i}")) for i in range(2)]
    buffers = [graph.call_function(torch.ops.aten.empty.memory_format, ([4],)) for _ in range(2)]
    bases = [graph.call_function(torch.ops.aten.zeros.default, ([4],)) for _ in range(2)]
    filled = [graph.call_function(torch.ops.aten.fill_.Scalar, (b, float(i))) for i, b in enumerate(bases)]
    graph.output((*same, *draws, *writes, *buffers, *filled))
    assert dedupe_structure(graph) == 2  # the second product and the second check
    kept = [n for n in graph.nodes if n.op == "call_function"]
    assert same[0] in kept and same[1] not in kept and checks[0] in kept and checks[1] not in kept
    # random draws, in-place writes, unset memory and tensors written in place later stay apart
    assert all(n in kept for n in draws + writes + buffers + bases + filled)
    assert list(graph.output_node().args[0][:2]) == [same[0], same[0]]


def plans_per_step(model, steps: int, eager=None) -> list:
    """``csr_plan`` calls of each step of ``model`` on a new graph of a new size (Dynamo compiles it with dynamic
    shapes from the second); with ``eager``, each step's output and input gradient checked against it."""
    built = []
    for step in range(steps):
        nodes = 40 + 3 * step
        edge_index, x = random_graph(nodes, 4 * nodes, seed=step, hub_degree=nodes // 2), torch.randn(nodes, 8)
        x.requires_grad_(True)
        outs = []
        built.append(op_counts(lambda: outs.append(model(x, edge_index)))["gnn_io::csr_plan"])
        if eager is not None:
            expected = eager(x, edge_index)
            torch.testing.assert_close(outs[0], expected)
            torch.testing.assert_close(torch.autograd.grad(outs[0].square().sum(), x)[0],
                                       torch.autograd.grad(expected.square().sum(), x)[0])
    return built


@pytest.mark.parametrize("setting", tiered(["on", None], [None]), ids=["on", "default"])
def test_a_new_graph_every_step_switches_to_the_plain_compile(monkeypatch, setting):
    """Mini-batches: once most calls built a new plan, the graph runs as torch.compile's default compiles it
    (structure inside, no gnn_io ops), results unchanged, and the report says so; by default on the CPU too."""
    if setting is None:
        monkeypatch.delenv("GNN_IO_CHURN", raising=False)
    else:
        monkeypatch.setenv("GNN_IO_CHURN", setting)
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TwoGCNLayers()
    built = plans_per_step(torch.compile(eager, backend="gnn_io"), 14, eager)
    # (the first two calls compile, which runs the structure on fake graphs too)
    assert built[2:9] == [1] * 7 and built[-3:] == [0, 0, 0], built
    misses = [m for r in rewrite_report.reports() for m in r.near_misses if m.pattern == "mini_batch"]
    assert misses and "torch.compile's default" in misses[-1].reason, misses


def test_a_new_graph_every_step_switches_under_cuda_graphs_too(monkeypatch):
    """The same switch where CUDA graphs are on and the buckets do not pad the graph (off here): its plan's
    data-dependent sizes (self loops) would otherwise compile a graph per size, then run shape-generic with a plan
    per step."""
    monkeypatch.delenv("GNN_IO_CHURN", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TwoGCNLayers()
    compiled = torch.compile(eager, backend="gnn_io", options={"cuda_graphs": True, "buckets": "off"})
    built = plans_per_step(compiled, 14, eager)
    assert built[2:9] == [1] * 7 and built[-3:] == [0, 0, 0], built
    misses = [m for r in rewrite_report.reports() for m in r.near_misses]
    assert any(m.pattern == "cuda_graphs" and "data-dependent size" in m.reason for m in misses), misses
    assert any(m.pattern == "mini_batch" and "torch.compile's default" in m.reason for m in misses), misses


@pytest.mark.parametrize("env", tiered_at([{"GNN_IO_CHURN": "off"},
                                           # every graph below has more edges than that
                                           {"GNN_IO_CHURN": "on", "GNN_IO_CHURN_EDGES": "100"}], [1]),
                         ids=["off", "large_graphs"])
def test_a_new_graph_every_step_keeps_the_rewrites(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    torch._dynamo.reset()
    torch.manual_seed(0)
    built = plans_per_step(torch.compile(TwoGCNLayers(), backend="gnn_io"), 11)
    assert built[2:] == [1] * 9, built


def test_an_unknown_churn_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("GNN_IO_CHURN", "sometimes")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="GNN_IO_CHURN"):
        plans_per_step(torch.compile(TwoGCNLayers(), backend="gnn_io"), 3)


@pytest.mark.parametrize("failure", tiered(["raised", "op_by_op"], ["op_by_op"]))
def test_a_failed_plain_compile_keeps_the_rewrites(monkeypatch, failure):
    """Where torch.compile's default cannot compile the graph (forward or backward: both are compiled up front),
    a new graph every step keeps the rewrites, and the report says why: whether the compile raised, or Inductor
    failed and the guarded compile fell back to running the graph op by op (a near miss in its report)."""
    from gnn_inductor import backend

    monkeypatch.setenv("GNN_IO_CHURN", "on")
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    compile_rewritten = backend.inductor_compile

    def failing_plain(gm, example_inputs, graph_report=None, static_inputs=None, **kwargs):
        if static_inputs is None:  # the plain compile of Dynamo's graph (the rewritten one names its static inputs)
            if failure == "raised":
                raise RuntimeError("plain compile failed on purpose")
            graph_report.near_misses.append(rewrite_report.NearMiss(
                "inductor", "plain compile failed on purpose; it runs op by op instead", {"source": "<graph>"}))
        return compile_rewritten(gm, example_inputs, graph_report, static_inputs, **kwargs)
    monkeypatch.setattr(backend, "inductor_compile", failing_plain)
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TwoGCNLayers()
    built = plans_per_step(torch.compile(eager, backend="gnn_io"), 11, eager)
    assert built[2:] == [1] * 9, built
    misses = [m.reason for r in rewrite_report.reports() for m in r.near_misses if m.pattern == "mini_batch"]
    assert any("plain compile failed on purpose" in reason for reason in misses), misses


@pytest.mark.parametrize("value", ["many", "-5", "1e6"])
def test_an_integer_setting_that_is_not_one_is_an_error(monkeypatch, value):
    """Integer settings (edge bounds, expected calls) name the variable on a bad value, never fall back silently."""
    from gnn_inductor import config, cost
    from gnn_inductor.config import SettingError

    monkeypatch.setenv("GNN_IO_SPMM_MIN_EDGES", value)
    with pytest.raises(SettingError, match="GNN_IO_SPMM_MIN_EDGES"):
        cost.spmm_min_edges()
    monkeypatch.setenv("GNN_IO_CHURN_EDGES", value)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="GNN_IO_CHURN_EDGES"):
        plans_per_step(torch.compile(TwoGCNLayers(), backend="gnn_io"), 3)
    monkeypatch.setenv("GNN_IO_EXPECTED_CALLS", " ")
    assert config.get("expected_calls") == config.default("expected_calls")  # blank: the default
    torch._dynamo.reset()


# the default tier: the size-specialized compile of GATConv (the other three pairs with --slow)
@pytest.mark.parametrize("cuda_graphs, layer", tiered(
    [pytest.param(graphs, layer, id=f"{'size_specialized' if graphs else 'plain'}-{layer}")
     for graphs in (False, True) for layer in ("gat", "gcn")], [(True, "gat")]))
def test_mask_indexing_of_edge_inputs_needing_a_gradient_moves_to_the_plan(layer, cuda_graphs, monkeypatch):
    """PyG's self-loop handling indexes the edge inputs by a structure mask (``edge_attr[mask]``). With edge inputs
    that need a gradient the indexing stays in the model's graph: its ``nonzero`` becomes structure (the plan makes
    it once per graph), and no boolean indexing is left to the compiled graph. Under ``GNN_IO_CUDAGRAPHS=1`` (the
    size-specialized compile, device independent) the boolean indexing made Inductor's tracing fail
    (``DynamicOutputShapeException: aten.nonzero``; found on the H100)."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.passes import structure
    from gnn_inductor.testing import assert_close_to_reference

    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")
    if cuda_graphs:
        monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    graphs = []
    hoist = structure.hoist_structure
    monkeypatch.setattr(structure, "hoist_structure", lambda gm: graphs.append(gm) or hoist(gm))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GATConv(8, 3, heads=2, edge_dim=3) if layer == "gat" else GCNConv(8, 6)
    compiled = torch.compile(model, backend="gnn_io")
    for seed in (1, 2):  # a graph with self loops among its edges, twice (the plan's build, then its hit)
        edge_index = random_graph(20, 60, seed=seed)
        x = torch.randn(20, 8)
        num_edges = edge_index.shape[1]
        edge_input = torch.randn(num_edges, 3) if layer == "gat" else torch.rand(num_edges) + 0.1
        results = []
        for module in (compiled, model):
            leaves = [x.clone().requires_grad_(), edge_input.clone().requires_grad_()]
            out = module(leaves[0], edge_index, leaves[1])
            grads = torch.autograd.grad(out.square().sum(), leaves)
            results.append((out, *grads))
        for name, got, want in zip(["output", "grad x", "grad edge input"], *results):
            assert_close_to_reference(name, got, want)
    main = graphs[0]
    boolean_index = [n for n in main.graph.nodes if n.target is torch.ops.aten.index.Tensor
                     and any(getattr(i.meta.get("val"), "dtype", None) == torch.bool for i in n.args[1] if i is not None)]
    assert not boolean_index, main.graph
    assert not [n for n in main.graph.nodes if n.target is torch.ops.aten.nonzero.default], main.graph


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_int32_csr_build_equals_the_int64_one(device):
    """CUDA builds the CSR in int32 throughout (half the memory of a billion-edge build); the same arrays as the
    int64 build on the CPU, on a graph with duplicates, self loops, isolated nodes and a hub, from either index
    dtype, on either device."""
    from gnn_inductor.plan.csr import build_csr

    edge_index = random_graph(300, 2000, hub_degree=120)
    dst, src = edge_index[1], edge_index[0]
    wide = build_csr(dst, src, 310, 305, torch.int64)
    for index_dtype in (torch.int64, torch.int32):
        narrow = build_csr(dst.to(device, index_dtype), src.to(device, index_dtype), 310, 305, torch.int32)
        assert all(n.dtype == torch.int32 and n.device.type == device for n in narrow)
        for n, w in zip(narrow, wide):
            assert torch.equal(n.cpu().long(), w)
