"""The fused CSR attention's launch swept on a whole heterogeneous training step: one model compiled by gnn_io, the
launch tables of kernels/attention/csr_launch.py changed in place between timings (the kernels read them at each
call), each launch timed over whole steps and profiled for the message passing's GPU time.

    python -m benchmarks.launch_sweep --graph rec-like --model to_hetero_gat

A launch is ``(tile elements, warps)`` as the tables hold it: the all-heads forward's
(:data:`csr_launch.ALL_HEADS_FORWARD_LAUNCH`), and the split backward's destination and source passes'
(:data:`csr_launch.SPLIT_BACKWARD_LAUNCH`), each swept with the others at their defaults. The defaults run first and
last: the two rows bound the run's drift. Prints a JSON line per launch and a table last.
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch

from gnn_inductor.kernels.attention import csr_launch
from benchmarks import hetero
from benchmarks.harness import median_ms
from benchmarks.step_profile import profile_steps

SWEEP = {
    "forward": [(128, 1), (128, 2), (256, 2), (512, 1), (512, 2), (512, 4), (1024, 4)],
    "dst": [(128, 1), (256, 1), (256, 2), (1024, 1), (1024, 2)],
    "src": [(128, 1), (256, 2), (512, 1), (512, 2), (1024, 4)],
}


def launches(family: str) -> list:
    """``[(name, forward launch, (dst launch, src launch))]``: the defaults, each swept launch with the others at
    their defaults, the defaults again."""
    forward, (dst, src) = csr_launch.ALL_HEADS_FORWARD_LAUNCH[family], csr_launch.SPLIT_BACKWARD_LAUNCH[family]
    runs = [("default", forward, (dst, src))]
    runs += [(f"forward {t}", t, (dst, src)) for t in SWEEP["forward"] if t != forward]
    runs += [(f"dst {t}", forward, (t, src)) for t in SWEEP["dst"] if t != dst]
    runs += [(f"src {t}", forward, (dst, t)) for t in SWEEP["src"] if t != src]
    return runs + [("default again", forward, (dst, src))]


@contextlib.contextmanager
def launch_tables(family: str, forward: tuple, backward: tuple):
    """The family's entries of the two tables set to ``forward`` and ``backward`` inside, restored after."""
    saved = csr_launch.ALL_HEADS_FORWARD_LAUNCH[family], csr_launch.SPLIT_BACKWARD_LAUNCH[family]
    csr_launch.ALL_HEADS_FORWARD_LAUNCH[family], csr_launch.SPLIT_BACKWARD_LAUNCH[family] = forward, backward
    try:
        yield
    finally:
        csr_launch.ALL_HEADS_FORWARD_LAUNCH[family], csr_launch.SPLIT_BACKWARD_LAUNCH[family] = saved


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="rec-like", choices=hetero.GRAPHS)
    parser.add_argument("--model", default="to_hetero_gat", choices=("to_hetero_gat", "hetero_gat", "hgt"))
    parser.add_argument("--steps", type=int, default=8, help="timed steps per launch")
    parser.add_argument("--warmup", type=int, default=2, help="steps per launch before its timing (its compile)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    work_args = hetero.parse(["--graphs", args.graph, "--models", args.model, "--scale", str(args.scale),
                              "--device", args.device])
    work = hetero.Workload(args.graph, work_args, False)
    model = hetero.build_model(args.model, work, work_args.hidden, work_args.classes, work_args.seed)
    compiled = hetero.compile_model("gnn_io", model, False)
    optimizer = torch.optim.Adam(model.parameters(), lr=hetero.LR)
    counter = iter(range(1 << 30))

    def step():
        return hetero.train_step(compiled, optimizer, *work.step(args.model, next(counter)), work)

    for _ in range(3):
        step()
    family = "dot" if args.model == "hgt" else "gat"
    rows = []
    for name, forward, backward in launches(family):
        with launch_tables(family, forward, backward):
            ms = median_ms(step, args.steps, warmup=args.warmup)
            profile = profile_steps(step, 2, work.device, top=4)
        row = {"graph": args.graph, "model": args.model, "launch": name, "step_ms": round(ms, 2),
               "message_passing_ms": round(profile["gpu_kinds"].get("message passing", 0.0), 2),
               "gpu_busy_ms": round(profile["gpu_busy_ms"], 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.graph}, {args.model}, {family} family: ms per training step (median of {args.steps}) and the "
          "message passing's GPU ms per step (profiled)\n")
    print("| launch (tile elements, warps) | step ms | message passing ms | GPU busy ms |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['launch']} | {r['step_ms']} | {r['message_passing_ms']} | {r['gpu_busy_ms']} |")
    return rows


if __name__ == "__main__":
    main()
