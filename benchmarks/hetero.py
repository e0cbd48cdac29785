"""Full-graph training steps of heterogeneous-graph models: PyG eager, ``torch.compile`` default (Inductor) and
``torch.compile(backend="gnn_io")``, each also under CUDA graphs (``mode="reduce-overhead"``), in the same process,
one after another.

    python -m benchmarks.hetero --graphs mag-like,rec-like --models rgcn,rgcn_bases,hgt,hetero_sage,hetero_gat,\\
        to_hetero_sage,to_hetero_gat --modes eager,inductor,gnn_io --hidden 64 --steps 10 --warmup 3 \\
        --device cuda --out hetero.json

Graphs (:func:`make_graph`, a seeded ``HeteroData`` built on ``--device`` with tensor ops only):

* ``mag-like``: ogbn-mag's counts (:data:`GRAPHS`) and the reverse of each relation but ``cites`` (the same edges
  flipped, ``rev_writes`` ...): 4 node types, 7 edge types, 1,939,743 nodes, 36,805,743 edges; 128 features;
* ``rec-like``: 2M users, 500k items, 10M ``(user, rates, item)`` edges and their reverse; 64 features.

``--scale`` multiplies every count (``max(1, round(count * scale))``). Each endpoint column of an edge type is
drawn on its own, with replacement (duplicate edges are kept): ``floor(n * u ** SKEW)`` for uniform ``u``, mapped
through a random permutation of the ``n`` nodes, so the node of degree rank ``r`` expects a degree falling as
``r ** (1 / SKEW - 1)`` (``r ** -0.5``), and hubs sit at random ids.

Models (:func:`build_model`), two layers ``features -> --hidden -> --classes``, ReLU between, seeded:

* ``rgcn`` / ``rgcn_bases``: a linear map per node type to ``--hidden``, then two ``RGCNConv`` over the
  graph of ``HeteroData.to_homogeneous()`` (``edge_type``), without and with ``num_bases=BASES``;
* ``rgcn_flat`` / ``rgcn_flat_bases``: two ``RGCNConv`` on the homogeneous graph's features (``x`` of
  ``to_homogeneous()``: every node type's rows one after another, all types of one width), as PyG's RGCN examples
  take them;
* ``hgt``: two ``HGTConv`` (``heads=HEADS``) on ``x_dict`` / ``edge_index_dict``;
* ``hetero_sage`` / ``hetero_gat``: two ``HeteroConv`` (``aggr="sum"``) of a ``SAGEConv`` or a ``GATConv``
  (``add_self_loops=False``; ``HEADS`` heads of ``hidden / HEADS`` then one head) per edge type;
* ``to_hetero_sage`` / ``to_hetero_gat``: ``to_hetero(..., aggr="sum")`` of the same two as a homogeneous module.

A step is ``zero_grad(set_to_none=True)``, forward, cross-entropy of the first node type's rows (``paper``,
``user``) against seeded random labels, backward and an Adam step. Per (graph, model, mode), after
``torch._dynamo.reset()``, on a deep copy of one seeded model (every mode starts from the same weights):

* ``ms``: the median of ``--steps`` steps after ``--warmup`` (at least one), each timed by ``time.perf_counter``
  between two ``torch.cuda.synchronize()`` (on CUDA); ``first_step_s``: the first step, compile included;
* ``peak_gb``: on CUDA, ``torch.cuda.max_memory_allocated`` over the mode above what was allocated before it
  (graph, features, labels): the model copy, its gradients, Adam's state, activations, compiled state;
* ``rel_err``: the first forward's output (every node type's rows) against eager PyG's, ``||a - b|| / ||b||``;
* ``error``: a mode that raises (out of memory, a compile error) records the exception and the run goes on;
* gnn_io: ``rewrites`` (op -> count, from the rewrite report) and ``near_misses`` (pattern -> reason).

Mini-batches (``--batch N``): the steps train on subgraphs sampled as PyG's ``NeighborLoader`` samples a
``HeteroData`` (:func:`benchmarks.sampler.hetero_neighbor_sample`: ``N`` seeds of the first node type, ``--fanout``
in-neighbours per edge type and hop), a pool of ``--pool`` batches drawn once and cycled, the loss on the seeds'
rows; ``recompiles``: Dynamo's graph compilations after the warm-up. The RGCN models take each batch's homogeneous
form (``HeteroData.to_homogeneous``: node types one after another, ``edge_type`` per edge; the ``rgcn_flat``
models its features in that order too).

Modes: ``eager``; ``inductor`` and ``inductor_cg``, ``torch.compile(model)`` and ``torch.compile(model,
mode="reduce-overhead")``, run as in a process that never imported gnn_inductor
(:func:`gnn_inductor.testing.plain_torch_compile`: Dynamo's default capture of data-dependent shapes, PyG's own
``HeteroLinear`` loop); ``gnn_io`` and ``gnn_io_cg``, ``backend="gnn_io"`` without and with
``mode="reduce-overhead"`` (which pads mini-batches to shape buckets, gnn_inductor/buckets.py, and records each
as a CUDA graph; ``buckets`` in a gnn_io record lists the padded sizes compiled). The ``_cg`` modes call
``torch.compiler.cudagraph_mark_step_begin()`` before each step and need ``--device cuda``: on another device their
records say they were skipped. ``--cpu-rewrites`` gives gnn_io ``options={"cpu_rewrite": True}`` (on the CPU it
otherwise leaves the aggregations to Inductor). A JSON line per record as it finishes; ``--out`` gets the records
and the metadata after each; a Markdown table last. ``--profile N``: N more steps per mode under the profiler
(:func:`benchmarks.step_profile.profile_steps`: the GPU's busy time, launches, the top ``--profile-top`` GPU ops).
"""
import argparse
import contextlib
import copy
import gc
import json
import statistics
import time
import traceback

