"""The backend as a user meets it: entry point, report (text and JSON), near misses, bad input."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch_geometric.nn import GCNConv, MessagePassing

import gnn_inductor
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import tiered


def test_backend_found_through_entry_point_in_a_fresh_interpreter():
    code = textwrap.dedent("""
        import sys, torch
        from torch_geometric.nn import GCNConv
        conv = GCNConv(4, 3)
        out = torch.compile(conv, backend="gnn_io")(torch.randn(10, 4), torch.randint(0, 10, (2, 30)))
        assert "gnn_inductor" in sys.modules, "backend did not load"
        from gnn_inductor.rewrite_report import reports
        print(sum(len(r.rewrites) for r in reports()))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "1"


def test_gcn_is_one_graph_despite_self_loop_nonzero():
    torch._dynamo.reset()
    counts = {}

    def counting_backend(gm, example_inputs):
        counts["graphs"] = counts.get("graphs", 0) + 1
        return gnn_inductor.gnn_io(gm, example_inputs)

    conv = GCNConv(4, 3)
    torch.compile(conv, backend=counting_backend)(torch.randn(10, 4), random_graph(10, 30))
    assert counts["graphs"] == 1


def test_json_report_written_by_env_var(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    monkeypatch.setenv("GNN_IO_REPORT", str(path))
    torch.manual_seed(0)
    check_rewrites(GCNConv(6, 3), torch.randn(20, 6), random_graph(20, 60), expect={"spmm": 1})
    data = json.loads(path.read_text())
    assert isinstance(data["near_misses"], list)
    spmm = [r for r in data["rewrites"] if r["pattern"] == "spmm"][-1]
    assert spmm["op"] == "gnn_io.spmm"
    assert "gcn_conv.py:" in spmm["source"]
    assert spmm["graph_stats"]["nodes"] == 20 and spmm["graph_stats"]["edges"] > 60


def test_text_report_names_the_user_source_line(capsys):
    class TwoLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(6, 8), GCNConv(8, 2)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    model = TwoLayer()
    check_rewrites(model, torch.randn(20, 6), random_graph(20, 60), expect={"spmm": 2})
    text = gnn_inductor.report(model)
    assert "GCNConv conv1 at " in text and f"{os.path.basename(__file__)}:" in text, text
    assert "runs gnn_io.spmm" in text and "max degree" in text, text


class ProductConv(MessagePassing):
    """reduce='mul' has no gnn_io op: must stay with Inductor, correct, and be reported."""

    def __init__(self):
        super().__init__(aggr="mul")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


class FeatureRoutedConv(torch.nn.Module):
    """Scatter index computed from features (not graph structure): left to Inductor."""

    def forward(self, x, edge_index):
        target = x.argmax(dim=1)
        msg = x.index_select(0, edge_index[0])
        return torch.zeros_like(x).index_add(0, target.index_select(0, edge_index[0]), msg)


@pytest.mark.parametrize("model, reason", [
    (ProductConv(), "prod"),
    (FeatureRoutedConv(), "computed from features"),
])
def test_near_miss_is_left_to_inductor_and_reported(model, reason):
    x = torch.rand(20, 5) + 0.5
    result = check_rewrites(model, x, random_graph(20, 60), expect={"spmm": 0, "gather_scatter": 0, "near_miss": 1})
    assert reason in result.near_misses[0].reason


def test_out_of_range_edge_index_raises_a_clear_error():
    torch._dynamo.reset()
    conv = GCNConv(4, 3)
    model = torch.compile(conv, backend="gnn_io")
    x, edge_index = torch.randn(10, 4), random_graph(10, 30)
    model(x, edge_index)
    bad = edge_index.clone()
    bad[0, 5] = 12
    with pytest.raises(IndexError, match=r"edge_index has values >= num_nodes \(max 12, num_nodes 10\)"):
        model(x, bad)


def check_against_eager(conv, x, edge_index):
    """``conv`` compiled with gnn_io against itself in eager mode: output and the gradients of ``x`` and every
    parameter, float32 at 1e-5."""
    x_new, x_ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, ref = torch.compile(conv, backend="gnn_io")(x_new, edge_index), conv(x_ref, edge_index)
    torch.testing.assert_close(out, ref, **tolerance(torch.float32))
    grad = torch.randn_like(ref)
    for g, w in zip(torch.autograd.grad(out, [x_new, *conv.parameters()], grad),
                    torch.autograd.grad(ref, [x_ref, *conv.parameters()], grad)):
        torch.testing.assert_close(g, w, **tolerance(torch.float32))


@pytest.mark.parametrize("name", tiered(["gcn", "sage_max", "gat", "transformer"], ["sage_max", "gat"]))
def test_cpu_leaves_aggregation_to_inductor_unless_asked(name, monkeypatch):
    """On CPU the ops' references are slower than Inductor's C++ code, so by default every aggregation is left
    to Inductor (the report says why, per layer); GNN_IO_CPU_REWRITE=1 takes the rewrites. Same results either
    way, output and gradients."""
    from torch_geometric import nn as pyg

    from gnn_inductor.rewrite_report import clear, reports

    make = {"gcn": lambda: GCNConv(6, 6), "sage_max": lambda: pyg.SAGEConv(6, 6, aggr="max"),
            "gat": lambda: pyg.GATConv(6, 3, heads=2), "transformer": lambda: pyg.TransformerConv(6, 3, heads=2)}[name]
    x, edge_index = torch.randn(40, 6), random_graph(40, 150, hub_degree=20)
    for setting in ("0", "1"):
        monkeypatch.setenv("GNN_IO_CPU_REWRITE", setting)
        monkeypatch.delenv("GNN_IO_FORCE", raising=False)
        torch._dynamo.reset()
        clear()  # reports of earlier tests' modules: a freed parameter's id can come back
        torch.manual_seed(0)
        conv = make()
        check_against_eager(conv, x, edge_index)
        mine = reports(conv)
        rewrites = [r for g in mine for r in g.rewrites]
        cpu_misses = [m for g in mine for m in g.near_misses if "on CPU Inductor's C++ code beats" in m.reason]
        if setting == "0":
            assert mine and not rewrites and cpu_misses, [(g.rewrites, g.near_misses) for g in mine]
        else:
            assert rewrites and not cpu_misses
    torch._dynamo.reset()


def test_declined_graph_makes_its_zero_base_and_still_checks_indices(monkeypatch):
    """A graph the cost model leaves to Inductor (as on CUDA under its thresholds): the scatter's zero base is
    made in the compiled graph, not passed in as a plan tensor (which Inductor would have to copy), so the
    graph Inductor compiles has only the user's inputs; the index check still runs once per graph."""
    from torch_geometric.nn import GINConv

    from gnn_inductor import backend, cost

    monkeypatch.setattr(cost, "_declined", lambda *a, **k: "declined for the test")
    compiled = []
    real = backend.inductor_compile

    def record(gm, example_inputs, *args, **kwargs):
        compiled.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return real(gm, example_inputs, *args, **kwargs)

    monkeypatch.setattr(backend, "inductor_compile", record)
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GINConv(torch.nn.Linear(6, 6))
    model = torch.compile(conv, backend="gnn_io")
    x, edge_index = torch.randn(40, 6), random_graph(40, 150, hub_degree=20)
    torch.testing.assert_close(model(x, edge_index), conv(x, edge_index))
    assert len(compiled) == 1 and not any(name.startswith("plan_") for name in compiled[0]), compiled
    bad = edge_index.clone()
    bad[0, 5] = 41
    with pytest.raises(IndexError, match=r"max 41, num_nodes 40"):
        model(x, bad)
    torch._dynamo.reset()


@pytest.mark.parametrize("make, expect", [
    (lambda: __import__("torch_geometric.nn", fromlist=["GATConv"]).GATConv(8, 4, heads=2), {"attention": 1}),
    (lambda: GCNConv(8, 8), {"spmm": 1}),
])
def test_bfloat16_models_accumulate_in_float32(make, expect):
    """Half-precision inputs: the ops accumulate in float32, so the compiled model is no further
    from float32 than eager bfloat16 is (hub of 150 neighbours)."""
    torch.manual_seed(0)
    model = make().to(torch.bfloat16)
    check_rewrites(model, torch.randn(80, 8, dtype=torch.bfloat16), random_graph(80, 300, hub_degree=150),
                   expect=expect)


def test_cuda_graph_mode_marks_parameters_and_plan_tensors_static(monkeypatch):
    """GNN_IO_CUDAGRAPHS=1: the forward graph's parameters and graph-plan inputs reach Inductor as static
    inputs (CUDA graph trees then neither copy them at each replay nor let per-plan caches hold pool
    memory); the backward's static inputs are Inductor's own. Recorded through Inductor's per-graph
    compile, which on CPU runs the same way (CUDA graphs themselves only apply to CUDA graphs)."""
    import torch._inductor.compile_fx as inductor

    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append((len(example_inputs), tuple(kwargs.get("static_input_idxs") or ()), kwargs.get("is_backward")))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(6, 6)
    x = torch.randn(40, 6, requires_grad=True)
    out = torch.compile(conv, backend="gnn_io")(x, random_graph(40, 150, hub_degree=60))
    out.sum().backward()
    forward = [s for s in seen if not s[2]]
    backward = [s for s in seen if s[2]]
    assert len(forward) == 1 and len(backward) == 1, seen
    num_inputs, static, _ = forward[0]
    # weight, bias and at least the plan's CSR (rowptr, col, values...): the trailing inputs
    assert num_inputs - 1 in static and len(static) >= 2 + 3, forward
    assert all(0 <= i < num_inputs for i in static)
    torch.testing.assert_close(out, conv(x, random_graph(40, 150, hub_degree=60)))
    torch._dynamo.reset()


def test_cuda_graph_mode_compiles_self_loop_graphs_at_concrete_sizes(monkeypatch):
    """GNN_IO_CUDAGRAPHS=1 on GCNConv (self loops: the plan's edge count is data-dependent): each graph is
    compiled at its concrete sizes, with no symbolic size left for CUDA graph trees to skip on; past the limit
    the shape-generic graph runs the rest. Every call matches eager, output and gradients."""
    import torch._inductor.compile_fx as inductor
    from gnn_inductor import specialize
    from gnn_inductor.rewrite_report import reports

    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        symbolic = any(isinstance(a, torch.SymInt) or (isinstance(a, torch.Tensor) and any(
            isinstance(d, torch.SymInt) for d in a.shape)) for a in example_inputs)
        seen.append((bool(kwargs.get("is_backward")), symbolic))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    monkeypatch.setattr(specialize, "MAX_SPECIALIZED", 2)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(6, 6)
    model = torch.compile(conv, backend="gnn_io")
    # three graphs of the same shape whose self-loop counts differ: three plan sizes
    graphs = [random_graph(40, 157 - k, seed=s, hub_degree=60, self_loops=k) for s, k in ((1, 0), (2, 3), (3, 7))]
    assert len({g.shape[1] for g in graphs}) == 1
    for edge_index in graphs + graphs[:1]:
        x = torch.randn(40, 6, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        out, ref = model(x, edge_index), conv(x_ref, edge_index)
        torch.testing.assert_close(out, ref, **tolerance(torch.float32))
        grad = torch.randn_like(ref)
        got = torch.autograd.grad(out, [x, conv.lin.weight], grad)
        want = torch.autograd.grad(ref, [x_ref, conv.lin.weight], grad)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tolerance(torch.float32))
    forward = [symbolic for is_backward, symbolic in seen if not is_backward]
    assert forward == [False, False, True], seen  # two concrete compiles, then the shape-generic one
    assert any("concrete sizes" in m.reason for r in reports() for m in r.near_misses)
    torch._dynamo.reset()


def test_static_inputs_leave_the_backward_and_changed_signatures_alone():
    from gnn_inductor.backend import _with_static_inputs

    inputs = [object()] * 5
    assert _with_static_inputs({"static_input_idxs": [0]}, inputs, (1, 4), 5)["static_input_idxs"] == [0, 1, 4]
    assert _with_static_inputs({"static_input_idxs": [0], "is_backward": True}, inputs, (1, 4), 5) == \
        {"static_input_idxs": [0], "is_backward": True}
    assert _with_static_inputs({"static_input_idxs": [0]}, inputs, (1, 4), 6) == {"static_input_idxs": [0]}


def test_plan_builds_run_in_place_without_cuda_graphs():
    from gnn_inductor.kernels.runtime.cuda_graphs import outside_graph_pool

    assert outside_graph_pool(lambda: 7, torch.device("cpu")) == 7
    with pytest.raises(ValueError, match="boom"):
        outside_graph_pool(lambda: (_ for _ in ()).throw(ValueError("boom")), torch.device("cpu"))


def test_plan_caches_keep_nothing_built_during_a_capture(monkeypatch):
    """A per-plan cache filled while a CUDA graph is being captured would hold tensors of the graph's pool that
    no output tracks (Inductor's graph trees refuse them; a new edge_index under
    GNN_IO_CUDAGRAPHS=1): during a capture the build runs and is returned uncached, after it the result is kept."""
    from gnn_inductor.kernels.runtime.cuda_graphs import kept_outside_graph_pool

    builds, cache, cuda = [], {}, torch.device("cuda")

    def build():
        builds.append(1)
        return len(builds)

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert kept_outside_graph_pool(cache, "slots", build, cuda) == 1 and cache == {}
    assert kept_outside_graph_pool(cache, "slots", build, cuda) == 2 and cache == {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert kept_outside_graph_pool(cache, "slots", build, cuda) == 3 and cache == {"slots": 3}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert kept_outside_graph_pool(cache, "slots", build, cuda) == 3  # kept before the capture: read, not rebuilt
    assert kept_outside_graph_pool(cache, "other", build, torch.device("cpu")) == 4 and cache["other"] == 4


@pytest.mark.parametrize("layer", ["gat", "sage_max"])
@pytest.mark.parametrize("setting, expected", [(None, 2), ("3", 3)])
def test_rewritten_graphs_compile_with_two_inductor_tiles(monkeypatch, setting, expected, layer):
    """Inductor's 3-tile reductions faulted ("misaligned address") in GATConv's backward on the H100, so the
    backend compiles its graphs with ``triton.max_tiles = 2`` unless GNN_IO_INDUCTOR_MAX_TILES says otherwise,
    forward and backward alike. GATConv's self-loop plan saves sizes for the backward, so AOTAutograd compiles its
    backward with the forward; SAGEConv's backward is compiled lazily, at the first backward (it had
    compiled without the backend's options)."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config as inductor_config
    from torch_geometric.nn import GATConv, SAGEConv

    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append((kwargs.get("is_backward", False), inductor_config.triton.max_tiles))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    if setting is None:
        monkeypatch.delenv("GNN_IO_INDUCTOR_MAX_TILES", raising=False)
    else:
        monkeypatch.setenv("GNN_IO_INDUCTOR_MAX_TILES", setting)
    torch.manual_seed(0)
    if layer == "gat":
        check_rewrites(GATConv(8, 4, heads=2), torch.randn(30, 8), random_graph(30, 120), expect={"attention": 1})
    else:
        check_rewrites(SAGEConv(8, 4, aggr="max"), torch.randn(30, 8), random_graph(30, 120),
                       expect={"gather_scatter": 1})
    assert {backward for backward, _ in seen} == {False, True}, seen
    assert all(tiles == expected for _, tiles in seen), seen


def test_lazily_compiled_backward_is_compiled_for_cuda_graphs(monkeypatch):
    """Under GNN_IO_CUDAGRAPHS=1 the backward, which AOTAutograd compiles at the first backward call, is compiled
    with Inductor's CUDA graphs on as the forward is (without it, on the H100 its kernels launched
    one by one and a step replayed the forward alone)."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config as inductor_config
    from torch_geometric.nn import SAGEConv

    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append((kwargs.get("is_backward", False), inductor_config.triton.cudagraphs,
                     inductor_config.triton.cudagraph_skip_dynamic_graphs))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    torch.manual_seed(0)
    check_rewrites(SAGEConv(8, 4, aggr="max"), torch.randn(30, 8), random_graph(30, 120),
                   expect={"gather_scatter": 1})
    # fixed sizes: Inductor's check for dynamic sizes is off (it counts loop indices as sizes, pytorch#197139)
    assert seen == [(False, True, False), (True, True, False)], seen
    # the report says what became of each (CPU tensors here: neither is recorded)
    from gnn_inductor import rewrite_report

    (graph,) = [g for g in rewrite_report.reports() if g.cuda_graphs][-1:]
    assert graph.cuda_graphs == {"forward": "not recorded (no CUDA tensors)",
                                 "backward": "not recorded (no CUDA tensors)"}, graph.cuda_graphs
    assert "CUDA graphs (GNN_IO_CUDAGRAPHS=1): forward not recorded" in "\n".join(
        rewrite_report.format_text_for([graph]))
    seen.clear()
    torch._dynamo.reset()
    model = torch.compile(SAGEConv(8, 4, aggr="max"), backend="gnn_io", dynamic=True)
    model(torch.randn(30, 8, requires_grad=True), random_graph(30, 120)).sum().backward()
    assert {backward for backward, _, _ in seen} == {False, True}, seen
    assert all(cudagraphs and skip_dynamic for _, cudagraphs, skip_dynamic in seen), seen
    torch._dynamo.reset()


@pytest.mark.parametrize("env, expected", [
    ({}, True),
    ({"GNN_IO_CUDAGRAPHS": "1"}, False),
    ({"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_INDUCTOR_MAX_AUTOTUNE": "1"}, True),
    ({"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_INDUCTOR_POINTWISE_AUTOTUNE": "1"}, True),
    ({"GNN_IO_INDUCTOR_POINTWISE_AUTOTUNE": "0"}, False),
])
def test_pointwise_autotuning_is_off_under_cuda_graphs(monkeypatch, env, expected):
    """Under CUDA graphs the forward and the lazily compiled backward are compiled without Inductor's timing of
    pointwise launch configurations (its flush buffer set the peak inside the graphs' pool), unless max-autotune
    or the setting asks for it; elsewhere Inductor's own default (on) stays."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config as inductor_config
    from torch_geometric.nn import SAGEConv

    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append((kwargs.get("is_backward", False), inductor_config.triton.autotune_pointwise))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    for name in ("GNN_IO_CUDAGRAPHS", "GNN_IO_INDUCTOR_MAX_AUTOTUNE", "GNN_IO_INDUCTOR_POINTWISE_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    torch._dynamo.reset()
    model = torch.compile(SAGEConv(8, 4, aggr="max"), backend="gnn_io")
    model(torch.randn(30, 8, requires_grad=True), random_graph(30, 120)).sum().backward()
    torch._dynamo.reset()
    assert seen == [(False, expected), (True, expected)], seen


def test_bad_max_tiles_setting_is_a_clear_error(monkeypatch):
    from gnn_inductor import backend

    monkeypatch.setenv("GNN_IO_INDUCTOR_MAX_TILES", "7")
    with pytest.raises(ValueError, match="GNN_IO_INDUCTOR_MAX_TILES"):
        backend.inductor_compile(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)])


def test_report_gives_the_degree_split_of_gather_scatter_rewrites():
    """The report says which split the fused reduction kernels use on the graph (hub rows, items)."""
    from torch_geometric.nn import SAGEConv
    from gnn_inductor.kernels.gather_scatter.fused import split_threshold

    torch.manual_seed(0)
    edge_index = random_graph(300, 1500, hub_degree=400)
    result = check_rewrites(SAGEConv(8, 8, aggr="max"), torch.randn(300, 8), edge_index,
                            expect={"gather_scatter": 1})
    (rewrite,) = [r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "gather_scatter"]
    split = rewrite["graph_stats"]["split"]
    rowptr = torch.zeros(301, dtype=torch.long)
    rowptr[1:] = torch.bincount(edge_index[1], minlength=300).cumsum(0)
    assert split["max_edges"] == split_threshold(rowptr)
    assert split["hub_rows"] == 1 and 0.2 < split["hub_edge_share"] < 0.25  # node 0 and its 400 extra edges
    assert "degree split (CUDA kernels): rows over" in gnn_inductor.report()


def test_report_lookup_by_parameter_is_by_identity_not_by_a_reusable_id():
    import weakref

    from gnn_inductor.rewrite_report import GraphReport

    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    report = GraphReport(0, [], [])
    report.track_parameters([p, torch.zeros(1)])
    assert report.uses([p]) and not report.uses([q])
    # q takes over p's id in the record (as a freed parameter's id can be reused): still not q's graph
    report.parameter_refs[id(q)] = weakref.ref(p)
    assert not report.uses([q])


def test_package_imports_outside_the_repository_root(tmp_path):
    """``patterns/`` and ``kernels/`` are installed as ``gnn_inductor.patterns`` and ``gnn_inductor.kernels``: an
    import of them as top-level packages works only from the repository root (where pytest runs), so the package
    must import from anywhere else, as the examples and users' scripts do."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import gnn_inductor, gnn_inductor.backend"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("name, attr, value", tiered(
    [("gat", "negative_slope", 0.7), ("gatv2", "negative_slope", 0.05), ("transformer", None, None)],  # p stays 0
    [("gat", "negative_slope", 0.7)]))
