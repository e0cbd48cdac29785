"""DGL frontend: ``torch.compile(model, backend="gnn_io")`` on unmodified DGL models.

DGL runs message passing in C (``gspmm``, ``gsddmm``, ``edge_softmax`` behind autograd Functions,
DLPack and a C graph index), which Dynamo cannot trace: each call splits the graph, so no
gather and scatter ever meet in one graph. While Dynamo traces (``torch.compiler.is_compiling()``),
the DGLGraph methods that message passing goes through take a traceable path instead: the graph
is read from its *structure*, ``src`` and ``dst`` (int64, ``[E]``, edge IDs in order) and the
node counts, cached on DGL's graph index when the graph is built, and messages are
written in the spellings PyG produces (``index_select`` gathers, ``scatter_add_`` /
``scatter_reduce_`` by destination, PyG's max-shifted edge softmax), so the patterns of
``patterns/`` see the same code as for a PyG layer. Outside compilation every method is DGL's own.

Covered while compiling, on graphs with one edge type (homogeneous graphs and blocks):
``update_all`` (built-in or user-defined message; built-in ``sum``/``mean``/``max``/``min`` reduce, or a
user-defined one that only reduces its mailbox over the degree dimension, see
gnn_inductor/frontends/dgl_udf.py; a user-defined ``apply_node_func``), ``apply_edges`` (built-in or
user-defined), ``dgl.ops.edge_softmax`` (all edges, by destination), ``in_degrees``/``out_degrees``, node and
edge counts, ``srcdata``/``dstdata``/``ndata``/``edata``, ``local_scope``. Anything else (heterographs, other
user-defined reduce functions, subsets of edges, graphs built before :func:`install`) runs DGL's own code,
which Dynamo splits at its C calls: slower, never a different result. See docs/dgl.md.
"""
from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass

import torch

from gnn_inductor.frontends import declines, dgl_import, dgl_udf

_STRUCTURE = "_gnn_io_structure"  # attribute on DGL's graph index (a new index per mutation)
_INSTALLED = []


# ---------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------

# `import dgl` after `import gnn_inductor` works without the .pth too (a no-op when the .pth installed it)
dgl_import.install_finder()


def import_dgl():
    """``import dgl``, then :func:`install` (DGL models capturable by the ``gnn_io`` backend); returns
    the ``dgl`` module.

    A plain ``import dgl`` works as well on torch releases that DGL's wheel has no graphbolt library
    for (DGL 2.1.0 on torch 2.11): ``dgl.graphbolt`` is then a stub, from the finder of
    gnn_inductor/frontends/dgl_import.py that installing gnn_inductor sets up at interpreter startup.
    This function makes sure that finder is there (for an interpreter started without site-packages'
    ``.pth`` files) and that graphs built after it get a cached structure.
    """
    dgl_import.install_finder()
    import dgl

    install()
    return dgl


# ---------------------------------------------------------------------------------------------
# Graph structure
# ---------------------------------------------------------------------------------------------

@dataclass
class _Structure:
    """What the traceable path knows about a graph: its edges and the sizes and ids around them."""
    src: torch.Tensor          # [E] int64 source of edge e (edge ids in order)
    dst: torch.Tensor          # [E] int64 destination of edge e
    num_src: int
    num_dst: int
    src_ntid: int
    dst_ntid: int
    src_ntype: str
    dst_ntype: str
    canonical_etype: tuple
    device: torch.device
    unibipartite: bool


def _remember(graph) -> None:
    """Cache the structure of a graph with one edge type on its graph index (eagerly, when the
    graph is built or mutated; a mutation makes a new index, so a stale cache is never read)."""
    gidx = graph._graph
    try:
        if gidx.number_of_etypes() != 1 or len(graph.srctypes) != 1 or len(graph.dsttypes) != 1:
            return
        src, dst, _ = gidx.edges(0, "eid")
        # separate inputs, not rows of one: each layer's edge_index[1] would be a new select node
        src_ntype, dst_ntype = graph.srctypes[0], graph.dsttypes[0]
        setattr(gidx, _STRUCTURE, _Structure(
            src.to(torch.int64), dst.to(torch.int64), graph.num_src_nodes(), graph.num_dst_nodes(),
            graph.get_ntype_id_from_src(src_ntype), graph.get_ntype_id_from_dst(dst_ntype), src_ntype, dst_ntype,
            graph.canonical_etypes[0], graph.device, graph.is_unibipartite))
    except Exception:  # noqa: BLE001  (a graph whose formats exclude COO: DGL's own path serves it)
        return


