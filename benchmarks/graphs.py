"""Graphs for the benchmark harness: seeded synthetic generators and the real graphs of
``shared/data`` (see its SOURCES.md). Every graph is returned as a coalesced, undirected
``edge_index [2, E]`` (both directions, duplicates removed, self loops kept as the data has them)."""
from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Graph:
    name: str
    num_nodes: int
    edge_index: torch.Tensor
    kind: str

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def coalesce(src: torch.Tensor, dst: torch.Tensor, num_nodes: int, undirected: bool = True) -> torch.Tensor:
    if undirected:
        src, dst = torch.cat([src, dst]), torch.cat([dst, src])
    key = torch.unique(src.long() * num_nodes + dst.long())
    return torch.stack([key // num_nodes, key % num_nodes])


def rmat(scale: int, num_edges: int, seed: int = 0, probs=(0.57, 0.19, 0.19, 0.05), device="cpu") -> Graph:
    """Power-law R-MAT graph (Graph500 parameters) with ``2**scale`` nodes; ``num_edges`` directed
    draws, then coalesced (so a little fewer edges remain). Node ids are scrambled so that hubs
    are not all at low ids."""
    generator = torch.Generator(device=device).manual_seed(seed)
    a, b, c, _ = probs
    src = torch.zeros(num_edges, dtype=torch.long, device=device)
    dst = torch.zeros(num_edges, dtype=torch.long, device=device)
    for level in range(scale):
        r = torch.rand(num_edges, generator=generator, device=device)
        src_bit = (r >= a + b).long()
        dst_bit = ((r >= a) & (r < a + b)).long() | (r >= a + b + c).long()
        src |= src_bit << level
        dst |= dst_bit << level
    n = 1 << scale
    scramble = torch.randperm(n, generator=generator, device=device)
    edge_index = coalesce(scramble[src], scramble[dst], n, undirected=False)
    return Graph(f"rmat-{scale}-{num_edges // 1_000_000 or num_edges}{'M' if num_edges >= 1_000_000 else ''}",
                 n, edge_index, "rmat")


def uniform(num_nodes: int, num_edges: int, seed: int = 0, device="cpu") -> Graph:
    generator = torch.Generator(device=device).manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator, device=device)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=generator, device=device)
    return Graph(f"uniform-{num_nodes}-{num_edges}", num_nodes, coalesce(src, dst, num_nodes, undirected=False),
                 "uniform")


def grid(side: int, device="cpu") -> Graph:
    """Road-like low-degree graph: a ``side x side`` 4-neighbour grid."""
    ids = torch.arange(side * side, device=device).view(side, side)
    right = torch.stack([ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)])
    down = torch.stack([ids[:-1, :].reshape(-1), ids[1:, :].reshape(-1)])
    both = torch.cat([right, down], dim=1)
    return Graph(f"grid-{side}x{side}", side * side, coalesce(both[0], both[1], side * side), "road-like")


def _edges_from_text(path: str, delimiter=None, skip: int = 0) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.strip() and line[0] not in "#%"][skip:]
    return np.loadtxt(lines, delimiter=delimiter, dtype=np.int64, usecols=(0, 1))


def _relabel(pairs: np.ndarray, name: str, kind: str) -> Graph:
    ids, inverse = np.unique(pairs.reshape(-1), return_inverse=True)
    pairs = torch.from_numpy(inverse.reshape(-1, 2))
    n = len(ids)
    return Graph(name, n, coalesce(pairs[:, 0], pairs[:, 1], n), kind)


def real(name: str, data_root: str) -> Graph:
    """A real graph from ``shared/data`` by its folder name."""
    d = os.path.join(data_root, name)
    if name == "Planetoid-Cora":
        with open(os.path.join(data_root, "Planetoid", "Cora", "raw", "ind.cora.graph"), "rb") as f:
            adjacency = pickle.load(f, encoding="latin1")
        pairs = np.array([(u, v) for u, vs in adjacency.items() for v in vs], dtype=np.int64)
        n = max(int(pairs.max()) + 1, len(adjacency))
        t = torch.from_numpy(pairs)
        return Graph("cora", n, coalesce(t[:, 0], t[:, 1], n), "real")
    files = {
        "ca-AstroPh": ("ca-AstroPh.txt", None, 0),
        "soc-Slashdot0902": ("soc-Slashdot0902.txt.gz", None, 0),
        "email-Enron": ("email-Enron.txt", None, 1),  # first line is a "nodes edges" header
        "MUSAE-github": ("git_edges.csv", ",", 1),
        "road-luxembourg-osm": ("road-luxembourg-osm.mtx", None, 1),  # first data line is the size line
    }
    file, delimiter, skip = files[name]
    pairs = _edges_from_text(os.path.join(d, file), delimiter, skip)
    return _relabel(pairs, name, "road-like" if name.startswith("road") else "real")


REAL_GRAPHS = ("Planetoid-Cora", "ca-AstroPh", "email-Enron", "MUSAE-github", "soc-Slashdot0902",
               "road-luxembourg-osm")
