"""Old code against new code, same machine, same run: the step time of each layer on each graph under two trees.

``python -m benchmarks.tree_ab --base REV --graphs rmat-large,grid-large --layers gcn,gat``

The tree at ``REV`` (``git archive``) and the working tree are each laid out as installed (``gnn_inductor/``, its
``kernels/`` and ``patterns/``) in a temporary folder, and every measurement runs in a fresh interpreter with that
folder first on ``PYTHONPATH``: no reinstall between trees, so the trees can alternate, case by case, for
``--rounds`` rounds. A case is one layer on one graph: compiled with ``backend="gnn_io"``, warmed up, then ``--reps``
rounds of ``--steps`` forward+backward steps, each round timed to a device sync; its time is the median round. The
table gives, per case, the best of its rounds' times for each tree and their ratio old/new (above 1: the new code
is faster). Graphs are built by :mod:`benchmarks.graphs` and layers as in :mod:`benchmarks.harness`, both from this
tree, so the two trees see the same inputs; the child imports nothing else of either tree but ``gnn_inductor``.

Measured this way on the H200, the run-to-run spread of a case is about 0.5%; the harness's default of 10
repetitions of one step showed rows 3-7% apart between two runs of identical code on the same machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = ("gnn_inductor", "kernels", "patterns")
LAYERS = ("gcn", "sage_mean", "sage_max", "gin", "gat", "gatv2", "transformer")


def stage(tree: str, into: str) -> str:
    """``tree``'s package laid out as installed (``gnn_inductor/kernels``, ``gnn_inductor/patterns``) in ``into``."""
    target = os.path.join(into, "gnn_inductor")
    shutil.copytree(os.path.join(tree, "gnn_inductor"), target, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("kernels", "patterns"):
        shutil.copytree(os.path.join(tree, sub), os.path.join(target, sub), ignore=shutil.ignore_patterns("__pycache__"))
    return into


def archive(rev: str, into: str) -> str:
    """The package files of git revision ``rev``, extracted into ``into``."""
    data = subprocess.run(["git", "-C", ROOT, "archive", rev, *PACKAGE], check=True, capture_output=True).stdout
    os.makedirs(into, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", into], input=data, check=True)
    return into


def make_layer(name: str, features: int, heads: int = 4):
    """The harness's layers of these names (benchmarks/harness.py ``make_layer``, 4 heads)."""
    import torch
    from torch_geometric import nn as pyg

    f = features
    return {"gcn": lambda: pyg.GCNConv(f, f), "sage_mean": lambda: pyg.SAGEConv(f, f, aggr="mean"),
            "sage_max": lambda: pyg.SAGEConv(f, f, aggr="max"), "gin": lambda: pyg.GINConv(torch.nn.Linear(f, f)),
            "gat": lambda: pyg.GATConv(f, f // heads, heads=heads),
            "gatv2": lambda: pyg.GATv2Conv(f, f // heads, heads=heads),
            "transformer": lambda: pyg.TransformerConv(f, f // heads, heads=heads)}[name]()


def child(args) -> int:
    """One graph, several layers, under the tree first on ``PYTHONPATH``: one JSON line per layer."""
    import torch

    import gnn_inductor  # the tree under test (registers the backend)
    from benchmarks.graphs import graph_suite  # this tree's graphs, the same for both trees

    device = torch.device(args.device)
    graph = graph_suite([args.graph], args.data_root, device)[0]
    dtype = getattr(torch, args.dtype)
    for name in args.layers.split(","):
        torch.manual_seed(0)
        layer = make_layer(name, args.features).to(device=device, dtype=dtype)
        x = torch.randn(graph.num_nodes, args.features, device=device, dtype=dtype, requires_grad=True)
        compiled = torch.compile(layer, backend="gnn_io")

        def step():
            compiled(x, graph.edge_index).sum().backward()

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        for _ in range(args.warmup):
            step()
        sync()
        rounds = []
        for _ in range(args.reps):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            rounds.append((time.perf_counter() - start) / args.steps * 1e3)
        print(json.dumps({"graph": graph.name, "layer": name, "ms": statistics.median(rounds),
                          "package": os.path.dirname(gnn_inductor.__file__)}), flush=True)
        compiled = layer = x = None  # free them before the next layer
        torch._dynamo.reset()
    return 0


def measure(staged: str, graph: str, args) -> list:
    # run from the staged folder: ROOT would put the working tree's own gnn_inductor/ first on the path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([staged, ROOT]))
    command = [sys.executable, "-m", "benchmarks.tree_ab", "--child", "--graph", graph, "--layers", args.layers,
               "--dtype", args.dtype, "--device", args.device, "--steps", str(args.steps), "--reps", str(args.reps),
               "--warmup", str(args.warmup), "--features", str(args.features), "--data-root", args.data_root]
    done = subprocess.run(command, cwd=staged, env=env, capture_output=True, text=True, timeout=args.timeout)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for row in rows:  # the tree measured is the one staged, not an installed copy
        if not row["package"].startswith(staged):
            raise RuntimeError(f"measured {row['package']}, not the staged tree {staged}")
    if done.returncode != 0 or not rows:
        print(f"{os.path.basename(staged)} {graph}: failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the old tree")
    parser.add_argument("--graphs", default="rmat-large")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=1, help="old, new alternations per graph")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--data-root",
                        default=os.environ.get("GNN_IO_DATA", os.path.join(ROOT, "..", "shared", "data")))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--graph", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"old": stage(archive(args.base, os.path.join(tmp, "old_src")), os.path.join(tmp, "old")),
                 "new": stage(ROOT, os.path.join(tmp, "new"))}
        best: dict = {}
        for graph in args.graphs.split(","):
            for _ in range(args.rounds):
                for label, staged in trees.items():
                    for row in measure(staged, graph, args):
                        key = (row["graph"], row["layer"], label)
                        best[key] = min(best.get(key, float("inf")), row["ms"])
    print(f"| graph | layer | {args.dtype} old ms | new ms | old/new |")
    print("| --- | --- | --- | --- | --- |")
    failed = 0
    for graph, layer in dict.fromkeys((g, lay) for g, lay, _ in best):
        old, new = best.get((graph, layer, "old")), best.get((graph, layer, "new"))
        ratio = f"{old / new:.3f}" if old and new else "-"
        failed += ratio == "-"
        print(f"| {graph} | {layer} | {old if old is None else round(old, 3)} | {new if new is None else round(new, 3)} "
              f"| {ratio} |")
    return 1 if failed or not best else 0


if __name__ == "__main__":
    sys.exit(main())
