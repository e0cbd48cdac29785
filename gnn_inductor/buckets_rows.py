"""What the rows of a graph's ``edge_index`` inputs index, and what its integers per edge may be padded by: the ATen
analyses behind :func:`gnn_inductor.buckets_layout.layout_of`.

:func:`row_counts` follows each ``edge_index`` row through the graph's ops to the tensors it indexes (the node count
each row addresses); :func:`edge_values_unsafe` says where an integer input per edge (RGCNConv's ``edge_type``) is used
so that padding it by its row 0's value could change a real output.
"""
from __future__ import annotations

import collections
import operator
from typing import Callable, Optional

import sympy
import torch

aten = torch.ops.aten


def size_expr(size):
    """A size (an int or a SymInt) as a sympy expression."""
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def size_symbol(size) -> Optional[sympy.Symbol]:
    """The symbol a size is, or None (a constant or an expression of symbols)."""
    expr = size_expr(size)
    return expr if isinstance(expr, sympy.Symbol) else None



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