import torch
from torch._dynamo.utils import counters
import torch.nn.functional as F

import gnn_inductor  # registers the backend; also turns on Dynamo's capture of data-dependent output shapes
from gnn_inductor import rewrite_report
from gnn_inductor.plan import state as graph_state
from gnn_inductor.testing import plain_torch_compile

from benchmarks.sampler import hetero_neighbor_sample, to_csc
from benchmarks.run_info import run_metadata
from benchmarks.step_profile import profile_steps, summary

MODELS = ("rgcn", "rgcn_bases", "rgcn_flat", "rgcn_flat_bases", "hgt", "hetero_sage", "hetero_gat", "to_hetero_sage",
          "to_hetero_gat")
MODES = ("eager", "inductor", "inductor_cg", "gnn_io", "gnn_io_cg")
BASELINES = ("eager", "inductor", "inductor_cg")
CUDA_GRAPH_MODES = ("inductor_cg", "gnn_io_cg")
HEADS = 4
BASES = 4
LR = 0.01
SKEW = 2.0

# counts at --scale 1: node types (the first is the one the loss reads), then (src, relation, dst, edges, reverse)
GRAPHS = {
    "mag-like": {"features": 128,
                 "nodes": {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965},
                 "edges": [("author", "writes", "paper", 7_145_660, "rev_writes"),
                           ("paper", "cites", "paper", 5_416_271, None),
                           ("paper", "has_topic", "field_of_study", 7_505_078, "rev_has_topic"),
                           ("author", "affiliated_with", "institution", 1_043_998, "rev_affiliated_with")]},
    "rec-like": {"features": 64, "nodes": {"user": 2_000_000, "item": 500_000},
                 "edges": [("user", "rates", "item", 10_000_000, "rated_by")]},
}


def scaled(count: int, scale: float) -> int:
    return max(1, round(count * scale))


def _endpoints(n: int, m: int, generator, device) -> torch.Tensor:
    """``m`` node ids of ``[0, n)`` with power-law multiplicities (see the module docstring)."""
    u = torch.rand(m, generator=generator, device=device, dtype=torch.float64)
    rank = (u.pow_(SKEW) * n).long().clamp_(max=n - 1)
    return torch.randperm(n, generator=generator, device=device)[rank]


