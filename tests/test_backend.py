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


def test_spmm_threshold_follows_its_environment_variable(monkeypatch):
    from gnn_inductor.cost import spmm_declined

    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    monkeypatch.setenv("GNN_IO_SPMM_MIN_EDGES", "1000")
    assert "cost model" in spmm_declined("cuda", 999)
    assert spmm_declined("cuda", 1000) is None
    assert spmm_declined("cpu", 10) is None  # the CPU path is the reference: always rewritten
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert spmm_declined("cuda", 10) is None


def test_declined_spmm_stays_with_inductor_and_is_reported(monkeypatch):
    """A match the cost model declines is neither SpMM nor gather-scatter, and is still correct."""
    import gnn_inductor.patterns.spmm as spmm_pattern

    monkeypatch.setattr(spmm_pattern, "spmm_declined", lambda device, edges: f"cost model: {edges} edges")
    torch.manual_seed(0)
    edge_index = random_graph(30, 100)
    result = check_rewrites(GCNConv(4, 4), torch.randn(30, 4), edge_index,
                            expect={"spmm": 0, "gather_scatter": 0, "near_miss": 1})
    assert result.near_misses[0].reason == f"cost model: {edge_index.shape[1]} edges"


def test_triton_binding_plan_carries_work_items(monkeypatch):
    """GNN_IO_SPMM=triton puts padded work items into the graph plan (no data-dependent sizes reach
    the compiled graph); on CPU the reference ignores them, the compile path is the same as on CUDA."""
    monkeypatch.setenv("GNN_IO_SPMM", "triton")
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(6, 6), torch.randn(40, 6), random_graph(40, 150, hub_degree=300),
                            expect={"spmm": 1, "near_miss": 0})
    assert result.report["graphs"][0]["hoisted_structure_nodes"] > 0


@pytest.mark.parametrize("crashing", ["forward", "backward"])
def test_inductor_compile_crash_leaves_the_graph_op_by_op(monkeypatch, crashing):
    """A crash inside Inductor's per-graph compile (of the forward graph, or of the backward graph,
    which Inductor compiles lazily at the first backward) must not reach the user: the graph runs op
    by op, outputs and gradients still match eager, and the report says why."""
    import torch._inductor.compile_fx as inductor
    from torch_geometric.nn import SAGEConv

    from gnn_inductor.testing import check_rewrites, random_graph

    real = inductor.compile_fx_inner

    def crash(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward", False) == (crashing == "backward"):
            raise RuntimeError("A compilation subprocess exited unexpectedly (simulated)")
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", crash)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(SAGEConv(8, 4, aggr="max"), torch.randn(30, 8), random_graph(30, 120),
                            expect={"gather_scatter": 1})
    reasons = [m.reason for m in result.near_misses]
    assert any("Inductor failed to compile this graph" in r for r in reasons), reasons


