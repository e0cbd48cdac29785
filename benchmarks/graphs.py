"""Graphs for the benchmark harness: seeded synthetic generators and the real graphs of
``shared/data`` (see its SOURCES.md). Every graph is returned as a coalesced ``edge_index [2, E]`` (duplicates
removed, self loops kept as the data has them). The real graphs and ``products-like`` hold both directions of each
edge; whether a synthetic graph does is its generator's ``undirected`` choice (``arxiv-like`` is directed, as
ogbn-arxiv's citations are)."""
from __future__ import annotations

import gzip
import os
import pickle
import sys
import time
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


def rmat_like(num_nodes: int, num_edges: int, undirected: bool, seed: int = 0, probs=(0.57, 0.19, 0.19, 0.05),
              name: str | None = None, device="cpu") -> Graph:
    """A power-law R-MAT graph with exactly ``num_nodes`` nodes and ``num_edges`` edges (as stored: an undirected
    graph counts each pair twice, once per direction; no self loops, no duplicates), to stand in for a real graph
    of that size. R-MAT draws land on ``2**ceil(log2(num_nodes))`` ids, scrambled and folded onto the
    ``num_nodes`` ids (each id takes one or two R-MAT ids, so the degree tail stays power-law); the distinct
    pairs of a few rounds of draws are kept until there are enough, then a seeded uniform subset of exactly the
    number needed. Every step is a tensor op on ``device``: seconds for 62M edges on a GPU."""
    generator = torch.Generator(device=device).manual_seed(seed)
    scale = max(1, (num_nodes - 1).bit_length())
    fold = torch.randperm(1 << scale, generator=generator, device=device) % num_nodes
    pairs = num_edges // 2 if undirected else num_edges
    keys = torch.empty(0, dtype=torch.long, device=device)
    draws = pairs + pairs // 2  # R-MAT repeats its hubs' pairs: more draws than pairs; topped up below if short
    while keys.numel() < pairs:
        src, dst = _folded_draws(draws, scale, probs, fold, generator, device)
        if undirected:
            src, dst = torch.minimum(src, dst), torch.maximum(src, dst)
        keep = src != dst
        drawn = src[keep] * num_nodes + dst[keep]
        del src, dst, keep  # a billion-edge graph: the draws are freed before the sort of the keys
        keys = torch.unique(torch.cat([keys, drawn]))
        del drawn
        draws = max(pairs - keys.numel(), 0) * 2 + 1024
    keys = keys[torch.randperm(keys.numel(), generator=generator, device=device)[:pairs]]
    src, dst = keys // num_nodes, keys % num_nodes
    edge_index = coalesce(src, dst, num_nodes, undirected=undirected)
    return Graph(name or f"rmat-like-{num_nodes}-{num_edges}", num_nodes, edge_index, "rmat")


def _folded_draws(count: int, scale: int, probs, fold, generator, device) -> tuple:
    """``count`` R-MAT ``(src, dst)`` draws on ``2**scale`` ids, folded through ``fold``."""
    a, b, c, _ = probs
    src = torch.zeros(count, dtype=torch.long, device=device)
    dst = torch.zeros(count, dtype=torch.long, device=device)
    for level in range(scale):
        r = torch.rand(count, generator=generator, device=device)
        src |= (r >= a + b).long() << level
        dst |= (((r >= a) & (r < a + b)) | (r >= a + b + c)).long() << level
    return fold[src], fold[dst]


