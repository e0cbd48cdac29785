"""Neighbour sampling as PyG's ``NeighborLoader`` does it, in vectorised torch on the CPU or a GPU.

PyG's ``NeighborLoader`` (torch_geometric/loader/neighbor_loader.py) hands the work to ``NeighborSampler``
(torch_geometric/sampler/neighbor_sampler.py), which calls pyg-lib's ``neighbor_sample`` on the graph's CSC (in-
neighbour lists by destination, ``sampler/utils.py: to_csc``). Neither pyg-lib nor torch-sparse installs here,
so :func:`neighbor_sample` reproduces that sampler for the homogeneous default (``replace=False``,
``disjoint=False``, ``subgraph_type="directional"``, no time, no edge weights):

* the seeds come first, in the order given (local ids ``0 .. batch_size - 1``);
* per hop, each frontier node (the previous hop's new nodes, in their local order) takes in-neighbours from
  its CSC neighbour list: all of them when ``fanout < 0`` or ``fanout >= in-degree``, in CSC order; otherwise
  ``fanout`` distinct ones by Robert Floyd's algorithm, the one pyg-lib runs (for ``i`` in ``deg - k .. deg - 1``:
  draw ``r`` uniformly in ``[0, i]``; if ``r`` was drawn already take ``i``), in the order drawn; fanout 0 takes none;
* the edges are emitted destination by destination in the frontier's order, each destination's sampled
  in-neighbours together, hop after hop; a source node met for the first time gets the next local id, so the
  nodes are numbered seeds first, then each hop's new nodes in the order the sampler meets them;
* ``edge_index = [local source (row), local destination (col)]``: pyg-lib's ``(row, col)`` with ``csc=True``,
  stacked as ``filter_data`` stacks them; ``n_id``, ``e_id`` (edge positions in the ``edge_index`` the CSC was
  built from), ``batch_size`` and the per-hop counts ``num_sampled_nodes`` (seeds first) and
  ``num_sampled_edges``, as the ``Data`` that ``NeighborLoader`` yields carries them.

:func:`hetero_neighbor_sample` does the same per edge type for a heterogeneous graph (one fanout list for every
edge type), as pyg-lib's heterogeneous sampler does for ``NeighborLoader`` on a ``HeteroData``.

What differs: the random stream (torch's generator, ``floor(U * (i + 1))`` from float64 uniforms, not pyg-lib's
``RandintEngine``), so the subgraphs are pyg-lib's in distribution and in every ordering rule, not draw for
draw. The CSC lists each destination's sources in ascending id: what PyG's stable ``index_sort`` by destination
gives for a coalesced (row-sorted) ``edge_index``. The loop runs over hops and over the fanout's draws, never over
nodes; per hop it costs the sampled edges plus ``fanout**2`` compares per node above the fanout, and a few host
syncs (sizes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Csc:
    """In-neighbour lists: ``row[colptr[v]:colptr[v + 1]]`` are the sources of the edges into ``v``, ascending;
    ``perm`` maps a CSC position back to its column in the ``edge_index`` the lists were built from."""
    colptr: torch.Tensor
    row: torch.Tensor
    perm: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.colptr.numel()) - 1

    @property
    def device(self) -> torch.device:
        return self.colptr.device

    def to(self, device) -> "Csc":
        return Csc(self.colptr.to(device), self.row.to(device), self.perm.to(device))


def to_csc(edge_index: torch.Tensor, num_nodes: int, device=None, num_src: int | None = None) -> Csc:
    """The CSC of ``edge_index`` (``[source, destination]``, ``num_nodes`` destinations; ``num_src`` sources, by
    default as many: a bipartite relation has its own) on ``device`` (default: where ``edge_index`` is)."""
    edge_index = edge_index.to(device) if device is not None else edge_index
    src, dst = edge_index[0].long(), edge_index[1].long()
    _, perm = torch.sort(dst * (num_nodes if num_src is None else num_src) + src)
    counts = torch.bincount(dst, minlength=num_nodes)
    colptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    torch.cumsum(counts, 0, out=colptr[1:])
    return Csc(colptr, src[perm], perm)


@dataclass
class SampledBatch:
    """One mini-batch, the fields of the ``Data`` that PyG's ``NeighborLoader`` yields for a homogeneous graph
    (``x`` and ``y`` are gathered by the caller from ``n_id``)."""
    n_id: torch.Tensor
    e_id: torch.Tensor
    edge_index: torch.Tensor
    batch_size: int
    num_sampled_nodes: list = field(default_factory=list)
    num_sampled_edges: list = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())

    def to(self, device, non_blocking: bool = False) -> "SampledBatch":
        return SampledBatch(self.n_id.to(device, non_blocking=non_blocking),
                            self.e_id.to(device, non_blocking=non_blocking),
                            self.edge_index.to(device, non_blocking=non_blocking), self.batch_size,
                            self.num_sampled_nodes, self.num_sampled_edges)


def floyd_sample(population: torch.Tensor, count: int, generator) -> torch.Tensor:
    """``[len(population), count]``: per row, ``count`` distinct offsets in ``[0, population)`` drawn by Robert
    Floyd's algorithm in its draw order (every row's population is above ``count``)."""
    picks = torch.empty((population.numel(), count), dtype=torch.long, device=population.device)
    for j in range(count):
        top = population - count + j  # this draw's i: uniform in [0, i], or i itself if taken already
        r = (torch.rand(population.numel(), dtype=torch.float64, generator=generator, device=population.device)
             * (top + 1)).long().minimum(top)
        if j:
            r = torch.where((picks[:, :j] == r[:, None]).any(1), top, r)
        picks[:, j] = r
    return picks


def _hop(csc: Csc, frontier: torch.Tensor, count: int, generator) -> tuple:
    """One hop from ``frontier`` (destination ids): ``(position, target)``, the CSC positions of the sampled
    in-edges and the index in ``frontier`` of each one's destination, destination by destination, each's sampled
    in-neighbours in CSC order or, above ``count``, in Floyd's draw order."""
    device = csc.device
    start = csc.colptr[frontier]
    degree = csc.colptr[frontier + 1] - start
    take = degree if count < 0 else degree.clamp(max=count)
    total = int(take.sum())
    target = torch.repeat_interleave(torch.arange(frontier.numel(), device=device), take, output_size=total)
    slot = torch.arange(total, device=device) - (torch.cumsum(take, 0) - take)[target]
    position = start[target] + slot  # the CSC position: all neighbours in CSC order ...
    if count > 0:
        heavy = degree > count
        heavy_rows = heavy.nonzero().squeeze(1)
        if heavy_rows.numel():  # ... or, above the fanout, Floyd's draws in their order
            picks = floyd_sample(degree[heavy_rows], count, generator)
            which = torch.full((frontier.numel(),), -1, dtype=torch.long, device=device)
            which[heavy_rows] = torch.arange(heavy_rows.numel(), device=device)
            drawn = heavy[target]
            position[drawn] = start[target[drawn]] + picks[which[target[drawn]], slot[drawn]]
    return position, target


