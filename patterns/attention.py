"""Attention aggregation: an edge softmax whose weights scale gathered values, summed by
destination (GATConv, GATv2Conv, TransformerConv). The target of the fused attention kernels.

Search::

    s = score(x_j, x_i, edge_attr, params)        # per-edge math, e.g. leaky_relu(a_j + a_i)
    alpha = softmax(s, dst)                        # already rewritten to gnn_io.edge_softmax
    out = scatter(message(alpha, x_j, ...), dst, reduce='sum')   # e.g. alpha.unsqueeze(-1) * x_j

Replacement: ``torch.ops.gnn_io.attention(args, roles, *csr_plan, score_key, message_key, eps, items,
max_edges)``; on CUDA ``items`` are the plan's work items (``gnn_io.work_items(rowptr, col, max_edges)``,
hoisted with the plan, so built once per graph) that split hubs across programs of the fused kernel
(``kernels/attention/csr_*.py``); elsewhere none. The edge softmax stays in the graph only for other users of ``alpha`` (returned attention
weights), otherwise it is removed as dead code.

Attention dropout (PyG's ``F.dropout(alpha)`` in training) is folded into the op: the canonical form spells it
``alpha * (rand(E, H) > p) * (1 / (1 - p))`` (``canonical.as_dropout``); the rewrite drops the random keep-mask
from the message and gives the op ``p`` and a seed drawn in the graph (``randint(2^31 - 1)`` from torch's
default generator: ``torch.manual_seed`` governs it, every call draws a new one). The kernels regenerate the
mask from the seed and the edge id in forward and backward (``kernels/runtime/rng.py``): no ``[E, H]`` tensor. A node
that reads the dropped-out alpha outside the message (PyG's returned attention weights) reads the same mask,
``gnn_io.dropout_keep(seed, [E, H], p)``. In eval mode there is no dropout in the graph at all.

Near misses: the weights pass through another random op that reads them, or the scores are not
per-edge math; those aggregations are left to the gather-scatter family, with the edge softmax
kept as its own op.
"""

import torch
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.attention.csr_launch import MAX_EDGES
from gnn_inductor.kernels.attention.forms import recognise

from gnn_inductor import canonical, config
from gnn_inductor.graph_match import (
    NotAnEdgeFunction,
    build_edge_fn,
    collect_region,
    index_key,
    match_aggregation,
    pack_args,
    val,
)
from gnn_inductor.kernels.runtime.roles import ROLE_EDGE
from gnn_inductor.passes.linear_fusion import parameter_name
from gnn_inductor.passes.patterns import Pattern, register_pattern
from gnn_inductor.rewrite_report import source_of

COVERS = (("GATConv / GATv2Conv / TransformerConv: softmax(score(x_i, x_j, e), dst) scaling a gathered message, "
          "summed by dst"),)


def _softmax_index(softmax_node):
    rowptr = softmax_node.args[1]
    return rowptr.args[0].args[0]  # getitem(csr_plan(dst, ...), 0)


def _is_dropout_of_softmax(node) -> bool:
    for inp in node.all_input_nodes:
        if inp.target == torch.ops.gnn_io.edge_softmax.default:
            return True
    return False