def test_dynamic_true_keeps_the_attention_rewrite_and_follows_a_changed_float(name, attr, value, monkeypatch):
    """With ``torch.compile(..., dynamic=True)`` Dynamo passes a layer's Python float (GATConv's LeakyReLU slope,
    TransformerConv's dropout p) as a scalar tensor read by ``.item()``. The backend must trace it (its value's
    symbol handed to the re-faked input), let Dynamo's restart for floats AOT autograd cannot turn into tensors
    through (it is a signal, not a failure), and specialise the slope, guarded: one graph with the fused attention,
    matching eager on graphs of several sizes, and a changed slope recompiles instead of reusing the old one
    (GATConv and GATv2Conv; TransformerConv's dropout p is not changed, since a nonzero p draws random masks)."""
    import copy

    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    from gnn_inductor import rewrite_report
    from gnn_inductor.testing import assert_close_to_reference, forward_backward

    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    make = {"gat": GATConv, "gatv2": GATv2Conv, "transformer": TransformerConv}[name]
    model = make(8, 3, heads=2)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="gnn_io", dynamic=True)
    first = len(rewrite_report.reports())
    for call, (num_nodes, num_edges, hub) in enumerate([(30, 80, 30), (40, 60, 0), (30, 80, 30), (25, 50, 10)]):
        if call == 2 and attr is not None:  # a new float after two calls: guarded, so the graph compiles again
            setattr(model, attr, value)
            setattr(reference, attr, value)
        edge_index = random_graph(num_nodes, num_edges, seed=call, hub_degree=hub)
        x = torch.randn(num_nodes, 8)
        got = forward_backward(compiled, [x.clone().requires_grad_(), edge_index], True, call, {})
        want = forward_backward(reference, [x.clone().requires_grad_(), edge_index], True, call, {})
        assert_close_to_reference(f"call {call} output", got[0][0], want[0][0])
        for (param, a), (_, e) in zip(got[1], want[1]):
            assert_close_to_reference(f"call {call} grad of {param}", a, e)
        assert_close_to_reference(f"call {call} grad of x", got[2][0], want[2][0])
    reports = rewrite_report.reports()[first:]
    assert all(sum(w.pattern == "attention" for w in r.rewrites) == 1 and not r.near_misses for r in reports), \
        "\n".join(rewrite_report.format_text_for(reports))
    assert len(reports) == (1 if attr is None else 2), len(reports)