def make_graph(name: str, scale: float = 1.0, device="cpu", seed: int = 0):
    """The graph ``name`` of :data:`GRAPHS` at ``scale`` on ``device``: a ``HeteroData`` with ``x`` (standard
    normal features) on every node type and ``edge_index`` on every edge type, reverses after their relation."""
    from torch_geometric.data import HeteroData

    spec, device = GRAPHS[name], torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    data = HeteroData()
    for node_type, count in spec["nodes"].items():
        data[node_type].x = torch.randn(scaled(count, scale), spec["features"], generator=generator, device=device)
    for src, rel, dst, count, reverse in spec["edges"]:
        m = scaled(count, scale)
        edge_index = torch.stack([_endpoints(data[t].num_nodes, m, generator, device) for t in (src, dst)])
        data[src, rel, dst].edge_index = edge_index
        if reverse is not None:
            data[dst, reverse, src].edge_index = edge_index.flip(0)
    return data


class Workload:
    """A graph on the device, its inputs in both forms (dicts; the homogeneous ``edge_index`` and ``edge_type``
    when an RGCN model is asked for) and the first node type's labels."""

    def __init__(self, name: str, args, homogeneous: bool):
        self.name, self.device = name, torch.device(args.device)
        self.data = make_graph(name, args.scale, self.device, args.seed)
        self.features = GRAPHS[name]["features"]
        self.node_types, self.first = self.data.node_types, self.data.node_types[0]
        self.x_dict, self.edge_index_dict = self.data.x_dict, self.data.edge_index_dict
        self.homogeneous = self.data.to_homogeneous(node_attrs=[], edge_attrs=[]) if homogeneous else None
        self.flat_x = None  # the rgcn_flat models' features, made at their first full-graph step
        generator = torch.Generator(device=self.device).manual_seed(args.seed + 1)
        self.y = torch.randint(0, args.classes, (self.data[self.first].num_nodes,), generator=generator,
                               device=self.device)
        self.num_nodes, self.num_edges = self.data.num_nodes, self.data.num_edges
        self.pool = self._sample_pool(args) if args.batch else []

    def _sample_pool(self, args) -> list:
        """``--pool`` mini-batches of ``--batch`` seeds of the first node type: ``(x_dict, edge_index_dict, y,
        homogeneous)``, the last the batch's ``(edge_index, edge_type, x)`` where an RGCN model was asked for, else
        None."""
        num_nodes = {t: self.data[t].num_nodes for t in self.node_types}
        cscs = {(s, r, d): to_csc(self.edge_index_dict[s, r, d], num_nodes[d], num_src=num_nodes[s])
                for s, r, d in self.data.edge_types}
        fanouts = [int(f) for f in args.fanout.split(",")]
        generator = torch.Generator(device=self.device).manual_seed(args.seed + 2)
        order = torch.randperm(num_nodes[self.first], generator=generator, device=self.device)
        pool, self.batch_nodes, self.batch_edges = [], [], []
        for i in range(args.pool):
            seeds = order[(i * args.batch) % order.numel():][:args.batch]
            batch = hetero_neighbor_sample(cscs, num_nodes, self.first, seeds, fanouts, generator)
            x_dict = {t: self.x_dict[t][ids] for t, ids in batch.n_id.items()}
            pool.append((x_dict, batch.edge_index, self.y[seeds],
                         self._homogeneous(batch) if self.homogeneous is not None else None))
            self.batch_nodes.append(sum(int(ids.numel()) for ids in batch.n_id.values()))
            self.batch_edges.append(sum(int(e.shape[1]) for e in batch.edge_index.values()))
        return pool

    def _homogeneous(self, batch) -> tuple:
        """A sampled batch's ``(edge_index, edge_type, x)`` as ``HeteroData.to_homogeneous`` gives them: the node
        types' rows one after another in ``node_types`` order, the edge types' edges in ``edge_types`` order, each edge
        type its index."""
        offsets, start = {}, 0
        for t in self.node_types:
            offsets[t], start = start, start + int(batch.n_id[t].numel())
        edges, types = [], []
        for k, (src, rel, dst) in enumerate(self.data.edge_types):
            index = batch.edge_index[src, rel, dst]
            edges.append(index + torch.tensor([[offsets[src]], [offsets[dst]]], device=index.device))
            types.append(torch.full((index.shape[1],), k, dtype=torch.long, device=index.device))
        x = torch.cat([self.x_dict[t][batch.n_id[t]] for t in self.node_types])
        return torch.cat(edges, dim=1), torch.cat(types), x

    def inputs(self, model: str) -> tuple:
        if model.startswith("rgcn_flat"):
            if self.flat_x is None:
                self.flat_x = torch.cat([self.x_dict[t] for t in self.node_types])
            return self.flat_x, self.homogeneous.edge_index, self.homogeneous.edge_type
        if model.startswith("rgcn"):
            return self.x_dict, self.homogeneous.edge_index, self.homogeneous.edge_type
        return self.x_dict, self.edge_index_dict

    def step(self, model: str, i: int) -> tuple:
        """``(inputs, labels)`` of step ``i``: the whole graph, or the pool's batches in turn."""
        if not self.pool:
            return self.inputs(model), self.y
        x_dict, edge_index_dict, y, homogeneous = self.pool[i % len(self.pool)]
        if model.startswith("rgcn_flat"):
            return (homogeneous[2], *homogeneous[:2]), y
        if model.startswith("rgcn"):
            return (x_dict, *homogeneous[:2]), y
        return (x_dict, edge_index_dict), y