def test_cost_model_thresholds(monkeypatch):
    """The CUDA cost model: below its edge thresholds SpMM and the fused gather-scatter are left to
    Inductor with a reason; other devices, unknown sizes and GNN_IO_FORCE=1 always rewrite."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    for declined, threshold in ((cost.spmm_declined, cost.SPMM_MIN_EDGES_CUDA),
                                (cost.gather_scatter_declined, cost.GATHER_SCATTER_MIN_EDGES_CUDA)):
        assert "cost model" in declined("cuda", threshold - 1)
        assert declined("cuda", threshold) is None
        assert declined("cpu", 10) is None and declined("cuda", None) is None
        monkeypatch.setenv("GNN_IO_FORCE", "1")
        assert declined("cuda", 10) is None
        monkeypatch.delenv("GNN_IO_FORCE")
    monkeypatch.setenv("GNN_IO_GS_MIN_EDGES", "5")
    assert cost.gather_scatter_declined("cuda", 10) is None


def test_cost_model_thresholds_are_off_under_cuda_graphs(monkeypatch):
    """GNN_IO_CUDAGRAPHS=1: a replay has no per-call CPU work, so no edge threshold declines SpMM, the fused
    gather-scatter or float32 attention (the mid-size GAT rule included); a threshold the user sets still holds;
    CPU devices and attention forms without a kernel are declined as before."""
    from gnn_inductor import cost

    for name in ("GNN_IO_FORCE", "GNN_IO_SPMM_MIN_EDGES", "GNN_IO_GS_MIN_EDGES", "GNN_IO_ATTENTION_MIN_EDGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert cost.spmm_declined("cuda", 10) is None and cost.gather_scatter_declined("cuda", 10) is None
    for family in cost.ATTENTION_MIN_EDGES_CUDA:
        assert cost.attention_declined("cuda", 10, family, "float32", False, 5) is None
    assert "no fused kernel" in cost.attention_declined("cuda", 10, None, "float32", False)
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "0")
    assert "cost model" in cost.spmm_declined("cpu", 10)
    monkeypatch.setenv("GNN_IO_GS_MIN_EDGES", "100")
    assert "GNN_IO_GS_MIN_EDGES" in cost.gather_scatter_declined("cuda", 10)
    assert cost.spmm_declined("cuda", 10) is None
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", "100")
    assert "cost model" in cost.attention_declined("cuda", 10, "dot", "float32", False)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "0")
    monkeypatch.delenv("GNN_IO_GS_MIN_EDGES")
    assert "cost model" in cost.gather_scatter_declined("cuda", 10)


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


def test_attention_cost_model(monkeypatch):
    """Float32 attention below its family's edge threshold is left to Inductor on CUDA, with TF32 allowed too for
    TransformerConv and GATConv only; half precision only for bfloat16 TransformerConv
    (test_bf16_transformer_threshold), other devices never, and
    GAT never from the sizes where Inductor's float32 GAT failed to launch."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    monkeypatch.delenv("GNN_IO_ATTENTION_PATH", raising=False)

    for family, threshold in cost.ATTENTION_MIN_EDGES_CUDA.items():
        assert "cost model" in cost.attention_declined("cuda", threshold - 1, family, "float32", False)
        assert cost.attention_declined("cuda", threshold, family, "float32", False) is None
        half = cost.attention_declined("cuda", 10, family, "bfloat16", False)
        assert ("cost model" in half) if family == "dot" else half is None, (family, half)
        assert cost.attention_declined("cuda", 10, family, "float16", False) is None
        tf32 = cost.attention_declined("cuda", threshold - 1, family, "float32", True)
        assert ("cost model" in tf32) if family in cost.TF32_DECLINED_FAMILIES else tf32 is None, (family, tf32)
        assert cost.attention_declined("cuda", threshold, family, "float32", True) is None
        assert cost.attention_declined("cpu", 10, family, "float32", False) is None
    assert set(cost.ATTENTION_MIN_EDGES_CUDA) == {"dot", "gat", "gatv2"}
    assert cost.TF32_DECLINED_FAMILIES == ("dot", "gat")
    # a forced kernel path runs at any size; a form without a kernel is still left to Inductor
    for path in ("csr", "block", "hybrid"):
        monkeypatch.setenv("GNN_IO_ATTENTION_PATH", path)
        assert cost.attention_declined("cuda", 10, "dot", "float32", True) is None
        assert "no fused kernel" in cost.attention_declined("cuda", 10, None, "float32", False)
    monkeypatch.setenv("GNN_IO_ATTENTION_PATH", "auto")
    assert "cost model" in cost.attention_declined("cuda", 10, "dot", "float32", True)
    assert cost.ATTENTION_MIN_EDGES_CUDA["gat"] < 4_200_000  # Inductor's float32 GAT failed to launch at 4.2M edges
    assert cost.attention_declined("cuda", 4_200_000, "gat", "float32", False) is None