def test_cuda_graph_state_reads_inductors_compiled_graph():
    """The report's CUDA-graph line for one compiled graph, from the fields of Inductor's compiled artifact."""
    from types import SimpleNamespace

    from gnn_inductor.backend import _cuda_graph_state

    def compiled(devices=("cuda",), disabled=None, fails=None, maps=1):
        return SimpleNamespace(device_types=set(devices), disabled_cudagraphs_reason=disabled,
                               cudagraph_info=SimpleNamespace(cudagraph_fail_reasons=fails), partition_maps=[0] * maps)

    assert _cuda_graph_state(compiled(), 0) == "recorded as one CUDA graph"
    assert _cuda_graph_state(compiled(maps=2), 2) == "recorded as 2 CUDA graphs"
    # a forward of three parts, one recorded (TransformerConv's, seen on the H100)
    assert _cuda_graph_state(compiled(), 3).startswith("1 of 3 parts recorded; the kernels of the other 2 launch")
    assert _cuda_graph_state(compiled(disabled="skipping cudagraphs due to mutated inputs"), 0) == \
        "not recorded (skipping cudagraphs due to mutated inputs)"
    assert _cuda_graph_state(compiled(fails=["cpu device"]), 0) == "not recorded (['cpu device'])"
    assert _cuda_graph_state(compiled(maps=0), 0).startswith("not recorded (Inductor made no CUDA-graph partition")
    assert _cuda_graph_state(compiled(devices=("cpu",)), 0) == "not recorded (no CUDA tensors)"
    assert _cuda_graph_state(object(), 0) == "not recorded (no CUDA tensors)"  # the op-by-op fallback