class RGCN(torch.nn.Module):
    """A linear map per node type to ``hidden``, the rows concatenated in ``node_types`` order (that of
    ``to_homogeneous``), then two ``RGCNConv``."""

    def __init__(self, node_types, relations, features, hidden, classes, bases):
        from torch_geometric.nn import RGCNConv

        super().__init__()
        self.node_types = list(node_types)
        self.project = torch.nn.ModuleDict({t: torch.nn.Linear(features, hidden) for t in self.node_types})
        self.conv1 = RGCNConv(hidden, hidden, relations, num_bases=bases)
        self.conv2 = RGCNConv(hidden, classes, relations, num_bases=bases)

    def forward(self, x_dict, edge_index, edge_type):
        x = torch.cat([self.project[t](x_dict[t]) for t in self.node_types])
        return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)


class FlatRGCN(torch.nn.Module):
    """Two ``RGCNConv`` on the features of every node, the node types' rows one after another."""

    def __init__(self, relations, features, hidden, classes, bases):
        from torch_geometric.nn import RGCNConv

        super().__init__()
        self.conv1 = RGCNConv(features, hidden, relations, num_bases=bases)
        self.conv2 = RGCNConv(hidden, classes, relations, num_bases=bases)

    def forward(self, x, edge_index, edge_type):
        return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)


class HeteroStack(torch.nn.Module):
    """Two layers of dict in, dict out (``HGTConv``, ``HeteroConv``), ReLU on every node type between them."""

    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: x.relu() for t, x in self.conv1(x_dict, edge_index_dict).items()}
        return self.conv2(x_dict, edge_index_dict)


