"""Gather-scatter: any per-edge message reduced by destination.

Search (what it matches)::

    x_j = x.index_select(0, src)        # or x[src], x.gather(0, src.view(-1, 1).expand(...))
    x_i = x.index_select(0, dst)
    msg = phi(x_j, x_i, edge_attr, params)   # any chain of pointwise ops, views that keep the
                                             # edge dimension, reductions over feature dims
    out = msg.new_zeros(N, ...).scatter_reduce_(0, dst.view(-1, 1).expand_as(msg), msg,
                                                 reduce, include_self=False)
    # also scatter_add_, index_add_, index_put_(accumulate=True), index_reduce_, and PyG's mean
    # (sum / clamp(count, 1)); reduce in sum, mean, amax, amin

Replacement: ``torch.ops.gnn_io.gather_scatter(args, roles, *csr_plan, phi_key, reduce)``.

Checks and near-miss reasons: reduce 'prod'/'mul'; include_self=True with max/min/mean; a scatter
index computed from features (not graph structure); gathers by more than one source index; an
op in the message that mixes edges (a reduction over the edge dim, a view that flattens it);
a tensor that is neither per-edge nor broadcast.
"""
import torch

from gnn_inductor.graph_match import build_edge_fn, match_aggregation, pack_args
from gnn_inductor.rewrite import Pattern

COVERS = ("index_select/x[idx]/gather -> pointwise chain -> scatter_add_/scatter_reduce_/index_add_/"
          "index_put_(accumulate)/index_reduce_ (sum, mean, amax, amin)",
          "torch_geometric.utils.scatter(reduce='sum'|'mean'|'max'|'min')")


def match(node, ctx):
    return match_aggregation(node, ctx.structure)


def replace(agg, ctx):
    tensors, roles, arg_of = pack_args([agg.region])
    key = ctx.register_fn(build_edge_fn(agg.region, arg_of, len(tensors), special_first=False))
    plan = ctx.plan_for(agg)
    new = ctx.call(torch.ops.gnn_io.gather_scatter.default,
                   (tensors, roles, *plan.walk, key, agg.scatter.reduce), before=agg.scatter.result)
    ctx.record("gather_scatter", "gnn_io.gather_scatter", agg.scatter.node,
               {"reduce": agg.scatter.reduce, "roles": list(roles), "message": key}, plan.rowptr)
    return new


PATTERN = Pattern("gather_scatter", COVERS, match, replace)