def test_pattern_families_register_into_the_pattern_pass_in_priority_order():
    """The pattern pass applies what registered into it (``rewrite.register_pattern``), the edge softmax first and
    the general gather-scatter last; it does not import the pattern modules itself."""
    import inspect

    from gnn_inductor.passes import patterns as rewrite

    assert [p.name for p in rewrite.registered_patterns()] == ["edge_softmax", "attention", "spmm", "gather_scatter"]
    source = inspect.getsource(rewrite)
    assert "from gnn_inductor.patterns" not in source and "import gnn_inductor.patterns" not in source


def test_every_pass_reports_through_the_pipeline_records(monkeypatch):
    """The passes run in the order gnn_inductor/pipeline.py declares, each with one record in the graph's report
    (ran with what it changed, or skipped with the setting that switched it off), shown in the text and the JSON;
    the passes after the split are recorded per side."""
    from gnn_inductor import pipeline, rewrite_report

    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_GATHER_LINEAR", "0")
    torch.manual_seed(0)
    x = torch.randn(30, 8, requires_grad=True)
    result = check_rewrites(GCNConv(8, 4), x, random_graph(30, 90), expect={"spmm": 1})
    (graph,) = [g for g in rewrite_report.reports() if any(w.pattern == "spmm" for w in g.rewrites)][-1:]
    before = [p for p in graph.passes if p.side is None]
    assert [p.name for p in before] == [p.name for p in pipeline.GRAPH_PASSES]
    records = {p.name: p for p in before}
    assert records["gather_linear"].status == "skipped" and records["gather_linear"].reason == "GNN_IO_GATHER_LINEAR=0"
    assert records["patterns"].status == "ran" and [w.pattern for w in records["patterns"].changed] == ["spmm"]
    assert records["hoist_structure"].count == graph.hoisted_nodes > 0
    sides = {p.side for p in graph.passes if p.name == "direct_ops"}
    assert sides == {"forward", "backward"}, graph.passes
    assert [p.name for p in graph.passes if p.side == "forward"] == \
        [p.name for p in pipeline.SPLIT_PASSES if p.side in ("both", "forward")]
    data = [g for g in result.report["graphs"] if g["graph_id"] == graph.graph_id][0]
    assert [p["name"] for p in data["passes"]] == [p.name for p in graph.passes]
    assert "passes: canonicalize 0, gather_linear skipped (GNN_IO_GATHER_LINEAR=0), patterns 1" in \
        "\n".join(rewrite_report.format_text_for([graph]))
