"""How many fixed-size compiles a mini-batch loop makes, and how much it pads: the buckets' choices, simulated.

    python -m benchmarks.bucket_reuse --graph arxiv-like --batch 1024 --fanout 10,10 --calls 250

Draws the batches as the mini-batch benchmark does (benchmarks/sampler.py: seeds from a shuffled epoch order of
``--train-fraction`` of the nodes, a new order per epoch) and runs each batch's sizes through
:meth:`gnn_inductor.buckets.Bucketed.choose`, the choice a compiled graph makes per call, once with bucket reuse as
configured, once without settling (every new size compiles, however late: :data:`gnn_inductor.buckets.SETTLE_CALLS`)
and once without the far reuse of sizes not met recently (``far_reuse`` 1). Nothing is compiled: a bucket counts as
compiled at its first choice. Prints, per seed and policy, the compiles, those after ``--warmup`` calls, the calls run
unpadded and the mean padding of nodes and edges; the figures behind :data:`gnn_inductor.buckets.FAR_REUSE` and
:data:`~gnn_inductor.buckets.SETTLE_CALLS`.
"""
from __future__ import annotations

import argparse
import collections
import json
import math

import torch

from benchmarks.graphs import graph_suite
from benchmarks.sampler import neighbor_sample, to_csc
from gnn_inductor import buckets


def batch_sizes(csc, num_nodes: int, batch: int, fanouts: list, train_fraction: float, calls: int,
                seed: int) -> list:
    """``(nodes, edges)`` of ``calls`` sampled batches, epoch after epoch."""
    generator = torch.Generator().manual_seed(seed)
    train = torch.randperm(num_nodes, generator=generator)[:max(1, int(train_fraction * num_nodes))]
    sizes = []
    while len(sizes) < calls:
        order = train[torch.randperm(train.numel(), generator=generator)]
        for start in range(0, order.numel(), batch):
            sampled = neighbor_sample(csc, order[start:start + batch], fanouts, generator)
            sizes.append((sampled.num_nodes, sampled.edge_index.shape[1]))
            if len(sizes) == calls:
                break
    return sizes


def simulate(sizes: list, warmup: int, far_reuse: float = buckets.FAR_REUSE, settle: bool = True) -> dict:
    """The compiles and padding of a loop over graphs of ``sizes`` under :meth:`Bucketed.choose`, and with ``settle``
    the bucket compiled ahead when they settle (:meth:`Bucketed.ahead`) and the calls that
    :meth:`Bucketed.stays_unpadded` runs unpadded instead of compiling (their padding is not in the means, which are
    over the padded calls)."""
    chooser = buckets.Bucketed.__new__(buckets.Bucketed)
    chooser.compiled, chooser.far_reuse, chooser.calls = {}, far_reuse, 0
    chooser.settle_calls = buckets.SETTLE_CALLS if settle else math.inf
    chooser.recent = collections.deque(maxlen=buckets.RECENT_CALLS)
    compiled_at, unpadded, node_pad, edge_pad = [], 0, 0.0, 0.0
    for call, (nodes, edges) in enumerate(sizes):
        own = buckets.padded_sizes(nodes, edges)
        key = chooser.choose(own, nodes, edges)
        if chooser.stays_unpadded(key, own):
            unpadded += 1
            continue
        for compiled in (key, chooser.ahead(key, nodes, edges)):
            if compiled is not None and compiled not in chooser.compiled:
                chooser.compiled[compiled] = True
                compiled_at.append(call)
        node_pad += key[0] / nodes - 1
        edge_pad += key[1] / max(1, edges) - 1
    padded = max(1, len(sizes) - unpadded)
    return {"compiles": len(compiled_at), "after_warmup": sum(c >= warmup for c in compiled_at),
            "compiled_at": compiled_at, "unpadded_calls": unpadded, "node_padding": node_pad / padded,
            "edge_padding": edge_pad / padded}


POLICIES = {"reuse, settled": (buckets.FAR_REUSE, True), "reuse, never settled": (buckets.FAR_REUSE, False),
            "near reuse only": (1.0, True)}


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--fanout", default="10,10")
    parser.add_argument("--train-fraction", type=float, default=0.1)
    parser.add_argument("--calls", type=int, default=250)
    parser.add_argument("--warmup", type=int, default=buckets.SETTLE_CALLS)
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", default=None, help="write the records here as JSON")
    args = parser.parse_args(argv)
    (graph,) = graph_suite([args.graph], args.data_root, torch.device("cpu"))
    csc = to_csc(graph.edge_index, graph.num_nodes)
    fanouts = [int(f) for f in args.fanout.split(",")]
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        sizes = batch_sizes(csc, graph.num_nodes, args.batch, fanouts, args.train_fraction, args.calls, seed)
        for policy, (far, settle) in POLICIES.items():
            record = {"seed": seed, "policy": policy, **simulate(sizes, args.warmup, far, settle)}
            records.append(record)
            print(f"seed {seed}, {policy}: {record['compiles']} compiles, {record['after_warmup']} after call "
                  f"{args.warmup} (at {record['compiled_at']}), {record['unpadded_calls']} calls unpadded, mean "
                  f"padding {record['node_padding']:.1%} of the nodes, {record['edge_padding']:.1%} of the edges")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "records": records}, f, indent=1)
    return records


if __name__ == "__main__":
    main()
