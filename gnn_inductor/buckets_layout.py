"""Which input of a Dynamo graph of changing sizes is what, for the padding of gnn_inductor/buckets.py.

The changing sizes of a sampled mini-batch are symbols of Dynamo's ShapeEnv: a node count per node type (the first
dimension of that type's features, ``[N_t, F]``) and an edge count per edge set (``edge_index [2, E_r]``).
:func:`layout_of` tags each symbol (``N`` and ``E`` where there is one of each, else ``N0``, ``N1`` ... and ``E0``
...), each input (an ``edge_index``, ``rows`` of a count, the count itself as an integer ``size``, or ``keep``) and
each output dimension to cut back, and finds for each ``edge_index`` the node count its row 0 (sources) and its row
1 (destinations) index: a padded edge must join a padded node of its source type to one of its destination type.

The rows' counts come from the graph's ATen ops (:func:`row_counts`), in a homogeneous mini-batch too (both rows
then index its one node count): a graph of one changing node count can still index a tensor of fixed size by a
row (a bipartite layer whose sources Dynamo fixed at one node), where a padded edge would point past its end.
"""
from __future__ import annotations

import collections
import operator
from typing import Callable, NamedTuple, Optional

import sympy
import torch

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


def size_expr(size):
    """A size (an int or a SymInt) as a sympy expression."""
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def size_symbol(size) -> Optional[sympy.Symbol]:
    """The symbol a size is, or None (a constant or an expression of symbols)."""
    expr = size_expr(size)
    return expr if isinstance(expr, sympy.Symbol) else None


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
    tag); ``out_dims`` lists per output its ``(dimension, tag)`` pairs to cut back. A call's sizes, padded sizes and
    bucket key list the node counts, then the edge counts, in tag order. Built by :func:`layout_of`."""

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
            for tag in dict.fromkeys(self.ends[i]):
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
                names = [f"{self.names[i]} ({' -> '.join(self.ends[i])})" for i in self.edge_inputs
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
            for tag in self.ends[i]:
                if tag in rows:
                    continue
                nodes = counts[self.slot[tag]]
                start = next_at[tag] - edges if tag in next_at else 0
                next_at[tag] = start + padded[slot]
                span = padded[self.slot[tag]] - nodes
                # from the kept ramp itself where it starts at 0 (a launch fewer), never in place on it
                turn = (ramp + start).remainder_(span) if start else ramp.remainder(span)
                rows[tag] = turn.add_(nodes)
            ends = self.ends[i]
            if ends[0] == ends[1] and i not in self.filtered:
                # both rows of one node type: one row viewed twice, which the padding's cat copies (an input the
                # graph takes whole stays a tensor of its own: the CUDA graphs copy inputs into static buffers)
                out[i] = rows[ends[0]].expand(2, -1)
            else:
                out[i] = torch.stack([rows[t] for t in ends])
        return out

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

    def trim(self, outputs, counts: tuple):
        """The outputs of a padded call cut back to the call's ``counts``."""
        trimmed = []
        for value, dims in zip(outputs, self.out_dims):
            if isinstance(value, torch.Tensor):
                for dim, tag in dims:
                    value = value.narrow(dim, 0, counts[self.slot[tag]])
            elif dims:
                value = counts[self.slot[dims[0][1]]]
            trimmed.append(value)
        return type(outputs)(trimmed) if isinstance(outputs, tuple) else trimmed


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
    out_dims, why = _output_dims(gm, tags)
    if why:
        return None, why
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
    ends = {}
    for i in edge_inputs:
        for r in (0, 1):
            if tags.get(rows[i, r]) not in nodes:
                kind = "an edge count" if rows[i, r] in edges.values() else (
                    "a fixed size (a node count Dynamo traced as a constant: 0 or 1, or one that had not changed)"
                    if not rows[i, r].free_symbols else "not one node type's changing count")
                return None, f"row {r} of {names[i]} indexes rows counted by {label(rows[i, r])}, {kind}"
        ends[i] = (tags[rows[i, 0]], tags[rows[i, 1]])
    return Layout(kinds, nodes, edges, out_dims, ends, names), None


def _output_dims(gm, tags: dict) -> tuple:
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
                elif expr.free_symbols & set(tags):
                    return None, f"an output of shape {tuple(value.shape)}: a size computed from the node count"
            dims.append(here)
        elif isinstance(value, torch.SymInt) and size_expr(value) in tags:
            dims.append([(0, tags[size_expr(value)])])
        else:
            dims.append([])
    return dims, None


# ---- which node count each edge_index row indexes ---------------------------------------------------------------

# ops that address rows of their first argument by an index tensor along a dimension argument: (self, dim, index)
_DIM_INDEXED = {
    aten.index_select.default, aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
    aten.scatter.value_reduce, aten.scatter_add.default, aten.scatter_reduce.two, aten.index_add.default,
    aten.index_copy.default, aten.index_reduce.default, aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
}
# ops that address dimensions of their first argument by a list of index tensors (None: a whole dimension)
_LIST_INDEXED = {aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default}
# ops whose outputs are positions or counts, not the ids they read
_POSITIONS_OUT = {aten.nonzero.default, aten.argsort.default, aten.argsort.stable, aten.argmax.default,
                  aten.argmin.default, aten.searchsorted.Tensor, aten.bincount.default}
