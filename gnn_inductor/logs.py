"""What the backend logs while a model compiles and first runs, through Python's ``logging`` under the
``gnn_inductor`` logger (docs/usage.md, "Logging").

- ``gnn_inductor.compile``: at INFO one line per graph Dynamo hands the backend (its rewrites per pattern, op and
  kernel, its near misses per kind and pattern, its plan, the compile's time), and one per plan's first build; at
  DEBUG each pass's record, each rewrite's details and source line, each near miss's reason.
- ``gnn_inductor.plan.*`` and ``gnn_inductor.kernels.*``: the steps of a plan build and of a kernel's first call
  (CSR build, block format, node orders, the one-off timings of kernel candidates), at INFO when one took a second
  or more (gnn_inductor/kernels/runtime/progress.py), and the kernel path decisions.

Three ways to turn it on. :func:`set_logs` (``gnn_inductor.set_logs(logging.INFO)``), or the ``logs`` setting
(``GNN_IO_LOGS=info``), which applies it at the next compile. PyTorch's logging: ``TORCH_LOGS="+gnn_inductor"``
(DEBUG) or ``TORCH_LOGS="gnn_inductor"`` (INFO), which PyTorch reads as a module name when ``torch`` is imported;
and, once ``gnn_inductor`` is imported, ``torch._logging.set_logs(modules={"gnn_io": logging.INFO})`` through the
alias this module registers. ``TORCH_LOGS="gnn_io"`` cannot work: PyTorch parses the variable while ``torch`` is
imported, before any package can register an alias, and rejects a name it does not know.
"""
from __future__ import annotations

import logging
import sys
from collections import Counter

from torch._logging._internal import register_log

from gnn_inductor.kernels.runtime.progress import duration, level_of
from gnn_inductor.rewrite_report import FALLBACK, KINDS

LOGGER = logging.getLogger("gnn_inductor")
log = logging.getLogger("gnn_inductor.compile")
TORCH_ALIAS = "gnn_io"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
FORMAT = "[%(asctime)s] %(name)s %(levelname)s: %(message)s"
KERNEL_CHARS = 60  # a rewrite's kernel description at INFO, cut to this (DEBUG has it whole)
FAILURES = ("backend", "inductor")  # patterns of the near misses that say a pass or Inductor failed

# torch._logging.set_logs(modules={"gnn_io": level}) sets the gnn_inductor logger; TORCH_LOGS is parsed before this
# runs, so only its module-name form ("gnn_inductor") reaches the logger from the environment.
register_log(TORCH_ALIAS, LOGGER.name)


class _Stderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is at each record (a notebook's or a test's redirect), not as it was
    when the handler was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_HANDLER = _Stderr()
_HANDLER.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
_FOLLOWED = [None]  # the value of the ``logs`` setting last applied by :func:`follow_setting`


def level_number(level) -> int:
    """``level`` as a ``logging`` level: a number, or a name of :data:`LEVELS` in any case."""
    if isinstance(level, str) and level.strip().lower() in LEVELS:
        return LEVELS[level.strip().lower()]
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    raise ValueError(f"log level {level!r}: give a logging level (logging.INFO) or one of {', '.join(LEVELS)}")


def _descendants() -> list:
    prefix = LOGGER.name + "."
    return [logger for name, logger in list(logging.Logger.manager.loggerDict.items())
            if name.startswith(prefix) and isinstance(logger, logging.Logger)]


def set_logs(level=logging.INFO) -> None:
    """Show the backend's log lines from ``level`` up (``logging.INFO``, ``logging.DEBUG``, or ``"info"``,
    ``"debug"``; ``logging.WARNING`` quiets them): the ``gnn_inductor`` logger takes ``level`` and every logger
    below it follows it (a level one of them was given, by ``TORCH_LOGS`` for one, is cleared). Where no handler
    would receive the records (no logging configured), a handler writing to stderr is added; otherwise they go to
    the handlers configured (the root logger's, PyTorch's). ``None`` undoes it: that handler removed, the levels
    left to the logging setup, and the ``logs`` setting applied again at the next compile."""
    for logger in _descendants():
        logger.setLevel(logging.NOTSET)
    if level is None:
        LOGGER.setLevel(logging.NOTSET)
        LOGGER.removeHandler(_HANDLER)
        _FOLLOWED[0] = None
        return
    LOGGER.setLevel(level_number(level))
    if not LOGGER.hasHandlers():
        LOGGER.addHandler(_HANDLER)


