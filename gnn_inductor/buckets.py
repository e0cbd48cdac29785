"""Shape buckets for graphs whose sizes change from call to call (sampled mini-batches).

A stream of sampled subgraphs gives Dynamo a graph of symbolic sizes: ``torch.compile`` then runs shape-generic
kernels and, under ``mode="reduce-overhead"``, records a new CUDA graph for every distinct size (every step).
Here each call's node and edge counts are padded up to a few buckets (:func:`bucket`, a geometric ladder), and
the graph is compiled once per bucket at fixed sizes, so CUDA graphs replay from the second step of a bucket on.
A heterogeneous mini-batch (features per node type, an ``edge_index`` per edge type) pads each node type and each
edge set to its own bucket; which input counts what is :func:`gnn_inductor.buckets_layout.layout_of`'s.

Padding never changes a real output. The padded nodes of a type replicate its node 0's row (finite wherever node 0
is, so no NaN of a padded row can reach a parameter gradient through a zero), the padded edges of an edge set join
padded nodes of its source type to padded nodes of its destination type (self loops within one type), spread so
that no padded node gets more than :data:`PAD_DEGREE` of them over all edge sets, and every output is cut back to
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

import torch

from gnn_inductor.buckets_layout import HOMOGENEOUS, Layout, SizeSlots, copy_module, layout_of, size_expr
from gnn_inductor.rewrite_report import source_of

__all__ = ["Bucketed", "HOMOGENEOUS", "Layout", "SizeSlots", "bucket", "copy_module", "fits", "layout_of",
           "padded_for", "padded_sizes", "redirect_filters", "why_unsafe", "with_constant_scalars"]

aten = torch.ops.aten

# the smallest bucket, the ladder's step (about 9% padding at most, 4.5% on average) and the alignment of a size
MIN_BUCKET = 256
GROWTH = 2 ** 0.125
ALIGN = 64
# the most padded edges on one padded node: a sum over them stays far from float16's range for any real message
PAD_DEGREE = 32
# fixed-size compiles kept per graph before calls of new bucket sizes run the shape-generic graph
MAX_BUCKETS = 8
# a call whose own bucket has no compile yet runs in a compiled bucket up to this factor larger in every size (two
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
# The buckets settle at the SETTLE_CALLS-th call: that call also compiles, ahead of need, the bucket one step of the
# ladder above the largest compiled one (in every size). After it, a call that no bucket holds within REUSE or
# FAR_REUSE and whose own bucket came up fewer than RECUR times in the last RECENT_CALLS calls (an outlier, an epoch's
# short last batch) runs in any compiled bucket that holds it, and one larger than all of them runs the captured graph
# as it is (eager PyTorch at its own sizes, outside the CUDA graphs' memory): neither compiles. A size that comes back
# RECUR times compiles its own bucket (the sizes drifted). Simulated over six seeds of 200 batches each drawn by
# benchmarks/sampler.py from the arxiv-sized graph (``python -m benchmarks.bucket_reuse``, fan-outs 15,10,5 and 10,10
# at 1024 and 4096 seeds), the buckets compiled 2, 0, 6 and 5 times after the 32nd call without this and never with
# it, no call ran unpadded, and the mean padding at 4096 seeds rose from 5-8% to 6-10% (the short last batches riding
# the full batches' bucket). On the H200 a 1024-seed GCNConv step run unpadded had raised the step's peak from about
# 190 to 260 MB: hence the bucket ahead.
SETTLE_CALLS = 32
RECUR = 3
ANY_SIZE = float(2 ** 40)  # the reuse factor of a rare size after the buckets settled: any compiled bucket


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


def padded_for(counts: tuple, slots: SizeSlots = HOMOGENEOUS) -> tuple:
    """The padded sizes of a call of ``counts`` (node counts and edge counts at the positions ``slots`` names): each
    edge count to its bucket (0 stays 0), each node count to the bucket that leaves it enough padded nodes for no
    padded node to carry more than :data:`PAD_DEGREE` of the padded edges that end on its type, and at least one."""
    padded = list(counts)
    for j in slots.edges:
        padded[j] = bucket(counts[j]) if counts[j] else 0
    for i in slots.nodes:
        load = sum(padded[j] - counts[j] for j in slots.loads.get(i, ()))
        padded[i] = bucket(counts[i] + max(1, -(-load // PAD_DEGREE)) - 1)
    return tuple(padded)


def padded_sizes(nodes: int, edges: int) -> tuple:
    """``(padded nodes, padded edges)`` for a homogeneous graph of ``nodes`` and ``edges``."""
    return padded_for((nodes, edges))


def fits(padded: tuple, counts: tuple, slots: SizeSlots = HOMOGENEOUS) -> bool:
    """Whether a call of ``counts`` fits the bucket of ``padded`` sizes: every count at most its padded size, and
    padded nodes of each type enough for the padded edges that end there (:data:`PAD_DEGREE` each at most)."""
    return all(p >= c for p, c in zip(padded, counts)) and all(
        (padded[i] - counts[i]) * PAD_DEGREE >= sum(padded[j] - counts[j] for j in slots.loads.get(i, ()))
        and padded[i] > counts[i] for i in slots.nodes)


def _fixed_in_graph(position: int, value, numbers) -> bool:
    """Whether an input is put into a bucket's graph as a constant (a Python number, or a 0-d tensor at one of the
    positions ``numbers`` that the graph reads as a number) instead of being passed at each call."""
    return isinstance(value, (int, float)) or position in numbers


def with_constant_scalars(gm: torch.fx.GraphModule, inputs: list, numbers: frozenset = frozenset()) \
        -> torch.fx.GraphModule:
    """``gm`` (rewritten in place) with each integer or float placeholder replaced by its value in ``inputs``, and
    the ``.item()`` reads of the 0-d tensors at the positions ``numbers`` by theirs (a bucket key holds the values
    of all of them that are not sizes): a compile at fixed sizes, where AOTAutograd would otherwise make a symbol of
    every such input, an unbacked one for a number read from a tensor (GATConv's dropout probability, whose range
    check then cannot be decided). The result takes the other tensor inputs only."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, value) in enumerate(zip(placeholders, inputs)):
        if not _fixed_in_graph(i, value, numbers):
            continue
        if i in numbers:  # its .item() reads become the number
            for read in list(node.users):
                read.replace_all_uses_with(value.item())
                gm.graph.erase_node(read)
        else:
            node.replace_all_uses_with(value)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


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
# they sort last and every real prefix stays as it was. With several node types a padded id of one type can be
# smaller than a real id of another, so these are declined there
_INTEGER_ORDERED = {aten.sort.default, aten.sort.stable, aten.bincount.default,
                    aten._unique2.default, aten.unique_consecutive.default, aten.searchsorted.Tensor,
                    aten.argsort.default, aten.argsort.stable}


