"""Mini-batch training, as PyG's ``NeighborLoader`` feeds it: a new sampled subgraph every step, so every step
meets a graph the backend has not seen (its plan, the CSR and the structure work built again) and shapes that
change from step to step (``torch.compile`` goes shape-generic after the second size).

    python -m benchmarks.minibatch --graph rmat-arxiv --layers sage_mean,sage_max,gcn,gat,transformer \\
        --modes eager,inductor,gnn_io --batch 1024 --fanout 15,10

Subgraphs are drawn before timing (``--pool`` of them, cycled, more than the plans a compiled graph keeps, so
every step misses the plan cache): ``--batch`` seed nodes, then per hop up to ``fanout`` in-neighbours of each
frontier node drawn uniformly with replacement and deduplicated, nodes relabelled seeds first. The model is two
layers of the harness's kind (``make_layer``) with a ReLU between; the loss reads the seeds' rows. Per mode: the
median of steps timed alone (synchronised before and after, as the harness times), the time per step issued
back to back (synchronised once at the end), Dynamo's frame compilations during the timed steps (a shape
recompile shows there), the output's error against eager on one subgraph, and (gnn_io modes) the report's near
misses. Each mode runs in a fresh process unless ``--same-process`` (see :func:`_isolated`). A table last.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks.harness import build, graph_suite, make_layer, mode_env


def in_csr(edge_index: torch.Tensor, num_nodes: int) -> tuple:
    """(rowptr, sources) of the in-neighbour lists, by destination: the first two parts of the backend's own CSR
    build (``gnn_io::csr_plan``, on the CPU: int64)."""
    from gnn_inductor.plan.csr import csr_plan

    rowptr, sources = csr_plan(edge_index[1], edge_index[0], num_nodes, num_nodes)[:2]
    return rowptr, sources


def sample(rowptr: torch.Tensor, sources: torch.Tensor, seeds: torch.Tensor, fanouts: list,
           generator: torch.Generator) -> tuple:
    """(nodes, edge_index): the sampled subgraph's original node ids (seeds first, then each hop's new nodes in
    id order) and its edges in local ids. Each hop draws ``fanout`` in-neighbours per frontier node with
    replacement (nodes without in-neighbours draw none) and keeps the distinct (source, destination) pairs.
    Vectorised: a few seconds for a pool of 2M-edge subgraphs of RMAT 2^20."""
    seen = torch.zeros(int(rowptr.numel()) - 1, dtype=torch.bool)
    seen[seeds] = True
    nodes, frontier = [seeds], seeds
    edges = []
    for fanout in fanouts:
        start, degree = rowptr[frontier], rowptr[frontier + 1] - rowptr[frontier]
        draw = (torch.rand(len(frontier), fanout, generator=generator) * degree[:, None]).long()
        has = (degree > 0)[:, None].expand(-1, fanout)
        picked = sources[(start[:, None] + draw)[has]]
        targets = frontier[:, None].expand(-1, fanout)[has]
        edges.append(torch.unique(torch.stack([picked, targets]), dim=1))
        candidates = torch.unique(picked)
        frontier = candidates[~seen[candidates]]
        seen[frontier] = True
        nodes.append(frontier)
    nodes = torch.cat(nodes)
    relabel = torch.full((int(rowptr.numel()) - 1,), -1, dtype=torch.long)
    relabel[nodes] = torch.arange(len(nodes))
    return nodes, relabel[torch.cat(edges, dim=1)]


class TwoLayers(torch.nn.Module):
    def __init__(self, layer: str, features: int):
        super().__init__()
        self.first = make_layer(layer, features)
        self.second = make_layer(layer, features)

    def forward(self, x, edge_index):
        return self.second(torch.relu(self.first(x, edge_index)), edge_index)


def run_mode(layer, mode, pool, features_all, batch, device, steps, warmup):
    """``inductor_breaks``: ``torch.compile`` default as a user gets it without gnn_inductor imported, Dynamo
    breaking the graph at data-dependent sizes (``capture_dynamic_output_shape_ops`` off; loading the backend
    turns it on for every mode of the process)."""
    import torch._dynamo.config as dynamo_config

    with mode_env(mode), dynamo_config.patch(capture_dynamic_output_shape_ops=mode != "inductor_breaks"):
        torch.manual_seed(0)
        layers = TwoLayers(layer, features_all.shape[1]).to(device)
        model = build("inductor" if mode == "inductor_breaks" else mode, layers)
        params = list(model.parameters())
        target = torch.randn(batch, features_all.shape[1], device=device)

        def step(i):
            nodes, edge_index = pool[i % len(pool)]
            for p in params:
                p.grad = None
            out = model(features_all[nodes], edge_index)
            (out[:batch] * target).sum().backward()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        for i in range(warmup):
            step(i)
        sync()
        from torch._dynamo.utils import counters
        compiles_before = counters["stats"]["unique_graphs"]
        gc.disable()
        try:
            alone = []
            for i in range(steps):
                sync()
                t = time.perf_counter()
                step(warmup + i)
                sync()
                alone.append((time.perf_counter() - t) * 1e3)
            sync()
            t = time.perf_counter()
            for i in range(steps):
                step(warmup + steps + i)
            sync()
            back_to_back = (time.perf_counter() - t) * 1e3 / steps
        finally:
            gc.enable()
        record = {"layer": layer, "mode": mode, "alone_ms": statistics.median(alone),
                  "back_to_back_ms": back_to_back, "compiles": counters["stats"]["unique_graphs"] - compiles_before}
        if mode.startswith("gnn_io"):
            from gnn_inductor import rewrite_report

            # the switch to torch.compile's code for small graphs that change every step (backend._Churn)
            misses = [m for r in rewrite_report.reports(model) for m in r.near_misses]
            record["switched"] = any(m.pattern == "mini_batch" and "later calls run" in m.reason for m in misses)
            # why a graph kept its rewrites, or went to Inductor whole (the first of each pattern's reasons)
            record["near_misses"] = {m.pattern: m.reason[:200] for m in reversed(misses)}
        nodes, edge_index = pool[0]
        with torch.no_grad():
            record["out"] = model(features_all[nodes], edge_index)[:batch].float().cpu()
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--layers", default="sage_mean,sage_max,gcn,gat,transformer")
    parser.add_argument("--modes", default="eager,inductor,gnn_io")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--fanout", default="15,10")
    parser.add_argument("--pool", type=int, default=24)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", default=os.environ.get("GNN_IO_DATA", os.path.join("..", "shared", "data")))
    parser.add_argument("--same-process", action="store_true",
                        help="every mode in this process (by default each mode runs in a fresh one)")
    parser.add_argument("--records-out", default=None, help=argparse.SUPPRESS)  # a child's records, as JSON
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not args.same_process and args.records_out is None and len(modes) > 1:
        return _isolated(argv, args, modes)
    device = torch.device(args.device)
    (graph,) = graph_suite([args.graph], args.data_root, "cpu")
    rowptr, sources = in_csr(graph.edge_index.cpu(), graph.num_nodes)
    generator = torch.Generator().manual_seed(0)
    pool = []
    for _ in range(args.pool):
        seeds = torch.randperm(graph.num_nodes, generator=generator)[:args.batch]
        nodes, edge_index = sample(rowptr, sources, seeds, [int(f) for f in args.fanout.split(",")], generator)
        pool.append((nodes.to(device), edge_index.to(device)))
    sizes = [(len(n), e.shape[1]) for n, e in pool]
    print(f"== {args.graph}: {args.pool} subgraphs of {args.batch} seeds, fanout {args.fanout}: "
          f"{min(s[0] for s in sizes)}-{max(s[0] for s in sizes)} nodes, "
          f"{min(s[1] for s in sizes)}-{max(s[1] for s in sizes)} edges", flush=True)
    torch.manual_seed(0)
    features_all = torch.randn(graph.num_nodes, args.features, device=device)
    records = []
    for layer in args.layers.split(","):
        reference = _eager_output(layer, pool[0], features_all, args.batch)
        for mode in modes:
            try:
                record = run_mode(layer, mode, pool, features_all, args.batch, device, args.steps, args.warmup)
            except Exception as exc:  # a crash of one mode is a result
                record = {"layer": layer, "mode": mode, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            out = record.pop("out", None)
            if out is not None:
                record["rel_err"] = float((out - reference).norm() / reference.norm().clamp_min(1e-30))
            records.append(record)
            print(f"== {record}", flush=True)
    if args.records_out is not None:
        with open(args.records_out, "w") as f:
            json.dump(records, f)
        return
    print_table(records, args, modes, device)


def _eager_output(layer, subgraph, features_all, batch):
    """Eager PyG's output on one subgraph (the model of :func:`run_mode`, same seed): the error reference."""
    torch.manual_seed(0)
    model = TwoLayers(layer, features_all.shape[1]).to(features_all.device)
    nodes, edge_index = subgraph
    with torch.no_grad():
        return model(features_all[nodes], edge_index)[:batch].float().cpu()


