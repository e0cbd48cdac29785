"""Linear maps of gathered rows, moved before the gather.

Many message functions start with a linear layer on the gathered features: GeneralConv's ``lin_msg(x_j)``,
CGConv's ``lin_f(cat([x_i, x_j, e_ij]))``, EdgeConv's ``nn(cat([x_i, x_j - x_i]))``, PointNetConv's
``local_nn(cat([x_j, pos_j - pos_i]))``, PNAConv's pre-transform of ``cat([x_i, x_j, e_ij])``. Traced, that is a GEMM
of ``E`` rows, ``addmm(b, A, t(W))``, whose left operand ``A`` is built from ``index_select(X, 0, idx)`` gathers:

    A = cat([p_1, ..., p_k], -1),   p = sum_t +-index_select(X_t, 0, idx_t)   or an edge tensor

Row gathers commute with a right product, so with ``W^T`` cut into the row blocks ``W_p`` of the pieces' columns:

    A W^T + b = sum_(X, idx) index_select(X (sum_p +-W_p), 0, idx)  +  sum_edge P W_p  +  b

Each distinct ``(X, idx)`` becomes one GEMM of ``X``'s rows (``N``, not ``E``: 15x fewer on RMAT 2^20), and no
``[E, K]`` concatenation or ``[E, F_out]`` GEMM result is made. What is left is per-edge math on gathered rows,
which the gather-scatter pattern fuses into its kernel when a scatter follows. Wrappers PyG puts around the
pieces are seen through: PNAConv's ``select(cat(...), 1, 0)`` of ``[E, 1, K]`` pieces (one tower), with its
``view``/``repeat`` of the node features.

The pass runs on the canonical ATen graph before the pattern matchers. A GEMM is moved only where it pays and
stays exact to rounding: at least one gathered piece, more gathered rows than source rows (``E > N``; taken as
so where ``E`` is data-dependent, as after PyG adds self loops), ``W`` and
``b`` graph inputs; for half-precision inputs only a single gathered piece (a split GEMM would round each
partial product to the half dtype before summing). ``GNN_IO_GATHER_LINEAR=0`` turns it off.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from gnn_inductor import config
from gnn_inductor.graph_match import tensor_val
from gnn_inductor.passes.linear_fusion import call_node, linear_map, parameter_name
from gnn_inductor.rewrite_report import source_of

aten = torch.ops.aten
ENV = config.SETTINGS["gather_linear"].env


@dataclass
class _Piece:
    """Columns ``[start, start + width)`` of ``A``: ``sign * index_select(source, 0, index)``, or, with ``index``
    None, ``sign * source`` (an edge tensor, ``[E, width]``)."""
    source: Node
    index: Node | None
    sign: int
    start: int
    width: int


def _rows(node) -> int | None:
    value = tensor_val(node)
    if value is None or value.dim() == 0:
        return None
    size = value.shape[0]
    if isinstance(size, torch.SymInt):
        size = size.node.hint
    return size if isinstance(size, int) else None


def _select_1_0(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target is aten.select.int \
        and tuple(node.args[1:]) == (1, 0) and tensor_val(node.args[0]) is not None \
        and tensor_val(node.args[0]).dim() == 3 and tensor_val(node.args[0]).shape[1] == 1


def _pieces(node, start: int, sign: int, squeeze: bool, out: list) -> bool:
    """Append the pieces of ``node`` (columns from ``start``) to ``out``; False if ``node`` is not a sum of
    gathers, a concatenation along the last dimension, or an edge tensor. ``squeeze``: ``node`` is ``[E, 1, k]``
    and ``A`` holds its ``select(., 1, 0)``."""
    value = tensor_val(node)
    if value is None or value.dim() != (3 if squeeze else 2):
        return False
    width = value.shape[-1]
    if not isinstance(width, int):
        return False
    if node.op == "call_function" and node.target is aten.cat.default:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if dim not in (-1, value.dim() - 1):
            return False
        for part in node.args[0]:
            if not _pieces(part, start, sign, squeeze, out):
                return False
            start += tensor_val(part).shape[-1]
        return True
    if node.op == "call_function" and node.target in (aten.add.Tensor, aten.sub.Tensor) and len(node.args) == 2 \
            and not node.kwargs and all(tensor_val(a) is not None and tuple(tensor_val(a).shape) == tuple(value.shape)
                                        for a in node.args):
        second = sign if node.target is aten.add.Tensor else -sign
        return _pieces(node.args[0], start, sign, squeeze, out) and _pieces(node.args[1], start, second, squeeze, out)
    if node.op == "call_function" and node.target is aten.index_select.default \
            and node.args[1] % value.dim() == 0:  # the row dimension (PyG writes -2)
        out.append(_Piece(node.args[0], node.args[2], sign, start, width))
        return True
    out.append(_Piece(node, None, sign, start, width))  # an edge tensor: its GEMM stays per edge
    return True


@dataclass
class _TooFewEdges:
    """A GEMM that qualifies but for the size rule: the graph has ``edges``, no more than ``rows`` of a gathered
    tensor, so moving it would not pay (for the report's near miss)."""
    edges: int
    rows: int
    weight: Node


def _analyse(gemm: Node):
    """``(A's pieces, bias or None, W, squeeze)`` of a GEMM worth moving, a :class:`_TooFewEdges` where only the
    size rule declines it, else None."""
    found = linear_map(gemm)
    if found is None:
        return None
    a, weight, bias = found
    squeeze = _select_1_0(a)
    pieces: list = []
    if not _pieces(a.args[0] if squeeze else a, 0, 1, squeeze, pieces):
        return None
    gathered = [p for p in pieces if p.index is not None]
    if not gathered:
        return None
    if tensor_val(a).dtype != torch.float32 and (len(pieces) != 1 or pieces[0].sign != 1):
        return None
    if not all(tensor_val(p.source).dtype == tensor_val(a).dtype for p in pieces):
        return None
    edges = _rows(a)  # None where data-dependent (self loops added by nonzero): edges outnumber nodes in GNNs
    rows = [_rows(p.source) for p in gathered]
    if edges is not None and any(r is None or r >= edges for r in rows):
        return _TooFewEdges(edges, max(rows), weight) if None not in rows else None
    return pieces, bias, weight, squeeze


def _source_rows(gm: GraphModule, source: Node, squeeze: bool) -> Node:
    """``source`` as 2-D rows (``select(., 1, 0)`` of a ``[rows, 1, k]`` source under PNA's wrapper)."""
    return call_node(gm, aten.select.int, (source, 1, 0)) if squeeze else source


def _move(gm: GraphModule, gemm: Node, pieces: list, bias, weight: Node, squeeze: bool) -> None:
    with gm.graph.inserting_before(gemm):
        weight_t = call_node(gm, aten.t.default, (weight,))
        blocks: dict = {}  # (source, index) -> [(sign, start, width)]: one GEMM per distinct gather
        for p in pieces:
            blocks.setdefault((p.source, p.index), []).append((p.sign, p.start, p.width))
        total = None
        for (source, index), parts in blocks.items():
            block = None
            for sign, start, width in parts:
                rows = call_node(gm, aten.slice.Tensor, (weight_t, 0, start, start + width))
                if block is not None:
                    block = call_node(gm, aten.add.Tensor if sign > 0 else aten.sub.Tensor, (block, rows))
                else:
                    block = rows if sign > 0 else call_node(gm, aten.neg.default, (rows,))
            product = call_node(gm, aten.mm.default, (_source_rows(gm, source, squeeze), block))
            term = product if index is None else call_node(gm, aten.index_select.default, (product, 0, index))
            total = term if total is None else call_node(gm, aten.add.Tensor, (total, term))
        if bias is not None:
            total = call_node(gm, aten.add.Tensor, (total, bias))
    total.meta.update({k: v for k, v in gemm.meta.items() if k != "val"})
    gemm.replace_all_uses_with(total)
    gm.graph.erase_node(gemm)


def move_linears_before_gathers(gm: GraphModule, kept: list | None = None) -> list:
    """Move each qualifying GEMM of gathered rows (module docstring) before its gathers, in place; returns one
    ``{"source", "weight", "gathers", "edge_pieces"}`` per GEMM moved, in graph order. ``kept`` (if given)
    gets one ``{"source", "weight", "edges", "rows"}`` per GEMM left per edge because the graph it was compiled
    for has no more edges than rows (sizes at the compiled example), for the report."""
    moved = []
    for node in list(gm.graph.nodes):
        found = _analyse(node)
        if found is None:
            continue
        if isinstance(found, _TooFewEdges):
            if kept is not None:
                kept.append({"source": source_of(node), "weight": parameter_name(found.weight),
                             "edges": found.edges, "rows": found.rows})
            continue
        pieces, bias, weight, squeeze = found
        source = source_of(node)
        _move(gm, node, pieces, bias, weight, squeeze)
        moved.append({"source": source, "weight": parameter_name(weight),
                      "gathers": len({(p.source, p.index) for p in pieces if p.index is not None}),
                      "edge_pieces": sum(p.index is None for p in pieces)})
    if moved:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return moved
