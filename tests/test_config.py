"""The settings (gnn_inductor/config.py): declared once, read from patches, the environment or defaults, checked in
one place, set per model through ``torch.compile``'s ``options=`` and ``mode=``, and documented by a generated
table."""
import json
import pathlib
import re
import threading

import pytest
import torch
from torch_geometric.nn import GCNConv

from gnn_inductor import config, rewrite_report
from gnn_inductor.config import SettingError
from gnn_inductor.testing import random_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_setting_is_declared_with_a_valid_default():
    envs = [s.env for s in config.SETTINGS.values()]
    assert len(set(envs)) == len(envs), envs
    for name, setting in config.SETTINGS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name) and setting.env.startswith("GNN_IO_"), name
        assert setting.doc and setting.kind in ("bool", "int", "choice", "path"), name
        value = setting.default
        if value is None:
            continue
        if setting.kind == "bool":
            assert isinstance(value, bool), name
        elif setting.kind == "int":
            assert setting.check_int(value, name, value) == value, name
        elif setting.kind == "choice":
            assert value in setting.choices, name
        else:
            assert isinstance(value, str), name


def test_choices_are_the_ones_the_modules_implement():
    from gnn_inductor.plan import orders as reorder
    from gnn_inductor.kernels.attention import selector as attention_paths

    assert set(config.SETTINGS["calibration"].choices) == {"auto", "H100", *attention_paths.DEVICE_CALIBRATION}
    assert set(config.SETTINGS["reorder"].choices) == {"auto", "off", *reorder.CANDIDATES}


def test_a_patch_wins_over_the_environment_which_wins_over_the_default(monkeypatch):
    monkeypatch.delenv("GNN_IO_PLAN_CHECK", raising=False)
    assert config.get("plan_check") == "auto" and not config.is_set("plan_check")
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", "fingerprint")
    assert config.get("plan_check") == "fingerprint" and config.is_set("plan_check")
    with config.patch(plan_check="version"):
        assert config.get("plan_check") == "version"
        with config.patch(plan_check=None):  # None: the default, the environment ignored
            assert config.get("plan_check") == "auto" and not config.is_set("plan_check")
        assert config.get("plan_check") == "version"
    assert config.get("plan_check") == "fingerprint"

    @config.patch(churn_edges=5, cuda_graphs="1")
    def decorated():
        return config.get("churn_edges"), config.get("cuda_graphs")

    assert decorated() == (5, True)
    assert config.get("churn_edges") == config.default("churn_edges")
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", " ")  # blank: the default
    assert config.get("plan_check") == "auto"


def test_patches_are_process_wide_and_may_exit_in_any_order():
    """A patch is seen by other threads (the autograd engine's device threads, the plan builds that
    kernels/runtime/cuda_graphs.py's outside_graph_pool runs on a worker thread), and each removes only its own entry."""
    outer, inner = config.patch(expected_calls=7), config.patch(expected_calls=9, force=True)
    outer.__enter__()
    inner.__enter__()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(config.get("expected_calls")))
    worker.start()
    worker.join()
    assert seen == [9]
    outer.__exit__(None, None, None)
    assert (config.get("expected_calls"), config.get("force")) == (9, True)
    inner.__exit__(None, None, None)
    assert (config.get("expected_calls"), config.get("force")) == (config.default("expected_calls"), False)


@pytest.mark.parametrize("name, bad, allowed", [
    ("strict", "yes", "0 or 1"),
    ("plan_check", "sometimes", "one of auto, fingerprint or version"),
    ("attention_heads", "every", "one of per_head, all"),
    ("churn_edges", "-5", "a non-negative integer"),
    ("inductor_max_tiles", "7", "an integer from 1 to 3"),
    ("fuse_min_group", "1", "an integer of at least 2"),
])
def test_a_bad_value_raises_naming_the_variable(monkeypatch, name, bad, allowed):
    setting = config.SETTINGS[name]
    monkeypatch.setenv(setting.env, bad)
    with pytest.raises(SettingError, match=re.escape(f"{setting.env}={bad!r}: set it to {allowed}")):
        config.get(name)
    with pytest.raises(SettingError, match=re.escape(f"{name} ({setting.env})={bad!r}")):
        config.patch(**{name: bad})


