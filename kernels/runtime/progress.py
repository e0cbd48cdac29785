"""Log lines for the slow steps of a plan build and of a kernel's first call: the CSR build, the block format, node
orders, the one-off timings of kernel candidates. A step that took :data:`PROGRESS_SECONDS` or more is logged at
INFO, so a user waiting on a large graph's first call sees where the time goes; a shorter one at DEBUG.
gnn_inductor/logs.py sets the levels (docs/usage.md, "Logging").

Times are host time by ``time.perf_counter``: nothing here synchronises a device. On CUDA a step's time covers its
kernels where the step synchronises itself (the CSR build's index check, the block format's sizes, the timings) and
their launches otherwise. The cost when the line is not shown is two clock reads and a level check.
"""
from __future__ import annotations

import contextlib
import logging
import time

PROGRESS_SECONDS = 1.0


def level_of(seconds: float) -> int:
    """The level a step of ``seconds`` is logged at."""
    return logging.INFO if seconds >= PROGRESS_SECONDS else logging.DEBUG


def duration(seconds: float) -> str:
    """``seconds`` as a log line shows it: seconds from one second, milliseconds below."""
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def done(log: logging.Logger, what: str, seconds: float) -> None:
    """Log that the step ``what`` took ``seconds``."""
    level = level_of(seconds)
    if log.isEnabledFor(level):
        log.log(level, "%s: %s", what, duration(seconds))


@contextlib.contextmanager
def timed(log: logging.Logger, what: str):
    """``with timed(log, "CSR build"):``: :func:`done` for the block's time (nothing when it raises)."""
    start = time.perf_counter()
    yield
    done(log, what, time.perf_counter() - start)