class Homogeneous(torch.nn.Module):
    """The homogeneous module ``to_hetero`` converts: two convolutions, ReLU between."""

    def __init__(self, kind, features, hidden, classes):
        super().__init__()
        self.conv1, self.conv2 = conv(kind, features, hidden, False), conv(kind, hidden, classes, True)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def conv(kind: str, inputs: int, outputs: int, last: bool) -> torch.nn.Module:
    """A bipartite ``SAGEConv`` or ``GATConv`` (explicit sizes, no self loops; ``HEADS`` heads concatenated, one
    head in the last layer) for one edge type."""
    from torch_geometric.nn import GATConv, SAGEConv

    if kind == "sage":
        return SAGEConv((inputs, inputs), outputs)
    if last:
        return GATConv((inputs, inputs), outputs, heads=1, add_self_loops=False)
    return GATConv((inputs, inputs), outputs // HEADS, heads=HEADS, add_self_loops=False)


def build_model(name: str, work: Workload, hidden: int, classes: int, seed: int) -> torch.nn.Module:
    from torch_geometric.nn import HeteroConv, HGTConv, to_hetero

    if name in ("hgt", "hetero_gat", "to_hetero_gat") and hidden % HEADS:
        raise ValueError(f"--hidden {hidden} is not a multiple of {HEADS} heads")
    if name == "hgt" and classes % HEADS:
        raise ValueError(f"--classes {classes} is not a multiple of {HEADS} heads (HGTConv)")
    torch.manual_seed(seed)
    f, metadata = work.features, work.data.metadata()
    if name in ("rgcn", "rgcn_bases"):
        model = RGCN(work.node_types, len(work.data.edge_types), f, hidden, classes,
                     BASES if name == "rgcn_bases" else None)
    elif name in ("rgcn_flat", "rgcn_flat_bases"):
        model = FlatRGCN(len(work.data.edge_types), f, hidden, classes, BASES if name.endswith("_bases") else None)
    elif name == "hgt":
        model = HeteroStack(HGTConv(f, hidden, metadata, heads=HEADS), HGTConv(hidden, classes, metadata, heads=HEADS))
    elif name in ("hetero_sage", "hetero_gat"):
        kind = name.split("_")[1]
        model = HeteroStack(*(HeteroConv({e: conv(kind, a, b, last) for e in work.data.edge_types}, aggr="sum")
                              for a, b, last in ((f, hidden, False), (hidden, classes, True))))
    elif name in ("to_hetero_sage", "to_hetero_gat"):
        model = to_hetero(Homogeneous(name.split("_")[-1], f, hidden, classes), metadata, aggr="sum")
    else:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    return model.to(work.device)


def compile_model(mode: str, model: torch.nn.Module, cpu_rewrites: bool):
    cuda_graphs = "reduce-overhead" if mode in CUDA_GRAPH_MODES else None
    if mode in ("gnn_io", "gnn_io_cg"):
        return torch.compile(model, backend="gnn_io", mode=cuda_graphs,
                             options={"cpu_rewrite": True} if cpu_rewrites else None)
    return torch.compile(model, mode=cuda_graphs) if mode in ("inductor", "inductor_cg") else model


def train_step(model, optimizer, inputs, y, work: Workload):
    optimizer.zero_grad(set_to_none=True)
    out = model(*inputs)
    rows = out[work.first] if isinstance(out, dict) else out
    F.cross_entropy(rows[:y.numel()], y).backward()
    optimizer.step()
    return out


def flat_output(out, work: Workload) -> torch.Tensor:
    """Every node type's output rows, one float32 vector on the host (the device's peak does not see it)."""
    if isinstance(out, dict):
        return torch.cat([out[t].detach().float().cpu().reshape(-1) for t in work.node_types if t in out])
    return out.detach().float().cpu().reshape(-1)


def run_mode(mode, name, pristine, work: Workload, args, reference):
    """One mode's record and its first forward's output (None if it raised)."""
    cuda = work.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    plain = mode in ("inductor", "inductor_cg")
    dynamo = plain_torch_compile() if plain else contextlib.nullcontext()
    record = {"graph": work.name, "model": name, "mode": mode, "nodes": work.num_nodes, "edges": work.num_edges}
    if work.pool:
        record.update(batch=args.batch, fanout=args.fanout, batch_nodes=[min(work.batch_nodes), max(work.batch_nodes)],
                      batch_edges=[min(work.batch_edges), max(work.batch_edges)])
    if mode in CUDA_GRAPH_MODES and not cuda:
        record["skipped"] = f"{mode} records CUDA graphs: it needs --device cuda"
        return record, None
    model = compiled = optimizer = first = None
    steps = iter(range(1 << 30))

    def step():
        if mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()  # a new training step: the last step's outputs are dead
        return train_step(compiled, optimizer, *work.step(name, next(steps)), work)
    try:
        with dynamo:
            torch._dynamo.reset()
            if cuda:
                sync()
                torch.cuda.reset_peak_memory_stats()
                resident = torch.cuda.memory_allocated()
            model = copy.deepcopy(pristine)
            compiled = compile_model(mode, model, args.cpu_rewrites)
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
            t = time.perf_counter()
            first = flat_output(step(), work)
            sync()
            record["first_step_s"] = time.perf_counter() - t
            if reference is not None:
                record["rel_err"] = float((first - reference).norm() / reference.norm().clamp_min(1e-30))
            for _ in range(1, args.warmup):
                step()
            sync()
            compiles = counters["stats"]["unique_graphs"]
            gc.collect()
            gc.disable()  # no collector pause inside a timed step (enabled again in the finally below)
            times = []
            for _ in range(args.steps):
                sync()
                t = time.perf_counter()
                step()
                sync()
                times.append((time.perf_counter() - t) * 1e3)
            gc.enable()
            record["ms"] = statistics.median(times) if times else None
            record["recompiles"] = counters["stats"]["unique_graphs"] - compiles
            if cuda:
                record["peak_gb"] = (torch.cuda.max_memory_allocated() - resident) / 2**30
            if args.profile:
                record.update(profile_steps(step, args.profile, work.device, top=args.profile_top))
            if mode in ("gnn_io", "gnn_io_cg"):
                reports = rewrite_report.reports(model)
                ops = [w.op for r in reports for w in r.rewrites]
                record["rewrites"] = {op: ops.count(op) for op in sorted(set(ops))}
                record["near_misses"] = {m.pattern: str(m.reason)[:200] for r in reports for m in r.near_misses}
                entries = [w for r in reports for w in r.rewrites if w.pattern == "buckets"]
                record["buckets"] = [b for w in entries for b in w.details["buckets"]]
                record["unpadded_calls"] = sum(w.details.get("unpadded_calls", 0) for w in entries)
    except Exception as exc:  # an out-of-memory or a compile error of one mode is a result, not the end of the run
        record["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
        traceback.print_exc(limit=3)
        first = None
    finally:
        gc.enable()
        model = compiled = optimizer = None
        torch._dynamo.reset()
        graph_state.clear()
        if cuda:
            torch.cuda.empty_cache()
    return record, first


def eager_output(pristine, work: Workload, name: str) -> torch.Tensor:
    """Eager PyG's forward with the pristine weights, for ``rel_err`` when eager is not the first mode."""
    with torch.no_grad():
        return flat_output(copy.deepcopy(pristine)(*work.step(name, 0)[0]), work)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="mag-like,rec-like", help="comma list of " + ", ".join(GRAPHS))
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--classes", type=int, default=32, help="outputs per node, the labels' range")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (at least one)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every node and edge count")
    parser.add_argument("--batch", type=int, default=0, help="seeds per sampled mini-batch (0: full-graph steps)")
    parser.add_argument("--fanout", default="10,10", help="in-neighbours per edge type and hop (mini-batches)")
    parser.add_argument("--pool", type=int, default=8, help="sampled mini-batches, cycled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also profile this many steps after the timed ones: the GPU's busy time, launches, the "
                             "top GPU ops (benchmarks/step_profile.py)")
    parser.add_argument("--profile-top", type=int, default=12, help="GPU ops listed per profiled record")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help='gnn_io with options={"cpu_rewrite": True}: the rewrites on the CPU too')
    parser.add_argument("--out", default=None, help="write the metadata and the records here as JSON")
    return parser.parse_args(argv)


