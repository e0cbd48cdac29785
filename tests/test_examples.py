"""The examples run as a user runs them, on the CPU at their smallest: exit status 0 and the lines a user reads.

Each example runs in a subprocess of its own (a fresh Dynamo, as from the command line), single-threaded
(``OMP_NUM_THREADS=1``: Inductor's multi-threaded CPU scatter kernels can crash in ``atomic_add_vec``, see
tests/conftest.py, and the other test tier shares the cores). examples/gat_cora.py, the README's first command,
runs in its default form (the cost model leaves the attention to Inductor on the CPU); the others run with
``--cpu-rewrites`` so that the report shows their rewrites. Cora is read from the local copy
(``$GNN_IO_DATA/Planetoid``, else ``../shared/data/Planetoid``): the cases that need it are skipped without it
rather than downloading it.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnn_inductor.frontends.dgl import import_dgl

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _example_data():
    spec = importlib.util.spec_from_file_location("example_data", EXAMPLES / "example_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCAL_CORA = _example_data().local_planetoid() / "Cora" / "raw"
needs_cora = pytest.mark.skipif(not LOCAL_CORA.is_dir(), reason=f"no local copy of Cora in {LOCAL_CORA} "
                                "(the example would download it; the tests do not use the network)")


def run(command: list, timeout: int = 300, **extra_env) -> str:
    """Run ``python <command>`` from the repository root; returns stdout and stderr, asserting exit status 0."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra_env)
    env.pop("GNN_IO_CPU_REWRITE", None)  # tests/conftest.py sets it; an example runs with its own flags only
    done = subprocess.run([sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited with {done.returncode}:\n{output[-6000:]}"
    return output


@needs_cora
def test_gat_cora_default_form(tmp_path):
    """The README's first command (one epoch): trains, evaluates, and the report says why the CPU took no
    rewrite."""
    output = run(["examples/gat_cora.py", "--epochs", "1", "--data-root", str(tmp_path)])
    assert "accuracy: train" in output
    assert "cost model: on CPU Inductor's C++ code beats the ops' references" in output
    assert "runs gnn_io." not in output and "0 rewritten" in output


@pytest.mark.slow  # two more processes on CI's two cores; tests/models/test_ddp.py's two-process test runs in CI
def test_ddp_minibatch_on_two_processes():
    """The multi-GPU example's CPU form: torchrun, two gloo processes, each sampling its own seeds (one Inductor
    compile thread per rank, as in tests/models/test_ddp.py)."""
    output = run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "examples/ddp_minibatch.py",
                  "--epochs", "1", "--steps", "3", "--batch-size", "64", "--cpu-rewrites"],
                 TORCHINDUCTOR_COMPILE_THREADS="1")
    assert "mean loss over 2 ranks" in output and "2 ranks of 64 seeds" in output
    assert "SAGEConv conv1 at examples/minibatch_sage.py" in output and "runs gnn_io.spmm" in output


@pytest.mark.slow  # the mini-batch paths (the switch, shape buckets) run in tests/test_buckets.py and tests/plan
def test_minibatch_sage():
    output = run(["examples/minibatch_sage.py", "--epochs", "1", "--steps", "3", "--batch-size", "64",
                  "--cpu-rewrites"])
    assert "test accuracy on 64 sampled seeds" in output
    assert "SAGEConv conv1 at examples/minibatch_sage.py" in output and "runs gnn_io.spmm" in output


@pytest.mark.slow  # the TransformerConv rewrite's end to end runs in tests/models; the README's first command here
def test_bf16_large():
    output = run(["examples/bf16_large.py", "--epochs", "1", "--cpu-rewrites"])
    assert "test accuracy:" in output
    assert "TransformerConv conv1 at examples/bf16_large.py" in output and "runs gnn_io.attention" in output


@pytest.mark.slow  # GCNConv's SpMM under inference_mode runs in tests/models/test_reliability.py
def test_inference():
    output = run(["examples/inference.py", "--calls", "2", "--cpu-rewrites"])
    assert "predicted 20000 nodes" in output
    assert "GCNConv conv1 at examples/inference.py" in output and "runs gnn_io.spmm" in output


@needs_cora
@pytest.mark.slow  # DGL's GraphConv compiled end to end runs in tests/frontends/dgl/test_dgl_zoo.py
def test_dgl_gcn(tmp_path):
    try:
        import_dgl()  # skips where DGL is not installed
    except ImportError as exc:
        pytest.skip(f"dgl is not installed ({exc}); pip install -e \".[dgl]\"")
    output = run(["examples/dgl_gcn.py", "--epochs", "1", "--data-root", str(tmp_path), "--cpu-rewrites"])
    assert "test accuracy:" in output
    assert "GraphConv conv1 at examples/dgl_gcn.py" in output and "runs gnn_io.spmm" in output


def test_my_model_file_passes_under_pytest():
    output = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/test_my_model.py"])
    assert "2 passed" in output
