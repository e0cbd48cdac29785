"""Anatomy of one training step on the GPU: where a mid-size graph's step goes when its GPU work is smaller
than its CPU work (session 9, section 5).

    python -m benchmarks.step_anatomy --layers sage_max,gcn,transformer --graph rmat-arxiv --modes inductor,gnn_io_force

Per (layer, mode): the CPU time to issue a step (no synchronisation), the time per step issued back to back,
the time of a step timed alone (synchronised before and after, as the harness times it), the CPU time of that
step's forward call and of its backward call (``fwd_cpu_ms``, ``bwd_cpu_ms``: the CPU work a CUDA graph replay
leaves), the GPU busy time per
step (sum of the kernels' durations), and per step the CUDA runtime/driver calls that launch kernels, copy or
synchronise, and the ATen ops that read a device value on the host (``item``, ``nonzero``...), which stall the
CPU until the GPU catches up. A short table last.
"""
import argparse
import collections
import os
import statistics
import time

import torch

from benchmarks.profile_layer import layer_step

HOST_READS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def anatomy(layer: str, graph: str, mode: str, steps: int) -> dict:
    step = layer_step(layer, graph, mode)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    issue_ms = (time.perf_counter() - start) * 1e3 / steps
    torch.cuda.synchronize()
    back_to_back_ms = (time.perf_counter() - start) * 1e3 / steps
    alone, forward_cpu, backward_cpu = [], [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = step.forward()
        t_forward = time.perf_counter()
        out.backward(step.grad)
        t_backward = time.perf_counter()
        torch.cuda.synchronize()
        alone.append((time.perf_counter() - t) * 1e3)
        forward_cpu.append((t_forward - t) * 1e3)
        backward_cpu.append((t_backward - t_forward) * 1e3)
        del out
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    counts = collections.Counter()
    gpu_us = 0.0
    for event in prof.events():
        name = event.name
        if event.device_type == torch.autograd.DeviceType.CUDA:
            gpu_us += event.device_time
            continue
        if name in LAUNCHES:
            counts["launches"] += 1
        elif name in SYNCS:
            counts[name] += 1
        elif name in HOST_READS:
            counts[name] += 1
    record = {"layer": layer, "mode": mode, "issue_ms": issue_ms, "back_to_back_ms": back_to_back_ms,
              "alone_ms": statistics.median(alone), "gpu_ms": gpu_us / 1e3 / 10,
              "fwd_cpu_ms": statistics.median(forward_cpu), "bwd_cpu_ms": statistics.median(backward_cpu)}
    record.update({k: v / 10 for k, v in counts.items()})
    print(f"== {layer} {graph} {mode}: {record}", flush=True)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=70), flush=True)
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="sage_max,gcn,transformer")
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--modes", default="inductor,gnn_io_force")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    records = []
    for layer in args.layers.split(","):
        for mode in args.modes.split(","):
            environment = dict(os.environ)  # layer_step applies the mode's environment
            try:
                records.append(anatomy(layer, args.graph, mode, args.steps))
            except Exception as exc:  # one failing mode is a result
                print(f"== {layer} {mode}: {type(exc).__name__}: {exc}", flush=True)
            os.environ.clear()
            os.environ.update(environment)
            torch._dynamo.reset()
    keys = ["issue_ms", "back_to_back_ms", "alone_ms", "fwd_cpu_ms", "bwd_cpu_ms", "gpu_ms", "launches"]
    extra = sorted({k for r in records for k in r} - set(keys) - {"layer", "mode"})
    print("\n| layer | mode | " + " | ".join(keys + extra) + " |")
    print("|---|---|" + "---|" * len(keys + extra))
    for r in records:
        cells = [f"{r.get(k, 0):.2f}" if isinstance(r.get(k, 0), float) else str(r.get(k, 0)) for k in keys + extra]
        print(f"| {r['layer']} | {r['mode']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