def rmat_multi(num_nodes: int, num_edges: int, seed: int = 0, probs=(0.57, 0.19, 0.19, 0.05), device="cpu",
               chunk: int = 1 << 27) -> Graph:
    """Exactly ``num_edges`` directed R-MAT draws on ``num_nodes`` ids (folded as :func:`rmat_like` folds them),
    kept as drawn: a multigraph, with the duplicate pairs and self loops the draws give. Nothing is sorted or
    deduplicated, so a billion edges take their two index arrays (16 GB) and one ``chunk`` of draws at a time."""
    generator = torch.Generator(device=device).manual_seed(seed)
    scale = max(1, (num_nodes - 1).bit_length())
    fold = torch.randperm(1 << scale, generator=generator, device=device) % num_nodes
    edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
    for begin in range(0, num_edges, chunk):
        size = min(chunk, num_edges - begin)
        edge_index[0, begin:begin + size], edge_index[1, begin:begin + size] = \
            _folded_draws(size, scale, probs, fold, generator, device)
    return Graph(f"rmat-multi-{num_nodes}-{num_edges}", num_nodes, edge_index, "rmat")


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


def sbm(num_nodes: int, community: int, num_edges: int, inside: float = 0.9, seed: int = 0,
        device="cpu") -> Graph:
    """Stochastic block model with dense communities hidden by a random node order: nodes in consecutive
    communities of ``community`` nodes, ``inside`` of the ``num_edges / 2`` undirected draws between two
    members of one community (uniformly chosen), the rest between any two nodes; then coalesced (both
    directions, duplicates removed: a little fewer edges remain) and the node ids scrambled."""
    generator = torch.Generator(device=device).manual_seed(seed)
    draws = num_edges // 2
    intra = int(draws * inside)
    communities = num_nodes // community
    which = torch.randint(0, communities, (intra,), generator=generator, device=device) * community
    a = which + torch.randint(0, community, (intra,), generator=generator, device=device)
    b = which + torch.randint(0, community, (intra,), generator=generator, device=device)
    far = draws - intra
    a = torch.cat([a, torch.randint(0, num_nodes, (far,), generator=generator, device=device)])
    b = torch.cat([b, torch.randint(0, num_nodes, (far,), generator=generator, device=device)])
    scramble = torch.randperm(num_nodes, generator=generator, device=device)
    return Graph(f"sbm-{num_nodes}-c{community}", num_nodes, coalesce(scramble[a], scramble[b], num_nodes), "dense")