# ---------------------------------------------------------------------------------------------
# Message passing in PyG's spellings
# ---------------------------------------------------------------------------------------------

def _broadcast(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return index.view(-1, *([1] * (like.dim() - 1))).expand_as(like)


def _scatter(messages: torch.Tensor, index: torch.Tensor, num: int, reduce: str) -> torch.Tensor:
    """``out[i] = reduce_{e: index[e] = i} messages[e]``, 0 where no edge arrives (DGL's and
    PyG's convention for every reduce)."""
    out = messages.new_zeros((num, *messages.shape[1:]))
    if reduce == "sum":
        return out.scatter_add_(0, _broadcast(index, messages), messages)
    if reduce == "mean":
        count = messages.new_zeros(num).scatter_add_(0, index, messages.new_ones(index.shape[0])).clamp(min=1)
        total = out.scatter_add_(0, _broadcast(index, messages), messages)
        return total / count.view(-1, *([1] * (total.dim() - 1))).expand_as(total)
    return out.scatter_reduce_(0, _broadcast(index, messages), messages, {"max": "amax", "min": "amin"}[reduce],
                               include_self=False)


def _pad_pair(lhs: torch.Tensor, rhs: torch.Tensor):
    """DGL's broadcasting: the operand with fewer dims gets size-1 dims after the first (the other
    is left alone, so the matcher sees the gathered row itself)."""
    ndim = max(lhs.dim(), rhs.dim())
    return tuple(t if t.dim() == ndim else t.view(t.shape[0], *([1] * (ndim - t.dim())), *t.shape[1:])
                 for t in (lhs, rhs))


def _binary(op: str, lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    lhs, rhs = _pad_pair(lhs, rhs)
    if op == "add":
        return lhs + rhs
    if op == "sub":
        return lhs - rhs
    if op == "mul":
        return lhs * rhs
    if op == "div":
        return lhs / rhs
    return (lhs * rhs).sum(-1, keepdim=True)  # dot


def _softmax_by_dst(logits: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    """Softmax over the edges entering each node, spelled as PyG's ``softmax(src, index)``
    (DGL adds no epsilon, so neither does this)."""
    shift = _scatter(logits.detach(), index, num, "max").index_select(0, index)
    exp = (logits - shift).exp()
    return exp / _scatter(exp, index, num, "sum").index_select(0, index)


def _degrees(index: torch.Tensor, num: int) -> torch.Tensor:
    return torch.zeros(num, dtype=torch.int64, device=index.device).scatter_add_(
        0, index, torch.ones(index.shape[0], dtype=torch.int64, device=index.device))


# ---------------------------------------------------------------------------------------------
# The traceable paths. Each takes (graph or graph index, structure, DGL's arguments) and returns
# DECLINED where it does not cover the call; DGL's own code then runs.
# ---------------------------------------------------------------------------------------------

class _Declined:
    """The type of :data:`DECLINED`: tested with ``isinstance``, which Dynamo answers for any traced value (an
    identity test against a plain object fails in Dynamo when the other side is a symbolic size, as
    ``graph.num_edges()`` is once a new block size made the graph dynamic)."""

    def __repr__(self) -> str:
        return "DECLINED"


DECLINED = _Declined()


def declined(value) -> bool:
    return isinstance(value, _Declined)


def _is_all(value) -> bool:
    from dgl.base import is_all

    return value is None or is_all(value)


def _all():
    from dgl.base import ALL

    return ALL


def _gather(frame, field: str, index: torch.Tensor) -> torch.Tensor:
    return frame[field].index_select(0, index)


def _edge_batch(graph, s):
    """DGL's ``EdgeBatch`` over all edges, its ``src``/``dst`` features gathered by the structure."""
    from dgl.udf import EdgeBatch

    src_frame, dst_frame = graph._node_frames[s.src_ntid], graph._node_frames[s.dst_ntid]
    edge_frame = graph._edge_frames[0]
    return EdgeBatch(graph, _all(), s.canonical_etype,
                     {k: _gather(src_frame, k, s.src) for k in src_frame},
                     {k: edge_frame[k] for k in edge_frame},
                     {k: _gather(dst_frame, k, s.dst) for k in dst_frame})


def _operand(graph, s, target: int, field: str) -> torch.Tensor:
    """The per-edge value of a built-in's operand; ``target`` is DGL's ``TargetCode``."""
    from dgl.function.base import TargetCode

    if target == TargetCode.SRC:
        return _gather(graph._node_frames[s.src_ntid], field, s.src)
    if target == TargetCode.DST:
        return _gather(graph._node_frames[s.dst_ntid], field, s.dst)
    return graph._edge_frames[0][field]


def _messages(graph, s, func):
    """Per-edge results ``{name: [E, ...]}`` of a DGL message function, built-in or user-defined."""
    from dgl.function.base import BuiltinFunction
    from dgl.function.message import BinaryMessageFunction, CopyMessageFunction

    if isinstance(func, CopyMessageFunction):
        return {func.out_field: _operand(graph, s, func.target, func.in_field)}
    if isinstance(func, BinaryMessageFunction) and func.binary_op in _BINARY_OPS:
        return {func.out_field: _binary(func.binary_op, _operand(graph, s, func.lhs, func.lhs_field),
                                        _operand(graph, s, func.rhs, func.rhs_field))}
    if isinstance(func, BuiltinFunction) or not callable(func):
        return DECLINED
    return dict(func(_edge_batch(graph, s)))


_BINARY_OPS = ("add", "sub", "mul", "div", "dot")


def _set_columns(frame, data: dict) -> None:
    """DGL's ``Frame.update`` without the C-side checks of ``_set_n_repr`` (sizes come from the
    same structure, so they hold)."""
    for key, value in data.items():
        frame.update_column(key, value)


def _is_udf(func) -> bool:
    from dgl.function.base import BuiltinFunction

    return callable(func) and not isinstance(func, BuiltinFunction)


def _update_all(graph, s, message_func, reduce_func, apply_node_func=None, etype=None):
    from dgl.function.reducer import SimpleReduceFunction

    builtin = isinstance(reduce_func, SimpleReduceFunction)
    if etype is not None or (builtin and reduce_func.name not in dgl_udf.KINDS) \
            or (not builtin and not _is_udf(reduce_func)) \
            or (apply_node_func is not None and not _is_udf(apply_node_func)):
        return DECLINED
    messages = _messages(graph, s, message_func)
    if declined(messages):
        return DECLINED
    extreme = builtin and reduce_func.name in ("max", "min")
    if builtin:
        out = _scatter(messages[reduce_func.msg_field], s.dst, s.num_dst, reduce_func.name)
        if extreme and apply_node_func is not None:
            # DGL's max/min kernel leaves -inf/+inf in the rows without messages for the apply function to see
            empty = (_degrees(s.dst, s.num_dst) == 0).view(-1, *([1] * (out.dim() - 1)))
            out = out.masked_fill(empty, float("-inf") if reduce_func.name == "max" else float("inf"))
        ndata = {reduce_func.out_field: out}
    else:
        ndata = _reduce_udf(graph, s, reduce_func, messages)
        if declined(ndata):
            return DECLINED
    if apply_node_func is not None:
        ndata = _apply_nodes(graph, s, apply_node_func, ndata)
        if extreme and ndata:  # then zeroes the infinities of the apply function's first output, and only those
            first = next(iter(ndata))
            ndata[first] = ndata[first].masked_fill(torch.isinf(ndata[first]), 0)
    _set_columns(graph._node_frames[s.dst_ntid], ndata)
    return None


def _reduce_udf(graph, s, func, messages: dict):
    """A Python reduce function whose mailbox fields are only reduced over their degree dimension: each
    reduction scattered by destination, the rest of the function run on per-node tensors
    (gnn_inductor/frontends/dgl_udf.py); DECLINED for any other."""
    frame = graph._node_frames[s.dst_ntid]
    data = {k: frame[k] for k in frame}
    code = dgl_udf.code_of(func)
    if code is None:
        return DECLINED
    uses = dgl_udf.mailbox_reductions(*code, tuple(messages), tuple(data))
    if isinstance(uses, str):  # why not: DGL's degree buckets run it
        return DECLINED
    mailbox = dict(messages)  # fields the function never reads stay as they are
    for key, kind in uses:
        mailbox[key] = dgl_udf.stand_in(_scatter(messages[key], s.dst, s.num_dst, kind))
    result = func(dgl_udf.Nodes(mailbox, data))
    has_messages = _degrees(s.dst, s.num_dst) > 0
    ndata = {}
    for key, value in dict(result).items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != s.num_dst:
            return DECLINED  # not one row per node: DGL's merge of the buckets decides what happens
        ndata[key] = dgl_udf.zero_rows_without_messages(value, has_messages)
    return ndata


def _apply_nodes(graph, s, func, ndata: dict) -> dict:
    """DGL's apply phase of ``update_all``: ``func`` on every destination node with the reduced fields and the
    node's other data; only what it returns is written back."""
    from dgl.udf import NodeBatch

    frame = graph._node_frames[s.dst_ntid]
    data = dict(ndata)
    for key in frame:
        if key not in data:
            data[key] = frame[key]
    nodes = torch.arange(s.num_dst, device=s.dst.device)
    return dict(func(NodeBatch(graph, nodes, s.dst_ntype, data)))


def _apply_edges(graph, s, func, edges=None, etype=None):
    if not _is_all(edges) or etype is not None:
        return DECLINED
    messages = _messages(graph, s, func)
    if declined(messages):
        return DECLINED
    _set_columns(graph._edge_frames[0], messages)
    return None


def _set_n_repr(graph, s, ntid, u, data):
    if not _is_all(u):
        return DECLINED
    _set_columns(graph._node_frames[ntid], data)
    return None


def _set_e_repr(graph, s, etid, edges, data):
    if not _is_all(edges):
        return DECLINED
    _set_columns(graph._edge_frames[etid], data)
    return None


def _in_degrees(graph, s, v=None, etype=None):
    if not _is_all(v) or etype is not None:
        return DECLINED
    return _degrees(s.dst, s.num_dst)


def _out_degrees(graph, s, u=None, etype=None):
    if not _is_all(u) or etype is not None:
        return DECLINED
    return _degrees(s.src, s.num_src)


def _num_nodes(graph, s, ntype=None):
    return DECLINED if ntype is not None or s.unibipartite else s.num_src


def _num_src_nodes(graph, s, ntype=None):
    return DECLINED if ntype is not None else s.num_src


def _num_dst_nodes(graph, s, ntype=None):
    return DECLINED if ntype is not None else s.num_dst


def _num_edges(graph, s, etype=None):
    return DECLINED if etype is not None else s.src.shape[0]


def _get_etype_id(graph, s, etype):
    return DECLINED if etype is not None else 0


def _srcdata(graph, s):
    from dgl.view import HeteroNodeDataView

    return HeteroNodeDataView(graph, s.src_ntype, s.src_ntid, _all())


def _dstdata(graph, s):
    from dgl.view import HeteroNodeDataView

    return HeteroNodeDataView(graph, s.dst_ntype, s.dst_ntid, _all())


def _ndata(graph, s):
    return DECLINED if s.unibipartite else _srcdata(graph, s)


def _edata(graph, s):
    from dgl.view import HeteroEdgeDataView

    return HeteroEdgeDataView(graph, None, _all())


def _is_unibipartite(graph, s):
    return s.unibipartite


def _device(graph, s):
    return s.device


def _local_var(graph, s):
    """DGL's ``local_var`` with ``DGLGraph.__copy__`` called directly (Dynamo does not trace ``copy.copy``)."""
    scoped = graph.__copy__()
    scoped._node_frames = [frame.clone() for frame in graph._node_frames]
    scoped._edge_frames = [frame.clone() for frame in graph._edge_frames]
    return scoped


def _number_of_etypes(gidx, s):
    return 1


def _edge_softmax_internal(gidx, s, logits, eids=None, norm_by="dst"):
    """DGL's ``edge_softmax`` kernel (behind ``dgl.ops.edge_softmax`` / ``dgl.nn.functional``)
    for all edges, normalised by destination."""
    if not _is_all(eids) or norm_by != "dst" or not isinstance(logits, torch.Tensor):
        return DECLINED
    return _softmax_by_dst(logits, s.dst, s.num_dst)


def _gspmm_internal(gidx, s, op, reduce_op, lhs, rhs):
    """DGL's ``gspmm`` kernel (behind ``dgl.ops.gspmm`` and ``dgl.ops.u_mul_e_sum`` & co.) for a
    sum. Max and min give -inf/inf to nodes without edges there, unlike ``update_all``: DGL's own."""
    if reduce_op != "sum" or op not in ("copy_lhs", "copy_rhs", "add", "sub", "mul", "div"):
        return DECLINED
    src = s.src
    if op == "copy_lhs":
        messages = lhs.index_select(0, src)
    elif op == "copy_rhs":
        messages = rhs
    else:
        messages = _binary(op, lhs.index_select(0, src), rhs)
    return _scatter(messages, s.dst, s.num_dst, "sum")


def _gsddmm_internal(gidx, s, op, lhs, rhs, lhs_target="u", rhs_target="v"):
    """DGL's ``gsddmm`` kernel (behind ``dgl.ops.gsddmm`` and ``dgl.ops.u_dot_v`` & co.)."""
    if op not in _BINARY_OPS + ("copy_lhs", "copy_rhs"):
        return DECLINED

    def operand(data, target):
        if target == "e":
            return data
        return data.index_select(0, s.src if target == "u" else s.dst)

    if op == "copy_lhs":
        return operand(lhs, lhs_target)
    if op == "copy_rhs":
        return operand(rhs, rhs_target)
    return _binary(op, operand(lhs, lhs_target), operand(rhs, rhs_target))


# ---------------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------------

# Message passing left to DGL's own code: what the traceable path does not take, for the report
_MESSAGE_PASSING = {
    "update_all": "several edge types, a built-in it does not cover, or a Python reduce function that does more "
                  "than reduce its mailbox (docs/dgl.md)",
    "apply_edges": "a subset of edges, several edge types or a built-in it does not cover",
    "edge_softmax_internal": "a subset of edges or norm_by other than 'dst'",
    "gspmm_internal": "a reduce other than sum (DGL's max/min leave +-inf in rows without edges there)",
    "gsddmm_internal": "an operator it does not cover",
}
def _switch(original, traced, graph_of=lambda obj: obj._graph):
    """``original`` that runs ``traced(obj, structure, ...)`` instead while Dynamo traces a graph
    with a cached structure; where ``traced`` declines, Dynamo breaks the graph and ``original``
    runs eagerly."""
    eager = torch.compiler.disable(original, recursive=True)

    @functools.wraps(original)
    def method(obj, *args, **kwargs):
        if torch.compiler.is_compiling():
            s = getattr(graph_of(obj), _STRUCTURE, None)
            if s is not None:
                result = traced(obj, s, *args, **kwargs)
                if not declined(result):
                    return result
                if original.__name__ in _MESSAGE_PASSING:  # worth a line in the report
                    declines.note(f"DGLGraph.{original.__name__}", _MESSAGE_PASSING[original.__name__])
                # a graph break into DGL's own code, run eagerly (its C calls would break anyway)
                return eager(obj, *args, **kwargs)
        return original(obj, *args, **kwargs)

    method.__gnn_io_original__ = original
    return method


def _remembering(original):
    @functools.wraps(original)
    def method(graph, *args, **kwargs):
        result = original(graph, *args, **kwargs)
        _remember(graph)
        return result

    method.__gnn_io_original__ = original
    return method


def _remembering_copy(original):
    """``original``, a method that returns a graph with a new graph index (``to``, ``clone``, ...), with
    the structure cached on the graph it returns."""
    @functools.wraps(original)
    def method(graph, *args, **kwargs):
        result = original(graph, *args, **kwargs)
        if isinstance(result, type(graph)) and not hasattr(result._graph, _STRUCTURE):
            _remember(result)
        return result

    method.__gnn_io_original__ = original
    return method


_METHODS = {
    "update_all": _update_all, "apply_edges": _apply_edges, "_set_n_repr": _set_n_repr, "_set_e_repr": _set_e_repr,
    "in_degrees": _in_degrees, "out_degrees": _out_degrees, "num_nodes": _num_nodes, "number_of_nodes": _num_nodes,
    "num_src_nodes": _num_src_nodes, "number_of_src_nodes": _num_src_nodes, "num_dst_nodes": _num_dst_nodes,
    "number_of_dst_nodes": _num_dst_nodes, "num_edges": _num_edges, "number_of_edges": _num_edges,
    "get_etype_id": _get_etype_id, "local_var": _local_var,
}
_PROPERTIES = {"srcdata": _srcdata, "dstdata": _dstdata, "ndata": _ndata, "edata": _edata,
               "is_unibipartite": _is_unibipartite, "device": _device}
# Methods that build a graph or give it a new graph index: the structure is cached after them.
# (__setstate__: a graph unpickled, as from a DataLoader's worker processes.)
_BUILDERS = ("_init", "__setstate__", "add_nodes", "add_edges", "remove_nodes", "remove_edges")
# Methods that return a copy with a new graph index, which DGL sets without _init: the structure is cached on
# the copy. ``to`` (and ``cpu``, which calls it) copies for any device given as a string, even the graph's own
# (DGL compares its torch.device with the string); ``int``/``long`` call ``astype``.
_COPIERS = ("to", "clone", "formats", "astype")


def install() -> bool:
    """Give Dynamo the traceable path through DGL (idempotent). Does nothing unless DGL is
    imported; runs when this module is imported after ``dgl``, else right after ``import dgl``
    (below), and from :func:`import_dgl`. Graphs built before it ran have no cached structure and
    keep DGL's own (graph-breaking) path; a copy of one made after it (``g.to(device)``) has one."""
    if _INSTALLED or "dgl" not in sys.modules:
        return bool(_INSTALLED)
    from dgl import heterograph_index
    from dgl.heterograph import DGLGraph

    # modules, not the functions of the same name that dgl.ops re-exports
    edge_softmax, sddmm, spmm = (importlib.import_module(f"dgl.ops.{name}") for name in ("edge_softmax", "sddmm", "spmm"))

    for name in _BUILDERS:
        setattr(DGLGraph, name, _remembering(getattr(DGLGraph, name)))
    for name in _COPIERS:
        setattr(DGLGraph, name, _remembering_copy(getattr(DGLGraph, name)))
    for name, traced in _METHODS.items():
        setattr(DGLGraph, name, _switch(getattr(DGLGraph, name), traced))
    for name, traced in _PROPERTIES.items():
        setattr(DGLGraph, name, property(_switch(getattr(DGLGraph, name).fget, traced)))
    by_index = functools.partial(_switch, graph_of=lambda gidx: gidx)
    heterograph_index.HeteroGraphIndex.number_of_etypes = by_index(
        heterograph_index.HeteroGraphIndex.number_of_etypes, _number_of_etypes)
    edge_softmax.edge_softmax_internal = by_index(edge_softmax.edge_softmax_internal, _edge_softmax_internal)
    spmm.gspmm_internal = by_index(spmm.gspmm_internal, _gspmm_internal)
    sddmm.gsddmm_internal = by_index(sddmm.gsddmm_internal, _gsddmm_internal)
    _INSTALLED.append(True)
    return True


# whichever of gnn_inductor and dgl a script imports first, graphs built after both imports are covered
dgl_import.call_after_import("dgl", install)
