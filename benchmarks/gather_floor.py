"""What bounds the max/min forward kernel's bandwidth (issue 4: "at least 50% of the measured copy bandwidth,
bytes counted as each input read once plus the output").

    python -m benchmarks.gather_floor --graphs rmat-large,rmat-arxiv

Per graph, the SAGEConv-max forward kernel (``gather_scatter_triton.forward``, identity message) is timed on:

- ``graph``: the graph itself;
- ``l2_sources``: the same destinations, degrees and work items, with every source id taken modulo ``--l2-rows``
  (default 32768 rows, 16 MiB at 128 float32 features), so every gathered row stays in the H100's 50 MiB L2
  cache after its first read: the kernel with perfect source reuse, a floor for any kernel that reads each edge's
  source row (no reuse of a loaded row across destination rows);
- ``self_sources``: every edge reads its own destination's row (source = destination), so a program reads one
  row again and again: the floor with the loads served by the L1 cache.

Bytes as the issue counts them: ``x`` and the output once (``N * F * 4`` each), ``col`` (4 bytes per edge) and
``rowptr``. The copy bandwidth is the harness's (``harness.copy_bandwidth``: a device-to-device copy). The last
table gives each variant's time, its share of the copy bandwidth by that count, and the gathered bytes
(``E * F * 4``) per second it moved.
"""
import argparse
import os

import torch

from benchmarks.harness import copy_bandwidth, graph_suite, median_ms
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import fused as g


def _plan(dst, src, n):
    plan = torch.ops.gnn_io.csr_plan(dst, src, n, n)
    return g.make_plan(*plan[:4], n, *plan[4:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", default="rmat-large")
    parser.add_argument("--reduce", default="max")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--l2-rows", type=int, default=32768)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (no bandwidth)")
    args = parser.parse_args()
    device = torch.device(args.device)
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    copy_bytes_per_s = copy_bandwidth(device)  # bytes per second, read and write counted
    rows = []
    for graph in graph_suite(args.graphs.split(","), os.environ.get("GNN_IO_DATA", "../shared/data"), device):
        src, dst = graph.edge_index
        n, e, f = graph.num_nodes, src.numel(), args.features
        torch.manual_seed(0)
        x = torch.randn(n, f, device=device)
        counted = 2 * n * f * 4 + e * 4 + (n + 1) * 4
        variants = {"graph": src, "l2_sources": src % args.l2_rows, "self_sources": dst}
        for name, sources in variants.items():
            plan = _plan(dst, sources, n)

            def fwd(plan=plan):
                return g.forward([x], [0], plan, key, args.reduce)
            fwd()
            ms = median_ms(fwd, args.reps)
            share = counted / (ms * 1e-3) / copy_bytes_per_s
            gathered = e * f * 4 / (ms * 1e-3) / 1e9
            print(f"== {graph.name} {name}: {ms:.3f} ms, {100 * share:.1f}% of copy bandwidth by the issue's count, "
                  f"{gathered:.0f} GB/s of gathered rows", flush=True)
            rows.append((graph.name, e, name, ms, share, gathered))
            del plan
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\ncopy bandwidth {copy_bytes_per_s / 1e9:.0f} GB/s, {args.reduce}, {args.features} float32 features; "
          "50% of copy bandwidth is the issue's target\n")
    print("| graph | edges | sources | forward ms | share of copy bandwidth | gathered GB/s |\n"
          "|---|---|---|---|---|---|")
    for name, e, variant, ms, share, gathered in rows:
        print(f"| {name} | {e} | {variant} | {ms:.3f} | {100 * share:.1f}% | {gathered:.0f} |")


if __name__ == "__main__":
    main()