def follow_setting(value) -> None:
    """Apply the ``logs`` setting's ``value`` (a name of :data:`LEVELS`, or None: unset) through :func:`set_logs`
    when it differs from the value last applied, so a :func:`set_logs` call between compiles stands until the
    setting changes."""
    if value is None or value == _FOLLOWED[0]:
        return
    set_logs(value)
    _FOLLOWED[0] = value


def _kernel(text: str) -> str:
    return text if len(text) <= KERNEL_CHARS else text[:KERNEL_CHARS - 3].rstrip() + "..."


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def describe(report, seconds: float) -> str:
    """The INFO line of one compiled graph, from its :class:`~gnn_inductor.rewrite_report.GraphReport`."""
    parts = []
    if report.rewrites:
        kinds = Counter((w.pattern, w.op, _kernel(w.kernel)) for w in report.rewrites)
        parts.append(_plural(len(report.rewrites), "rewrite") + ": " + "; ".join(
            f"{pattern} x{n} -> {op}" + (f" ({kernel})" if kernel else "")
            for (pattern, op, kernel), n in kinds.items()))
    else:
        parts.append("no rewrite")
    for kind in KINDS:  # the near misses by kind (declined, not matched, fallback), then pattern
        patterns = Counter(m.pattern for m in report.near_misses if m.kind == kind)
        if patterns:
            parts.append(f"{sum(patterns.values())} {kind.replace('_', ' ')} ("
                         + ", ".join(f"{p} x{n}" for p, n in patterns.items()) + ")")
    if report.hoisted_nodes:
        parts.append(f"plan of {report.hoisted_nodes} structure nodes, built at the first call of each graph")
    failed = [p.as_text() for p in report.passes if p.status == "failed"]
    if failed:
        parts.append("failed: " + "; ".join(failed))
    if report.cuda_graphs:
        parts.append("CUDA graphs: " + "; ".join(f"{side} {state}" for side, state in report.cuda_graphs.items()))
    return f"graph {report.graph_id} compiled in {duration(seconds)}: " + ", ".join(parts)


def details(report) -> list:
    """The DEBUG lines of one compiled graph: its pass records, rewrites and near misses."""
    where = f"graph {report.graph_id}"
    lines = [f"{where} passes: " + ", ".join(p.as_text() for p in report.passes)] if report.passes else []
    for w in report.rewrites:
        extra = ", ".join(f"{k}={v}" for k, v in w.details.items() if k not in ("edge_functions", "members"))
        lines.append(f"{where} rewrite [{w.pattern}] -> {w.op} ({w.kernel})" + (f" {extra}" if extra else "")
                     + f" at {w.source['source']}")
    lines.extend(f"{where} near miss [{m.pattern}] at {m.source['source']}: {m.reason}" for m in report.near_misses)
    return lines


def compile_started(gm) -> None:
    """Log the start of a compile (INFO): the first call of a compiled model is silent while it compiles (10-30 s
    on a GPU, up to a minute on a CPU), so the user sees that it is under way and what it is compiling."""
    if log.isEnabledFor(logging.INFO):
        calls = sum(1 for node in gm.graph.nodes if node.op in ("call_function", "call_method", "call_module"))
        log.info("compiling a graph of %d ops (Dynamo's capture): rewriting message passing, then Inductor", calls)


def graph_compiled(reports: list, seconds: float) -> None:
    """Log the graphs one call of the backend compiled (``reports``: the reports it added), in ``seconds``."""
    if not log.isEnabledFor(logging.INFO):
        return
    if not reports:
        log.info("graph compiled in %s", duration(seconds))
    for report in reports:
        log.info("%s", describe(report, seconds))
        for m in report.near_misses:  # a failure the backend ran around: its reason at INFO
            if m.kind == FALLBACK or m.pattern in FAILURES:
                log.info("graph %d: %s", report.graph_id, m.reason)
        if log.isEnabledFor(logging.DEBUG):
            for line in details(report):
                log.debug("%s", line)


def plan_built(report, seconds: float, builds: int) -> None:
    """Log a plan build of the graph of ``report`` (the ``builds``-th of its plan cache), which took ``seconds``:
    INFO for the first build and for a slow one, DEBUG for the others (a new graph each step in mini-batch
    training)."""
    level = logging.INFO if builds == 1 else level_of(seconds)
    if not log.isEnabledFor(level):
        return
    stats = next((w.graph_stats for w in report.rewrites if w.graph_stats), None)
    size = f", {stats['nodes']:,} nodes, {stats['edges']:,} edges" if stats else ""
    log.log(level, "graph %d: plan built in %s (build %d%s)", report.graph_id, duration(seconds), builds, size)