def match(node, ctx):
    softmaxes = frozenset(n for n in node.graph.nodes if n.target == torch.ops.gnn_io.edge_softmax.default)
    if not softmaxes:
        return None
    agg = match_aggregation(node, ctx.structure, special=softmaxes)
    if not hasattr(agg, "region"):
        return None
    region = agg.region
    if region.special is None:
        random_weights = [n for n in region.inputs if n.op == "call_function" and _is_dropout_of_softmax(n)
                          and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
        if random_weights:
            return ("attention weights pass through a random op that reads them before the message; "
                    "aggregated as gnn_io.edge_softmax + gnn_io.gather_scatter")
        return None
    if agg.scatter.reduce != "sum" or index_key(_softmax_index(region.special)) != agg.roles.dst_key:
        return None
    agg.softmax = region.special
    try:
        agg.score_region = collect_region(agg.softmax.args[0], agg.roles)
    except NotAnEdgeFunction as exc:
        return f"attention scores are not per-edge math ({exc}); aggregated by gather_scatter"
    agg.dropout = _fold_dropout(region)
    return agg


def _fold_dropout(region) -> canonical.Dropout | None:
    """The dropout on alpha when the message reads alpha only through it, taken out of the message: the region's
    alpha input becomes the dropout's result and the keep-mask is no longer an input (the op applies dropout
    itself). None, and the region unchanged, otherwise: the mask then stays a per-edge input and the op runs
    its reference (correct, not fused)."""
    alpha, members = region.special, set(region.nodes)
    readers = [n for n in alpha.users if n in members]
    dropout = canonical.as_dropout(next(iter(readers[0].users))) if len(readers) == 1 and \
        len(readers[0].users) == 1 else None
    if dropout is None or dropout.input is not alpha or dropout.result not in members or \
            len(dropout.keep.users) != 1 or len(dropout.rand.users) != 1 or \
            region.inputs.get(dropout.keep, (None,))[0] != ROLE_EDGE:
        return None
    region.special = dropout.result
    region.nodes = [n for n in region.nodes if n is not dropout.masked and n is not dropout.result]
    del region.inputs[dropout.keep]
    return dropout


def _draw_seed(dropout: canonical.Dropout, ctx):
    """The seed node of a folded dropout, and the dropout's keep-mask replaced by the one the op draws from it
    (for anything else in the graph that reads the dropped-out alpha; dead code otherwise)."""
    device = val(dropout.keep).device
    seed = ctx.call(torch.ops.aten.randint.default, (rng.SEED_HIGH, []), before=dropout.keep, dtype=torch.int64,
                    device=device)
    same_mask = ctx.call(torch.ops.gnn_io.dropout_keep.default, (seed, list(dropout.rand.args[0]), dropout.p),
                         before=dropout.keep)
    dropout.keep.replace_all_uses_with(same_mask)
    graph = ctx.gm.graph
    graph.erase_node(dropout.keep)
    graph.erase_node(dropout.rand)  # random ops are never dead code to FX
    return seed


def replace(agg, ctx):
    tensors, roles, arg_of = pack_args([agg.region, agg.score_region])
    score_key = ctx.register_fn(build_edge_fn(agg.score_region, arg_of, len(tensors), special_first=False))
    message_key = ctx.register_fn(build_edge_fn(agg.region, arg_of, len(tensors), special_first=True))
    eps = agg.softmax.args[4]
    plan = ctx.plan_for(agg)
    before = agg.scatter.result
    items, max_edges = None, 0
    if val(agg.scatter.node).device.type == "cuda":
        items = ctx.call_parts(torch.ops.gnn_io.work_items.default, (plan.rowptr, plan.col, MAX_EDGES), before, 4)
        max_edges = MAX_EDGES
    dropout = (_draw_seed(agg.dropout, ctx), agg.dropout.p) if agg.dropout is not None else ()
    new = ctx.call(torch.ops.gnn_io.attention.default,
                   (tensors, roles, *plan.walk, score_key, message_key, eps, items, max_edges, *dropout), before=before)
    form = recognise(score_key, message_key, roles)
    details = {"roles": list(roles), "score": score_key, "message": message_key,
               "family": None if isinstance(form, str) else form.family,
               "dtype": str(val(new).dtype).removeprefix("torch.")}
    new = _as_eager_dtype(new, agg, ctx, details)
    rows = val(agg.scatter.node).shape[0]
    if isinstance(rows, int):  # destination rows, for the cost model (not with symbolic sizes)
        details["rows"] = rows
    if agg.dropout is not None:
        details["dropout_p"] = agg.dropout.p
    ctx.record("attention", "gnn_io.attention", agg.scatter.node, details, plan.rowptr)
    return new


def _as_eager_dtype(new, agg, ctx, details: dict):
    """The op's output in the dtype of the aggregation it replaces. The op's is half precision when any argument
    is (kernels/attention/layout.py); eager's is the message's, float32 where autocast or a float32 parameter
    promotes it (``alpha * x_j`` with float32 ``alpha`` and bfloat16 ``x_j``: GATConv under any autocast,
    TransformerConv and GATv2Conv under CUDA autocast). Without the cast the layer's output and everything after
    it would change dtype; with it the op's output is eager's float32 sum rounded once to half precision (as every
    other result autocast leaves in half precision). ``details["dtype"]`` stays the op's (the kernels' precision,
    which the cost model keys on), ``details["output_dtype"]`` is eager's where they differ."""
    eager = val(agg.scatter.result).dtype
    if val(new).dtype == eager:
        return new
    details["output_dtype"] = str(eager).removeprefix("torch.")
    return ctx.call(torch.ops.aten._to_copy.default, (new,), before=agg.scatter.result, dtype=eager)


PATTERN = register_pattern(Pattern("attention", COVERS, match, replace), priority=20)


BIAS_ENV = config.SETTINGS["attention_bias"].env
_RESHAPES = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)