def _number_new(source: torch.Tensor, local: torch.Tensor, first: torch.Tensor, offset: int) -> torch.Tensor:
    """The nodes of ``source`` without a local id yet (``local < 0``), in the order the edges meet them, numbered
    from ``offset`` in ``local``; ``first`` is scratch of ``local``'s size."""
    candidate = source[local[source] < 0]
    order = torch.arange(candidate.numel(), device=source.device)
    first[candidate] = candidate.numel()
    first.scatter_reduce_(0, candidate, order, "amin")
    new = candidate[first[candidate] == order]
    local[new] = torch.arange(offset, offset + new.numel(), device=source.device)
    return new


def neighbor_sample(csc: Csc, seeds: torch.Tensor, num_neighbors: list, generator=None) -> SampledBatch:
    """Sample the ``len(num_neighbors)``-hop neighbourhood of ``seeds`` (distinct node ids) on ``csc``'s device,
    as pyg-lib's ``neighbor_sample`` does for ``NeighborLoader`` (the module's docstring says what matches).
    ``generator``: a ``torch.Generator`` on that device (None: torch's default)."""
    device, n = csc.device, csc.num_nodes
    seeds = seeds.to(device=device, dtype=torch.long)
    local = torch.full((n,), -1, dtype=torch.long, device=device)  # global id -> local id, -1: not sampled yet
    first = torch.empty(n, dtype=torch.long, device=device)  # scratch: first position of a new node in a hop
    local[seeds] = torch.arange(seeds.numel(), device=device)
    nodes, sources, targets, edge_ids = [seeds], [], [], []
    num_sampled_nodes, num_sampled_edges = [int(seeds.numel())], []
    frontier, begin = seeds, 0
    for count in num_neighbors:
        position, target = _hop(csc, frontier, count, generator)
        source = csc.row[position]
        new = _number_new(source, local, first, sum(num_sampled_nodes))
        nodes.append(new)
        sources.append(local[source])
        targets.append(target + begin)
        edge_ids.append(csc.perm[position])
        num_sampled_nodes.append(int(new.numel()))
        num_sampled_edges.append(int(position.numel()))
        begin += frontier.numel()
        frontier = new
    empty = torch.empty(0, dtype=torch.long, device=device)
    edge_index = torch.stack([torch.cat(sources or [empty]), torch.cat(targets or [empty])])
    return SampledBatch(torch.cat(nodes), torch.cat(edge_ids or [empty]), edge_index, int(seeds.numel()),
                        num_sampled_nodes, num_sampled_edges)


