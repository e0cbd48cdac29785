"""The mini-batch table in one command: each model at each seed count, at the depth and fan-out it is usually
trained with, every mode in its own process (:mod:`benchmarks.minibatch`), the rows spread over the GPUs (one chain
of processes per GPU), a JSON file per row in ``--out``, and the rows printed last as the results page shows them.

    python -m benchmarks.minibatch_suite --gpus 2 --out runs/
    python -m benchmarks.minibatch_suite --models gcn,gat --batches 4096 --gpus 2 --out runs/ -- --profile 5

Arguments after ``--`` go to every run of :mod:`benchmarks.minibatch` (``--hidden``, ``--profile``, ``--device``...).
The files join the results page with ``python -m benchmarks.harness --merge docs/benchmarks/results.json
runs/*.json --out docs/benchmarks``. A row that fails or passes ``--timeout`` is missing from the table, and its log
(``--out``/MODEL-BATCH.log) says why. On one H200 a row with the four default modes took about 150 s (on a cycled
pool of 24 batches; with a new batch every step, the default, reduce-overhead records a CUDA graph per step).
"""
import argparse
import json
import os
import subprocess
import sys
import threading

from benchmarks.run_pages import minibatch_section

# layers and fan-out per model: two hops of 10 for the attention models, three of 15, 10, 5 for the others
SHAPES = {"gat": (2, "10,10"), "transformer": (2, "10,10"), "gcn": (3, "15,10,5"), "sage_mean": (3, "15,10,5"),
          "sage_max": (3, "15,10,5")}
MODES = "eager,inductor,inductor_cg,gnn_io_cg"


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(SHAPES), help="of " + ", ".join(SHAPES))
    parser.add_argument("--batches", default="1024,4096", help="seed counts, one row per model and count")
    parser.add_argument("--modes", default=MODES)
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--steps", type=int, default=20)
    # the buckets settle in their first gnn_inductor.buckets.SETTLE_CALLS calls (the first step compiles at its own
    # sizes): the warm-up covers those, so the timed steps count the compiles a settled loop makes
    parser.add_argument("--warmup", type=int, default=40, help="untimed steps first (default 40)")
    parser.add_argument("--pool", type=int, default=0, help="pre-sampled batches per row, cycled; 0 (the default): a "
                        "new batch every step, as in training (benchmarks.minibatch --pool 0)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs to spread the rows over; 0: no CUDA_VISIBLE_DEVICES")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a row may take")
    parser.add_argument("--out", required=True, help="a folder for the rows' JSON files and logs")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    args.extra = extra
    unknown = [m for m in args.models.split(",") if m not in SHAPES]
    if unknown:
        parser.error(f"unknown --models {', '.join(unknown)}; of {', '.join(SHAPES)}")
    return args


def rows(args) -> list:
    """(model, seeds) pairs, the seed counts outermost: dealt round-robin (:func:`lanes`), each GPU gets about as
    many rows of each seed count."""
    return [(model, int(batch)) for batch in args.batches.split(",") for model in args.models.split(",")]


def command(args, model: str, batch: int) -> list:
    layers, fanout = SHAPES[model]
    return [sys.executable, "-m", "benchmarks.minibatch", "--graph", args.graph, "--model", model, "--layers",
            str(layers), "--fanout", fanout, "--batch", str(batch), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--pool", str(args.pool), "--modes", args.modes,
            "--out", os.path.join(args.out, f"{model}-{batch}.json"), *args.extra]


def lanes(items: list, count: int) -> list:
    """``items`` dealt round-robin over ``count`` chains (one when ``count`` is 0: no GPU named)."""
    count = max(count, 1)
    return [items[i::count] for i in range(count) if items[i::count]]


def _run_chain(args, gpu, chain):
    env = dict(os.environ)
    if args.gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    for model, batch in chain:
        with open(os.path.join(args.out, f"{model}-{batch}.log"), "w") as log:
            try:
                subprocess.run(command(args, model, batch), env=env, stdout=log, stderr=subprocess.STDOUT,
                               timeout=args.timeout, check=False)
            except subprocess.TimeoutExpired:
                log.write(f"\nstopped after --timeout {args.timeout} s\n")


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    threads = [threading.Thread(target=_run_chain, args=(args, gpu, chain))
               for gpu, chain in enumerate(lanes(rows(args), args.gpus))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs, missing = [], []
    for model, batch in rows(args):
        path = os.path.join(args.out, f"{model}-{batch}.json")
        if os.path.exists(path):
            with open(path) as f:
                runs.append(json.load(f))
        else:
            missing.append(f"{model} at {batch} seeds")
    lines = minibatch_section(runs)
    print("\n".join(lines))
    if missing:
        print("no result (see the logs in --out): " + ", ".join(missing))
    return runs


if __name__ == "__main__":
    main()
