"""Which input of a Dynamo graph of changing sizes is what, for the padding of gnn_inductor/buckets.py.

The changing sizes of a sampled mini-batch are symbols of Dynamo's ShapeEnv: a node count per node type (the first
dimension of that type's features, ``[N_t, F]``) and an edge count per edge set (``edge_index [2, E_r]``).
:func:`layout_of` tags each symbol (``N`` and ``E`` where there is one of each, else ``N0``, ``N1`` ... and ``E0``
...), each input (an ``edge_index``, ``rows`` of a count, the count itself as an integer ``size``, or ``keep``) and
each output dimension to cut back, and finds for each ``edge_index`` the node count its row 0 (sources) and its row
1 (destinations) index: a padded edge must join a padded node of its source type to one of its destination type.

The rows' counts come from the graph's ATen ops (:func:`gnn_inductor.buckets_rows.row_counts`), in a homogeneous
mini-batch too (both rows then index its one node count): a graph of one changing node count can still index a
tensor of fixed size by a row (a bipartite layer whose sources Dynamo fixed at one node), where a padded edge would
point past its end. A row may also index node types concatenated (per-type maps, then ``torch.cat`` in
``to_homogeneous`` order, then one ``edge_index`` over the rows): :func:`concatenations` finds their order in the
graph, and the padding moves the real ids to where their rows are once each type is padded in its place.
"""
from __future__ import annotations

import collections
from typing import Callable, NamedTuple, Optional

import torch

from gnn_inductor.buckets_rows import edge_values_unsafe, row_counts, size_expr, size_symbol
from gnn_inductor.canonical import canonicalize, fake_inputs

aten = torch.ops.aten

# node metadata that holds values of the tracing's fake mode (and its ShapeEnv's symbols)
_TRACED_VALUES = ("example_value", "val", "tensor_meta", "unbacked_bindings")


