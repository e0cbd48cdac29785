"""The backend's logging (gnn_inductor/logs.py): a line per compiled graph at INFO, the details at DEBUG, nothing at
the default level, and the ways to turn it on (gnn_inductor.set_logs, the ``logs`` setting, PyTorch's TORCH_LOGS
and torch._logging.set_logs)."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch_geometric.nn import GCNConv

from gnn_inductor import config, logs
from gnn_inductor.testing import random_graph


@pytest.fixture(autouse=True)
def default_logging():
    """Each test starts from the default logging state (a test before may have set a level, or had PyTorch's
    logging take the logger over, which stops its records from reaching pytest's capture) and leaves it."""
    propagate = logs.LOGGER.propagate
    logs.set_logs(None)
    logs.LOGGER.propagate = True
    yield
    logs.set_logs(None)
    logs.LOGGER.propagate = propagate


def _compile_gcn():
    """A small GCNConv compiled with gnn_io and called once (the CPU takes the rewrites: tests/conftest.py)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    torch.compile(GCNConv(4, 3), backend="gnn_io")(torch.randn(10, 4), random_graph(10, 30))


def _ours(records) -> list:
    return [r for r in records if r.name == "gnn_inductor" or r.name.startswith("gnn_inductor.")]


def test_info_has_one_line_per_compiled_graph_and_debug_the_pass_records(caplog):
    with config.patch(logs="debug", cpu_rewrite=True):
        _compile_gcn()
    records = _ours(caplog.records)
    compiled = [r.getMessage() for r in records if r.levelno == logging.INFO and "compiled in" in r.getMessage()]
    assert len(compiled) == 1, [r.getMessage() for r in records]
    started = [i for i, r in enumerate(records) if r.levelno == logging.INFO and r.getMessage().startswith("compiling")]
    assert len(started) == 1 and records.index(next(r for r in records if "compiled in" in r.getMessage())) > \
        started[0], "the compile's start is logged before its result"
    assert "spmm x1 -> gnn_io.spmm" in compiled[0] and compiled[0].startswith("graph ")
    plan = [r.getMessage() for r in records if r.levelno == logging.INFO and "plan built" in r.getMessage()]
    assert len(plan) == 1 and "10 nodes" in plan[0], plan
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    passes = [m for m in debug if " passes: " in m]
    assert passes and "canonicalize" in passes[0] and "hoist_structure" in passes[0], debug
    assert any("rewrite [spmm]" in m and "gcn_conv.py:" in m for m in debug), debug
    assert any(r.name == "gnn_inductor.plan.csr" and "CSR build" in r.getMessage() for r in records), debug


def test_nothing_is_logged_at_the_default_level(caplog, capsys):
    _compile_gcn()
    assert _ours(caplog.records) == []
    assert "gnn_inductor" not in capsys.readouterr().err


def test_set_logs_sets_the_level_of_every_gnn_inductor_logger():
    child = logging.getLogger("gnn_inductor.plan.csr")
    child.setLevel(logging.ERROR)  # as TORCH_LOGS sets each module's logger
    logs.set_logs("debug")
    assert logs.LOGGER.level == logging.DEBUG and child.getEffectiveLevel() == logging.DEBUG
    logs.set_logs(logging.WARNING)
    assert not child.isEnabledFor(logging.INFO)
    logs.set_logs(None)
    assert logs.LOGGER.level == logging.NOTSET
    with pytest.raises(ValueError, match="log level"):
        logs.set_logs("loud")


ROUTES = textwrap.dedent("""
    import logging, sys
    import torch
    import gnn_inductor
    from gnn_inductor import logs

    probe = logging.getLogger("gnn_inductor.compile")

    def show(step):
        print("--", step, file=sys.stderr, flush=True)
        probe.debug("debug line")
        probe.info("info line")

    show("default")
    if sys.argv[1] == "python":
        logs.set_logs(logging.INFO)
        show("set_logs")
        logs.set_logs(None)
        torch._logging.set_logs(modules={"gnn_io": logging.DEBUG})
        show("torch set_logs")
    else:
        show("TORCH_LOGS")
""")


def _run(route: str, **env) -> dict:
    """The log lines each step of :data:`ROUTES` printed on stderr: ``{step: [lines]}``."""
    result = subprocess.run([sys.executable, "-c", ROUTES, route], capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    steps: dict = {}
    current = None
    for line in result.stderr.splitlines():
        if line.startswith("-- "):
            current = line[3:]
            steps[current] = []
        elif current is not None and " line" in line:
            steps[current].append(line)
    return steps


def test_set_logs_and_torch_set_logs_reach_the_logger():
    steps = _run("python")
    assert steps["default"] == []
    assert len(steps["set_logs"]) == 1 and "gnn_inductor.compile INFO: info line" in steps["set_logs"][0]
    assert len(steps["torch set_logs"]) == 2, steps  # through the gnn_io alias, DEBUG included


def test_torch_logs_names_the_package():
    steps = _run("torch_logs", TORCH_LOGS="+gnn_inductor")
    assert len(steps["default"]) == 2 and len(steps["TORCH_LOGS"]) == 2, steps
