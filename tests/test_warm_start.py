"""Warm starts: a second process compiling the same model for the same sizes reuses Inductor's FX graph cache
(the graphs after the backend's passes), and its compiled model still computes what eager PyG computes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

CHILD = textwrap.dedent("""
    import json
    import os
    import torch
    from torch._dynamo.utils import counters
    from torch_geometric.nn import GATConv, GCNConv
    import gnn_inductor

    torch.manual_seed(0)
    edge_index = torch.randint(0, 300, (2, 2000))
    x = torch.randn(300, 16, requires_grad=True)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(16, 16), GATConv(16, 8, heads=2)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    model = Model()
    expected = model(x, edge_index)
    expected.sum().backward()
    expected_grad, x.grad = x.grad, None
    options = json.loads(os.environ.get("CHILD_OPTIONS", "{}"))
    out = torch.compile(model, backend="gnn_io", options=options)(x, edge_index)
    out.sum().backward()
    rewrites = sum(len(r.rewrites) for r in gnn_inductor.rewrite_report.reports())
    print(json.dumps({"aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
                      "hits": counters["inductor"]["fxgraph_cache_hit"],
                      "misses": counters["inductor"]["fxgraph_cache_miss"], "rewrites": rewrites,
                      "out_err": float((out - expected).abs().max()), "grad_err": float((x.grad - expected_grad).abs().max())}))
""")


def _run(cache_dir, options=None) -> dict:
    # the CPU rewrites through the environment, as a user sets them: settings given as options (or a patch) keep
    # AOTAutograd's cache off
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "GNN_IO_CPU_REWRITE": "1",
           "GNN_IO_AOT_CACHE": "auto", "CHILD_OPTIONS": json.dumps(options or {})}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_compiled_graphs(tmp_path):
    cold, warm = _run(tmp_path), _run(tmp_path)
    assert cold["rewrites"] == warm["rewrites"] >= 2
    assert cold["misses"] >= 2 and cold["hits"] == 0 and cold["aot_hits"] == 0
    # AOTAutograd's cache: forward and backward loaded at once, from Inductor's FX graph cache
    assert warm["aot_hits"] == 1 and warm["hits"] == cold["misses"] and warm["misses"] == 0
    for run in (cold, warm):
        assert run["out_err"] < 1e-4 and run["grad_err"] < 1e-4


# the warm start itself runs in the default tier; the options' cache setting with --slow
@pytest.mark.slow
def test_settings_given_as_options_keep_aot_autograds_cache_off(tmp_path):
    """A graph loaded from AOTAutograd's cache runs its backward without the compile's settings in force, so a
    compile with options never uses that cache; Inductor's FX graph cache still serves it."""
    options = {"plan_check": "fingerprint"}
    cold, warm = _run(tmp_path, options), _run(tmp_path, options)
    assert cold["aot_hits"] == warm["aot_hits"] == 0
    assert warm["hits"] == cold["misses"] >= 2 and warm["misses"] == 0
    assert warm["out_err"] < 1e-4 and warm["grad_err"] < 1e-4


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the worker-pool wait applies to CUDA graphs only."""

    @property
    def is_cuda(self):
        return True


def test_the_compile_worker_pool_is_awaited_on_a_cache_miss_only(monkeypatch):
    from types import SimpleNamespace

    from torch._inductor import compile_fx
    from torch._inductor.async_compile import AsyncCompile

    from gnn_inductor import caching

    assert callable(compile_fx.fx_codegen_and_compile)  # the function a miss calls, which the wait wraps

    waits, generated = [], []
    monkeypatch.setattr(AsyncCompile, "wait_pool_ready", classmethod(lambda cls, timeout=120: waits.append(timeout)))
    inductor = SimpleNamespace(fx_codegen_and_compile=lambda *a, **k: generated.append(a) or "code")
    original = inductor.fx_codegen_and_compile
    inputs = [torch.zeros(2).as_subclass(_OnCuda)]
    with caching.workers_on_cache_miss(inductor, inputs):
        pass  # a cache hit: Inductor loads the graph without generating code
    assert waits == [] and inductor.fx_codegen_and_compile is original
    with caching.workers_on_cache_miss(inductor, inputs):
        assert inductor.fx_codegen_and_compile("gm") == "code"  # a miss: code generation, after the pool is up
    assert waits == [120] and generated == [("gm",)] and inductor.fx_codegen_and_compile is original
    with caching.workers_on_cache_miss(inductor, [torch.zeros(2)]):  # CPU graphs compile C++ in process
        inductor.fx_codegen_and_compile("gm")
    assert waits == [120]
