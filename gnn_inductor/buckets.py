"""Shape buckets for graphs whose sizes change from call to call (sampled mini-batches).

A stream of sampled subgraphs gives Dynamo a graph of symbolic sizes: ``torch.compile`` then runs shape-generic
kernels and, under ``mode="reduce-overhead"``, records a new CUDA graph for every distinct size (every step).
Here each call's node and edge counts are padded up to a few buckets (:func:`bucket`, a geometric ladder), and
the graph is compiled once per bucket at fixed sizes, so CUDA graphs replay from the second step of a bucket on.

Padding never changes a real output. The padded nodes replicate node 0's row (finite wherever node 0 is, so
no NaN of a padded row can reach a parameter gradient through a zero), the padded edges are self loops of the
padded nodes (spread so that none gets more than :data:`PAD_DEGREE` of them), and every output is cut back to
the real rows. An edge filter by a mask (PyG's ``remove_self_loops``: ``edge_index[:, mask]``) would leave a
data-dependent edge count, which neither a fixed-size compile nor a CUDA graph takes: :func:`redirect_filters`
keeps every edge slot instead and points the dropped edges at padded nodes, where they change no real row.

That holds when each op of the graph treats rows independently or by index: :func:`why_unsafe`
walks the graph's ATen ops and declines, with the op named, any op that reduces over, contracts over or picks by
position along a node or edge dimension (``x.mean(0)``, a batch norm in training, ``x[-1]``, a global pool, an
input of node ids other than ``edge_index``).
"""
from __future__ import annotations

import collections
import math
import operator
from typing import Callable, Optional

import sympy
import torch

from gnn_inductor.canonical import fake_inputs
from gnn_inductor.rewrite_report import source_of

aten = torch.ops.aten

# the smallest bucket, the ladder's step (about 9% padding at most, 4.5% on average) and the alignment of a size
MIN_BUCKET = 256
GROWTH = 2 ** 0.125
ALIGN = 64
# the most padded edges on one padded node: a sum over them stays far from float16's range for any real message
PAD_DEGREE = 32
# fixed-size compiles kept per graph before calls of new bucket sizes run the shape-generic graph
MAX_BUCKETS = 8
# a call whose own bucket has no compile yet runs in a compiled bucket up to this factor larger in both sizes (two
# steps of the ladder), if there is one, instead of compiling its own. Over six epochs of 1024-seed batches drawn by
# benchmarks/sampler.py from the arxiv-sized graph (fanouts 10,10 and 15,10,5; two seeds; 102 batches each), the
# ladder alone compiled 6-9 buckets, the last at batch 67-94; with this reuse 2-4, the last at batch 16-50 (each
# epoch's short last batch), for mean padding of 4.7-9.2% of the nodes and 4.9-14.9% of the edges (4.5-5.3% alone)
REUSE = GROWTH ** 2
# a call of a size not met in the last RECENT_CALLS calls (an epoch's short last batch, an outlier) also runs in a
# compiled bucket up to FAR_REUSE larger: a size compiles its own bucket when it comes back. Over 250 batches drawn
# by benchmarks/sampler.py (15 epochs of 10% of the arxiv-sized graph's nodes as seeds; 1024 seeds with fanouts
# 10,10 and 15,10,5; two seeds each), REUSE alone compiled 4-5 buckets, 1-2 of them after the 30th batch (at
# batches 33-186); with this, 2-3 buckets, none after the 19th, for mean padding of 5.7-11.1% of the nodes and
# 8.2-10.2% of the edges (4.5-9.2% and 5.0-7.4% with REUSE alone). At 4096 seeds (10,10) it took the late compiles
# from 3 to 2: those are batches larger than every compiled bucket, which no reuse covers.
FAR_REUSE = 2.0
RECENT_CALLS = 16


def _rung(step: int) -> float:
    # rounded: 256 * (2 ** 0.125) ** 16 is 1024.0000000000005 in floating point, which would round up to 1088
    return round(MIN_BUCKET * GROWTH ** step, 6)