def fold_bias(gm) -> list:
    """Fold ``attention(...) + bias`` into the attention op's ``bias`` argument (kernels/attention/op.py: the sum is
    made in the op's output, so the attention output and the layer's output are one tensor). Two spellings: PyG's
    GATConv and GATv2Conv add a bias of ``H * C`` elements to the concatenated heads, ``view(out, [N, H * C]) +
    bias``; DGL's GATConv adds one of shape ``[1, H, C]`` to ``out`` itself. Only for an attention output read by
    that reshape (read by the addition alone) or by the addition alone, and a bias of ``H * C`` elements of the
    output's dtype and device that exists before the op (a graph input or an earlier node, or a reshape of one),
    broadcast over rows only. ``GNN_IO_ATTENTION_BIAS=0`` turns it off. Returns the folded additions
    (``{"source", "bias"}``)."""
    if not config.get("attention_bias"):
        return []
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    folded = []
    for node in list(gm.graph.nodes):
        if node.target is not torch.ops.gnn_io.attention.default or node.kwargs.get("bias") is not None \
                or len(node.users) != 1:
            continue
        (user,) = node.users
        rows = user if user.target in _RESHAPES else None
        if rows is not None and len(rows.users) != 1:
            continue
        add = next(iter(rows.users)) if rows is not None else user
        summand = rows if rows is not None else node
        if add.target is not torch.ops.aten.add.Tensor or add.kwargs or len(add.args) != 2 \
                or not isinstance(add.args[0], torch.fx.Node) or not isinstance(add.args[1], torch.fx.Node):
            continue
        bias = add.args[1] if add.args[0] is summand else add.args[0]
        if bias is summand or not _fits_as_bias(val(bias), val(node), val(summand), val(add)):
            continue
        while order[bias] > order[node] and bias.target in _RESHAPES and isinstance(bias.args[0], torch.fx.Node):
            bias = bias.args[0]  # DGL's bias.view(1, H, C), made after the op: its base (the op views it itself)
        if order[bias] > order[node]:
            continue
        node.kwargs = {**node.kwargs, "bias": bias}
        add.replace_all_uses_with(summand)
        name = parameter_name(bias) if bias.op == "placeholder" else bias.name
        folded.append({"source": source_of(add), "bias": name})
        gm.graph.erase_node(add)
    if folded:
        gm.recompile()
    return folded


def _fits_as_bias(bias, out, summand, total) -> bool:
    """Whether ``summand + bias`` (``summand`` the attention output ``out`` or its ``[N, H * C]`` view) is
    ``out`` plus one bias row broadcast over the rows, with the summand's shape and dtype."""
    if bias is None or out is None or summand is None or total is None:
        return False
    row = tuple(summand.shape[1:])
    return (bias.dtype == out.dtype == total.dtype and bias.device == out.device
            and tuple(total.shape) == tuple(summand.shape) and bias.numel() == out[0].numel()
            and tuple(bias.shape) in (row, (1, *row)))
