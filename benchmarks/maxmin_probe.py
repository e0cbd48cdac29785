"""Max/min gather-scatter kernels alone: forward, backward and each launch of the backward, per variant.

    python -m benchmarks.maxmin_probe --graphs rmat-large,rmat-arxiv --variants walk,arg

A variant is a value of ``GNN_IO_MAXMIN_BACKWARD`` (``kernels/gather_scatter/backward.py: maxmin_backward``).
Each variant's gradient error against the first variant's is printed next to its times (medians of
CUDA-event timings, ``harness.median_ms``); the per-launch list comes from one profiled backward.
"""
import argparse
import os

import torch

from benchmarks.harness import graph_suite, median_ms
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import backward as gb, fused as g


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
            os.environ[gb.MAXMIN_BACKWARD_ENV] = variant

            def fwd():
                arg = torch.full((n, args.features), -1, dtype=torch.int32, device="cuda") \
                    if variant == "arg" else None
                return g.forward([x], [0], p, key, args.reduce, arg=arg), arg

            out, arg = fwd()

            def bwd():
                return gb.backward(dy, [x], [0], p, key, args.reduce, [True], out, arg)
            grad = bwd()[0]
            if reference is None:
                reference = grad
            error = ((grad - reference).abs().max() / reference.abs().max().clamp(min=1e-30)).item()
            forward_ms, backward_ms = median_ms(fwd, args.reps), median_ms(bwd, args.reps)
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
