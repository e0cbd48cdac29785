"""The CPU cost of a compiled layer's step without a GPU: the Python of our ops and of the layers around them,
measured on a small CPU graph with the fused path taken (Triton's interpreter, ``GNN_IO_CPU_REWRITE=1``) and
every Triton kernel launch replaced by a no-op. Outputs are garbage; only the time to issue a step counts.
This finds per-call Python (structure rebuilt per call, slow helpers) without spending device time.

    python -m benchmarks.python_overhead --layer transformer --rows 40
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("GNN_IO_CPU_REWRITE", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from benchmarks.harness import build, make_layer  # noqa: E402
from gnn_inductor.testing import random_graph  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", default="transformer")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--edges", type=int, default=40000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--callees", default="", help="comma-separated pstats patterns: what they call")
    args = parser.parse_args()
    launches = []
    # on CUDA the compiled graph passes the plan's work items (a structure node); on CPU the attention ops get
    # none and build them per call, CPU-only work that would swamp the profile: keep them per graph here
    from gnn_inductor.kernels.attention import csr_backward, csr_chunked, csr_forward, csr_launch
    from gnn_inductor.kernels.attention import layout as attention_layout

    build_items, kept = attention_layout.call_items, {}

    def plan_items(rowptr, col, items, max_edges):
        if items:
            return build_items(rowptr, col, items, max_edges)
        key = (id(rowptr), id(col))
        if key not in kept:
            kept[key] = (rowptr, col, list(torch.ops.gnn_io.work_items(rowptr, col, csr_launch.MAX_EDGES)))
        return kept[key][2], csr_launch.MAX_EDGES
    for module in (csr_forward, csr_backward, csr_chunked):  # the drivers that build a call's items
        module.call_items = plan_items
    InterpretedFunction.__getitem__ = lambda self, grid: (lambda *a, **k: launches.append(self.fn.__name__))
    torch.manual_seed(0)
    src, dst = random_graph(args.nodes, args.edges, seed=0)
    edge_index = torch.stack([src, dst])
    model = build(args.mode, make_layer(args.layer, 128))
    x = torch.randn(args.nodes, 128, requires_grad=True)
    grad = torch.randn(args.nodes, 128)

    def step():
        x.grad = None
        for p in model.parameters():
            p.grad = None
        model(x, edge_index).backward(grad)

    for _ in range(5):
        step()
    launches.clear()
    step()
    print(f"== {args.layer} {args.mode}: Triton launches per step: {len(launches)} ({', '.join(launches)})")
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    print(f"step without kernels: median {statistics.median(times):.3f} ms (CPU tensors of {args.nodes} nodes, "
          f"{args.edges} edges)")
    from benchmarks.stack_sampler import StackSampler

    with StackSampler() as sampler:
        for _ in range(args.steps):
            step()
    print(sampler.table(args.rows))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        step()
    profile.disable()
    stats = pstats.Stats(profile).sort_stats("tottime")
    stats.print_stats(args.rows)
    for pattern in filter(None, args.callees.split(",")):
        stats.sort_stats("cumulative").print_callees(pattern)


if __name__ == "__main__":
    main()