def metadata(args, argv) -> dict:
    return run_metadata("benchmarks.hetero", torch.device(args.device), argv)


def main(argv=None) -> list:
    args = parse(argv)
    args.warmup = max(1, args.warmup)
    graphs, models, modes = (s.split(",") for s in (args.graphs, args.models, args.modes))
    for given, known, what in ((graphs, GRAPHS, "graph"), (models, MODELS, "model"), (modes, MODES, "mode")):
        if any(g not in known for g in given):
            raise SystemExit(f"unknown {what} in {','.join(given)}; one of {', '.join(known)}")
    meta, records = metadata(args, argv), []

    def keep(record):
        records.append(record)
        print(json.dumps(record), flush=True)
        if args.out is not None:  # after every record: a run cut short keeps what it measured
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "args": vars(args), "records": records}, f, indent=1)

    def fail(graph, names, what, exc):  # a graph or a model that could not be built: an error record per mode
        for record in ({"graph": graph, "model": n, "mode": m, "error": f"{what}: {type(exc).__name__}: {exc}"}
                       for n in names for m in modes):
            keep(record)

    for graph in graphs:
        try:
            work = Workload(graph, args, any(m.startswith("rgcn") for m in models))
        except Exception as exc:
            fail(graph, models, "graph", exc)
            continue
        print(f"== {graph}: {work.num_nodes} nodes, {work.num_edges} edges in {len(work.data.edge_types)} types")
        for name in models:
            try:
                pristine = build_model(name, work, args.hidden, args.classes, args.seed)
                reference = None if modes[0] == "eager" else eager_output(pristine, work, name)
            except Exception as exc:
                fail(graph, [name], "model", exc)
                continue
            for mode in modes:
                record, out = run_mode(mode, name, pristine, work, args, reference)
                if mode == "eager" and reference is None and out is not None:
                    reference, record["rel_err"] = out, 0.0
                keep(record)
            pristine = reference = None
        work = None
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print_table(records, graphs, models, meta)
    return records


