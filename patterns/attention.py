"""Attention aggregation: an edge softmax whose weights scale gathered values, summed by
destination (GATConv, GATv2Conv, TransformerConv). The target of the fused attention kernels.

Search::

    s = score(x_j, x_i, edge_attr, params)        # per-edge math, e.g. leaky_relu(a_j + a_i)
    alpha = softmax(s, dst)                        # already rewritten to gnn_io.edge_softmax
    out = scatter(message(alpha, x_j, ...), dst, reduce='sum')   # e.g. alpha.unsqueeze(-1) * x_j

Replacement: ``torch.ops.gnn_io.attention(args, roles, *csr_plan, score_key, message_key, eps, items,
max_edges)``; on CUDA ``items`` are the plan's work items (``gnn_io.work_items(rowptr, col, max_edges)``,
hoisted with the plan, so built once per graph) that split hubs across programs of the fused kernel
(``kernels/attention_triton.py``); elsewhere none. The edge softmax stays in the graph only for other users of ``alpha`` (returned attention
weights), otherwise it is removed as dead code.

Attention dropout (PyG's ``F.dropout(alpha)``) stays fused: the canonical form spells it as a
random keep-mask (``rand(E, H) > p``, drawn from the shape alone), which reaches the op as a
per-edge input, so forward and backward see the same mask.

Near misses: the weights pass through another random op that reads them, or the scores are not
per-edge math; those aggregations are left to the gather-scatter family, with the edge softmax
kept as its own op.
"""
import torch
from gnn_inductor.kernels.attention_triton import MAX_EDGES, recognise

from gnn_inductor.graph_match import (
    NotAnEdgeFunction,
    build_edge_fn,
    collect_region,
    index_key,
    match_aggregation,
    pack_args,
    val,
)
from gnn_inductor.rewrite import Pattern

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
    try:
        agg.score_region = collect_region(region.special.args[0], agg.roles)
    except NotAnEdgeFunction as exc:
        return f"attention scores are not per-edge math ({exc}); aggregated by gather_scatter"
    return agg


def replace(agg, ctx):
    tensors, roles, arg_of = pack_args([agg.region, agg.score_region])
    score_key = ctx.register_fn(build_edge_fn(agg.score_region, arg_of, len(tensors), special_first=False))
    message_key = ctx.register_fn(build_edge_fn(agg.region, arg_of, len(tensors), special_first=True))
    eps = agg.region.special.args[4]
    plan = ctx.plan_for(agg)
    before = agg.scatter.result
    items, max_edges = None, 0
    if val(agg.scatter.node).device.type == "cuda":
        items = ctx.call_parts(torch.ops.gnn_io.work_items.default, (plan.rowptr, plan.col, MAX_EDGES), before, 4)
        max_edges = MAX_EDGES
    new = ctx.call(torch.ops.gnn_io.attention.default,
                   (tensors, roles, *plan.walk, score_key, message_key, eps, items, max_edges), before=before)
    form = recognise(score_key, message_key, roles)
    ctx.record("attention", "gnn_io.attention", agg.scatter.node,
               {"roles": list(roles), "score": score_key, "message": message_key,
                "family": None if isinstance(form, str) else form.family,
                "dtype": str(val(agg.scatter.node).dtype).removeprefix("torch.")}, plan.rowptr)
    return new


PATTERN = Pattern("attention", COVERS, match, replace)
