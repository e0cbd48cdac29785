"""A sampling profiler for one thread's Python stack: unlike cProfile it adds no cost per function call, so
Python-heavy code (launchers, small helpers) is not inflated against C calls. A daemon thread reads the
target thread's frame (``sys._current_frames``) every ``interval`` seconds and counts, per function, the samples
where it is the innermost Python frame (self) and those where it is anywhere on the stack (inclusive). Time spent
inside a C function (an ATen op, a kernel launch) is counted to the Python frame that called it. The sampler
needs the GIL to read the stack, so the interpreter's switch interval is set to the sampling interval while it
runs (and restored after): the sampled thread then yields at the next bytecode boundary, or when a C call that
holds the GIL returns.

    with StackSampler() as sampler:
        for _ in range(200):
            step()
    print(sampler.table(rows=30))

``python -m benchmarks.cpu_profile --sampler`` uses it on a layer's step.

``all_threads=True`` samples every other thread too (the autograd engine runs a CUDA backward on its own device
thread, where the main thread only waits in ``_engine_run_backward``): :meth:`table` then gives the main thread's
table and one for the other threads, each as a share of the sampling ticks, so the two show how much of the
wall time each thread spent in Python or in C calls made from Python (a thread inside C++ with no Python frame,
such as the engine between nodes, is not seen).
"""
from __future__ import annotations

import collections
import sys
import threading
import time


class StackSampler:
    def __init__(self, interval: float = 1e-4, thread_id: int | None = None, all_threads: bool = False):
        self.interval = interval
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.all_threads = all_threads
        self.self_counts: collections.Counter = collections.Counter()
        self.inclusive_counts: collections.Counter = collections.Counter()
        self.samples = 0
        self.ticks = 0
        self.other_self: collections.Counter = collections.Counter()
        self.other_inclusive: collections.Counter = collections.Counter()
        self.other_samples = 0
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            frames = sys._current_frames()
            self.ticks += 1
            frame = frames.get(self.thread_id)
            if frame is not None:
                self.samples += 1
                _count(frame, self.self_counts, self.inclusive_counts)
            if self.all_threads:
                for ident, other in frames.items():
                    if ident not in (me, self.thread_id):
                        self.other_samples += 1
                        _count(other, self.other_self, self.other_inclusive)
            time.sleep(self.interval)

    def __enter__(self) -> "StackSampler":
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval)
        self._worker = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._worker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._worker.join()
        sys.setswitchinterval(self._switch)

    def table(self, rows: int = 30) -> str:
        """The ``rows`` functions of most inclusive samples, then those of most self samples, as percentages of
        all samples."""
        if not self.all_threads:
            return counts_table(self.samples, self.self_counts, self.inclusive_counts, rows, max(1, self.samples))
        ticks = max(1, self.ticks)
        return "\n".join([
            f"main thread, as % of {self.ticks} ticks:", counts_table(self.samples, self.self_counts,
                                                                self.inclusive_counts, rows, ticks), "",
            f"other threads (autograd's device thread), as % of the same {self.ticks} ticks:",
            counts_table(self.other_samples, self.other_self, self.other_inclusive, rows, ticks)])


def _count(frame, self_counts, inclusive_counts) -> None:
    self_counts[_name(frame)] += 1
    seen = set()
    while frame is not None:
        name = _name(frame)
        if name not in seen:  # recursion counts once
            seen.add(name)
            inclusive_counts[name] += 1
        frame = frame.f_back


def counts_table(samples, self_counts, inclusive_counts, rows: int, total: int) -> str:
    """``samples`` and the ``rows`` names of most inclusive counts (with their self counts), then those of most self
    counts, as percentages of ``total`` (also benchmarks/pyspy_summary.py's tables)."""
    lines = [f"{samples} samples", "", "| inclusive % | self % | function |", "|---|---|---|"]
    for name, count in inclusive_counts.most_common(rows):
        lines.append(f"| {100 * count / total:.1f} | {100 * self_counts[name] / total:.1f} | {name} |")
    lines += ["", "| self % | function |", "|---|---|"]
    for name, count in self_counts.most_common(rows):
        lines.append(f"| {100 * count / total:.1f} | {name} |")
    return "\n".join(lines)


def _name(frame) -> str:
    code = frame.f_code
    filename = code.co_filename
    for marker in ("site-packages/", "/work/main/", "/gnn_inductor/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{code.co_firstlineno}({code.co_name})"