def print_table(records, graphs, models, meta):
    by = {(r["graph"], r["model"], r["mode"]): r for r in records}

    def cell(r, key, fmt):
        if r is None or r.get(key) is None:
            return "error" if r and "error" in r else "-"
        return fmt.format(r[key])

    def ms(r):
        return r.get("ms") if r and "error" not in r else None

    print(f"\n{meta['device']}, torch {meta['torch']}, PyG {meta['torch_geometric']}: ms per training step (median), "
          "compile = torch.compile default, _cg = mode=\"reduce-overhead\" (CUDA graphs); x best: the best of eager, "
          "compile and compile_cg over the best gnn_io mode; peak GB above the graph's own memory (CUDA); rel_err of "
          "the first forward against eager, compile / compile_cg / gnn_io / gnn_io_cg\n")
    print("| graph | model | eager ms | compile ms | compile_cg ms | gnn_io ms | gnn_io_cg ms | gnn_io vs eager "
          "| gnn_io vs compile | x best | peak GB eager/compile/compile_cg/gnn_io/gnn_io_cg | rel_err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for graph in graphs:
        for name in models:
            rows = [by.get((graph, name, m)) for m in MODES]
            times = dict(zip(MODES, map(ms, rows)))
            ratio = ["{:.2f}x".format(times[base] / times["gnn_io"]) if times[base] and times["gnn_io"] else "-"
                     for base in ("eager", "inductor")]
            baseline = min((times[m] for m in BASELINES if times[m]), default=None)
            ours = min((times[m] for m in ("gnn_io", "gnn_io_cg") if times[m]), default=None)
            best = "{:.2f}x".format(baseline / ours) if baseline and ours else "-"
            peaks = "/".join(cell(r, "peak_gb", "{:.2f}") for r in rows)
            errs = " / ".join(cell(r, "rel_err", "{:.1e}") for r in rows[1:])
            print(f"| {graph} | {name} | " + " | ".join(cell(r, "ms", "{:.2f}") for r in rows)
                  + f" | {ratio[0]} | {ratio[1]} | {best} | {peaks} | {errs} |")
            notes += [f"{graph} {name} {r['mode']}: {r['error']}" for r in rows if r and "error" in r]
            notes += [f"{graph} {name} {r['mode']} skipped: {r['skipped']}" for r in rows if r and "skipped" in r]
    for line in notes:
        print("- " + line)
    profiled = [r for r in records if "gpu_busy_ms" in r]
    if profiled:
        print("\nprofiles (per step):")
        for r in profiled:
            print(f"- {r['graph']} {r['model']} {r['mode']}: {r['ms']:.2f} ms, {summary(r)}")
            for name, gpu_ms, count in r["top_gpu"]:
                print(f"    {gpu_ms:8.3f} ms x{count:<5g} {name}")


if __name__ == "__main__":
    main()