def test_bf16_transformer_threshold(monkeypatch):
    """bfloat16 TransformerConv under 500k edges goes to Inductor (measured: Inductor ahead on SNAP facebook,
    road-luxembourg-osm, ca-AstroPh and squirrel, behind from MUSAE-github's 578k edges on); bf16 GAT and GATv2
    never (Inductor's bf16 GAT crashes, its GATv2 crashed or trailed); GNN_IO_ATTENTION_MIN_EDGES moves it;
    CUDA graphs, GNN_IO_FORCE and a forced path lift it."""
    from gnn_inductor import cost

    for name in ("GNN_IO_CUDAGRAPHS", "GNN_IO_ATTENTION_PATH", "GNN_IO_ATTENTION_MIN_EDGES", "GNN_IO_FORCE"):
        monkeypatch.delenv(name, raising=False)
    threshold = cost.HALF_ATTENTION_MIN_EDGES_CUDA[("dot", "bfloat16")]
    assert 396_846 < threshold <= 578_006  # squirrel declined, MUSAE-github kept
    assert "bfloat16 dot attention" in cost.attention_declined("cuda", threshold - 1, "dot", "bfloat16", False)
    assert cost.attention_declined("cuda", threshold, "dot", "bfloat16", False) is None
    for family in ("gat", "gatv2"):
        assert cost.attention_declined("cuda", 10, family, "bfloat16", False) is None
    assert cost.attention_declined("cpu", 10, "dot", "bfloat16", False) is None
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", "100")
    assert cost.attention_declined("cuda", 1000, "dot", "bfloat16", False) is None
    assert "GNN_IO_ATTENTION_MIN_EDGES" in cost.attention_declined("cuda", 99, "dot", "bfloat16", False)
    monkeypatch.delenv("GNN_IO_ATTENTION_MIN_EDGES")
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None
    monkeypatch.delenv("GNN_IO_FORCE")
    monkeypatch.setenv("GNN_IO_ATTENTION_PATH", "csr")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None