def test_options_take_the_public_settings_only():
    with pytest.raises(SettingError, match="unknown option fp32_gemm: the options are report, strict, plan_check"):
        config.compile_settings(options={"fp32_gemm": "cublas"})
    with pytest.raises(SettingError, match="unknown option plan_chek"):
        config.compile_settings(options={"plan_chek": "version"})
    with pytest.raises(SettingError, match="PLAN_CHECK"):
        config.compile_settings(options={"plan_check": "sometimes"})
    with pytest.raises(SettingError, match="reduce-overhead"):
        config.compile_settings(mode="fastest")
    assert config.compile_settings() == config.compile_settings("default", {}) == {}
    assert config.compile_settings(options={"cuda_graphs": True, "churn_edges": 10}) == {
        "cuda_graphs": True, "churn_edges": 10}
    assert config.compile_settings("max-autotune") == {"cuda_graphs": True, "inductor_max_autotune": True}
    assert config.compile_settings("max-autotune-no-cudagraphs") == {"inductor_max_autotune": True}


def test_an_unknown_option_fails_the_compile():
    torch._dynamo.reset()
    model = torch.compile(GCNConv(8, 4), backend="gnn_io", options={"max_autotune": True})
    with pytest.raises(Exception, match="unknown option max_autotune"):
        model(torch.randn(50, 8), random_graph(50, 200))
    torch._dynamo.reset()


def test_compiled_callables_run_under_their_options(monkeypatch):
    """What the backend returns, and the forward and backward Inductor compiles, run under the options at each call,
    in Inductor's calling convention (a boxed call stays boxed), with the callable's attributes."""
    from gnn_inductor import backend

    class Boxed:
        _boxed_call = True
        marker = "kept"

        def __call__(self, inputs):
            return config.get("plan_check"), list(inputs)

    monkeypatch.delenv("GNN_IO_PLAN_CHECK", raising=False)
    with config.patch(plan_check="version"):
        settings = config.snapshot()
    wrapped = backend.UnderSettings(Boxed(), settings)
    assert wrapped._boxed_call and wrapped.marker == "kept"
    assert wrapped([1, 2]) == ("version", [1, 2])
    assert config.get("plan_check") == "auto"


def test_a_snapshot_is_every_setting_at_one_moment(monkeypatch):
    """``config.snapshot()``: every setting resolved (patch, else environment, else default), immutable, with what
    was set; ``config.applied`` makes reads (``get`` and ``is_set``) answer from it, the environment aside."""
    monkeypatch.delenv("GNN_IO_PLAN_CHECK", raising=False)
    monkeypatch.setenv("GNN_IO_CHURN_EDGES", "77")
    with config.patch(force=True):
        settings = config.snapshot()
    assert set(settings) == set(config.SETTINGS)
    assert (settings["plan_check"], settings["churn_edges"], settings["force"]) == ("auto", 77, True)
    assert settings.is_set("churn_edges") and settings.is_set("force") and not settings.is_set("plan_check")
    with pytest.raises(TypeError):
        settings["force"] = False  # immutable
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", "version")
    monkeypatch.delenv("GNN_IO_CHURN_EDGES")
    with config.applied(settings):
        assert (config.get("plan_check"), config.get("churn_edges"), config.get("force")) == ("auto", 77, True)
        assert config.is_set("churn_edges") and not config.is_set("plan_check")
        with config.patch(plan_check="fingerprint"):  # a patch inside still wins
            assert config.get("plan_check") == "fingerprint"
    assert (config.get("plan_check"), config.get("churn_edges")) == ("version", config.default("churn_edges"))
    monkeypatch.setenv("GNN_IO_STRICT", "yes")
    with pytest.raises(SettingError, match="GNN_IO_STRICT"):
        config.snapshot()


def test_a_compiled_model_keeps_the_settings_of_its_compile(monkeypatch):
    """A variable changed between the compile and a call does not reach the compiled model, forward or backward:
    both run under the compile's snapshot. Here ``plan_check``: the default checks CPU graphs' fingerprints, so a
    write through ``.data`` rebuilds the plan, which ``version``, set after the compile, would not."""
    monkeypatch.delenv("GNN_IO_PLAN_CHECK", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(8, 4)
    model = torch.compile(conv, backend="gnn_io")
    edge_index, x = random_graph(50, 200), torch.randn(50, 8, requires_grad=True)
    model(x, edge_index).sum().backward()
    graph = rewrite_report.reports()[-1]
    monkeypatch.setenv("GNN_IO_PLAN_CHECK", "version")
    edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 50
    out = model(x, edge_index)
    torch.testing.assert_close(out, conv(x, edge_index))
    assert graph.plan_stale == 1 and graph.plan_check.startswith("each reuse compares"), graph
    out.sum().backward()
    assert config.get("plan_check") == "version"  # the environment's value, outside the compiled model
    torch._dynamo.reset()


def test_max_autotune_reaches_inductor(monkeypatch):
    from gnn_inductor import backend
    import torch._inductor.compile_fx as inductor

    seen = []
    monkeypatch.setattr(inductor, "compile_fx", lambda gm, inputs, inner_compile, config_patches: seen.append(
        config_patches))
    with config.patch(**config.compile_settings("max-autotune-no-cudagraphs")):
        backend.inductor_compile(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)])
    backend.inductor_compile(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)])
    assert seen[0]["max_autotune"] and seen[0]["coordinate_descent_tuning"], seen
    assert "max_autotune" not in seen[1] and "triton.cudagraphs" not in seen[0], seen