def batched_random(num_graphs: int, nodes_per_graph: int, edges_per_graph: int, seed: int = 0,
                   device="cpu") -> Graph:
    """A batch of small random graphs in batch order (each graph's nodes consecutive, as PyG's DataLoader
    concatenates them): ``edges_per_graph / 2`` undirected draws per graph, coalesced."""
    generator = torch.Generator(device=device).manual_seed(seed)
    draws = num_graphs * (edges_per_graph // 2)
    base = torch.arange(num_graphs, device=device).repeat_interleave(edges_per_graph // 2) * nodes_per_graph
    a = base + torch.randint(0, nodes_per_graph, (draws,), generator=generator, device=device)
    b = base + torch.randint(0, nodes_per_graph, (draws,), generator=generator, device=device)
    n = num_graphs * nodes_per_graph
    return Graph(f"batch-{num_graphs}x{nodes_per_graph}", n, coalesce(a, b, n), "dense")


TU_SETS = ("MUTAG", "PROTEINS", "ENZYMES", "AIDS", "Mutagenicity")


def tu_batch(data_root: str, min_graphs: int = 10_000) -> Graph:
    """The TU data sets of ``shared/data/TUDataset`` batched as PyG's DataLoader does (graphs one after
    another, node ids consecutive), the whole collection repeated until it holds ``min_graphs`` graphs."""
    pieces, offset, graphs = [], 0, 0
    while graphs < min_graphs:
        for name in TU_SETS:
            raw = os.path.join(data_root, "TUDataset", name, "raw")
            pairs = np.loadtxt(os.path.join(raw, f"{name}_A.txt"), delimiter=",", dtype=np.int64) - 1
            indicator = np.loadtxt(os.path.join(raw, f"{name}_graph_indicator.txt"), dtype=np.int64)
            pieces.append(torch.from_numpy(pairs) + offset)
            offset += len(indicator)
            graphs += int(indicator.max())
    pairs = torch.cat(pieces)
    return Graph(f"tu-batch-{graphs}", offset, coalesce(pairs[:, 0], pairs[:, 1], offset), "dense")


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
        "MUSAE-wikipedia-squirrel": ("squirrel_edges.csv", ",", 1),
        "SNAP-facebook_combined": ("facebook_combined.txt", None, 0),
    }
    file, delimiter, skip = files[name]
    pairs = _edges_from_text(os.path.join(d, file), delimiter, skip)
    return _relabel(pairs, name, "road-like" if name.startswith("road") else "real")


REAL_GRAPHS = ("Planetoid-Cora", "ca-AstroPh", "email-Enron", "MUSAE-github", "soc-Slashdot0902",
               "road-luxembourg-osm", "MUSAE-wikipedia-squirrel", "SNAP-facebook_combined")


# R-MAT corners for products-like: flatter than Graph500's (0.57, 0.19, 0.19, 0.05), which at this size leaves a
# quarter of the nodes without a neighbour (ogbn-products has almost none) and hubs far above its 17,481
PRODUCTS_LIKE_PROBS = (0.45, 0.22, 0.22, 0.11)


def graph_suite(names: list, data_root: str, device) -> list:
    """The graphs of these names, each generated (seeded) or read, with its size and the time it took on stderr."""
    out = []
    for name in names:
        start = time.perf_counter()
        out.append(_one_graph(name, data_root, device))
        print(f"graph {out[-1].name}: {out[-1].num_nodes} nodes, {out[-1].num_edges} edges, made in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out


def _one_graph(name: str, data_root: str, device) -> Graph:
    if name == "rmat-large":
        return rmat(20, 16_000_000, seed=0, device=device)
    if name == "products-like":  # ogbn-products' size: 2,449,029 nodes, 61,859,140 edges (undirected)
        return rmat_like(2_449_029, 61_859_140, undirected=True, probs=PRODUCTS_LIKE_PROBS, seed=0,
                         name=name, device=device)
    if name == "arxiv-like":  # ogbn-arxiv's size: 169,343 nodes, 1,166,243 directed edges
        return rmat_like(169_343, 1_166_243, undirected=False, seed=0, name=name, device=device)
    if name == "rmat-arxiv":
        return rmat(17, 1_150_000, seed=0, device=device)
    if name == "uniform-large":
        return uniform(1 << 20, 16_000_000, seed=0, device=device)
    if name == "grid-large":
        return grid(1024, device=device)
    if name == "sbm-dense":  # locally dense: communities of 32 in random order, 262k nodes, ~6.8M edges
        return sbm(1 << 18, 32, 11_000_000, seed=0, device=device)
    if name == "batch-random":  # locally dense: 20,000 graphs of 50 nodes in batch order, ~16.8M edges
        return batched_random(20_000, 50, 1_000, seed=0, device=device)
    if name == "tu-batch":
        return tu_batch(data_root)
    if name == "rmat-small":
        return rmat(10, 8_000, seed=0, device=device)
    if name.startswith("rmat-like-") and name.count("-") == 3:  # rmat-like-NODES-EDGES, directed
        nodes, edges = name.split("-")[2:]
        return rmat_like(int(nodes), int(edges), undirected=False, seed=0, name=name, device=device)
    if name.startswith("rmat-multi-") and name.count("-") == 3:  # rmat-multi-NODES-EDGES: a billion edges fit
        nodes, edges = name.split("-")[2:]
        return rmat_multi(int(nodes), int(edges), seed=0, device=device)
    if name.startswith("rmat-") and name.count("-") == 2:  # rmat-SCALE-EDGES, e.g. rmat-18-4000000
        scale, edges = name.split("-")[1:]
        return rmat(int(scale), int(edges), seed=0, device=device)
    return real(name, data_root)


SUITE = ["Planetoid-Cora", "ca-AstroPh", "MUSAE-github", "soc-Slashdot0902", "road-luxembourg-osm",
         "rmat-arxiv", "grid-large", "uniform-large", "rmat-large"]
