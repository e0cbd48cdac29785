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

Several reductions over the same messages share one pass (:func:`merge`, after the family's scan):
the calls that walk the same plan over the same arguments, with messages of one shape, become one
``torch.ops.gnn_io.gather_scatter_multi(args, roles, rowptr, col, row, perm, [phi_key, ...],
[reduce, ...], ...)``, one member per distinct (message, reduce), each call reading its member's
output. Messages may differ (PyG's std is ``mean(x)`` and ``mean(x * x)`` over the same ``x``);
arguments may not (a call reading other tensors, or the same ones in another order, stays apart). A
message that gathers nothing but reads an edge tensor the model computed (PNA's
``pre_nn([x_i, x_j])``) is taken only when another reduction reads the same tensor, i.e. when there is
a pass to share; alone, Inductor's scatter reads it as often (a near miss says so where a GEMM made that tensor
per edge).
"""
import operator

import torch

from gnn_inductor.cost import gather_scatter_declined
from gnn_inductor.graph_match import build_edge_fn, match_aggregation, pack_args, sibling_aggregations, val
from gnn_inductor.kernels.gather_scatter import launches as gather_scatter_triton
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_EDGE
from gnn_inductor.passes.patterns import Pattern, register_pattern
from gnn_inductor.rewrite_report import Rewrite

COVERS = (("index_select/x[idx]/gather -> pointwise chain -> scatter_add_/scatter_reduce_/index_add_/"
           "index_put_(accumulate)/index_reduce_ (sum, mean, amax, amin)"),
          "torch_geometric.utils.scatter(reduce='sum'|'mean'|'max'|'min')")


def match(node, ctx):
    agg = match_aggregation(node, ctx.structure, edge_messages=True)
    if not hasattr(agg, "region"):
        return agg
    if not agg.gathers and not sibling_aggregations(agg, ctx.structure):
        # one reduction of a computed edge tensor: no pass to share, and Inductor's scatter reads it as often. Said
        # in the report only where a GEMM made it per edge (EdgeConv's MLP, a Linear after per-edge math): a user
        # may ask why that layer keeps no fused aggregation. (Not for every such tensor: GATConv's self-loop
        # attribute mean reduces an input edge tensor, nothing a user wrote as message passing.)
        gemm = _per_edge_gemm(agg)
        if gemm is None:
            return None
        return (f"{agg.scatter.reduce} of an edge tensor that a GEMM made per edge ({gemm}, a linear map after "
                "per-edge math such as EdgeConv's MLP), with no gathered rows in the message and no other reduction "
                "of it to share a pass: no fused kernel takes a GEMM per edge, so Inductor runs it")
    declined = gather_scatter_declined(val(agg.scatter.node).device.type, ctx.num_edges_hint)
    if declined is None:
        return agg
    ctx.declined.add(agg.scatter.node)
    return declined


_GEMMS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
          torch.ops.aten.baddbmm.default)


def _per_edge_gemm(agg) -> str | None:
    """The GEMM (its op name) that made an edge input of ``agg``'s message, if one did."""
    for node, (role, _) in agg.region.inputs.items():
        if role == ROLE_EDGE and node.op == "call_function" and node.target in _GEMMS:
            return f"aten.{node.target.__name__.split('.')[0]}"
    return None


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


def merge(ctx) -> None:
    """Merge this family's calls that can share one pass over the edges (module docstring): grouped by
    plan, arguments (the same nodes in the same roles and order) and message shape."""
    groups = {}
    for rewrite in ctx.rewrites:
        node = rewrite.op_node
        if rewrite.op != "gnn_io.gather_scatter" or not node.users:
            continue
        args, roles, rowptr, col, row, perm = node.args[:6]
        shape = str(tuple(val(node).shape[1:]))
        groups.setdefault((tuple(args), tuple(roles), rowptr, col, row, perm, shape), []).append(rewrite)
    order = {n: i for i, n in enumerate(ctx.gm.graph.nodes)}
    for group in groups.values():
        if len(group) > 1:
            _merge(sorted(group, key=lambda r: order[r.op_node]), ctx)


def _merge(group: list, ctx) -> None:
    """One ``gather_scatter_multi`` before the first call of ``group`` (every call reads the same arguments,
    so they exist there; its plan items serve all), each call's uses moved to its member's output."""
    first = group[0].op_node
    args, roles, rowptr, col, row, perm, _, _, t_plan, items, t_items = first.args
    members = list(dict.fromkeys((r.op_node.args[6], r.op_node.args[7]) for r in group))
    keys, reduces = [key for key, _ in members], [reduce for _, reduce in members]
    multi = ctx.call(torch.ops.gnn_io.gather_scatter_multi.default,
                     (args, roles, rowptr, col, row, perm, keys, reduces, t_plan, items, t_items), before=first)
    outputs = [ctx.call(operator.getitem, (multi, j), before=first) for j in range(len(members))]
    sources = {member: [] for member in members}
    for rewrite in group:
        member = (rewrite.op_node.args[6], rewrite.op_node.args[7])
        rewrite.op_node.replace_all_uses_with(outputs[members.index(member)])
        sources[member].append(_origin(rewrite.source))
    details = {"reduce": "+".join(reduces), "roles": group[0].details["roles"], "merged_calls": len(group),
               "members": [{"reduce": reduce, "message": key, "at": sources[(key, reduce)]} for key, reduce in members],
               "lowering": _lowering(args, roles, keys)}
    merged = Rewrite("gather_scatter", "gnn_io.gather_scatter_multi", group[0].source, details)
    merged.op_node, merged.plan_node = multi, group[0].plan_node
    replaced = {id(r) for r in group}
    position = min(i for i, r in enumerate(ctx.rewrites) if id(r) in replaced)
    ctx.rewrites[position:position] = [merged]
    ctx.rewrites[:] = [r for r in ctx.rewrites if id(r) not in replaced]


def _origin(source: dict) -> str:
    """Where a merged call's reduction was written: the innermost ``forward`` on its stack (PyG's
    ``MaxAggregation.forward``, ``StdAggregation.forward``, a user's own module), else its source line."""
    inner = [frame for frame in source["frames"] if frame.endswith(" in forward")]
    return inner[-1].removesuffix(" in forward") if inner else source["source"]


def _lowering(tensors, roles, keys) -> str:
    """``triton`` when the message (a key), or the messages together (a list of keys), generate into the
    fused CUDA kernels, else why not."""
    try:
        specs = [(role, tuple(int(s) for s in (val(t).shape if role == ROLE_DENSE else val(t).shape[1:])),
                  val(t).dtype) for t, role in zip(tensors, roles)]
    except TypeError:
        return "reference: symbolic feature sizes"
    if any(dtype == torch.float64 for _, _, dtype in specs):
        return "reference: float64 arguments (the kernels compute in float32)"
    try:
        found = gather_scatter_triton.lowered_members([keys] if isinstance(keys, str) else list(keys), specs)
    except Exception as exc:  # a generator bug must not break compilation; the op decides again at run time
        return f"unknown: {type(exc).__name__}: {exc}"
    return "triton" if not isinstance(found, Exception) else f"reference: {found}"


PATTERN = register_pattern(Pattern("gather_scatter", COVERS, match, replace, after=merge), priority=40)
