"""What bounds a training step: the GPU's busy time against the step's wall time, from one profiler trace.

A step whose GPU is busy for much less than the step takes is bound by the host (Python, Dynamo's guards,
AOTAutograd's wrappers, kernel launches); one whose GPU is busy for most of it is bound by its kernels, and the
top kernels say which. :func:`profile_steps` runs a step under ``torch.profiler`` and reduces the trace to a few
figures per step; the mini-batch benchmark records them per mode (``--profile``).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# host calls that put work on the GPU: one kernel each, or a whole CUDA graph
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemcpyAsync",
            "cudaMemsetAsync")
GRAPH_LAUNCH = "cudaGraphLaunch"

# GPU ops by what they do, from their names (first match wins): the dense GEMMs (cuBLAS, CUTLASS, the backend's Triton
# GEMMs and segment products), the message passing (cuSPARSE, the backend's reduction and attention kernels,
# Inductor's and ATen's gather, scatter and index kernels), the loss, the optimizer and copies or fills; the rest is
# elementwise
KINDS = (
    ("gemm", ("gemm", "xmma", "cutlass", "_mm_kernel", "_stationary_kernel", "gemv", "splitkreduce",
              "_segment_weight_grad_kernel")),
    ("loss", ("nll_loss", "log_softmax", "softmax_warp", "cross_entropy")),
    ("message passing", ("cusparse", "csrmm", "spmm", "scatter", "gather", "index", "segment", "forward_all_heads",
                         "split_backward", "delta_kernel", "combine_kernel", "_zero_empty_rows", "_gat_", "_dot_",
                         "atomic_backward", "forward_kernel", "kernel_gs", "reduce_kernel")),
    ("optimizer", ("multi_tensor_apply", "adam", "foreach")),
    ("copy or fill", ("memcpy", "memset", "fill", "copy")),
)


def kind_of(name: str) -> str:
    """The :data:`KINDS` entry a GPU op's name falls in; ``other`` for none."""
    lowered = name.lower()
    return next((kind for kind, marks in KINDS if any(m in lowered for m in marks)), "other")


def busy_ns(intervals: list) -> int:
    """The length of the union of ``(start, end)`` intervals."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def profile_steps(step: Callable[[], object], steps: int, device: torch.device, top: int = 6) -> dict:
    """Run ``step()`` ``steps`` times under the profiler (after a synchronisation) and return per step:
    ``profiled_ms`` (wall time under the profiler, which adds its own host cost), ``gpu_busy_ms`` (the union of
    the GPU's kernel, copy and fill intervals), ``gpu_ops`` (how many of those), ``launches`` and
    ``graph_launches`` (the host's launch calls: single kernels and copies, CUDA graphs), ``top_gpu``:
    the ``top`` GPU ops by total time as ``[name, ms per step, count per step]``, and ``top_host``: the
    ``2 * top`` host ranges and ops by inclusive time, the same way (nested ranges count in each that holds them:
    ``Optimizer.step#Adam.step`` holds its ``aten::_foreach_*`` ops), which says where a host-bound step goes;
    ``gpu_kinds``: the GPU ops' summed ms per step by :func:`kind_of`, which says what a GPU-bound step is made of."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = time.perf_counter() - start
    events = prof.profiler.kineto_results.events()
    # the GPU's kernels, copies and fills; not the ranges the profiler draws on the GPU's timeline for annotations
    # (``Optimizer.step#Adam.step`` spans the optimizer's kernels)
    gpu = [e for e in events if e.device_type() == DeviceType.CUDA and not e.is_user_annotation()]
    host = collections.Counter(e.name() for e in events if e.device_type() == DeviceType.CPU)
    ranked = _ranked(gpu, top)
    kinds = collections.Counter()
    for e in gpu:
        kinds[kind_of(e.name())] += e.duration_ns() / 1e6 / steps
    on_host = [e for e in events if e.device_type() == DeviceType.CPU and not e.name().startswith("ProfilerStep")]
    return {
        "profiled_ms": wall * 1e3 / steps,
        "gpu_busy_ms": busy_ns([(e.start_ns(), e.end_ns()) for e in gpu]) / 1e6 / steps,
        "gpu_ops": len(gpu) / steps,
        "launches": sum(host[name] for name in LAUNCHES) / steps,
        "graph_launches": host[GRAPH_LAUNCH] / steps,
        "top_gpu": [[name[:90], ns / 1e6 / steps, count / steps] for name, (ns, count) in ranked],
        "gpu_kinds": dict(kinds.most_common()),
        "top_host": [[name[:90], ns / 1e6 / steps, count / steps] for name, (ns, count) in _ranked(on_host, 2 * top)],
    }


def host_functions(step: Callable[[], object], steps: int, top: int = 30) -> dict:
    """Run ``step()`` ``steps`` times under ``cProfile`` and return per step the ``top`` Python functions by their own
    time (``host_self``) and by their inclusive time (``host_inclusive``), each ``[where, ms per step, calls per
    step]``: which Python code a host-bound step spends its time in (Dynamo's guards, AOTAutograd's wrappers, CUDA
    graph trees, the backend's own). The profiler roughly doubles the cost of each Python call, so the figures rank
    the functions; the step's own time is the benchmark's."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        for _ in range(steps):
            step()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (primitive calls, calls, self s, inclusive s, ...)

    def where(fn) -> str:
        file, line, name = fn
        parts = file.replace("\\", "/").split("/")
        short = "/".join(parts[-2:]) if len(parts) > 1 else file
        return f"{short}:{line}({name})"

    def ranked(column: int) -> list:
        rows = sorted(stats.items(), key=lambda kv: -kv[1][column])[:top]
        return [[where(fn), row[column] * 1e3 / steps, row[1] / steps] for fn, row in rows]

    return {"host_self": ranked(2), "host_inclusive": ranked(3)}


def _ranked(events: list, top: int) -> list:
    """The ``top`` event names by summed duration: ``[(name, (ns, count))]``."""
    per_name = collections.defaultdict(lambda: [0, 0])
    for e in events:
        per_name[e.name()][0] += e.duration_ns()
        per_name[e.name()][1] += 1
    return sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]


def summary(record: dict) -> str:
    """One line of a record's profile figures (empty without them)."""
    if "gpu_busy_ms" not in record:
        return ""
    tops = "; ".join(f"{name[:48]} {ms:.3f} ms x{count:g}" for name, ms, count in record["top_gpu"][:4])
    host = "; ".join(f"{name[:40]} {ms:.3f} ms x{count:g}" for name, ms, count in record.get("top_host", [])[:8])
    kinds = ", ".join(f"{kind} {ms:.3f}" for kind, ms in record.get("gpu_kinds", {}).items())
    return (f"profiled {record['profiled_ms']:.2f} ms/step, GPU busy {record['gpu_busy_ms']:.3f} ms in "
            f"{record['gpu_ops']:g} ops ({kinds}), host launches {record['launches']:g} + "
            f"{record['graph_launches']:g} CUDA graphs; top: {tops}" + (f"; host: {host}" if host else ""))
