"""Train a 2-layer GAT on Cora with ``torch.compile(model, backend="gnn_io")``, then print the rewrite report.

    python examples/gat_cora.py [--epochs 20] [--device cuda] [--cpu-rewrites] [--data-root DIR]

Cora comes from a local copy of the Planetoid raw files when there is one (``$GNN_IO_DATA/Planetoid``, else
``../shared/data/Planetoid`` next to this repository), copied into ``--data-root`` (default
``data_cache/Planetoid``), because PyG writes its processed files next to ``raw/``; without one, PyG downloads
Cora (this needs network).

The model is the GAT of Velickovic et al. (8 heads of 8 hidden features, ELU, dropout 0.6 on the features). Each
layer's scores, edge softmax and weighted sum become one ``gnn_io.attention`` op. The learning rate is twice the
paper's so that the default 20 epochs reach about 0.8 test accuracy.

On the CPU the cost model leaves the attention to Inductor, whose C++ code is faster there than the ops' reference
code, and the report says so. ``--cpu-rewrites`` takes the rewrites anyway, to see them on the CPU (the ops'
reference code, slower than Inductor's). On a GPU Cora is below the cost model's size thresholds too
(docs/kernel_selection.md); the fused kernels pay from about a million edges.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv

import gnn_inductor
from example_data import DEFAULT_DATA_ROOT, load_cora


class GAT(torch.nn.Module):
    def __init__(self, in_channels: int, num_classes: int, hidden: int = 8, heads: int = 8, dropout: float = 0.6):
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads)
        self.conv2 = GATConv(hidden * heads, num_classes, heads=1, concat=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT,
                        help="writable Planetoid root holding (or receiving) Cora/raw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = load_cora(args.data_root).to(args.device)
    model = GAT(data.num_features, int(data.y.max()) + 1).to(args.device)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = torch.compile(model, backend="gnn_io", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    epoch_times = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        logits = compiled(data.x, data.edge_index)
        loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        epoch_times.append(time.perf_counter() - start)
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}  {epoch_times[-1]:.2f}s")

    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        pred = compiled(data.x, data.edge_index).argmax(dim=-1)
    acc = {name: float((pred[mask] == data.y[mask]).float().mean())
           for name, mask in (("train", data.train_mask), ("val", data.val_mask), ("test", data.test_mask))}
    print(f"accuracy: train {acc['train']:.3f}  val {acc['val']:.3f}  test {acc['test']:.3f}  "
          f"(evaluation {time.perf_counter() - start:.1f}s: compiles the inference graph)")
    print(f"training: {sum(epoch_times):.1f}s, of which {epoch_times[0]:.1f}s in epoch 1 (compiles the training "
          f"graph and builds the graph plan)")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