def copy_module(gm: torch.fx.GraphModule, values: bool = True) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose graph can be rewritten in place (Inductor's passes do) without touching ``gm``'s; node
    metadata is shared, not copied, and without ``values`` the traced values are left out (a compile in another
    fake mode, whose data-dependent sizes must not meet Dynamo's symbols of the same names)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    if not values:
        for node in graph.nodes:
            node.meta = {k: v for k, v in node.meta.items() if k not in _TRACED_VALUES}
    return torch.fx.GraphModule(gm, graph)


class SizeSlots(NamedTuple):
    """Positions in a bucket key's sizes: the node counts', the edge counts', and for each node count's position the
    edge counts' positions whose padded edges end on its padded nodes (once per ``edge_index`` and end: an edge set
    between two node types loads both, one within a type loads it once, its padded edges being self loops)."""
    nodes: tuple
    edges: tuple
    loads: dict


# the sizes of a homogeneous mini-batch: (nodes, edges), every padded edge a self loop of a padded node
HOMOGENEOUS = SizeSlots((0,), (1,), {0: (1,)})


class Layout:
    """What each input of a Dynamo graph is for the padding: ``("edge_index", E)`` (``[2, E]`` integers), ``("rows",
    tag)`` (a tensor whose first dimension is the count ``tag``), ``("size", tag)`` (the count as an integer input),
    ``("scalar", None)`` (a 0-d CPU tensor the graph only reads as a number: a float module attribute such as
    GATConv's ``negative_slope`` or ``dropout``, which Dynamo passes as a tensor) or ``("keep", None)``. ``nodes``
    and ``edges`` map each tag to its symbol (one symbol: the tag ``N`` or ``E``);
    ``ends`` maps each ``edge_index`` input's position to the node tags of its rows 0 and 1 (by default the one node
    tag), an end being a tuple of tags where the row indexes node types concatenated in that order (the rows of a
    ``torch.cat`` of per-type tensors, as ``to_homogeneous`` orders them); ``out_dims`` lists per output its
    ``(dimension, tag or tuple of tags)`` pairs to cut back. A call's sizes, padded sizes and bucket key list the node
    counts, then the edge counts, in tag order. Built by :func:`layout_of`.

    In a concatenation each node type is padded in its own place, so the real ids of a concatenated row move: those
    of type ``t`` by the padded rows of the types before it (:meth:`pad`), and the padded edges land on the last
    type's padded rows."""

    def __init__(self, kinds: list, nodes, edges, out_dims: list, ends: Optional[dict] = None,
                 names: Optional[list] = None):
        self.kinds, self.out_dims = kinds, out_dims
        self.nodes = dict(nodes) if isinstance(nodes, dict) else {"N": nodes}
        self.edges = dict(edges) if isinstance(edges, dict) else {"E": edges}
        self.order = list(self.nodes) + list(self.edges)
        self.slot = {tag: i for i, tag in enumerate(self.order)}
        self.width = len(self.order)
        self.names = names or [f"input {i}" for i in range(len(kinds))]
        self.edge_inputs = [i for i, (kind, _) in enumerate(kinds) if kind == "edge_index"]
        self.scalars = {i for i, (kind, _) in enumerate(kinds) if kind == "scalar"}
        if ends is None:
            (node,) = self.nodes
            ends = {i: (node, node) for i in self.edge_inputs}
        self.ends = ends
        # the edge_index inputs whose padded nodes the graph takes as last inputs (set by buckets.redirect_filters)
        self.filtered = []
        self._ramps = {}  # (dtype, device) -> arange kept for :meth:`targets`
        self.count_at = {}  # tag -> (input position, kind) where a call's count is read
        for i, (kind, tag) in enumerate(kinds):
            if kind in ("rows", "edge_index", "size") and tag not in self.count_at:
                self.count_at[tag] = (i, kind)
        loads = {self.slot[tag]: [] for tag in self.nodes}
        for i in self.edge_inputs:
            for tag in dict.fromkeys(_landing(end) for end in self.ends[i]):
                loads[self.slot[tag]].append(self.slot[kinds[i][1]])
        self.slots = SizeSlots(tuple(range(len(self.nodes))), tuple(range(len(self.nodes), self.width)),
                               {i: tuple(edges) for i, edges in loads.items()})

    def sizes(self, args) -> tuple:
        """A call's counts, in the order of the bucket key."""
        counts = []
        for tag in self.order:
            i, kind = self.count_at[tag]
            counts.append(int(args[i]) if kind == "size" else args[i].shape[1 if kind == "edge_index" else 0])
        return tuple(counts)

    def key(self, args, sizes: tuple) -> tuple:
        """The compile key of a call: its padded sizes and everything else that fixes the compiled shapes."""
        rest = tuple(tuple(a.shape[1:]) if kind == "rows" else a.item() if kind == "scalar" else
                     (tuple(a.shape) if isinstance(a, torch.Tensor) else a)
                     for (kind, _), a in zip(self.kinds, args) if kind in ("rows", "keep", "scalar"))
        return sizes + rest

    def describe(self) -> list:
        """Per position of a bucket key's sizes, what it counts: its tag and the inputs of that count (an edge set's
        ``edge_index`` with its rows' node tags)."""
        out = []
        for tag in self.order:
            if tag in self.nodes:
                names = [self.names[i] for i, (kind, t) in enumerate(self.kinds) if t == tag and kind == "rows"]
            else:
                names = [f"{self.names[i]} ({' -> '.join(map(_named, self.ends[i]))})" for i in self.edge_inputs
                         if self.kinds[i][1] == tag]
            out.append(f"{tag}: {', '.join(names)}")
        return out

    def targets(self, args, counts: tuple, padded: tuple) -> dict:
        """Per ``edge_index`` input, ``[2, padded edges]`` padded node ids (its dtype and device): row ``r`` names
        padded nodes of row ``r``'s node type, in turn, one per edge slot. The last slots are the padded edges (a self
        loop where both rows are of one type); :func:`gnn_inductor.buckets.redirect_filters` sends the edges a filter
        drops to the others. The padded edges of all edge sets that end on one node type follow each other round
        its padded nodes, so none gets more than its share (``SizeSlots.loads``). Only the padded edges' slots are made
        (the real edges keep their own ids), but for the inputs the graph also takes whole (:attr:`filtered`)."""
        out, next_at = {}, {}
        for i in self.edge_inputs:
            edges, slot = counts[self.slot[self.kinds[i][1]]], self.slot[self.kinds[i][1]]
            first = 0 if i in self.filtered else edges
            ramp = self._ramp(padded[slot], args[i])[first:]
            rows = {}
            for end in self.ends[i]:
                if end in rows:
                    continue
                tag = _landing(end)
                nodes = counts[self.slot[tag]] + self._before(end, padded)
                start = next_at[tag] - edges if tag in next_at else 0
                next_at[tag] = start + padded[slot]
                span = padded[self.slot[tag]] - counts[self.slot[tag]]
                # from the kept ramp itself where it starts at 0 (a launch fewer), never in place on it
                turn = (ramp + start).remainder_(span) if start else ramp.remainder(span)
                rows[end] = turn.add_(nodes)
            ends = self.ends[i]
            if ends[0] == ends[1] and i not in self.filtered:
                # both rows of one node type: one row viewed twice, which the padding's cat copies (an input the
                # graph takes whole stays a tensor of its own: the CUDA graphs copy inputs into static buffers)
                out[i] = rows[ends[0]].expand(2, -1)
            else:
                out[i] = torch.stack([rows[t] for t in ends])
        return out

    def _before(self, end, padded: tuple) -> int:
        """Where the landing type of ``end`` starts among the padded rows of its concatenation (0 for one type)."""
        return sum(padded[self.slot[t]] for t in end[:-1]) if isinstance(end, tuple) else 0

    def _moved(self, edge_index: torch.Tensor, i: int, counts: tuple, padded: tuple) -> torch.Tensor:
        """``edge_index`` (input ``i``) with the ids of its concatenated rows moved to the padded layout: an id of
        type ``t`` up by the padded rows of the types before ``t``, ``sum_{s < t} (padded_s - count_s)``, one
        comparison with each type's first id (Python numbers: nothing copied to the device)."""
        rows = []
        for end, row in zip(self.ends[i], edge_index):
            if isinstance(end, tuple):
                first, moved = 0, row
                for before in end[:-1]:
                    first += counts[self.slot[before]]
                    shift = padded[self.slot[before]] - counts[self.slot[before]]
                    if shift:
                        moved = moved + (row >= first).to(row.dtype) * shift
                row = moved
            rows.append(row)
        return torch.stack(rows)

    def _ramp(self, length: int, like: torch.Tensor) -> torch.Tensor:
        """``arange(length)`` in ``like``'s dtype and device, a view of one kept per dtype and device: a step pads
        its edge sets without an ``arange`` each (on a heterogeneous batch of seven edge sets that was 22 launches
        per step, the host's largest item after the compiled call)."""
        key = (like.dtype, like.device)
        ramp = self._ramps.get(key)
        if ramp is None or ramp.numel() < length:
            ramp = self._ramps[key] = torch.arange(length, dtype=like.dtype, device=like.device)
        return ramp[:length]

    def pad(self, args, counts: tuple, padded: tuple, targets: Optional[dict] = None) -> list:
        """``args`` of ``counts`` padded to ``padded``: padded rows replicate row 0 (zeros where there is none), and
        the padded edges are the last slots of :meth:`targets` (made here unless given)."""
        targets = self.targets(args, counts, padded) if targets is None else targets
        out = []
        for i, ((kind, tag), arg) in enumerate(zip(self.kinds, args)):
            if kind == "size":
                out.append(padded[self.slot[tag]])
            elif kind == "edge_index":
                ends = targets[i]
                if any(isinstance(end, tuple) for end in self.ends[i]):
                    arg = self._moved(arg, i, counts, padded)
                out.append(torch.cat([arg, ends[:, ends.shape[1] - (padded[self.slot[tag]] - arg.shape[1]):]], dim=1))
            elif kind == "rows":
                count = padded[self.slot[tag]] - counts[self.slot[tag]]
                if arg.shape[0] == 0:  # nothing to replicate: zeros (an empty edge set's attributes)
                    out.append(torch.cat([arg, arg.new_zeros((count,) + tuple(arg.shape[1:]))]))
                else:
                    out.append(torch.cat([arg, arg[:1].expand((count,) + tuple(arg.shape[1:]))]))
            else:
                out.append(arg)
        return out

    def trim(self, outputs, counts: tuple, padded: tuple):
        """The outputs of a padded call (at ``padded`` sizes) cut back to the call's ``counts``: a concatenation of
        node types to each type's real rows, in order."""
        trimmed = []
        for value, dims in zip(outputs, self.out_dims):
            if isinstance(value, torch.Tensor):
                for dim, tag in dims:
                    if isinstance(tag, tuple):
                        starts = [self._before(tag[:k + 1], padded) for k in range(len(tag))]
                        value = torch.cat([value.narrow(dim, start, counts[self.slot[t]])
                                           for start, t in zip(starts, tag)], dim)
                    else:
                        value = value.narrow(dim, 0, counts[self.slot[tag]])
            elif dims:
                value = counts[self.slot[dims[0][1]]]
            trimmed.append(value)
        return type(outputs)(trimmed) if isinstance(outputs, tuple) else trimmed


def _landing(end) -> str:
    """The node tag an end's padded edges land on: the type itself, or the last of a concatenation."""
    return end[-1] if isinstance(end, tuple) else end


def _named(end) -> str:
    return " + ".join(end) if isinstance(end, tuple) else end


def _is_edge_index(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point() \
        and value.dtype != torch.bool and value.shape[0] == 2 and size_symbol(value.shape[1]) is not None


def _read_as_number(node: torch.fx.Node, value) -> bool:
    """Whether a placeholder is a 0-d CPU tensor that the graph only reads with ``.item()``."""
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu" and \
        bool(node.users) and all(u.op == "call_method" and u.target == "item" for u in node.users)


def _tagged(symbols: list, letter: str) -> dict:
    return {letter if len(symbols) == 1 else f"{letter}{i}": s for i, s in enumerate(symbols)}


def layout_of(gm: torch.fx.GraphModule, canonical: Optional[Callable] = None) -> tuple:
    """``(Layout, None)`` for a Dynamo graph whose inputs can be padded, else ``(None, why)``. ``canonical()`` gives
    the graph's ATen form where the rows' node types must be found (by default ``canonicalize`` of a copy)."""
    example_inputs = fake_inputs(gm)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    edge_syms = list(dict.fromkeys(size_symbol(v.shape[1]) for v in example_inputs if _is_edge_index(v)))
    if not edge_syms:
        return None, "no edge_index of a changing size among the inputs"
    node_syms = list(dict.fromkeys(size_symbol(v.shape[0]) for v in example_inputs
                                   if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.is_floating_point()
                                   and size_symbol(v.shape[0]) not in [None] + edge_syms))
    if not node_syms:
        return None, "no node features of a changing size among the inputs"
    nodes, edges = _tagged(node_syms, "N"), _tagged(edge_syms, "E")
    tags = {s: tag for tag, s in list(nodes.items()) + list(edges.items())}
    kinds, edge_values = [], []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if _read_as_number(node, value):
            kinds.append(("scalar", None))
        elif isinstance(value, torch.SymInt):
            expr = size_expr(value)
            if expr in tags:
                kinds.append(("size", tags[expr]))
            elif expr.free_symbols & set(tags):
                return None, f"an integer input {expr} computed from the node or edge counts"
            else:
                kinds.append(("keep", None))
        elif isinstance(value, torch.Tensor):
            exprs = [size_expr(d) for d in value.shape]
            tagged = [i for i, e in enumerate(exprs) if e.free_symbols & set(tags)]
            if not tagged:
                kinds.append(("keep", None))
            elif _is_edge_index(value) and exprs[1] in edges.values():
                kinds.append(("edge_index", tags[exprs[1]]))
            elif tagged == [0] and exprs[0] in tags and value.is_floating_point():
                kinds.append(("rows", tags[exprs[0]]))
            elif tagged == [0] and exprs[0] in edges.values() and value.dtype != torch.bool:
                # integers per edge (RGCNConv's edge_type): padded like any edge rows, by row 0's value, which
                # :func:`edge_values_unsafe` checks that no real output can tell from another edge's
                kinds.append(("rows", tags[exprs[0]]))
                edge_values.append(len(kinds) - 1)
            elif not value.is_floating_point():
                return None, (f"an integer input of shape {tuple(exprs)} besides edge_index (node ids or a batch "
                              f"vector): its padded entries would need values that change no output")
            else:
                return None, f"an input of shape {tuple(exprs)} whose node or edge count is not its first dimension"
        else:
            kinds.append(("keep", None))
    edge_inputs = [i for i, (kind, _) in enumerate(kinds) if kind == "edge_index"]
    counted = collections.defaultdict(list)  # symbol -> the inputs whose rows (or edges) it counts
    for i, (kind, tag) in enumerate(kinds):
        if kind in ("rows", "edge_index"):
            counted[nodes.get(tag, edges.get(tag))].append(names[i])

    def label(expr) -> str:
        if expr in counted:
            return f"{expr} ({', '.join(counted[expr])})"
        return f"{expr} (counts added: inputs concatenated)" if len(expr.free_symbols) > 1 else str(expr)
    aten_gm = (canonical or (lambda: canonicalize(copy_module(gm))))()
    rows, why = row_counts(aten_gm, edge_inputs, names, label)
    if why:
        return None, why
    why = edge_values_unsafe(aten_gm, edge_values, names, set(tags))
    if why:
        return None, why
    orders = concatenations(aten_gm, nodes)
    out_dims, why = _output_dims(gm, tags, orders)
    if why:
        return None, why
    ends = {}
    for i in edge_inputs:
        for r in (0, 1):
            if rows[i, r] in orders:
                continue
            if tags.get(rows[i, r]) not in nodes:
                kind = "an edge count" if rows[i, r] in edges.values() else (
                    "a fixed size (a node count Dynamo traced as a constant: 0 or 1, or one that had not changed)"
                    if not rows[i, r].free_symbols else "not one node type's changing count")
                return None, f"row {r} of {names[i]} indexes rows counted by {label(rows[i, r])}, {kind}"
        ends[i] = tuple(orders.get(rows[i, r]) or tags[rows[i, r]] for r in (0, 1))
    return Layout(kinds, nodes, edges, out_dims, ends, names), None


def concatenations(aten_gm: torch.fx.GraphModule, nodes: dict) -> dict:
    """``{count: tags}`` for each sum of node counts that the graph concatenates along rows (``torch.cat`` of tensors
    of one node type each, every type once), the tags in the order of the concatenation. A sum concatenated in two
    orders is left out (its rows' types are ambiguous)."""
    symbols = {symbol: tag for tag, symbol in nodes.items()}
    found = collections.defaultdict(set)
    for node in aten_gm.graph.nodes:
        if node.target is not aten.cat.default:
            continue
        values = [part.meta.get("val") for part in node.args[0]]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(values) < 2 or not all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in values) \
                or dim % values[0].dim() != 0:
            continue
        parts = [size_expr(v.shape[0]) for v in values]
        if all(p in symbols for p in parts) and len(set(parts)) == len(parts):
            found[sum(parts[1:], parts[0])].add(tuple(symbols[p] for p in parts))
    return {count: next(iter(orders)) for count, orders in found.items() if len(orders) == 1}


def _output_dims(gm, tags: dict, orders: dict) -> tuple:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    dims = []
    for value in torch.fx.node.map_aggregate(output.args[0], lambda n: n.meta.get("example_value")
                                             if isinstance(n, torch.fx.Node) else n):
        if isinstance(value, torch.Tensor):
            here = []
            for i, size in enumerate(value.shape):
                expr = size_expr(size)
                if expr in tags:
                    here.append((i, tags[expr]))
                elif expr in orders:
                    here.append((i, orders[expr]))
                elif expr.free_symbols & set(tags):
                    return None, f"an output of shape {tuple(value.shape)}: a size computed from the node count"
            dims.append(here)
        elif isinstance(value, torch.SymInt) and size_expr(value) in tags:
            dims.append([(0, tags[size_expr(value)])])
        else:
            dims.append([])
    return dims, None
