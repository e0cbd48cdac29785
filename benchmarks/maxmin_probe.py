"""Max/min gather-scatter kernels alone: forward, backward and each launch of the backward, per variant.

    python -m benchmarks.maxmin_probe --graphs rmat-large,rmat-arxiv --variants walk,arg

A variant is a value of ``GNN_IO_MAXMIN_BACKWARD`` (``kernels/gather_scatter_triton.py: maxmin_backward``).
Each variant's gradient is checked against the walk's (the default) before it is timed. Times are medians of
CUDA-event timings; the per-launch list comes from one profiled backward.
"""
import argparse
import os
import statistics

import torch

from benchmarks.harness import graph_suite
from gnn_inductor import edge_functions
from gnn_inductor.kernels import gather_scatter_triton as g


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _launches(fn) -> list:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name[:40], e.device_time / 1e3) for e in prof.events() if e.device_time > 0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", default="rmat-large")
    parser.add_argument("--variants", default="walk")
    parser.add_argument("--reduce", default="max")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    rows = []
    for graph in graph_suite(args.graphs.split(","), os.environ.get("GNN_IO_DATA", "../shared/data"), "cuda"):
        src, dst = graph.edge_index
        n = graph.num_nodes
        plan = torch.ops.gnn_io.csr_plan(dst, src, n, n)
        p = g.make_plan(*plan[:4], n, *plan[4:])
        torch.manual_seed(0)
        x = torch.randn(n, args.features, device="cuda")
        dy = torch.randn(n, args.features, device="cuda")
        reference = None
        for variant in args.variants.split(","):
            os.environ[g.MAXMIN_BACKWARD_ENV] = variant

            def fwd():
                arg = torch.full((n, args.features), -1, dtype=torch.int32, device="cuda") \
                    if variant == "arg" else None
                return g.forward([x], [0], p, key, args.reduce, arg=arg), arg

            out, arg = fwd()

            def bwd():
                return g.backward(dy, [x], [0], p, key, args.reduce, [True], out, arg)
            grad = bwd()[0]
            if reference is None:
                reference = grad
            error = ((grad - reference).abs().max() / reference.abs().max().clamp(min=1e-30)).item()
            forward_ms, backward_ms = _median_ms(fwd, args.reps), _median_ms(bwd, args.reps)
            print(f"== {graph.name} {variant}: forward {forward_ms:.3f} ms, backward {backward_ms:.3f} ms, "
                  f"grad max rel err vs first {error:.2e}")
            for name, ms in _launches(bwd):
                print(f"   backward launch {name:40s} {ms:8.3f} ms")
            rows.append((graph.name, variant, forward_ms, backward_ms, error))
    print("\n| graph | variant | forward ms | backward ms | grad err |\n|---|---|---|---|---|")
    for name, variant, f, b, e in rows:
        print(f"| {name} | {variant} | {f:.3f} | {b:.3f} | {e:.1e} |")


if __name__ == "__main__":
    main()