# ops whose first output holds the ids they read and whose others hold positions or counts
_FIRST_OUTPUT_IDS = {aten.sort.default, aten.sort.stable, aten.topk.default, aten.max.dim, aten.min.dim,
                     aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
                     aten.kthvalue.default, aten.mode.default, aten.median.dim}
# ops that keep the order of a [2, E] tensor's rows where their dimension argument is not 0
_DIM_KEEPING = {aten.select.int: 1, aten.slice.Tensor: 1, aten.narrow.default: 1, aten.index_select.default: 1,
                aten.cat.default: 1, aten.unsqueeze.default: 1, aten.squeeze.dim: 1}
# ops that keep it where the output's first dimension is still the two rows
_SHAPE_KEEPING = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
                  aten.clone.default, aten._to_copy.default, aten.detach.default, aten.alias.default,
                  aten.contiguous.default, aten.lift_fresh_copy.default, aten.where.self}
# the rows an entry of the walk stands for: row 0, row 1, both in order (the [2, E] tensor), both in an unknown order
_ROWS = {0: (0,), 1: (1,), "both": (0, 1), "any": (0, 1)}


def _rows_carried(carried) -> frozenset:
    """What a walked value carries: a set, or per output of a multi-output op a list of sets (all of them)."""
    if isinstance(carried, list):
        return frozenset().union(*carried)
    return carried or frozenset()


def _arg(node, position: int, name: str, default=None):
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _index_uses(node) -> list:
    """``(index argument, size it addresses)`` for each index tensor ``node`` uses to address rows."""
    target = node.target
    if target in _DIM_INDEXED:
        source = _val(node.args[0])
        return [(_arg(node, 2, "index"), source.shape[_arg(node, 1, "dim") % source.dim()])]
    if target in _LIST_INDEXED:
        source, uses, dim = _val(node.args[0]), [], 0
        for index in _arg(node, 1, "indices"):
            value = _val(index)
            if value is None:
                dim += 1
            elif value.dtype in (torch.bool, torch.uint8):  # a mask spans its own dimensions and addresses none
                dim += value.dim()
            else:
                uses.append((index, source.shape[dim]))
                dim += 1
        return uses
    if target is aten.embedding.default:
        return [(node.args[1], _val(node.args[0]).shape[0])]
    if target is aten.bincount.default:
        return [(node.args[0], node.meta["val"].shape[0])]
    if target is aten.take.default:
        return [(node.args[1], _val(node.args[0]).numel())]
    return []


def _keeps_row_order(node, out) -> bool:
    """Whether ``node`` keeps row 0 of a ``[2, E]`` argument as row 0 of its output."""
    if not (isinstance(out, torch.Tensor) and out.dim() >= 1 and out.shape[0] == 2):
        return False
    first = _val(node.args[0][0] if node.target is aten.cat.default else
                 node.args[1] if node.target is aten.where.self else node.args[0])
    if first is None or first.dim() == 0:
        return False
    if node.target in _DIM_KEEPING:
        dim = _arg(node, _DIM_KEEPING[node.target], "dim", 0)
        return dim % (out.dim() if node.target is aten.unsqueeze.default else first.dim()) != 0
    if node.target in (aten.index.Tensor, aten._unsafe_index.Tensor):
        return _arg(node, 1, "indices")[0] is None
    shape_keeping = node.target in _SHAPE_KEEPING or (isinstance(node.target, torch._ops.OpOverload)
                                                      and torch.Tag.pointwise in node.target.tags)
    return shape_keeping and first.shape[0] == 2 and (first.dim() == out.dim() or node.target in (
        aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default))


def _carried(node, data: set, out, position) -> frozenset:
    """The edge rows whose ids output ``position`` of ``node`` (None: its only output) carries, from ``data``, the
    rows its non-index arguments carry."""
    if not isinstance(out, torch.Tensor) or out.dtype == torch.bool or node.target in _POSITIONS_OUT:
        return frozenset()
    if node.target in _FIRST_OUTPUT_IDS and position not in (None, 0):
        return frozenset()
    carried = set()
    for edge_input, row in data:
        if row != "both":
            carried.add((edge_input, row))
        elif node.target is aten.select.int and _arg(node, 1, "dim") % _val(node.args[0]).dim() == 0 \
                and isinstance(node.args[2], int):
            carried.add((edge_input, node.args[2] % 2))
        elif node.target is aten.unbind.int and _arg(node, 1, "dim", 0) == 0 and position is not None:
            carried.add((edge_input, position % 2))
        else:
            carried.add((edge_input, "both" if _keeps_row_order(node, out) else "any"))
    return frozenset(carried)


