"""Data for the examples: Cora (a local copy, else PyG's download) and synthetic graphs of any size.

Plain PyG code, nothing specific to gnn_inductor: copy what you need.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.datasets import Planetoid
from torch_geometric.transforms import NormalizeFeatures

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_ROOT = REPO / "data_cache" / "Planetoid"


def local_planetoid() -> Path:
    """Where a local copy of the Planetoid raw files is looked for: ``$GNN_IO_DATA/Planetoid``, else
    ``../shared/data/Planetoid`` next to this repository."""
    return Path(os.environ.get("GNN_IO_DATA") or REPO.parent / "shared" / "data") / "Planetoid"


def load_cora(data_root: Path = DEFAULT_DATA_ROOT) -> Data:
    """Cora from ``data_root/Cora``. Missing raw files are copied from the local copy when there is one;
    otherwise PyG downloads them (this needs network)."""
    raw, local = Path(data_root) / "Cora" / "raw", local_planetoid() / "Cora" / "raw"
    if not any(raw.glob("ind.cora.*")):
        if local.is_dir():
            shutil.copytree(local, raw, dirs_exist_ok=True)
        else:
            print(f"no local copy of Cora in {local}: downloading it with PyG into {data_root}")
    return Planetoid(str(data_root), "Cora", transform=NormalizeFeatures())[0]


def planted_graph(num_nodes: int, num_edges: int, *, num_classes: int = 8, features: int = 64,
                  community: int = 0, inside: float = 0.8, seed: int = 0) -> Data:
    """A node classification task on a synthetic graph: ``y`` (classes), ``x`` (a class centroid plus noise: a
    node's own features classify it poorly, its neighbourhood well) and ``edge_index`` ([2, num_edges]), where a
    fraction ``inside`` of each node's in-edges come from its own group, the rest from anywhere. A group is the
    node's class or, with ``community`` > 0, a block of ``community`` consecutive nodes (a locally dense graph,
    like a batch of small graphs), whose class is the block's number modulo ``num_classes``. A split:
    ``train_mask`` (60%) and ``test_mask``."""
    generator = torch.Generator().manual_seed(seed)
    if community:
        group = torch.arange(num_nodes) // community
        y = group % num_classes
    else:
        y = group = torch.randint(num_classes, (num_nodes,), generator=generator)
    members = torch.argsort(group)  # the nodes of each group, one group after another
    counts = torch.bincount(group)
    starts = torch.cumsum(counts, 0) - counts
    dst = torch.randint(num_nodes, (num_edges,), generator=generator)
    offset = (torch.rand(num_edges, generator=generator) * counts[group[dst]]).long()
    same_group = members[starts[group[dst]] + offset]
    anywhere = torch.randint(num_nodes, (num_edges,), generator=generator)
    src = torch.where(torch.rand(num_edges, generator=generator) < inside, same_group, anywhere)
    centroids = torch.randn(num_classes, features, generator=generator)
    x = centroids[y] + 0.5 * features ** 0.5 * torch.randn(num_nodes, features, generator=generator)
    train_mask = torch.rand(num_nodes, generator=generator) < 0.6
    return Data(x=x, edge_index=torch.stack([src, dst]), y=y, train_mask=train_mask, test_mask=~train_mask)
