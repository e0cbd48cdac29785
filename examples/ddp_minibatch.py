"""Mini-batch GraphSAGE on several GPUs (or CPU processes) with ``DistributedDataParallel``, compiled with
``backend="gnn_io"``:

    torchrun --nproc-per-node 2 examples/ddp_minibatch.py                          # CPU, gloo
    torchrun --nproc-per-node 4 examples/ddp_minibatch.py --device cuda --large    # one GPU per process, NCCL

Each process (rank) holds the whole graph and its features, draws its own seeds from its share of the training
nodes (a fresh split every epoch, as ``DistributedSampler`` does), samples a subgraph around them
(examples/minibatch_sage.py's sampler) and trains the same model; DDP averages the gradients across ranks, so every
step trains on ``--batch-size`` seeds per rank. ``torch.compile`` wraps the DDP model: Dynamo's DDPOptimizer splits
the captured graph at DDP's gradient buckets and the backend compiles each piece (docs/usage.md, "Several GPUs").
Rank 0 prints the losses, the step time and the rewrite report.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import gnn_inductor
from example_data import planted_graph
from minibatch_sage import GraphSAGE, NeighbourSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, the GPU of LOCAL_RANK)")
    parser.add_argument("--large", action="store_true", help="2^20 nodes and 16M edges (for GPUs)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="mini-batches per epoch and rank")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per step and rank")
    parser.add_argument("--fanout", default="15,10")
    parser.add_argument("--backend", default="gnn_io", choices=("gnn_io", "inductor", "eager"),
                        help="inductor: torch.compile's default backend, eager: no torch.compile (for comparison)")
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same graph and the same initial weights on every rank
    nodes, edges = (1 << 20, 16_000_000) if args.large else (20_000, 200_000)
    data = planted_graph(nodes, edges, features=128)
    sampler = NeighbourSampler(data.edge_index, data.num_nodes)
    fanouts = [int(f) for f in args.fanout.split(",")]
    train_nodes = data.train_mask.nonzero().view(-1)

    model = GraphSAGE(data.num_features, 128, int(data.y.max()) + 1).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = {"gnn_io": lambda: torch.compile(ddp, backend="gnn_io", options=options),
                "inductor": lambda: torch.compile(ddp), "eager": lambda: ddp}[args.backend]()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    step_times, wall_times = [], []
    for epoch in range(1, args.epochs + 1):
        generator = torch.Generator().manual_seed(epoch)  # one shuffle for all ranks, then each rank its share
        mine = train_nodes[torch.randperm(len(train_nodes), generator=generator)][rank::world]
        torch.manual_seed(1000 * epoch + rank)  # each rank samples its own neighbourhoods
        model.train()
        for step in range(args.steps):
            begin = time.perf_counter()
            seeds = mine[(step * args.batch_size) % len(mine):][:args.batch_size]
            batch_nodes, edge_index = sampler.sample(seeds, fanouts)
            x, y = data.x[batch_nodes].to(device), data.y[seeds].to(device)
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(compiled(x, edge_index.to(device))[:len(seeds)], y)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()  # the step's time is the GPU's, not the time to queue its work
            step_times.append(time.perf_counter() - start)
            wall_times.append(time.perf_counter() - begin)
        loss = loss.detach()
        dist.all_reduce(loss)  # the epoch's last loss, summed over the ranks (once per epoch: a collective per step
        # would add a synchronisation of all ranks to every step)
        if rank == 0:
            print(f"epoch {epoch}  mean loss over {world} ranks {loss.item() / world:.4f}")

    if rank == 0:
        def median_ms(times):  # the last half: the first steps compile
            later = sorted(times[len(times) // 2:])
            return later[len(later) // 2] * 1e3

        step_ms, wall_ms = median_ms(step_times), median_ms(wall_times)
        print(f"steps: first {step_times[0]:.2f}s (compiles), median of the last half {step_ms:.1f} ms "
              f"({wall_ms:.1f} ms with the sampling), {world} ranks of {args.batch_size} seeds, "
              f"{args.backend}: {world * args.batch_size / wall_ms * 1e3:.0f} seeds/s")
        if args.backend == "gnn_io":
            print()
            gnn_inductor.report(model)
    dist.barrier()  # every rank done before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
