"""Train a 2-layer DGL GCN (``dgl.nn.pytorch.GraphConv``) on Cora, compiled with ``backend="gnn_io"``.

    pip install -e ".[dgl]"
    python examples/dgl_gcn.py [--epochs 50] [--cpu-rewrites] [--data-root DIR]
    python examples/dgl_gcn.py --large                  # a synthetic graph of 2^20 nodes and 10M edges
    python examples/dgl_gcn.py --device cuda --large    # needs a CUDA build of DGL that matches your torch

A plain ``import dgl``: DGL 2.1.0, the newest on the package index, cannot import its graphbolt part on torch 2.11
(the library is missing), and installing gnn_inductor sets up the import so that the rest of DGL imports without
it (docs/dgl.md). ``import gnn_inductor`` before building graphs lets Dynamo capture their message passing. That
DGL is CPU-only; no CUDA build of it exists for torch 2.11. Cora is found as in examples/gat_cora.py (a local copy,
else PyG's download).

Each GraphConv's ``update_all`` becomes a ``gnn_io.spmm``. On the CPU the cost model leaves it to Inductor,
whose C++ code is faster there (``--cpu-rewrites`` takes the rewrite, to see it: the ops' reference code, slower
than Inductor's).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import dgl
except ModuleNotFoundError as exc:
    if exc.name != "dgl":
        raise
    print(f"skipped: this example needs DGL, which is not installed ({exc}); pip install -e \".[dgl]\"")
    sys.exit(0)
import torch
import torch.nn.functional as F
from dgl.nn.pytorch import GraphConv

import gnn_inductor  # before building graphs: makes DGL's message passing traceable (docs/dgl.md)
from example_data import DEFAULT_DATA_ROOT, load_cora, planted_graph


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = GraphConv(in_channels, hidden, activation=F.relu, allow_zero_in_degree=True)
        self.conv2 = GraphConv(hidden, num_classes, allow_zero_in_degree=True)

    def forward(self, g, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(g, F.dropout(x, p=0.5, training=self.training))
        return self.conv2(g, F.dropout(x, p=0.5, training=self.training))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--large", action="store_true", help="a synthetic graph of 2^20 nodes and 10M edges")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = planted_graph(1 << 20, 10_000_000, features=128) if args.large else load_cora(args.data_root)
    src, dst = data.edge_index
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=data.num_nodes)).to(args.device)
    x, y = data.x.to(args.device), data.y.to(args.device)
    train_mask, test_mask = data.train_mask.to(args.device), data.test_mask.to(args.device)

    model = GCN(data.num_features, 16, int(data.y.max()) + 1).to(args.device)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = torch.compile(model, backend="gnn_io", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(compiled(g, x)[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
        if epoch == 1 or epoch % 10 == 0 or epoch == args.epochs:
            print(f"epoch {epoch:3d}  loss {loss.item():.4f}  {time.perf_counter() - start:.1f}s since the start")

    model.eval()
    with torch.no_grad():
        pred = compiled(g, x).argmax(dim=-1)
    print(f"test accuracy: {(pred[test_mask] == y[test_mask]).float().mean():.3f}")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