def _tagged_dims(value, tagged: set) -> list:
    if not isinstance(value, torch.Tensor):
        return []
    return [i for i, size in enumerate(value.shape) if size_expr(size).free_symbols & tagged]


def _dims_arg(node, position: int, ndim: int) -> list:
    dims = node.args[position] if len(node.args) > position else node.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % max(ndim, 1) for d in dims]


def why_unsafe(aten_gm: torch.fx.GraphModule, layout: Layout) -> Optional[str]:
    """None where padding provably changes no real row of any output, else which op (and the user's line) mixes
    padded rows into real ones."""
    nodes = set(layout.nodes.values())
    tagged = nodes | set(layout.edges.values())
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
                    tagged |= {s for d in v.shape for s in size_expr(d).free_symbols
                               if str(s).startswith(("u", "unbacked"))}
        if not touched:
            continue
        why = _op_mixes_rows(node, inputs, tagged, nodes)
        if why:
            return f"{why} (at {source_of(node)['source']})"
    return None


def _op_mixes_rows(node, inputs, tagged: set, nodes: set) -> Optional[str]:
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
        if any(len(size_expr(first.shape[d]).free_symbols & tagged) > 1 for d in dims):
            # a concatenation of counts (node types, or edges and self loops): padded rows sit between real ones
            return f"{name} picks rows by position along a dimension of several counts"
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
        if len(nodes) > 1:
            return f"{name} orders node ids, which with several node types padding may reorder"
        return None
    if target is aten.cumsum.default and not first.is_floating_point():
        # prefix sums of integers per node (degrees into CSR offsets): the padded nodes are the last rows. Over an
        # edge dimension padded edges can sit between real ones (after a concatenation), so it is declined there
        size = size_expr(first.shape[node.args[1] % first.dim()])
        if len(size.free_symbols) == 1 and size.free_symbols <= nodes:
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