def test_report_option_writes_the_json_report(tmp_path, monkeypatch):
    monkeypatch.delenv("GNN_IO_REPORT", raising=False)
    path = tmp_path / "report.json"
    torch._dynamo.reset()
    model = torch.compile(GCNConv(8, 4), backend="gnn_io", options={"report": str(path)})
    model(torch.randn(50, 8), random_graph(50, 200))
    data = json.loads(path.read_text())
    assert data["graphs"] and any(r["pattern"] == "spmm" for r in data["rewrites"]), data["rewrites"]
    assert config.get("report") is None  # the option holds for that model's compile and calls only
    torch._dynamo.reset()


def test_plan_check_option_trusts_the_version_counter(monkeypatch):
    """``options={"plan_check": "version"}``: a write through ``.data`` is not followed (the default checks CPU
    graphs, tests/plan/test_plan.py), because the option holds at each call, where the plan is reused."""
    monkeypatch.delenv("GNN_IO_PLAN_CHECK", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(8, 4)
    model = torch.compile(conv, backend="gnn_io", options={"plan_check": "version"})
    edge_index, x = random_graph(50, 200), torch.randn(50, 8)
    before = model(x, edge_index)
    edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 50
    torch.testing.assert_close(model(x, edge_index), before)
    assert rewrite_report.reports()[-1].plan_stale == 0
    assert not torch.allclose(before, conv(x, edge_index))
    torch._dynamo.reset()


def test_reduce_overhead_mode_compiles_with_cuda_graphs_requested(monkeypatch):
    """``mode="reduce-overhead"`` is ``cuda_graphs``: on CPU tensors nothing is recorded and the results are eager's;
    the report says CUDA graphs were asked for, of the forward and of the backward, which AOTAutograd compiles at
    the first backward, outside the forward's call."""
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GCNConv(8, 4)
    model = torch.compile(conv, backend="gnn_io", mode="reduce-overhead")
    edge_index, x = random_graph(50, 200), torch.randn(50, 8, requires_grad=True)
    out = model(x, edge_index)
    torch.testing.assert_close(out, conv(x, edge_index))
    out.sum().backward()
    (graph,) = [g for g in rewrite_report.reports() if g.cuda_graphs][-1:]
    assert graph.cuda_graphs == {"forward": "not recorded (no CUDA tensors)",
                                 "backward": "not recorded (no CUDA tensors)"}, graph.cuda_graphs
    assert any(m.pattern == "cuda_graphs" for m in graph.near_misses)  # self loops: compiled at each graph's sizes
    assert not config.get("cuda_graphs")
    torch._dynamo.reset()


def test_the_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "usage.md").read_text()
    begin = "<!-- generated by `python -m gnn_inductor.config`: edit gnn_inductor/config.py, not this table -->\n"
    end = "<!-- end of the generated settings table -->"
    assert begin in text and end in text
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == config.markdown_table(), "docs/usage.md's settings table is stale: python -m gnn_inductor.config"


def test_every_setting_points_at_docs_that_exist():
    """The table's "more" column names pages of docs/ ("this page": usage.md, where a quoted section follows)."""
    for setting in config.SETTINGS.values():
        for part in filter(None, setting.more.split(", ")):
            if part.startswith('"') or part == "this page":
                continue
            assert (ROOT / "docs" / part).is_file(), f"{setting.name}: docs/{part} does not exist"


def test_only_the_config_module_reads_the_environment():
    readers = [str(path.relative_to(ROOT)) for folder in ("gnn_inductor", "kernels", "patterns")
               for path in sorted((ROOT / folder).rglob("*.py"))
               if "os.environ" in path.read_text() and path != ROOT / "gnn_inductor" / "config.py"]
    assert readers == [], readers
