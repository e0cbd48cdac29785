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

Replacement: ``torch.ops.gnn_io.gather_scatter(args, roles, rowptr, col, row, perm, phi_key, reduce,
[t_rowptr, t_col, t_perm], items, t_items)``, the work items of the CSR and of its transpose built
with the plan (``gnn_io::gather_scatter_items``, hoisted: once per graph). The report's
``details.lowering`` says whether the message lowers into the fused CUDA kernels (``triton``) or
which op keeps it on the reference there.

Checks and near-miss reasons: reduce 'prod'/'mul'; include_self=True with max/min/mean; a scatter
index computed from features (not graph structure); gathers by more than one source index; an
op in the message that mixes edges (a reduction over the edge dim, a view that flattens it);
a tensor that is neither per-edge nor broadcast.
"""
import torch

from gnn_inductor.cost import gather_scatter_declined
from gnn_inductor.graph_match import build_edge_fn, match_aggregation, pack_args, val
from gnn_inductor.kernels import gather_scatter_triton
from gnn_inductor.kernels._common import ROLE_DENSE
from gnn_inductor.rewrite import Pattern

COVERS = (("index_select/x[idx]/gather -> pointwise chain -> scatter_add_/scatter_reduce_/index_add_/"
           "index_put_(accumulate)/index_reduce_ (sum, mean, amax, amin)"),
          "torch_geometric.utils.scatter(reduce='sum'|'mean'|'max'|'min')")


def match(node, ctx):
    agg = match_aggregation(node, ctx.structure)
    if not hasattr(agg, "region"):
        return agg
    declined = gather_scatter_declined(val(agg.scatter.node).device.type, ctx.num_edges_hint)
    if declined is None:
        return agg
    ctx.declined.add(agg.scatter.node)
    return declined


def replace(agg, ctx):
    tensors, roles, arg_of = pack_args([agg.region])
    key = ctx.register_fn(build_edge_fn(agg.region, arg_of, len(tensors), special_first=False))
    plan = ctx.plan_for(agg)
    before = agg.scatter.result
    items_op = torch.ops.gnn_io.gather_scatter_items.default
    items = ctx.call_parts(items_op, (plan.rowptr, plan.col), before, 4)
    t_items = ctx.call_parts(items_op, (plan.t_rowptr, plan.t_col), before, 4)
    new = ctx.call(torch.ops.gnn_io.gather_scatter.default,
                   (tensors, roles, *plan.walk, key, agg.scatter.reduce, [plan.t_rowptr, plan.t_col, plan.t_perm],
                    items, t_items), before=before)
    ctx.record("gather_scatter", "gnn_io.gather_scatter", agg.scatter.node,
               {"reduce": agg.scatter.reduce, "roles": list(roles), "message": key,
                "lowering": _lowering(tensors, roles, key)}, plan.rowptr)
    return new


def _lowering(tensors, roles, key) -> str:
    """``triton`` when the message generates into the fused CUDA kernels, else why not."""
    try:
        specs = [(role, tuple(int(s) for s in (val(t).shape if role == ROLE_DENSE else val(t).shape[1:])),
                  val(t).dtype) for t, role in zip(tensors, roles)]
    except TypeError:
        return "reference: symbolic feature sizes"
    if any(dtype == torch.float64 for _, _, dtype in specs):
        return "reference: float64 arguments (the kernels compute in float32)"
    try:
        found = gather_scatter_triton.lowering(key, specs)
    except Exception as exc:  # a generator bug must not break compilation; the op decides again at run time
        return f"unknown: {type(exc).__name__}: {exc}"
    return "triton" if not isinstance(found, Exception) else f"reference: {found}"


PATTERN = Pattern("gather_scatter", COVERS, match, replace)
