"""Train a 2-layer GAT on Cora with ``torch.compile(model, backend="gnn_io")``, then print the
rewrite report.

    python examples/gat_cora.py [--epochs 20] [--data-root DIR]

Cora is read offline: the raw Planetoid files are copied from ``../shared/data/Planetoid/Cora/raw``
(next to this repository) into ``--data-root`` (default ``data_cache/Planetoid`` in the
repository), because PyG writes its processed files next to ``raw/``.

The model is the GAT of Velickovic et al. (8 heads of 8 hidden features, ELU, dropout 0.6 on the
features). Attention dropout is 0; each layer's scores, edge softmax and weighted sum become one
``gnn_io.attention`` op that reads only node rows and the graph plan (with attention dropout it would
also read a seed and draw the mask itself: docs/attention.md). The learning rate is twice the paper's so that the
default 20 epochs reach about 0.8 test accuracy.

The example runs on CPU. There the cost model would leave the attention to Inductor, whose C++ code is faster
than the ops' CPU references (docs/kernel_selection.md), so the example sets ``GNN_IO_CPU_REWRITE=1`` to show
the rewrite and its report; ``--no-cpu-rewrite`` shows the default CPU behaviour instead.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.datasets import Planetoid
from torch_geometric.nn import GATConv
from torch_geometric.transforms import NormalizeFeatures

import gnn_inductor

REPO = Path(__file__).resolve().parent.parent
SHARED_PLANETOID = REPO.parent / "shared" / "data" / "Planetoid"
DEFAULT_DATA_ROOT = REPO / "data_cache" / "Planetoid"


class GAT(torch.nn.Module):
    def __init__(self, in_channels: int, num_classes: int, hidden: int = 8, heads: int = 8, dropout: float = 0.6):
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=0.0)
        self.conv2 = GATConv(hidden * heads, num_classes, heads=1, concat=False, dropout=0.0)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def load_cora(data_root: Path):
    """Cora from ``data_root/Cora``; its raw files are copied from the shared data when missing."""
    raw = data_root / "Cora" / "raw"
    if not raw.is_dir():
        shared_raw = SHARED_PLANETOID / "Cora" / "raw"
        if not shared_raw.is_dir():
            raise SystemExit(f"no Cora raw files in {raw} and none to copy from {shared_raw}; "
                             "put the Planetoid raw files (ind.cora.*) in one of them or pass --data-root")
        shutil.copytree(shared_raw, raw)
    return Planetoid(str(data_root), "Cora", transform=NormalizeFeatures())[0]


def accuracies(logits: torch.Tensor, data) -> dict:
    pred = logits.argmax(dim=-1)
    return {name: float((pred[mask] == data.y[mask]).float().mean())
            for name, mask in (("train", data.train_mask), ("val", data.val_mask), ("test", data.test_mask))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT,
                        help="writable Planetoid root holding (or receiving) Cora/raw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cpu-rewrite", action="store_true",
                        help="leave the attention to Inductor on CPU, as the cost model does by default")
    args = parser.parse_args()
    if not args.no_cpu_rewrite:
        os.environ.setdefault("GNN_IO_CPU_REWRITE", "1")

    torch.manual_seed(args.seed)
    data = load_cora(args.data_root)
    model = GAT(data.num_features, int(data.y.max()) + 1)
    compiled = torch.compile(model, backend="gnn_io")
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
        acc = accuracies(compiled(data.x, data.edge_index), data)
    print(f"accuracy: train {acc['train']:.3f}  val {acc['val']:.3f}  test {acc['test']:.3f}  "
          f"(evaluation {time.perf_counter() - start:.1f}s: compiles the inference graph)")
    print(f"training: {sum(epoch_times):.1f}s, of which {epoch_times[0]:.1f}s in epoch 1 (compiles the training "
          f"graph and builds the graph plan)")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