def test_gat_mid_size_rule_takes_graphs_of_enough_edges_and_rows(monkeypatch):
    """Float32 GATConv under its edge threshold takes the fused path from 1M edges when the graph also has 100k
    destination rows (RMAT 2^17 and 2^18 won, soc-Slashdot0902 with 82k rows did not); other
    families have no such rule, and GNN_IO_ATTENTION_MIN_EDGES sets one plain threshold instead."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    edges, rows = cost.ATTENTION_MIN_EDGES_AND_ROWS_CUDA["gat"]
    assert edges < cost.ATTENTION_MIN_EDGES_CUDA["gat"]
    assert cost.attention_declined("cuda", edges, "gat", "float32", False, rows) is None
    assert cost.attention_declined("cuda", 1_092_745, "gat", "float32", False, 131_072) is None     # RMAT 2^17
    assert "cost model" in cost.attention_declined("cuda", 1_086_763, "gat", "float32", False, 82_168)  # Slashdot
    # TF32: the same rule; under it GATConv goes to Inductor, GATv2Conv does not
    assert cost.attention_declined("cuda", 1_092_745, "gat", "float32", True, 131_072) is None      # RMAT 2^17
    assert "cost model" in cost.attention_declined("cuda", 396_160, "gat", "float32", True, 18_772)  # ca-AstroPh
    assert cost.attention_declined("cuda", 396_160, "gatv2", "float32", True, 18_772) is None
    assert "cost model" in cost.attention_declined("cuda", edges - 1, "gat", "float32", False, 10 * rows)
    assert "cost model" in cost.attention_declined("cuda", edges, "gat", "float32", False, None)
    assert "cost model" in cost.attention_declined("cuda", 900_000, "dot", "float32", False, 10 * rows)
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", str(2 * edges))
    assert "cost model" in cost.attention_declined("cuda", edges, "gat", "float32", False, rows)


def test_attention_form_without_a_kernel_goes_to_inductor_on_cuda(monkeypatch):
    """A form no kernel covers (family None, e.g. PyG's SoftmaxAggregation) would run the op's reference on
    CUDA: declined there at any size and precision, kept on CPU (where the reference is the path) and when
    forced."""
    from gnn_inductor import cost

    for dtype, tf32 in (("float32", False), ("bfloat16", False), ("float32", True)):
        assert "no fused kernel" in cost.attention_declined("cuda", 50_000_000, None, dtype, tf32)
    assert cost.attention_declined("cpu", 50_000_000, None, "float32", False) is None
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert cost.attention_declined("cuda", 50_000_000, None, "float32", False) is None


def test_attention_rewrite_gives_the_cost_model_its_rows(monkeypatch):
    """The backend asks the cost model with the attention's destination rows (the mid-size rule reads them)."""
    from gnn_inductor import cost
    from torch_geometric.nn import GATConv

    asked = []
    monkeypatch.setattr(cost, "attention_declined", lambda device, edges, family, dtype, tf32, rows=None:
                        asked.append((family, edges, rows)))
    edge_index = random_graph(40, 160, hub_degree=60)
    check_rewrites(GATConv(6, 3, heads=2), torch.randn(40, 6), edge_index, expect={"attention": 1})
    assert asked and all(a == ("gat", edge_index.shape[1], 40) for a in asked), asked


def test_declined_attention_graph_goes_to_inductor_whole(monkeypatch):
    """A graph whose only rewrites are declined attention runs as torch.compile's default would (no gnn_io
    op, no plan), is still correct, and the report says why for each layer."""
    from gnn_inductor import cost
    from torch_geometric.nn import GATConv

    monkeypatch.setattr(cost, "attention_declined", lambda device, edges, family, dtype, tf32, rows=None:
                        f"cost model: {family} {dtype} at {edges} edges")
    torch.manual_seed(0)
    edge_index = random_graph(40, 160, hub_degree=60)
    result = check_rewrites(GATConv(6, 3, heads=2), torch.randn(40, 6), edge_index,
                            expect={"attention": 0, "edge_softmax": 0, "near_miss": 1})
    assert result.near_misses[0].reason == f"cost model: gat float32 at {edge_index.shape[1]} edges"
    assert result.report["graphs"][0]["hoisted_structure_nodes"] == 0


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


def _compile_with_crashing_inductor(monkeypatch, crashing: str):
    """Inductor failing on any graph without gnn_io ops (in the forward or the backward compile), and the cost
    model declining every attention graph (on CUDA: small float32 graphs), as a stand-in."""
    import torch._inductor.compile_fx as inductor

    from gnn_inductor import cost
    from gnn_inductor.rewrite_report import clear

    real = inductor.compile_fx_inner

    def crash(gm, example_inputs, **kwargs):
        ours = any(n.op == "call_function" and "gnn_io" in str(n.target) for n in gm.graph.nodes)
        if not ours and kwargs.get("is_backward", False) == (crashing == "backward"):
            raise RuntimeError("Inductor failed on Dynamo's graph (simulated)")
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", crash)
    monkeypatch.setattr(cost, "attention_declined", lambda *a, **k: "declined for the test")
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch._dynamo.reset()
    clear()


@pytest.mark.parametrize("crashing", ["forward", "backward"])
def test_a_declined_graph_inductor_cannot_compile_runs_the_fused_attention(monkeypatch, crashing):
    """A graph of fixed sizes the cost model leaves to Inductor whole, where Inductor fails (forward or backward,
    both compiled up front): the rewritten graph runs (its plan built once), not Dynamo's graph op by op. Results
    match eager; the report says why."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.rewrite_report import reports

    _compile_with_crashing_inductor(monkeypatch, crashing)
    torch.manual_seed(0)
    conv = GATConv(6, 3, heads=2)
    check_against_eager(conv, torch.randn(40, 6), random_graph(40, 150, hub_degree=20))
    mine = reports(conv)
    assert [r.pattern for g in mine for r in g.rewrites if r.pattern == "attention"], mine
    reasons = [m.reason for g in mine for m in g.near_misses]
    assert any("Inductor failed on Dynamo's graph (simulated)" in r and "fused attention runs instead" in r
               for r in reasons), reasons
    assert not any("runs op by op" in r for r in reasons), reasons
    torch._dynamo.reset()


def test_a_declined_graph_of_changing_sizes_inductor_cannot_compile_runs_eagerly(monkeypatch):
    """Mini-batches (sizes that change, Dynamo's dynamic-shape graph) where Inductor fails on a declined graph
    (GATConv on the H100: an unbacked-size assertion): Dynamo's graph runs in eager mode, with no gnn_io op and no
    plan; results match eager at every size; the report says why."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.rewrite_report import reports
    from tests.plan.test_plan import op_counts

    _compile_with_crashing_inductor(monkeypatch, "backward")
    torch.manual_seed(0)
    conv = GATConv(6, 3, heads=2)
    for step, nodes in enumerate((40, 47, 53)):
        edge_index = random_graph(nodes, 4 * nodes, seed=step, hub_degree=nodes // 2)
        counts = op_counts(lambda: check_against_eager(conv, torch.randn(nodes, 6), edge_index))
        if step == 2:  # the dynamic-shape graph, compiled at step 1: nothing of gnn_io's runs
            assert not any(name.startswith("gnn_io::") for name in counts), counts
    reasons = [m.reason for g in reports(conv) for m in g.near_misses]
    assert any("Inductor failed on Dynamo's graph (simulated)" in r and "in eager mode" in r for r in reasons), reasons
    torch._dynamo.reset()


def test_graphs_left_to_inductor_whole_keep_its_own_tiles(monkeypatch):
    """A graph the cost model declines compiles exactly as torch.compile's default: Inductor's own
    ``triton.max_tiles``, not the backend's 2 (unless GNN_IO_INDUCTOR_MAX_TILES is set)."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config as inductor_config
    from torch_geometric.nn import GATConv

    from gnn_inductor import cost

    default = inductor_config.triton.max_tiles
    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append(inductor_config.triton.max_tiles)
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    monkeypatch.setattr(cost, "attention_declined", lambda *a, **k: "declined for the test")
    monkeypatch.delenv("GNN_IO_INDUCTOR_MAX_TILES", raising=False)
    torch.manual_seed(0)
    check_rewrites(GATConv(8, 4, heads=2), torch.randn(30, 8), random_graph(30, 120),
                   expect={"attention": 0, "near_miss": 1})
    assert seen and all(tiles == default for tiles in seen), (seen, default)


def test_a_rewrite_error_without_a_message_still_falls_back(monkeypatch):
    """An exception raised without a message (``AssertionError()``) inside the rewrite must reach the report as a
    near miss with the graph left to Inductor, not crash the fallback (its first line is an empty list's)."""
    import gnn_inductor.backend as backend

    def fail(state):
        raise AssertionError()

    monkeypatch.setattr(backend, "_rewrite_and_compile", fail)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30), expect={"spmm": 0})
    assert [m.reason for m in result.near_misses] == [
        "graph left to Inductor unchanged: the pass canonicalize raised AssertionError: "]


@pytest.mark.parametrize("error", [IndexError, RuntimeError, KeyError])
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_an_exception_in_a_backend_pass_goes_to_inductor_naming_the_pass(monkeypatch, error, strict):
    """Any exception a pass of the backend raises while compiling (an ``IndexError`` included: the user's index
    errors come from the plan at run time, never from a pass) leaves the graph to Inductor, correct against eager,
    with a report entry naming the pass and the error; ``GNN_IO_STRICT=1`` raises it."""
    from gnn_inductor.passes import structure

    def fail(gm):
        raise error("list index out of range")

    monkeypatch.setattr(structure, "hoist_structure", fail)
    if strict:
        monkeypatch.setenv("GNN_IO_STRICT", "1")
    else:
        monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    conv, x, edge_index = GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30)
    if strict:
        torch._dynamo.reset()
        with pytest.raises(Exception, match="list index out of range"):
            torch.compile(conv, backend="gnn_io")(x, edge_index)
        return
    result = check_rewrites(conv, x, edge_index, expect={"spmm": 0})
    assert [m.reason.split(":")[1] for m in result.near_misses] == [" the pass hoist_structure raised " + error.__name__]


def test_an_exception_in_a_pass_after_the_split_compiles_the_graph_without_those_passes(monkeypatch):
    """The passes on the forward and backward graphs after AOTAutograd's split run inside Inductor's compile (the
    backward's at the first backward): one that raises leaves that graph compiled without them, correct, with a
    report entry naming the pass."""
    from gnn_inductor.passes import direct_ops

    def fail(gm):
        raise RuntimeError("retarget failed")

    monkeypatch.setattr(direct_ops, "retarget", fail)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30), expect={"spmm": 1})
    reasons = [m.reason for m in result.near_misses]
    assert reasons and all(r.startswith("the pass direct_ops raised RuntimeError: retarget failed") for r in reasons)


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
    from gnn_inductor.testing import _assert_close, _step

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
        got = _step(compiled, [x.clone().requires_grad_(), edge_index], True, call, {})
        want = _step(reference, [x.clone().requires_grad_(), edge_index], True, call, {})
        _assert_close(f"call {call} output", got[0][0], want[0][0])
        for (param, a), (_, e) in zip(got[1], want[1]):
            _assert_close(f"call {call} grad of {param}", a, e)
        _assert_close(f"call {call} grad of x", got[2][0], want[2][0])
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
