"""Mini-batch training as a PyG user runs it with ``NeighborLoader``: a new sampled subgraph every step, so every
step meets a graph the backend has not seen (its plan, CSR and structure work built again) and shapes that change
from step to step (``torch.compile`` goes shape-generic after the second size).

    python -m benchmarks.minibatch --graph products-like --model sage_mean --batch 1024 --fanout 15,10,5 \\
        --modes eager,inductor,inductor_cg,gnn_io,gnn_io_cg --sample-on cpu --epoch --out minibatch.json

Batches come from :func:`benchmarks.sampler.neighbor_sample` (pyg-lib's sampling rules; its docstring says what
matches and what differs). The model is ``--layers`` PyG convolutions of ``--model`` (``--hidden`` wide; GAT and
TransformerConv with 4 heads of ``hidden / 4``, the last layer one head), ReLU between, ``--features`` inputs and
``--classes`` outputs; a step is ``zero_grad``, forward, cross-entropy of the seeds' rows (``out[:batch_size]``)
against random labels, backward and an Adam step. Per mode:

* ``alone_ms`` / ``loop_ms``: a step without sampling, on a ``--pool`` of pre-sampled batches cycled (more than
  the plans a compiled graph keeps), or with ``--pool 0`` a new batch every step, as in training (a mode that keeps a
  CUDA graph per batch size then records one at every step); alone = synchronised before and after each step, the
  median; loop = the mean of steps issued back to back;
* ``sampled_ms`` (and ``steps_per_s``): steps back to back with the sampling inside the loop, on ``--sample-on``:
  ``cpu`` as ``NeighborLoader`` does (graph, features and labels on the CPU, ``x[n_id]`` gathered there and the
  batch copied to ``--device``), ``cuda`` with all of it on the GPU;
* ``epoch_s`` (``--epoch``): every training node (a seeded ``--train-fraction`` of the nodes) once as a seed,
  shuffled, in batches of ``--batch`` (the last one short), sampling included;
* ``recompiles`` / ``aot_compiles``: after the warm-up, over all the timed steps, Dynamo's graph compilations and
  AOT autograd's (the second also counts what a backend compiles inside a graph Dynamo already has); their time
  lands in the steps that met them;
* ``peak_mb``: on CUDA, ``torch.cuda.max_memory_allocated`` above what was resident when the mode began;
* ``gpu_busy_ms``, ``launches``, ``top_gpu`` ... (``--profile N``): N more pre-sampled steps under the profiler
  (:func:`benchmarks.step_profile.profile_steps`), to tell a step bound by the host from one bound by its kernels;
* ``phases_ms`` (``--phases N``): N more pre-sampled steps back to back, timed phase by phase on the host (the
  batch, ``zero_grad``, forward, loss, backward, the optimizer step; :func:`phase_times`), where a step is the
  host's;
* ``rel_err``: the first step's seed rows against eager PyG's, same weights, same batch.

``inductor`` and ``inductor_cg`` are ``torch.compile(model)`` and ``torch.compile(model, mode="reduce-overhead")``
with Dynamo's default capture (importing gnn_inductor turns ``capture_dynamic_output_shape_ops`` on for the
process; those modes patch it back off); ``gnn_io`` and ``gnn_io_cg`` are ``backend="gnn_io"`` without and with
``mode="reduce-overhead"``. Each mode runs in a fresh process unless ``--same-process`` (:func:`_isolated`).
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from benchmarks.graphs import graph_suite
from benchmarks.run_info import run_metadata
from benchmarks.sampler import neighbor_sample, to_csc
from benchmarks.step_profile import host_functions, profile_steps, summary

MODELS = ("sage_mean", "sage_max", "gcn", "gat", "transformer")
MODES = ("eager", "inductor", "inductor_cg", "gnn_io", "gnn_io_cg")
BASELINES = ("eager", "inductor", "inductor_cg")
HEADS = 4
LR = 0.01


def make_conv(model: str, inputs: int, outputs: int, last: bool) -> torch.nn.Module:
    """One PyG convolution as the PyG examples build it: multi-head attention concatenates ``HEADS`` heads of
    ``outputs / HEADS`` in the hidden layers, and the last layer has one head."""
    from torch_geometric import nn as pyg

    if model in ("sage_mean", "sage_max"):
        return pyg.SAGEConv(inputs, outputs, aggr=model.split("_")[1])
    if model == "gcn":
        return pyg.GCNConv(inputs, outputs)
    if model in ("gat", "transformer"):
        conv = pyg.GATConv if model == "gat" else pyg.TransformerConv
        if last:
            return conv(inputs, outputs, heads=1)
        if outputs % HEADS:
            raise ValueError(f"--hidden {outputs} is not a multiple of {HEADS} heads")
        return conv(inputs, outputs // HEADS, heads=HEADS)
    raise ValueError(f"unknown --model {model!r}; one of {', '.join(MODELS)}")


class Net(torch.nn.Module):
    def __init__(self, model: str, features: int, hidden: int, classes: int, layers: int):
        super().__init__()
        widths = [features] + [hidden] * (layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(make_conv(model, a, b, i == layers - 1)
                                         for i, (a, b) in enumerate(zip(widths, widths[1:])))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def compile_model(mode: str, model: torch.nn.Module):
    torch._dynamo.reset()
    if mode == "eager":
        return model
    if mode in ("gnn_io", "gnn_io_cg"):
        import gnn_inductor  # noqa: F401  (registers the backend)
    backend = "gnn_io" if mode.startswith("gnn_io") else "inductor"
    return torch.compile(model, backend=backend, mode="reduce-overhead" if mode.endswith("_cg") else None)


def new_net(args, device) -> Net:
    torch.manual_seed(args.seed)
    return Net(args.model, args.features, args.hidden, args.classes, args.layers).to(device)


PHASES = ("batch", "zero_grad", "forward", "loss", "backward", "step")


def phase_times(model, optimizer, batch_at, steps: int) -> dict:
    """Host time per phase (:data:`PHASES`) of ``steps`` training steps on ``batch_at(i)``, back to back and never
    synchronised, so each phase's wall time is the host's while the device keeps up: ms per step. On a step bound
    by the host the phases add up to the step; on one bound by its kernels a phase that waits for them (a copy to
    the CPU, the allocator) takes their time."""
    total = dict.fromkeys(PHASES, 0.0)
    for i in range(steps):
        marks = [time.perf_counter()]
        x, edge_index, y, batch_size = batch_at(i)
        marks.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        out = model(x, edge_index)
        marks.append(time.perf_counter())
        loss = F.cross_entropy(out[:batch_size], y)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        for name, start, end in zip(PHASES, marks, marks[1:]):
            total[name] += end - start
    return {name: seconds * 1e3 / steps for name, seconds in total.items()}


def train_step(model, optimizer, x, edge_index, y, batch_size):
    optimizer.zero_grad(set_to_none=True)
    out = model(x, edge_index)
    F.cross_entropy(out[:batch_size], y).backward()
    optimizer.step()
    return out


class Workload:
    """The graph's CSC, features, labels and training nodes on the sampling device, a device copy of the features
    and labels for the pre-sampled pool, and the pool itself (``(n_id, edge_index, batch_size)`` on the device)."""

    def __init__(self, args):
        self.device, self.sample_device = torch.device(args.device), torch.device(args.sample_on)
        if self.sample_device.type == "cuda" and self.device.type != "cuda":
            raise SystemExit("--sample-on cuda needs --device cuda")
        (graph,) = graph_suite([args.graph], args.data_root, self.device)
        self.graph_name, self.num_nodes, self.num_edges = graph.name, graph.num_nodes, graph.num_edges
        self.csc = to_csc(graph.edge_index, graph.num_nodes).to(self.sample_device)
        del graph
        self.fanouts = [int(f) for f in args.fanout.split(",")]
        self.batch = args.batch
        torch.manual_seed(args.seed)
        self.x = torch.randn(self.num_nodes, args.features).to(self.sample_device)
        self.y = torch.randint(0, args.classes, (self.num_nodes,)).to(self.sample_device)
        self.x_device, self.y_device = self.x.to(self.device), self.y.to(self.device)
        self.generator = torch.Generator(device=self.sample_device).manual_seed(args.seed)
        train = max(1, int(args.train_fraction * self.num_nodes))
        self.train = torch.randperm(self.num_nodes, generator=self.generator, device=self.sample_device)[:train]
        self.order, self.next = self.shuffled(), 0
        self.pool = []
        for _ in range(args.pool):
            batch = self.sample(self.take_seeds())
            self.pool.append((batch.n_id.to(self.device), batch.edge_index.to(self.device), batch.batch_size))
        self.order, self.next = self.shuffled(), 0  # the sampled loop starts a fresh epoch order

    def shuffled(self):
        return self.train[torch.randperm(self.train.numel(), generator=self.generator, device=self.sample_device)]

    def take_seeds(self):
        """The next ``--batch`` training nodes of the running epoch order (a new order when it runs out)."""
        if self.next >= self.order.numel():
            self.order, self.next = self.shuffled(), 0
        seeds = self.order[self.next:self.next + self.batch]
        self.next += self.batch
        return seeds

    def sample(self, seeds):
        return neighbor_sample(self.csc, seeds, self.fanouts, self.generator)

    def loader_batch(self, seeds):
        """What the training loop gets from the loader for ``seeds``: sampled, ``x`` and the seeds' labels
        gathered where the graph lives, then on the device."""
        batch = self.sample(seeds)
        x, y = self.x[batch.n_id], self.y[batch.n_id[:batch.batch_size]]
        return (x.to(self.device), batch.edge_index.to(self.device), y.to(self.device), batch.batch_size)

    def pool_batch(self, i):
        n_id, edge_index, batch_size = self.pool[i % len(self.pool)]
        return self.x_device[n_id], edge_index, self.y_device[n_id[:batch_size]], batch_size


def run_mode(mode, args, work, reference):
    plain = mode in ("inductor", "inductor_cg")
    from torch._dynamo.utils import counters

    dynamo = contextlib.nullcontext()
    if plain and "gnn_inductor" in sys.modules:  # as in a process that never imported it (each mode's own, by default)
        from gnn_inductor.testing import plain_torch_compile

        dynamo = plain_torch_compile()
    device = work.device
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with dynamo:
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
        net = new_net(args, device)
        model = compile_model(mode, net)
        optimizer = torch.optim.Adam(net.parameters(), lr=LR)
        record = {"model": args.model, "mode": mode}
        x, edge_index, y, batch_size = work.pool_batch(0)
        out = train_step(model, optimizer, x, edge_index, y, batch_size)[:batch_size].detach().float().cpu()
        record["rel_err"] = float((out - reference).norm() / reference.norm().clamp_min(1e-30))
        for i in range(1, args.warmup):
            train_step(model, optimizer, *work.pool_batch(i))
        sync()
        compiles = counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"]
        gc.disable()
        try:
            alone = []
            for i in range(args.steps):
                batch = work.pool_batch(args.warmup + i)
                sync()
                t = time.perf_counter()
                train_step(model, optimizer, *batch)
                sync()
                alone.append((time.perf_counter() - t) * 1e3)
            sync()
            t = time.perf_counter()
            for i in range(args.steps):
                train_step(model, optimizer, *work.pool_batch(args.warmup + args.steps + i))
            sync()
            record["alone_ms"] = statistics.median(alone)
            record["loop_ms"] = (time.perf_counter() - t) * 1e3 / args.steps
            t = time.perf_counter()
            for _ in range(args.steps):
                train_step(model, optimizer, *work.loader_batch(work.take_seeds()))
            sync()
            record["sampled_ms"] = (time.perf_counter() - t) * 1e3 / args.steps
            record["steps_per_s"] = 1e3 / record["sampled_ms"]
            if args.phases:
                sync()
                first = args.warmup + 2 * args.steps
                record["phases_ms"] = phase_times(model, optimizer, lambda i: work.pool_batch(first + i), args.phases)
                sync()
            if args.profile:
                first = args.warmup + 2 * args.steps + args.phases  # after the phases' batches
                batches = iter(range(first, first + args.profile))
                record.update(profile_steps(lambda: train_step(model, optimizer, *work.pool_batch(next(batches))),
                                            args.profile, device))
            if args.host_profile:
                first = args.warmup + 2 * args.steps + args.phases + args.profile
                batches = iter(range(first, first + args.host_profile))
                record.update(host_functions(
                    lambda: train_step(model, optimizer, *work.pool_batch(next(batches))), args.host_profile))
            if args.epoch:
                order = work.shuffled()
                t = time.perf_counter()
                for start in range(0, order.numel(), args.batch):
                    train_step(model, optimizer, *work.loader_batch(order[start:start + args.batch]))
                sync()
                record["epoch_s"] = time.perf_counter() - t
                record["epoch_steps"] = -(-order.numel() // args.batch)
        finally:
            gc.enable()
        record["recompiles"] = counters["stats"]["unique_graphs"] - compiles[0]
        record["aot_compiles"] = counters["aot_autograd"]["total"] - compiles[1]
        if cuda:
            record["peak_mb"] = (torch.cuda.max_memory_allocated() - resident) / 2**20
        if mode.startswith("gnn_io"):
            from gnn_inductor import rewrite_report

            misses = [m for r in rewrite_report.reports(model) for m in r.near_misses]
            # whether the backend switched to torch.compile's code for graphs that change every step
            record["switched"] = any(m.pattern == "mini_batch" and "later calls run" in m.reason for m in misses)
            record["near_misses"] = {m.pattern: m.reason[:200] for m in reversed(misses)}
            # the padded sizes compiled (gnn_inductor/buckets.py), one fixed-size graph each
            entries = [w for r in rewrite_report.reports(model) for w in r.rewrites if w.pattern == "buckets"]
            record["buckets"] = [b for w in entries for b in w.details["buckets"]]
            # calls of a rare size after the buckets settled, run unpadded (gnn_inductor.buckets.SETTLE_CALLS)
            record["unpadded_calls"] = sum(w.details.get("unpadded_calls", 0) for w in entries)
    return record


def eager_reference(args, work):
    """Eager PyG's first step on the first pooled batch (the weights of :func:`new_net`): the seeds' rows."""
    net = new_net(args, work.device)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    x, edge_index, y, batch_size = work.pool_batch(0)
    return train_step(net, optimizer, x, edge_index, y, batch_size)[:batch_size].detach().float().cpu()


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--model", default="sage_mean", help="one of " + ", ".join(MODELS) + "; or a list, a,b")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--batch", type=int, default=1024, help="seed nodes per batch")
    parser.add_argument("--fanout", default="15,10,5", help="in-neighbours per node, one per hop (-1: all)")
    parser.add_argument("--pool", type=int, default=24, help="pre-sampled batches for the steps without sampling, "
                        "cycled; 0: one per step (warm-up, timed, --phases and --profile steps), so that no step meets "
                        "a batch twice, as in training")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--sample-on", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--epoch", action="store_true", help="time one epoch, sampling included")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also profile this many pre-sampled steps: the GPU's busy time against the step's, "
                             "launches, the top GPU ops (benchmarks/step_profile.py)")
    parser.add_argument("--phases", type=int, default=0, metavar="STEPS",
                        help="also time this many pre-sampled steps back to back phase by phase on the host")
    parser.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                        help="also run this many pre-sampled steps under cProfile: the Python functions the host's "
                             "time goes to (benchmarks/step_profile.py)")
    parser.add_argument("--train-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", default=os.environ.get("GNN_IO_DATA", os.path.join("..", "shared", "data")))
    parser.add_argument("--same-process", action="store_true",
                        help="every mode in this process (by default each mode runs in a fresh one)")
    parser.add_argument("--out", default=None, help="write the records (and the arguments) here as JSON")
    parser.add_argument("--records-out", default=None, help=argparse.SUPPRESS)  # a child's records, as JSON
    args = parser.parse_args(argv)
    if args.pool == 0:
        args.pool = args.warmup + 2 * args.steps + args.phases + args.profile + args.host_profile
    return args


def main(argv=None):
    args = parse(argv)
    modes, models = args.modes.split(","), args.model.split(",")
    if not args.same_process and args.records_out is None and len(modes) > 1:
        return finish(_isolated(argv, models, modes), args, models, modes, argv)
    work = Workload(args)
    sizes = [(n.numel(), e.shape[1]) for n, e, _ in work.pool]
    print(f"== {work.graph_name} ({work.num_nodes} nodes, {work.num_edges} edges): {len(sizes)} batches of "
          f"{args.batch} seeds, fanout {args.fanout}: {min(s[0] for s in sizes)}-{max(s[0] for s in sizes)} nodes, "
          f"{min(s[1] for s in sizes)}-{max(s[1] for s in sizes)} edges", flush=True)
    records = []
    for model in models:
        args.model = model
        reference = eager_reference(args, work)
        for mode in modes:
            try:
                record = run_mode(mode, args, work, reference)
            except Exception as exc:  # a crash of one mode is a result
                record = {"model": model, "mode": mode, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            record.update(graph=work.graph_name, batch=args.batch, fanout=args.fanout,
                          nodes=[min(s[0] for s in sizes), max(s[0] for s in sizes)],
                          edges=[min(s[1] for s in sizes), max(s[1] for s in sizes)])
            records.append(record)
            print(f"== {record}", flush=True)
    args.model = ",".join(models)
    if args.records_out is not None:
        with open(args.records_out, "w") as f:
            json.dump(records, f)
        return records
    return finish(records, args, models, modes, argv)


def _isolated(argv, models, modes):
    """Each mode in a fresh process, one after another. In one process the mode timed last ran faster (the same
    mode: TransformerConv under torch.compile 1.46 ms first, 1.04 ms third, on the CPU; on the H200 torch.compile,
    timed last, led gnn_io's identical code by 15-20%): Dynamo's state carried across modes (its
    automatic-dynamic memory of the frame survives ``torch._dynamo.reset``), warm caches, the allocator."""
    argv = list(sys.argv[1:] if argv is None else argv)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            path = os.path.join(tmp, f"{mode}.json")
            child = []
            skip = False
            for a in argv:  # drop --modes and --out: the child runs one mode and hands its records back
                if skip:
                    skip = False
                elif a in ("--modes", "--out"):
                    skip = True
                elif not a.startswith(("--modes=", "--out=")):
                    child.append(a)
            subprocess.run([sys.executable, "-m", "benchmarks.minibatch", *child, "--modes", mode,
                            "--records-out", path], check=False)
            if os.path.exists(path):
                with open(path) as f:
                    records += json.load(f)
            else:
                records += [{"model": model, "mode": mode, "error": "the process failed"} for model in models]
    return records


def finish(records, args, models, modes, argv=None):
    if args.out is not None:
        with open(args.out, "w") as f:
            json.dump({"meta": run_metadata("benchmarks.minibatch", torch.device(args.device), argv),
                       "args": vars(args), "records": records}, f, indent=1)
    print_table(records, args, models, modes)
    return records


def print_table(records, args, models, modes):
    device = torch.device(args.device)
    where = "its own process" if len(modes) > 1 and not args.same_process else "this process"
    print(f"\n{torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
          f"{args.graph}, {args.layers} layers of {args.hidden}, {args.features} features, {args.classes} classes, "
          f"batch {args.batch}, fanout {args.fanout}, sampling on {args.sample_on}, each mode in {where}. "
          f"ms per training step: alone = synchronised per step (median of {args.steps}), loop = back to back, "
          f"both on pre-sampled batches; sampled = back to back with sampling; x best = the best of "
          f"{'/'.join(BASELINES)} over this mode (loop, sampled); "
          f"compiles after the warm-up: Dynamo / AOT\n")
    print("| model | mode | alone | loop | sampled | steps/s | epoch s | x best | compiles | peak MB | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    by = {(r["model"], r["mode"]): r for r in records}
    for model in models:
        best = {k: min((by[(model, m)][k] for m in BASELINES if k in by.get((model, m), {})), default=None)
                for k in ("loop_ms", "sampled_ms")}
        for mode in modes:
            r = by.get((model, mode), {"error": "no record"})
            if "error" in r:
                print(f"| {model} | {mode} | {r['error'][:80]} |" + " |" * 8)
                continue
            speedup = "/".join(f"{best[k] / r[k]:.2f}" if best[k] else "-" for k in ("loop_ms", "sampled_ms"))
            cells = [f"{r['alone_ms']:.2f}", f"{r['loop_ms']:.2f}", f"{r['sampled_ms']:.2f}",
                     f"{r['steps_per_s']:.1f}", f"{r['epoch_s']:.2f}" if "epoch_s" in r else "-", speedup,
                     f"{r['recompiles']}/{r['aot_compiles']}" + (" (switched)" if r.get("switched") else "")
                     + (f" ({len(r['buckets'])} buckets)" if r.get("buckets") else ""),
                     f"{r['peak_mb']:.0f}" if "peak_mb" in r else "-", f"{r['rel_err']:.1e}"]
            print(f"| {model} | {mode} | " + " | ".join(cells) + " |")
    phased = [r for r in records if "phases_ms" in r]
    if phased:
        print("\nhost time per phase (ms per step, back to back):")
        for r in phased:
            print(f"- {r['model']} {r['mode']}: loop {r['loop_ms']:.2f}; "
                  + ", ".join(f"{name} {ms:.3f}" for name, ms in r["phases_ms"].items()))
    profiled = [r for r in records if "gpu_busy_ms" in r]
    if profiled:
        print("\nprofiles (per step):")
        for r in profiled:
            print(f"- {r['model']} {r['mode']}: alone {r['alone_ms']:.2f} ms, {summary(r)}")
    for r in (r for r in records if "host_self" in r):
        print(f"\nPython on the host, {r['model']} {r['mode']} (ms per step under cProfile, calls per step):")
        for title, rows in (("own time", r["host_self"]), ("inclusive", r["host_inclusive"])):
            print(f"  {title}: " + "; ".join(f"{w} {ms:.3f} x{n:g}" for w, ms, n in rows))


if __name__ == "__main__":
    main()
