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
"""
from __future__ import annotations

import collections
import sys
import threading
import time


class StackSampler:
    def __init__(self, interval: float = 1e-4, thread_id: int | None = None):
        self.interval = interval
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.self_counts: collections.Counter = collections.Counter()
        self.inclusive_counts: collections.Counter = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            frame = sys._current_frames().get(self.thread_id)
            if frame is not None:
                self.samples += 1
                self.self_counts[_name(frame)] += 1
                seen = set()
                while frame is not None:
                    name = _name(frame)
                    if name not in seen:  # recursion counts once
                        seen.add(name)
                        self.inclusive_counts[name] += 1
                    frame = frame.f_back
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
        total = max(1, self.samples)
        lines = [f"{self.samples} samples", "", "| inclusive % | self % | function |", "|---|---|---|"]
        for name, count in self.inclusive_counts.most_common(rows):
            lines.append(f"| {100 * count / total:.1f} | {100 * self.self_counts[name] / total:.1f} | {name} |")
        lines += ["", "| self % | function |", "|---|---|"]
        for name, count in self.self_counts.most_common(rows):
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
