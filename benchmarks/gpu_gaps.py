"""Where a step's GPU time is idle: the gaps between its kernels, with the CPU ops that ran in each, from a profiler
trace of a few steps, each synchronised before and after as the harness times it.

    python -m benchmarks.gpu_gaps --layer gat --graph rmat-large --mode gnn_io

Per step: span (first kernel start to last kernel end), busy (the kernels' union of busy time) and idle (span -
busy); then the gaps above ``--min-gap`` us in the last step, with the kernels on each side and the CPU ops that
started inside the gap, longest first. The profiler's own overhead stretches CPU time, so gaps are upper bounds
(session 25: ``gnn_io::linear_scores`` took 435 us of CPU under the profiler and 86 us without it,
``benchmarks/linear_scores_overhead.py``). The time from the step's start to its first kernel is not measured:
the CPU and kernel timestamps of ``prof.events()`` put them at the same instant.
"""
import argparse
import statistics

import torch

from benchmarks.profile_layer import layer_step


def _kernels(prof) -> list:
    """``(start_us, end_us, name)`` of every GPU kernel and memset/memcpy in the trace, by start."""
    out = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.name != "gnn_io_step":
            out.append((event.time_range.start, event.time_range.end, event.name))
    return sorted(out)


def _cpu_ops(prof) -> list:
    """``(start_us, end_us, name)`` of the CPU ops in the trace (aten, gnn_io, Python launches), by start."""
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CPU and e.name != "gnn_io_step")


def _steps(prof) -> list:
    """``(start_us, end_us)`` of each ``step`` range (CPU), by start."""
    return sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.name == "gnn_io_step")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", default="gat")
    parser.add_argument("--graph", default="rmat-large")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--min-gap", type=float, default=10.0)
    args = parser.parse_args()
    step = layer_step(args.layer, args.graph, args.mode, args.features)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            torch.cuda.synchronize()
            with torch.profiler.record_function("gnn_io_step"):
                step()
            torch.cuda.synchronize()
    kernels = _kernels(prof)
    rows = []
    last_gaps = []
    steps = _steps(prof)
    for i, (start, end) in enumerate(steps):
        next_start = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        mine = [k for k in kernels if start <= k[0] < next_start]
        if not mine:
            continue
        busy, cursor, gaps = 0.0, mine[0][0], []
        previous = None
        for k_start, k_end, name in mine:
            if k_start > cursor:
                if k_start - cursor >= args.min_gap and previous is not None:
                    gaps.append((k_start - cursor, previous, name, cursor, k_start))
            busy += max(0.0, k_end - max(k_start, cursor))
            cursor = max(cursor, k_end)
            previous = name
        span = cursor - mine[0][0]
        rows.append((span / 1e3, busy / 1e3, (span - busy) / 1e3))
        last_gaps = gaps
    print(f"== {args.layer} {args.graph} {args.mode}: {len(rows)} steps under the profiler "
          f"({torch.cuda.get_device_name()})")
    print("| step | span ms | busy ms | idle ms |")
    print("| --- | --- | --- | --- |")
    for i, (span, busy, idle) in enumerate(rows):
        print(f"| {i} | {span:.3f} | {busy:.3f} | {idle:.3f} |")
    medians = [statistics.median(col) for col in zip(*rows)]
    print(f"| median | {medians[0]:.3f} | {medians[1]:.3f} | {medians[2]:.3f} |")
    print(f"\ngaps of at least {args.min_gap} us in the last step (us, kernel before, kernel after):")
    cpu = _cpu_ops(prof)

    def during(lo, hi):  # the CPU ops that started in [lo, hi), longest first
        inside = [(e - b, n) for b, e, n in cpu if lo <= b < hi]
        return ", ".join(f"{n[:50]} {d:.0f}" for d, n in sorted(inside, reverse=True)[:8])
    for gap, before, after, lo, hi in sorted(last_gaps, reverse=True)[:15]:
        print(f"  {gap:8.1f}  {before[:60]}  ->  {after[:60]}")
        print(f"            CPU ops started in the gap: {during(lo, hi)}")


if __name__ == "__main__":
    main()
