"""Mini-batch GraphSAGE training on sampled subgraphs, compiled with ``backend="gnn_io"``.

    python examples/minibatch_sage.py                         # CPU: 20k nodes, 200k edges
    python examples/minibatch_sage.py --device cuda --large   # GPU: 2^20 nodes, 16M edges

Each step samples a subgraph around ``--batch-size`` seed nodes (``--fanout`` in-neighbours per node and hop, as
PyG's ``NeighborLoader`` does; a small sampler is written out below, since ``NeighborLoader`` needs pyg-lib) and
trains on the seeds' labels. The graph is synthetic, with classes planted in features and edges (example_data.py).

Every step brings a new, small graph, and a graph plan built per step costs more than the fused kernels save on
it: after 8 steps the backend runs the code ``torch.compile`` itself would run, and the report lists that as a
``mini_batch`` near miss (docs/usage.md, "Mini-batch training"). Expect ``torch.compile``'s speed here. On the
CPU the cost model leaves the aggregations to Inductor from the start (``--cpu-rewrites`` takes the rewrites, to
see them: the ops' reference code, slower than Inductor's).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

import gnn_inductor
from example_data import planted_graph


class NeighbourSampler:
    """Subgraphs around seed nodes: per hop, ``fanout`` in-neighbours of each frontier node drawn with
    replacement (distinct edges kept). Returns the subgraph's node ids, seeds first, and its local edge_index."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        order = torch.argsort(edge_index[1])
        self.sources = edge_index[0, order]
        degree = torch.bincount(edge_index[1], minlength=num_nodes)
        self.rowptr = torch.cat([degree.new_zeros(1), torch.cumsum(degree, 0)])
        self.num_nodes = num_nodes

    def sample(self, seeds: torch.Tensor, fanouts: list) -> tuple:
        seen = torch.zeros(self.num_nodes, dtype=torch.bool)
        seen[seeds] = True
        nodes, frontier, edges = [seeds], seeds, []
        for fanout in fanouts:
            start, degree = self.rowptr[frontier], self.rowptr[frontier + 1] - self.rowptr[frontier]
            draw = (torch.rand(len(frontier), fanout) * degree[:, None]).long()
            has = (degree > 0)[:, None].expand(-1, fanout)
            picked = self.sources[(start[:, None] + draw)[has]]
            # distinct (source, destination) pairs, through one integer key per pair (torch.unique over
            # columns, ``dim=1``, compares them one by one: 95% of a step's sampling time)
            keys = torch.unique(picked * self.num_nodes + frontier[:, None].expand(-1, fanout)[has])
            edges.append(torch.stack([keys // self.num_nodes, keys % self.num_nodes]))
            frontier = torch.unique(picked)
            frontier = frontier[~seen[frontier]]
            seen[frontier] = True
            nodes.append(frontier)
        nodes = torch.cat(nodes)
        local = torch.full((self.num_nodes,), -1, dtype=torch.long)
        local[nodes] = torch.arange(len(nodes))
        return nodes, local[torch.cat(edges, dim=1)]


class GraphSAGE(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden)
        self.conv2 = SAGEConv(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--large", action="store_true", help="2^20 nodes and 16M edges (for a GPU)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="mini-batches per epoch")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanout", default="15,10")
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    nodes, edges = (1 << 20, 16_000_000) if args.large else (20_000, 200_000)
    data = planted_graph(nodes, edges, features=128)
    sampler = NeighbourSampler(data.edge_index, data.num_nodes)
    fanouts = [int(f) for f in args.fanout.split(",")]
    train_nodes = data.train_mask.nonzero().view(-1)

    model = GraphSAGE(data.num_features, 128, int(data.y.max()) + 1).to(args.device)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = torch.compile(model, backend="gnn_io", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    step_times = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        for _ in range(args.steps):
            seeds = train_nodes[torch.randint(len(train_nodes), (args.batch_size,))].unique()
            batch_nodes, edge_index = sampler.sample(seeds, fanouts)
            x, y = data.x[batch_nodes].to(args.device), data.y[seeds].to(args.device)
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(compiled(x, edge_index.to(args.device))[:len(seeds)], y)
            loss.backward()
            optimizer.step()
            loss = loss.item()  # waits for the step
            step_times.append(time.perf_counter() - start)
        print(f"epoch {epoch}  loss {loss:.4f}  subgraph of the last step: {len(batch_nodes)} nodes, "
              f"{edge_index.shape[1]} edges")

    later = sorted(step_times[len(step_times) // 2:])
    print(f"steps: first {step_times[0]:.2f}s (compiles), median of the last half "
          f"{later[len(later) // 2] * 1e3:.1f} ms")
    test_seeds = data.test_mask.nonzero().view(-1)[:args.batch_size]
    batch_nodes, edge_index = sampler.sample(test_seeds, fanouts)
    model.eval()
    with torch.no_grad():
        pred = compiled(data.x[batch_nodes].to(args.device), edge_index.to(args.device))[:len(test_seeds)].argmax(-1)
    print(f"test accuracy on {len(test_seeds)} sampled seeds: {(pred.cpu() == data.y[test_seeds]).float().mean():.3f}")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