def bucket(size: int) -> int:
    """The smallest step of the ladder ``MIN_BUCKET * GROWTH**k`` above ``size``, rounded up to :data:`ALIGN`: always
    more than ``size``, so that there is a padded node for the padded edges."""
    step = max(0, math.ceil(math.log((size + 1) / MIN_BUCKET) / math.log(GROWTH)))
    while _rung(step) <= size:
        step += 1
    return int(math.ceil(_rung(step) / ALIGN) * ALIGN)


def padded_sizes(nodes: int, edges: int) -> tuple:
    """``(padded nodes, padded edges)`` for a graph of ``nodes`` and ``edges``: enough padded nodes that none
    carries more than :data:`PAD_DEGREE` padded edges."""
    edge_bucket = bucket(edges) if edges else 0
    extra_nodes = max(1, -(-(edge_bucket - edges) // PAD_DEGREE))
    return bucket(nodes + extra_nodes - 1), edge_bucket


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


def with_constant_ints(gm: torch.fx.GraphModule, inputs: list) -> torch.fx.GraphModule:
    """``gm`` (rewritten in place) with each integer placeholder replaced by its value in ``inputs``: a compile at
    fixed sizes, where AOTAutograd would otherwise make a symbol of every integer input. The result takes the
    tensor inputs only."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, inputs):
        if isinstance(value, int):
            node.replace_all_uses_with(value)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _symbol(size) -> Optional[sympy.Symbol]:
    expr = _expr(size)
    return expr if isinstance(expr, sympy.Symbol) else None


class Layout:
    """What each input of a Dynamo graph is for the padding: ``edge_index`` (``[2, E]`` integers), ``rows`` (a tensor
    whose first dimension counts nodes or edges), ``size`` (the node or edge count as an integer input) or
    ``keep``. Built by :func:`layout_of`."""

    def __init__(self, kinds: list, nodes, edges, out_dims: list):
        self.kinds, self.nodes, self.edges, self.out_dims = kinds, nodes, edges, out_dims
        self.edge_at = next(i for i, (kind, _) in enumerate(kinds) if kind == "edge_index")
        self.node_at = next((i for i, (kind, tag) in enumerate(kinds) if kind == "rows" and tag == "N"), None)

    def sizes(self, args) -> tuple:
        edge_index = args[self.edge_at]
        edges = edge_index.shape[1]
        nodes = args[self.node_at].shape[0] if self.node_at is not None else None
        for (kind, tag), arg in zip(self.kinds, args):
            if kind == "size" and tag == "N":
                nodes = int(arg)
        return nodes, edges

    def key(self, args, sizes: tuple) -> tuple:
        """The compile key of a call: its padded sizes and everything else that fixes the compiled shapes."""
        rest = tuple(tuple(a.shape[1:]) if kind == "rows" else (tuple(a.shape) if isinstance(a, torch.Tensor) else a)
                     for (kind, _), a in zip(self.kinds, args) if kind in ("rows", "keep"))
        return sizes + rest

    def pad(self, args, nodes: int, edges: int, padded: tuple, targets: Optional[torch.Tensor] = None) -> list:
        """``args`` padded to ``padded``; the padded edges are self loops of the padded nodes named by the last
        slots of ``targets`` (:func:`pad_targets`, made here unless given)."""
        node_pad, edge_pad = padded[0] - nodes, padded[1] - edges
        out = []
        for (kind, tag), arg in zip(self.kinds, args):
            if kind == "size":
                out.append(padded[0] if tag == "N" else padded[1])
            elif kind == "edge_index":
                loops = (pad_targets(nodes, padded, arg) if targets is None else targets)[edges:]
                out.append(torch.cat([arg, loops.expand(2, edge_pad)], dim=1))
            elif kind == "rows":
                count = node_pad if tag == "N" else edge_pad
                if arg.shape[0] == 0:  # nothing to replicate: zeros (an empty edge set's attributes)
                    out.append(torch.cat([arg, arg.new_zeros((count,) + tuple(arg.shape[1:]))]))
                else:
                    out.append(torch.cat([arg, arg[:1].expand((count,) + tuple(arg.shape[1:]))]))
            else:
                out.append(arg)
        return out

    def trim(self, outputs, nodes: int, edges: int):
        trimmed = []
        for value, dims in zip(outputs, self.out_dims):
            if isinstance(value, torch.Tensor):
                for dim, tag in dims:
                    value = value.narrow(dim, 0, nodes if tag == "N" else edges)
            elif dims:
                value = nodes if dims[0][1] == "N" else edges
            trimmed.append(value)
        return type(outputs)(trimmed) if isinstance(outputs, tuple) else trimmed


def layout_of(gm: torch.fx.GraphModule) -> tuple:
    """``(Layout, None)`` for a Dynamo graph whose inputs can be padded, else ``(None, why)``."""
    example_inputs = fake_inputs(gm)
    edge_syms = set()
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point() \
                and value.dtype != torch.bool and value.shape[0] == 2 and _symbol(value.shape[1]) is not None:
            edge_syms.add(_symbol(value.shape[1]))
    if len(edge_syms) != 1:
        return None, ("no edge_index of a changing size among the inputs" if not edge_syms
                      else "several edge sets of different sizes")
    edges = edge_syms.pop()
    node_syms = {_symbol(v.shape[0]) for v in example_inputs if isinstance(v, torch.Tensor) and v.dim() >= 1
                 and v.is_floating_point() and _symbol(v.shape[0]) not in (None, edges)}
    if len(node_syms) != 1:
        return None, ("no node features of a changing size among the inputs" if not node_syms
                      else "node features of several changing sizes")
    nodes = node_syms.pop()
    tags = {nodes: "N", edges: "E"}
    kinds = []
    for value in example_inputs:
        if isinstance(value, torch.SymInt):
            expr = _expr(value)
            if expr in tags:
                kinds.append(("size", tags[expr]))
            elif expr.free_symbols & set(tags):
                return None, f"an integer input {expr} computed from the node or edge count"
            else:
                kinds.append(("keep", None))
        elif isinstance(value, torch.Tensor):
            exprs = [_expr(d) for d in value.shape]
            tagged = [i for i, e in enumerate(exprs) if e.free_symbols & set(tags)]
            if not tagged:
                kinds.append(("keep", None))
            elif value.dim() == 2 and exprs[1] == edges and exprs[0] == 2 and not value.is_floating_point():
                kinds.append(("edge_index", "E"))
            elif tagged == [0] and exprs[0] in tags and value.is_floating_point():
                kinds.append(("rows", tags[exprs[0]]))
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
    return Layout(kinds, nodes, edges, out_dims), None


def _output_dims(gm, tags: dict) -> tuple:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    dims = []
    for value in torch.fx.node.map_aggregate(output.args[0], lambda n: n.meta.get("example_value")
                                             if isinstance(n, torch.fx.Node) else n):
        if isinstance(value, torch.Tensor):
            here = []
            for i, size in enumerate(value.shape):
                expr = _expr(size)
                if expr in tags:
                    here.append((i, tags[expr]))
                elif expr.free_symbols & set(tags):
                    return None, f"an output of shape {tuple(value.shape)}: a size computed from the node count"
            dims.append(here)
        elif isinstance(value, torch.SymInt) and _expr(value) in tags:
            dims.append([(0, tags[_expr(value)])])
        else:
            dims.append([])
    return dims, None


# ---- the row analysis: which ops keep padded rows apart from real ones -------------------------------------------

_SHAPE_OPS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.expand.default, aten.clone.default, aten.alias.default, aten._to_copy.default,
    aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default, aten.cat.default, aten.stack.default,
    aten.index_select.default, aten.index.Tensor, aten.gather.default, aten.embedding.default, aten.nonzero.default,
    aten.masked_select.default, aten.zeros.default, aten.ones.default, aten.full.default, aten.empty.memory_format,
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.zeros_like.default, aten.ones_like.default,
    aten.full_like.default, aten.empty_like.default, aten.rand_like.default, aten.randn_like.default,
    aten.bernoulli.p, aten.bernoulli.default, aten.native_dropout.default, aten.copy.default,
    aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.scalar_tensor.default,
    aten.repeat.default, aten.expand_as.default, aten.view_as.default,
    aten._assert_scalar.default, aten.sym_constrain_range_for_size.default, aten._assert_tensor_metadata.default,
    # elementwise ops without ATen's pointwise tag
    aten.leaky_relu.default, aten.prelu.default, aten._prelu_kernel.default, aten.masked_fill.Tensor,
    aten.hardswish.default, aten.hardsigmoid.default, aten.glu.default, aten.lerp.Scalar, aten.lerp.Tensor,
}
# index-addressed writes: a padded edge writes only into a padded node
_SCATTERS = {
    aten.scatter_add.default, aten.scatter.src, aten.scatter.value, aten.scatter_reduce.two, aten.index_add.default,
    aten.index_put.default, aten.index_reduce.default, aten.index_copy.default,
}
# ops that pick rows by position: op -> position of its dimension argument (a slice or narrow from row 0 keeps
# the real rows, a select of a non-negative index a real one)
_POSITIONAL = {aten.slice.Tensor: 1, aten.narrow.default: 1, aten.select.int: 1, aten.unbind.int: 1,
               aten.split.Tensor: 2, aten.split_with_sizes.default: 2, aten.flip.default: 1, aten.roll.default: 2}
# reductions: (op, position of the dims argument); reducing over a row dimension mixes padded rows in
_REDUCTIONS = {
    aten.sum.dim_IntList: 1, aten.mean.dim: 1, aten.amax.default: 1, aten.amin.default: 1, aten.max.dim: 1,
    aten.min.dim: 1, aten.prod.dim_int: 1, aten.var.correction: 1, aten.std.correction: 1, aten.logsumexp.default: 1,
    aten._softmax.default: 1, aten._log_softmax.default: 1, aten.any.dim: 1, aten.all.dim: 1, aten.argmax.default: 1,
    aten.argmin.default: 1, aten.linalg_vector_norm.default: 2, aten.norm.ScalarOpt_dim: 2, aten.cumsum.default: 1,
    aten.cumprod.default: 1, aten.var_mean.correction: 1, aten.any.dims: 1,
}
# ordered integer work on edges (a CSR's sort and prefix sums): the padded entries have the largest node ids, so
# they sort last and every real prefix stays as it was
_INTEGER_ORDERED = {aten.sort.default, aten.sort.stable, aten.bincount.default,
                    aten._unique2.default, aten.unique_consecutive.default, aten.searchsorted.Tensor,
                    aten.argsort.default, aten.argsort.stable}


def _tagged_dims(value, tagged: set) -> list:
    if not isinstance(value, torch.Tensor):
        return []
    return [i for i, size in enumerate(value.shape) if _expr(size).free_symbols & tagged]


def _dims_arg(node, position: int, ndim: int) -> list:
    dims = node.args[position] if len(node.args) > position else node.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % max(ndim, 1) for d in dims]


def why_unsafe(aten_gm: torch.fx.GraphModule, layout: Layout) -> Optional[str]:
    """None where padding provably changes no real row of any output, else which op (and the user's line) mixes
    padded rows into real ones."""
    tagged = {layout.nodes, layout.edges}
    for node in aten_gm.graph.nodes:
        if node.op != "call_function":
            continue
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else [value]
        inputs = [a.meta.get("val") for a in node.all_input_nodes]
        touched = any(_tagged_dims(v, tagged) for v in inputs)
        if touched:  # a data-dependent size drawn from rows (a mask's count) counts rows too
            for v in values:
                if isinstance(v, torch.Tensor):
                    tagged |= {s for d in v.shape for s in _expr(d).free_symbols
                               if str(s).startswith(("u", "unbacked"))}
        if not touched:
            continue
        why = _op_mixes_rows(node, inputs, tagged, layout.nodes)
        if why:
            return f"{why} (at {source_of(node)['source']})"
    return None


def _op_mixes_rows(node, inputs, tagged: set, nodes) -> Optional[str]:
    target = node.target
    name = getattr(target, "__name__", str(target))
    first = inputs[0] if inputs else None
    if isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags:
        return None
    if target in _SHAPE_OPS or not isinstance(target, torch._ops.OpOverload):
        return None
    if target in _POSITIONAL:
        dim = node.args[_POSITIONAL[target]] if len(node.args) > _POSITIONAL[target] else 0
        dims = range(first.dim()) if dim is None else [d % first.dim() for d in
                                                        (dim if isinstance(dim, (list, tuple)) else [dim])]
        if not set(dims) & set(_tagged_dims(first, tagged)):
            return None
        if target in (aten.slice.Tensor, aten.narrow.default):
            start = node.args[2] if len(node.args) > 2 else 0
            step = node.args[4] if target is aten.slice.Tensor and len(node.args) > 4 else 1
            if start in (None, 0) and step == 1:
                return None  # the first rows: real ones, or all
        if target is aten.select.int and isinstance(node.args[2], int) and node.args[2] >= 0:
            return None
        return f"{name} picks rows by position"
    if target in _SCATTERS:
        dim = 0 if target is aten.index_put.default else node.args[1]
        if dim % max(first.dim(), 1) in _tagged_dims(node.meta.get("val"), tagged):
            return None
        return f"{name} sums rows into a tensor that has no row per node or edge"
    if target in _INTEGER_ORDERED and first is not None and not first.is_floating_point():
        return None
    if target is aten.cumsum.default and not first.is_floating_point():
        # prefix sums of integers per node (degrees into CSR offsets): the padded nodes are the last rows. Over an
        # edge dimension padded edges can sit between real ones (after a concatenation), so it is declined there
        size = _expr(first.shape[node.args[1] % first.dim()])
        if not size.free_symbols - {nodes}:
            return None
    if target in _REDUCTIONS:
        dims = _dims_arg(node, _REDUCTIONS[target], first.dim())
        if set(dims) & set(_tagged_dims(first, tagged)):
            return f"{name} reduces over the rows"
        return None
    if target in (aten.sum.default, aten.mean.default, aten.amax.default, aten.max.default, aten.min.default,
                  aten.prod.default, aten.any.default, aten.all.default, aten._local_scalar_dense.default):
        return f"{name} reduces over the rows"
    if target in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default):
        a, b = [arg.meta["val"] for arg in (node.args[1:3] if target in (aten.addmm.default, aten.baddbmm.default)
                                            else node.args[:2])]
        if (a.dim() - 1) in _tagged_dims(a, tagged) or (b.dim() - 2) in _tagged_dims(b, tagged):
            return f"{name} contracts over the rows"
        return None
    if target is aten.native_layer_norm.default:
        normalized = len(node.args[1])
        if set(range(first.dim() - normalized, first.dim())) & set(_tagged_dims(first, tagged)):
            return f"{name} normalises over the rows"
        return None
    if target is aten._native_batch_norm_legit_no_training.default:
        return None
    return f"{name} is not known to keep rows apart"


# ---- edge filters at fixed sizes -----------------------------------------------------------------------------------

# where a data-dependent edge count may go once the filter keeps every edge slot: the sizes of new tensors (one
# entry per edge, the dropped ones included, as the edge tensors now have), runtime asserts, and integer arithmetic
# that itself goes only there. Anything else (a count used as a value, a slice up to it) keeps the filter.
_SIZE_FUNCTIONS = {torch.ones, torch.zeros, torch.empty, torch.Size, torch.ops.aten._assert_scalar.default,
                   torch.ops.aten.sym_constrain_range_for_size.default}
_SIZE_METHODS = {"view", "reshape", "expand", "new_zeros", "new_ones", "new_empty"}


def _is_scalar(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat))


def _only_sizes(node: torch.fx.Node, seen: set) -> bool:
    """Whether every use of the symbolic scalar ``node`` (transitively) is a size or an assert."""
    for user in node.users:
        if user in seen:
            continue
        seen.add(user)
        if user.op == "call_function" and user.target in _SIZE_FUNCTIONS:
            if user.target is torch.Size and not _only_sizes(user, seen):
                return False
            continue
        if user.op == "call_method" and user.target in _SIZE_METHODS and user.args[0] is not node:
            continue
        if user.op == "call_function" and _is_scalar(user.meta.get("example_value")) and _only_sizes(user, seen):
            continue
        return False
    return True


def _edge_mask(index, edges) -> Optional[torch.fx.Node]:
    """The boolean mask of an index ``mask`` or ``(:, mask)`` whose length is the input edge count, else None."""
    mask = index[1] if isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) else index
    if not isinstance(mask, torch.fx.Node):
        return None
    value = mask.meta.get("example_value")
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() == 1
            and _expr(value.shape[0]) == edges):
        return None
    return mask


def redirect_filters(gm: torch.fx.GraphModule, layout: Layout) -> tuple:
    """Rewrite ``gm`` (a Dynamo graph, in place) so that no edge filter by a mask changes its sizes:
    ``edge_index[:, mask]`` and ``edge_index[i][mask]`` become ``where(mask, ..., pad_ids)``, where ``pad_ids``
    (a new last input, :func:`pad_targets`) names a padded node for every edge slot, so a dropped edge joins two
    padded nodes; an edge attribute ``attr[mask]`` (floating point) keeps all its rows, aligned with the kept slots.

    Returns ``(count, None)``, ``(0, None)`` where the graph filters nothing, or ``(0, why)`` with ``gm`` unchanged
    where a filter cannot keep its slots: one of other integers (edge types), or a filtered count used for more
    than sizes and asserts."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    edge_index = placeholders[layout.edge_at]
    rows_of_edges = {edge_index}
    for node in gm.graph.nodes:  # edge_index[0], edge_index[1]
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] is edge_index \
                and isinstance(node.args[1], int):
            rows_of_edges.add(node)
    plan = []
    for node in gm.graph.nodes:
        if not (node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2):
            continue
        source, index = node.args
        mask = _edge_mask(index, layout.edges)
        if mask is None:
            continue
        value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else None
        if source in rows_of_edges and (source is not edge_index or isinstance(index, tuple)):
            plan.append((node, source, mask, "redirect"))
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 1 \
                and _expr(value.shape[0]) == layout.edges and not isinstance(index, tuple):
            plan.append((node, source, mask, "keep"))
        else:
            return 0, f"a mask filters {node.format_node()[:120]}, which is not edge_index or an edge attribute"
    if not plan:
        return 0, None
    counts = {s for node, *_ in plan for d in node.meta["example_value"].shape
              for s in _expr(d).free_symbols if s != layout.edges}
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if _is_scalar(value) and counts & _expr(value).free_symbols and not _only_sizes(node, set()):
            return 0, f"the filtered edge count is used as a value ({node.format_node()[:120]})"
    with gm.graph.inserting_after(placeholders[-1]):
        pad_ids = gm.graph.placeholder("gnn_io_pad_ids")
    for node, source, mask, how in plan:
        if how == "keep":
            node.replace_all_uses_with(source)
        else:
            with gm.graph.inserting_before(node):
                node.replace_all_uses_with(gm.graph.call_function(torch.where, (mask, source, pad_ids)))
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return len(plan), None


def pad_targets(nodes: int, padded: tuple, like: torch.Tensor) -> torch.Tensor:
    """For each of the ``padded[1]`` edge slots a padded node (``like``'s dtype and device), in turn: the padded
    edges' nodes (the last slots) and where :func:`redirect_filters` sends the edges a filter drops."""
    return nodes + torch.arange(padded[1], device=like.device, dtype=like.dtype) % (padded[0] - nodes)


class Bucketed:
    """The callable for a Dynamo graph of changing sizes: each call padded to its bucket (:func:`padded_sizes`, or
    a compiled bucket up to :data:`REUSE` larger, or :data:`FAR_REUSE` for a size not met in the last
    :data:`RECENT_CALLS` calls, :meth:`covering`), run by that bucket's fixed-size compile
    (``compile_at(gm, example_inputs)``, one per bucket, made at its first call; None where it failed), its outputs
    cut back. Past :data:`MAX_BUCKETS` compiles, or after a failed one, a call of a new bucket runs ``dynamic``, the
    shape-generic compile."""

    def __init__(self, gm, layout: Layout, compile_at: Callable, dynamic: Callable, on_compile: Callable = None,
                 pad_ids: bool = False):
        self.gm, self.layout, self.compile_at, self.dynamic = gm, layout, compile_at, dynamic
        self.compiled, self.on_compile, self.failed = {}, on_compile, False
        self.pad_ids = pad_ids  # ``gm`` takes :func:`pad_targets` as its last input (:func:`redirect_filters`)
        self.recent = collections.deque(maxlen=RECENT_CALLS)  # the calls' own bucket keys
        self.far_reuse = FAR_REUSE

    def covering(self, key: tuple, nodes: int, edges: int, factor: float = REUSE) -> Optional[tuple]:
        """The smallest compiled bucket (the same sizes besides nodes and edges) that holds a call of ``nodes`` and
        ``edges``, at most ``factor`` times the call's own bucket ``key`` in each size, with padded nodes enough
        for its padded edges (:data:`PAD_DEGREE`); None where there is none."""
        fits = [k for k, fn in self.compiled.items() if fn is not None and k[2:] == key[2:]
                and key[0] <= k[0] <= key[0] * factor and key[1] <= k[1] <= key[1] * factor
                and (k[0] - nodes) * PAD_DEGREE >= k[1] - edges]
        return min(fits, key=lambda k: (k[1], k[0])) if fits else None

    def choose(self, own: tuple, nodes: int, edges: int) -> tuple:
        """The bucket key a call of ``nodes`` and ``edges`` runs in, ``own`` being its own: ``own`` where compiled,
        else the :meth:`covering` compiled bucket within :data:`REUSE` or, for a size not met in the last
        :data:`RECENT_CALLS` calls, within ``far_reuse``, else ``own`` (to compile). Records the call's size."""
        key = own
        if own not in self.compiled:
            larger = self.covering(own, nodes, edges)
            if larger is None and own not in self.recent:
                larger = self.covering(own, nodes, edges, self.far_reuse)
            key = own if larger is None else larger
        self.recent.append(own)
        return key

    def __call__(self, *args):
        nodes, edges = self.layout.sizes(args)
        padded = padded_sizes(nodes, edges)
        key = self.choose(self.layout.key(args, padded), nodes, edges)
        padded = key[:2]
        fn = self.compiled.get(key)
        if key not in self.compiled and (self.failed or len(self.compiled) >= MAX_BUCKETS):
            return self.dynamic(*args)
        targets = pad_targets(nodes, padded, args[self.layout.edge_at]) if self.pad_ids else None
        inputs = self.layout.pad(args, nodes, edges, padded, targets)
        if targets is not None:
            inputs.append(targets)
        tensors = [a for a in inputs if not isinstance(a, int)]
        if key not in self.compiled:
            bucket_gm = with_constant_ints(copy_module(self.gm, values=False), inputs)
            fn = self.compiled[key] = self.compile_at(bucket_gm, tensors)
            self.failed = fn is None  # a graph Inductor cannot compile at one fixed size fails at the others too
            if fn is not None and self.on_compile is not None:
                self.on_compile(key)
        if fn is None:  # this bucket's fixed-size compile failed (the report says why): the shape-generic graph
            return self.dynamic(*args)
        return self.layout.trim(fn(*tensors), nodes, edges)