def _edge_mask(index, edges: set) -> Optional[torch.fx.Node]:
    """The boolean mask of an index ``mask`` or ``(:, mask)`` whose length is an input edge count, else None."""
    mask = index[1] if isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) else index
    if not isinstance(mask, torch.fx.Node):
        return None
    value = mask.meta.get("example_value")
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() == 1
            and size_expr(value.shape[0]) in edges):
        return None
    return mask


def redirect_filters(gm: torch.fx.GraphModule, layout: Layout) -> tuple:
    """Rewrite ``gm`` (a Dynamo graph, in place) so that no edge filter by a mask changes its sizes:
    ``edge_index[:, mask]`` and ``edge_index[i][mask]`` become ``where(mask, ..., pad_ids)``, where ``pad_ids``
    (a new last input per filtered ``edge_index``, its :meth:`Layout.targets`) names a padded node of each row's node
    type for every edge slot, so a dropped edge joins two padded nodes; an edge attribute ``attr[mask]`` (floating
    point) keeps all its rows, aligned with the kept slots. ``layout.filtered`` lists the filtered ``edge_index``
    inputs' positions, in the order of the new inputs.

    Returns ``(count, None)``, ``(0, None)`` where the graph filters nothing, or ``(0, why)`` with ``gm`` unchanged
    where a filter cannot keep its slots: one of other integers (edge types), or a filtered count used for more
    than sizes and asserts."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    edge_syms = set(layout.edges.values())
    rows_of_edges = {placeholders[i]: (i, None) for i in layout.edge_inputs}  # node -> (input, row or None: both)
    for node in gm.graph.nodes:  # edge_index[0], edge_index[1]
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in rows_of_edges \
                and rows_of_edges[node.args[0]][1] is None and node.args[1] in (0, 1, -1, -2):
            rows_of_edges[node] = (rows_of_edges[node.args[0]][0], node.args[1] % 2)
    plan = []
    for node in gm.graph.nodes:
        if not (node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2):
            continue
        source, index = node.args
        mask = _edge_mask(index, edge_syms)
        if mask is None:
            continue
        value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else None
        if source in rows_of_edges and (rows_of_edges[source][1] is not None or isinstance(index, tuple)):
            plan.append((node, source, mask, rows_of_edges[source]))
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 1 \
                and size_expr(value.shape[0]) == size_expr(mask.meta["example_value"].shape[0]) \
                and not isinstance(index, tuple):
            plan.append((node, source, mask, None))
        else:
            return 0, f"a mask filters {node.format_node()[:120]}, which is not edge_index or an edge attribute"
    if not plan:
        return 0, None
    counts = {s for node, *_ in plan for d in node.meta["example_value"].shape
              for s in size_expr(d).free_symbols if s not in edge_syms}
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if _is_scalar(value) and counts & size_expr(value).free_symbols and not _only_sizes(node, set()):
            return 0, f"the filtered edge count is used as a value ({node.format_node()[:120]})"
    layout.filtered = sorted({rows[0] for *_, rows in plan if rows is not None})
    pad_ids, last = {}, placeholders[-1]
    for i in layout.filtered:
        with gm.graph.inserting_after(last):
            pad_ids[i] = last = gm.graph.placeholder("gnn_io_pad_ids")
    for node, source, mask, rows in plan:
        if rows is None:
            node.replace_all_uses_with(source)
        else:
            with gm.graph.inserting_before(node):
                targets = pad_ids[rows[0]]
                if rows[1] is not None:
                    targets = gm.graph.call_function(operator.getitem, (targets, rows[1]))
                node.replace_all_uses_with(gm.graph.call_function(torch.where, (mask, source, targets)))
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return len(plan), None


class Bucketed:
    """The callable for a Dynamo graph of changing sizes: each call padded to its bucket (:func:`padded_for`, or
    a compiled bucket up to :data:`REUSE` larger, or :data:`FAR_REUSE` for a size not met in the last
    :data:`RECENT_CALLS` calls, :meth:`covering`), run by that bucket's fixed-size compile
    (``compile_at(gm, example_inputs)``, one per bucket, made at its first call; None where it failed), its outputs
    cut back. Past :data:`SETTLE_CALLS` calls, a call of a new bucket that is rare (:meth:`stays_unpadded`) runs
    ``unpadded`` (the captured graph as it is) where given; past :data:`MAX_BUCKETS` compiles, or after a failed one,
    a call of a new bucket runs ``dynamic``, the shape-generic compile. A bucket key is the padded sizes (node
    counts, then edge counts, ``slots``) and the fixed shapes of the other inputs."""

    slots = HOMOGENEOUS  # the positions of the sizes in a key (a chooser made without a layout: (nodes, edges))

    def __init__(self, gm, layout: Layout, compile_at: Callable, dynamic: Callable, on_compile: Callable = None,
                 unpadded: Optional[Callable] = None, on_unpadded: Callable = None):
        self.gm, self.layout, self.compile_at, self.dynamic = gm, layout, compile_at, dynamic
        self.unpadded, self.on_unpadded = unpadded, on_unpadded
        self.slots = layout.slots
        self.compiled, self.on_compile, self.failed = {}, on_compile, False
        self.recent = collections.deque(maxlen=RECENT_CALLS)  # the calls' own bucket keys
        self.far_reuse, self.settle_calls, self.calls = FAR_REUSE, SETTLE_CALLS, 0

    def covering(self, key: tuple, *counts: int, factor: float = REUSE) -> Optional[tuple]:
        """The smallest compiled bucket (the same fixed shapes besides the padded sizes) that holds a call of
        ``counts``, at most ``factor`` times the call's own bucket ``key`` in each size (plus the ladder's
        :data:`ALIGN`, so that two steps up are within :data:`REUSE` wherever the rounding falls), with padded nodes
        of each type enough for the padded edges that end there (:func:`fits`); None where there is none."""
        width = len(counts)
        found = [k for k, fn in self.compiled.items() if fn is not None and k[width:] == key[width:]
                 and all(key[i] <= k[i] <= key[i] * factor + ALIGN for i in range(width))
                 and fits(k[:width], counts, self.slots)]
        return min(found, key=lambda k: (sum(k[j] for j in self.slots.edges), sum(k[i] for i in self.slots.nodes))) \
            if found else None

    def choose(self, own: tuple, *counts: int) -> tuple:
        """The bucket key a call of ``counts`` runs in, ``own`` being its own: ``own`` where compiled, else the
        :meth:`covering` compiled bucket within :data:`REUSE` or, for a size not met in the last
        :data:`RECENT_CALLS` calls, within ``far_reuse``, else ``own`` (to compile). Records the call's size."""
        key = own
        if own not in self.compiled:
            larger = self.covering(own, *counts)
            if larger is None and own not in self.recent:
                larger = self.covering(own, *counts, factor=self.far_reuse)
            if larger is None and self.calls >= self.settle_calls and self.recent.count(own) + 1 < RECUR:
                larger = self.covering(own, *counts, factor=ANY_SIZE)
            key = own if larger is None else larger
        self.recent.append(own)
        self.calls += 1
        return key

    def stays_unpadded(self, key: tuple, own: tuple) -> bool:
        """Whether the call just chosen (bucket ``key``, its own ``own``) runs unpadded instead of compiling ``key``:
        the buckets are settled (past :data:`SETTLE_CALLS` calls) and ``own`` came up fewer than :data:`RECUR` times
        in the last :data:`RECENT_CALLS` calls (a size larger than every compiled bucket, met rarely)."""
        return key not in self.compiled and self.calls > self.settle_calls and self.recent.count(own) < RECUR

    def ahead(self, key: tuple, *counts: int) -> Optional[tuple]:
        """At the call that settles the buckets (the :data:`SETTLE_CALLS`-th; ``key`` its bucket, of ``counts``): the
        bucket one step of the ladder above the largest compiled one with ``key``'s fixed shapes, in every size, to
        compile now with this call's inputs padded to it; None at other calls, where it is compiled, past
        :data:`MAX_BUCKETS` or where this call cannot be padded to it (:func:`fits`)."""
        if self.calls != self.settle_calls or len(self.compiled) >= MAX_BUCKETS:
            return None
        width = len(counts)
        same = [k for k, fn in self.compiled.items() if fn is not None and k[width:] == key[width:]]
        if not same:
            return None
        top = max(same, key=lambda k: (sum(k[j] for j in self.slots.edges), sum(k[i] for i in self.slots.nodes)))
        sizes = tuple(bucket(size) if size else 0 for size in top[:width])
        return sizes + top[width:] if sizes + top[width:] not in self.compiled and fits(sizes, counts, self.slots) \
            else None

    def __call__(self, *args):
        layout = self.layout
        counts = layout.sizes(args)
        own = layout.key(args, padded_for(counts, self.slots))
        key = self.choose(own, *counts)
        padded = key[:layout.width]
        fn = self.compiled.get(key)
        if self.unpadded is not None and not self.failed and self.stays_unpadded(key, own):
            if self.on_unpadded is not None:
                self.on_unpadded()
            return self.unpadded(*args)
        if key not in self.compiled and (self.failed or len(self.compiled) >= MAX_BUCKETS):
            return self.dynamic(*args)
        if key not in self.compiled:
            fn = self._compile(key, args, counts)
        ahead = None if self.failed else self.ahead(key, *counts)
        if ahead is not None:
            self._compile(ahead, args, counts)
        if fn is None:  # this bucket's fixed-size compile failed (the report says why): the shape-generic graph
            return self.dynamic(*args)
        return layout.trim(fn(*self._padded(args, counts, padded)[1]), counts, padded)

    def _padded(self, args, counts: tuple, padded: tuple) -> tuple:
        """``args`` of ``counts`` padded to ``padded``: every graph input, and the tensors of a bucket's call."""
        layout = self.layout
        targets = layout.targets(args, counts, padded)
        inputs = layout.pad(args, counts, padded, targets) + [targets[i] for i in layout.filtered]
        return inputs, [a for i, a in enumerate(inputs) if not _fixed_in_graph(i, a, layout.scalars)]

    def _compile(self, key: tuple, args, counts: tuple):
        """The fixed-size compile of bucket ``key``, its example inputs ``args`` of ``counts`` padded to it."""
        inputs, tensors = self._padded(args, counts, key[:self.layout.width])
        bucket_gm = with_constant_scalars(copy_module(self.gm, values=False), inputs, self.layout.scalars)
        fn = self.compiled[key] = self.compile_at(bucket_gm, tensors)
        self.failed = fn is None  # a graph Inductor cannot compile at one fixed size fails at the others too
        if fn is not None and self.on_compile is not None:
            self.on_compile(key)
        return fn