@dataclass
class HeteroSampledBatch:
    """One heterogeneous mini-batch, the fields of the ``HeteroData`` that ``NeighborLoader`` yields: per node type
    the global ids in local order (``n_id``; the seeds first in ``input_type``), per edge type the local
    ``edge_index`` and the edge positions ``e_id``."""
    n_id: dict
    edge_index: dict
    e_id: dict
    input_type: str
    batch_size: int


def hetero_neighbor_sample(cscs: dict, num_nodes: dict, input_type: str, seeds: torch.Tensor, num_neighbors: list,
                           generator=None) -> HeteroSampledBatch:
    """Sample the ``len(num_neighbors)``-hop neighbourhood of ``seeds`` (distinct ids of ``input_type``) over the
    edge types of ``cscs`` (``(src, rel, dst)`` -> the :class:`Csc` of that relation, ``num_nodes[dst]`` columns,
:func:`to_csc` with ``num_src=num_nodes[src]``), as
    pyg-lib's heterogeneous ``neighbor_sample`` does for ``NeighborLoader`` with the same fanout for every edge type:
    per hop and per edge type in ``cscs``'s order, each destination node first met in the previous hop (the seeds in
    the first) takes in-neighbours by that relation as :func:`neighbor_sample` does; a source node met for the first
    time gets the next local id of its type and joins the next hop's frontier of its type. The random stream differs
    from pyg-lib's as the module's docstring says."""
    device = next(iter(cscs.values())).device
    seeds = seeds.to(device=device, dtype=torch.long)
    local = {t: torch.full((n,), -1, dtype=torch.long, device=device) for t, n in num_nodes.items()}
    first = {t: torch.empty(n, dtype=torch.long, device=device) for t, n in num_nodes.items()}
    local[input_type][seeds] = torch.arange(seeds.numel(), device=device)
    nodes = {t: [] for t in num_nodes}
    nodes[input_type].append(seeds)
    counts = {t: 0 for t in num_nodes}
    counts[input_type] = int(seeds.numel())
    edges = {e: ([], [], []) for e in cscs}
    empty = torch.empty(0, dtype=torch.long, device=device)
    frontier = {t: (seeds, 0) if t == input_type else (empty, 0) for t in num_nodes}  # (ids, first local id)
    for count in num_neighbors:
        new_nodes = {t: [] for t in num_nodes}
        for (src, rel, dst), csc in cscs.items():
            ids, begin = frontier[dst]
            if not ids.numel():
                continue
            position, target = _hop(csc, ids, count, generator)
            source = csc.row[position]
            new = _number_new(source, local[src], first[src], counts[src])
            counts[src] += int(new.numel())
            new_nodes[src].append(new)
            sources, targets, edge_ids = edges[src, rel, dst]
            sources.append(local[src][source])
            targets.append(target + begin)
            edge_ids.append(csc.perm[position])
        for t, added in new_nodes.items():
            start = sum(int(n.numel()) for n in nodes[t])
            nodes[t].extend(added)
            frontier[t] = (torch.cat(added) if added else empty, start)
    edge_index = {e: torch.stack([torch.cat(s or [empty]), torch.cat(d or [empty])]) for e, (s, d, _) in edges.items()}
    e_id = {e: torch.cat(i or [empty]) for e, (_, _, i) in edges.items()}
    return HeteroSampledBatch({t: torch.cat(n or [empty]) for t, n in nodes.items()}, edge_index, e_id, input_type,
                              int(seeds.numel()))
