"""Where the CPU time of a step goes (Python functions, cProfile), for layers whose GPU work is smaller than
their per-call CPU work (mid-size graphs):

    python -m benchmarks.cpu_profile --layer sage_max --graph rmat-arxiv --mode gnn_io
"""
import argparse
import cProfile
import pstats
import time

import torch

from benchmarks.profile_layer import layer_step


def sampled_steps(step, count: int) -> None:
    """``count`` steps, each synchronised as the harness times them; an outside sampler keeps the stacks under this
    function's frame (the warm-up and compile before it are not the step)."""
    for _ in range(count):
        step()
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", default="sage_max")
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--callees", default="", help="comma-separated pstats patterns (e.g. "
                        "'csr_forward.py:.*\\(forward\\)'): print what those functions call, with times")
    parser.add_argument("--sampler", action="store_true", help="also sample the stack (benchmarks/stack_sampler.py: "
                        "no per-call cost, so Python-heavy code is not inflated as under cProfile)")
    parser.add_argument("--all-threads", action="store_true", help="the sampler also reads the autograd engine's "
                        "device thread, where a CUDA backward runs")
    parser.add_argument("--loop", type=int, default=0, help="after the timing, only run this many more steps in "
                        "sampled_steps() and stop: for an outside sampler (py-spy, benchmarks/pyspy_summary.py)")
    args = parser.parse_args()
    step = layer_step(args.layer, args.graph, args.mode)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    cpu_ms = (time.perf_counter() - start) * 1e3 / args.steps
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    print(f"== {args.layer} {args.graph} {args.mode}: CPU {cpu_ms:.3f} ms/step issued, {wall_ms:.3f} ms/step with the GPU")
    if args.loop:
        sampled_steps(step, args.loop)
        return
    if args.sampler:
        from benchmarks.stack_sampler import StackSampler

        with StackSampler(all_threads=args.all_threads) as sampler:
            for _ in range(args.steps * 5):
                step()
            torch.cuda.synchronize()
        print(sampler.table(args.rows))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile).sort_stats("tottime")
    stats.print_stats(args.rows)
    stats.sort_stats("cumulative").print_stats(args.rows)
    for pattern in filter(None, args.callees.split(",")):
        stats.sort_stats("cumulative").print_callees(pattern)


if __name__ == "__main__":
    main()