def _isolated(argv, args, modes):
    """Each mode in a fresh process, one after another, then one table. In one process the mode timed last ran
    faster (the same mode: TransformerConv under torch.compile 1.46 ms first, 1.04 ms third, on the CPU; on the
    H200 torch.compile, timed last, led gnn_io's identical code by 15-20%): Dynamo's state carried across modes
    (its automatic-dynamic memory of the frame survives ``torch._dynamo.reset``), warm caches, the allocator."""
    argv = list(sys.argv[1:] if argv is None else argv)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            path = os.path.join(tmp, f"{mode}.json")
            child = list(argv)
            if "--modes" in child:
                i = child.index("--modes")
                del child[i:i + 2]
            child = [a for a in child if not a.startswith("--modes=")]
            subprocess.run([sys.executable, "-m", "benchmarks.minibatch", *child, "--modes", mode,
                            "--records-out", path], check=False)
            if os.path.exists(path):
                with open(path) as f:
                    records += json.load(f)
            else:
                records += [{"layer": layer, "mode": mode, "error": "the process failed"}
                            for layer in args.layers.split(",")]
    device = torch.device(args.device)
    print_table(records, args, modes, device)


def print_table(records, args, modes, device):
    print(f"\n{torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, two layers, "
          f"{args.features} features, {args.graph}, batch {args.batch}, fanout {args.fanout}, a new subgraph each "
          f"step, each mode in {'this process' if args.same_process else 'its own process'}; ms per step (alone = "
          f"synchronised per step, median of {args.steps}; loop = back to back); rel err against eager PyG\n")
    print("| layer | " + " | ".join(f"{m} alone | {m} loop" for m in modes) + " | gnn_io x eager | gnn_io x inductor "
          "| compiles while timed | rel err |")  # x inductor: inductor_breaks where inductor failed
    print("|---|" + "---|" * (2 * len(modes) + 4))
    by = {(r["layer"], r["mode"]): r for r in records}
    for layer in args.layers.split(","):
        cells = []
        for m in modes:
            r = by[(layer, m)]
            if "alone_ms" in r:
                cells += [f"{r['alone_ms']:.2f}", f"{r['back_to_back_ms']:.2f}"]
            else:
                cells += [r.get("error", "-")[:60], "-"]
        g, e = by.get((layer, "gnn_io"), {}), by.get((layer, "eager"), {})
        i = by.get((layer, "inductor"), {})
        if "alone_ms" not in i:
            i = by.get((layer, "inductor_breaks"), {})
        ratio = (lambda a, b: f"{a['alone_ms'] / b['alone_ms']:.2f}" if "alone_ms" in a and "alone_ms" in b else "-")
        compiles = ", ".join(f"{m} {by[(layer, m)].get('compiles', '-')}" for m in modes) + "".join(
            f" ({m} switched to torch.compile's code)" for m in modes if by[(layer, m)].get("switched"))
        errs = ", ".join(f"{by[(layer, m)].get('rel_err', float('nan')):.1e}" for m in modes if m != "eager")
        print(f"| {layer} | " + " | ".join(cells) + f" | {ratio(e, g)} | {ratio(i, g)} | {compiles} | {errs} |")


if __name__ == "__main__":
    main()
