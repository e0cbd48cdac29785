"""First-call time of a compiled model in a new process, cold (empty Inductor cache) and warm (the cache a
previous process filled), for ``torch.compile``'s default backend and for gnn_io:

    python -m benchmarks.first_call --model gat --nodes 100000 --edges 2000000            # on a GPU
    python -m benchmarks.first_call --device cpu --cpu-rewrites --nodes 4000 --edges 40000

Each measurement is a fresh interpreter (``--child``) timing the first forward+backward step of a 2-layer
model, from the call of the compiled model to the end of the backward; the ``torch.compile`` children never
import gnn_inductor, so they run as in a user's process without it. Prints a table of seconds and Inductor's
FX graph cache hits."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(args) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from torch_geometric.nn import GATConv, GCNConv

    device = torch.device(args.device)
    torch.manual_seed(0)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), device=device)
    x = torch.randn(args.nodes, args.features, device=device, requires_grad=True)
    conv = {"gcn": lambda i, o: GCNConv(i, o), "gat": lambda i, o: GATConv(i, o // 4, heads=4)}[args.model]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = conv(args.features, args.features), conv(args.features, args.features)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    model = Model().to(device)
    if args.mode == "gnn_io":
        import gnn_inductor  # noqa: F401  (registers the backend)

        if args.cpu_rewrites:  # the environment, as a user sets it (a patch would keep AOTAutograd's cache off)
            os.environ["GNN_IO_CPU_REWRITE"] = "1"
        compiled = torch.compile(model, backend="gnn_io")
    else:
        compiled = torch.compile(model)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    compiled(x, edge_index).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if profiler is not None:
        import pstats

        profiler.disable()
        with open(args.profile, "w") as out:
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
    return {"seconds": seconds, "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
            "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hits": counters["aot_autograd"]["autograd_cache_hit"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gat", choices=("gcn", "gat"))
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=2_000_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", default="inductor,gnn_io")
    parser.add_argument("--cpu-rewrites", action="store_true", help="gnn_io takes its rewrites on the CPU too")
    parser.add_argument("--profile", help="a child only: write cProfile's cumulative table of the first call here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.mode = args.child
        print(json.dumps(child(args)), flush=True)
        return 0
    rows = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            for start in ("cold", "warm"):
                command = [sys.executable, "-m", "benchmarks.first_call", "--child", mode, "--model", args.model,
                           "--nodes", str(args.nodes), "--edges", str(args.edges), "--features",
                           str(args.features), "--device", args.device] + (["--cpu-rewrites"] * args.cpu_rewrites)
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                result = json.loads(lines[-1]) if lines else {"error": done.stderr.strip().splitlines()[-1:]}
                rows.append({"mode": mode, "start": start, **result})
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.model}, {args.nodes} nodes, {args.edges} edges, {args.features} features, {args.device}\n")
    print("| mode | start | first call s | FX graph cache hits / misses | AOTAutograd cache hits |\n|---|---|---:|---|---|")
    for r in rows:
        cell = f"{r['seconds']:.1f}" if "seconds" in r else f"error: {r['error']}"
        print(f"| {'torch.compile' if r['mode'] == 'inductor' else r['mode']} | {r['start']} | {cell} | "
              f"{r.get('fx_hits', '-')} / {r.get('fx_misses', '-')} | {r.get('aot_hits', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