def row_counts(aten_gm: torch.fx.GraphModule, edge_inputs: list, names: list, label: Callable = str) -> tuple:
    """``({(input position, row): size expression}, None)``: the count each row of each ``edge_index`` input indexes
    in ``aten_gm`` (the graph's canonical ATen form), or ``(None, why)``.

    Every tensor computed from an ``edge_index`` row carries the row along (through any op, but not through an
    index argument, a boolean result, or an output of positions such as ``nonzero``'s or ``sort``'s indices); the
    two rows of the whole ``[2, E]`` tensor stay apart while an op keeps its first dimension as it is. Each op that
    uses a carrying tensor as an index (``index_select``, ``x[idx]``, ``gather``, the scatters, ``index_add``,
    ``embedding``, ``bincount``) says the row addresses the size of the indexed dimension. A row must address one
    size, whatever it is (the caller checks that it is a node count); ``label`` names a size in the reason."""
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        return None, f"the ATen graph has {len(placeholders)} inputs where Dynamo's has {len(names)}"
    carries = {placeholders[i]: frozenset({(i, "both")}) for i in edge_inputs}
    addressed = collections.defaultdict(set)
    for node in aten_gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            source = carries.get(node.args[0])
            if isinstance(source, list) and node.args[1] < len(source):
                carries[node] = source[node.args[1]]
            continue
        uses = _index_uses(node)
        for index, size in uses:
            for edge_input, row in _rows_carried(carries.get(index)):
                for r in _ROWS[row]:
                    addressed[edge_input, r].add(size_expr(size))
        operands = collections.Counter()
        torch.fx.node.map_arg((node.args, node.kwargs), lambda n: operands.update([n]))
        operands.subtract(index for index, _ in uses)
        data = set().union(*(_rows_carried(carries.get(n)) for n, count in operands.items() if count > 0))
        if not data:
            continue
        out = node.meta.get("val")
        if isinstance(out, (tuple, list)):
            carries[node] = [_carried(node, data, value, k) for k, value in enumerate(out)]
        else:
            carries[node] = _carried(node, data, out, None)
    rows = {}
    for i in edge_inputs:
        for r in (0, 1):
            sizes = addressed.get((i, r), set())
            if not sizes:
                return None, f"row {r} of {names[i]} indexes no tensor in the graph: its node type is not known"
            if len(sizes) > 1:
                return None, (f"row {r} of {names[i]} indexes tensors of "
                              f"{' and '.join(sorted(map(label, sizes)))} rows: its node type is ambiguous")
            (rows[i, r],) = sizes
    return rows, None


# ---- integers per edge (edge types) --------------------------------------------------------------------------------

# ops that read rows of their source at the positions an index names: a padded edge's entry reads a row
_INDEX_READS = {aten.index_select.default, aten.gather.default, aten.index.Tensor, aten._unsafe_index.Tensor,
                aten.embedding.default, aten.take.default}
# ops whose result depends on how often each value comes, or where: counts, orders, prefix sums
_VALUE_COUNTING = {aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable,
                   aten.bincount.default, aten._unique2.default, aten.unique_dim.default,
                   aten.unique_consecutive.default, aten.searchsorted.Tensor, aten.cumsum.default,
                   aten.histc.default, aten.topk.default, aten.kthvalue.default, aten.mode.default,
                   aten.median.dim, aten.median.default}


def edge_values_unsafe(aten_gm: torch.fx.GraphModule, positions: list, names: list, counts: set) -> Optional[str]:
    """None where the integer inputs per edge at ``positions`` (edge types) may be padded by their row 0's value,
    else why not. Their padded entries then name a value the real edges already have, so what reads by them (a
    relation's weights, ``weight[edge_type]``), compares them (``edge_type == r``: a mask, whose filters
    :func:`gnn_inductor.buckets.redirect_filters` keeps at fixed sizes) or computes on them row by row treats a padded
    edge as any other, and the padded edges join padded nodes only. Declined: a value used as an index into rows of a
    node or edge count (``counts``: node ids, not types), an index that writes (``scatter(ones, edge_type)``: a
    count per type, which the padded edges would raise) and ops that count, order or take prefix sums of them. A
    reduction over the edges is :func:`gnn_inductor.buckets.why_unsafe`'s to decline."""
    if not positions:
        return None
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    carried = {placeholders[i]: names[i] for i in positions}
    for node in aten_gm.graph.nodes:
        if node.op != "call_function":
            continue
        ins = [n for n in node.all_input_nodes if n in carried]
        if not ins:
            continue
        name = _op_name(node)
        uses = _index_uses(node)
        for index, size in uses:
            if index not in carried:
                continue
            if node.target not in _INDEX_READS:
                return f"{name} writes or counts by the values of the integer edge input {carried[index]}"
            if size_expr(size).free_symbols & counts:
                return (f"{name} indexes rows of a node or edge count by the values of the integer edge input "
                        f"{carried[index]} (node ids, not edge types)")
        if node.target in _VALUE_COUNTING:
            return f"{name} counts or orders the values of the integer edge input {carried[ins[0]]}"
        values = [n for n in ins if n not in {index for index, _ in uses}]
        out = node.meta.get("val")
        outs = out if isinstance(out, (tuple, list)) else [out]
        if values and any(isinstance(v, torch.Tensor) and v.dtype != torch.bool for v in outs):
            carried[node] = carried[values[0]]  # the values themselves, or computed from them row by row
    return None


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target))
