"""SpMM: the sum/mean aggregation whose message is a (possibly weighted) copy of the source row.

Search::

    x_j = x.index_select(0, src)
    msg = x_j                          # or w.view(-1, 1) * x_j (either order), w any per-edge scalar
                                       # not computed from x_j: an edge weight, GCN's
                                       # dinv[src] * w * dinv[dst], ...
    out = scatter(msg, dst, reduce='sum' | 'mean')

Covers GCNConv (normalisation weights computed from structure, hoisted into the graph plan),
GraphConv add/mean, SAGEConv mean/sum, GINConv and any weighted copy-and-sum.

Replacement: ``values = edge_weight[perm]`` (or ones), times ``1 / max(1, deg)`` of each entry's
row for a mean, ``t_values = values[t_perm]`` and
``torch.ops.gnn_io.spmm(x, values, t_values, rowptr, col, row, t_rowptr, t_col, 'sum')``. When
the weights are structure (GCN's normalisation, no weights at all) the values are hoisted into the
graph plan with the CSR: the cached matrix of the paper's design, built once per graph.

Checks: the message is the gathered source row times at most one per-edge scalar that does not
depend on that row; else the aggregation goes on to the gather-scatter family (no near miss is
recorded here). It goes there too when another aggregation by the same destination reads the same
inputs and is no SpMM (``SAGEConv(aggr=['mean', 'max'])``, ``MultiAggregation``): that family merges
them into one pass over the edges. A weight that is not structure (it needs a gradient) is computed per call by
Inductor and only permuted into CSR order here.
"""
import torch

from torch.fx import Node

from gnn_inductor.cost import spmm_declined
from gnn_inductor.graph_match import aten, match_aggregation, same_size, sibling_aggregations, val
from gnn_inductor.kernels.spmm.csr_product import spmm_binding
from gnn_inductor.plan.work_items import DEFAULT_MAX_EDGES as MAX_EDGES
from gnn_inductor.kernels.runtime.roles import ROLE_SRC
from gnn_inductor.passes.patterns import Pattern, register_pattern
from gnn_inductor.rewrite_report import source_of

COVERS = ("scatter(x.index_select(0, src), dst, 'sum'|'mean')",
          "scatter(edge_weight.view(-1, 1) * x_j, dst, 'sum'|'mean')")


def match(node, ctx):
    agg = match_aggregation(node, ctx.structure)
    if not hasattr(agg, "region") or _form(agg) is None:
        return None
    agg.x_j, agg.weight = _form(agg)
    if any(_form(sibling) is None for sibling in sibling_aggregations(agg, ctx.structure)):
        # a max, a min or another message over the same rows: the gather-scatter family takes this one too
        # and gives them all one pass over the edges (gnn_io::gather_scatter_multi)
        return None
    return _costed(agg, ctx)


def _form(agg):
    """``(x_j, weight)`` when the aggregation is an SpMM (a sum or mean of the gathered source row
    ``x_j``, times at most one per-edge scalar ``weight`` or None), else None."""
    if agg.scatter.reduce not in ("sum", "mean"):
        return None
    region, root = agg.region, agg.region.root
    if root in region.inputs:  # the message is the gathered row itself
        return (root, None) if region.inputs[root][0] == ROLE_SRC else None
    if root.target != aten.mul.Tensor or not all(isinstance(a, Node) for a in root.args):
        return None
    for x_j, weight in (root.args, tuple(reversed(root.args))):
        if region.inputs.get(x_j, (None,))[0] == ROLE_SRC and _per_edge_scalar(weight, x_j, region) and \
                not _depends_on(weight, x_j, region):
            return x_j, weight
    return None


def _costed(agg, ctx):
    """The match, or the cost model's reason to leave it to Inductor (the family after this one
    must not take it either: ``ctx.declined``)."""
    declined = spmm_declined(val(agg.x_j).device.type, ctx.num_edges_hint)
    if declined is None:
        return agg
    ctx.declined.add(agg.scatter.node)
    return declined


def _per_edge_scalar(node, x_j, region) -> bool:
    """One floating point value per edge, broadcast over every feature dim of the message."""
    v, xv = val(node), val(x_j)
    return v.is_floating_point() and v.dim() <= xv.dim() and v.dim() >= 1 and \
        all(same_size(s, 1) for s in v.shape[1:])


def _depends_on(node, target, region) -> bool:
    members = set(region.nodes)
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if n in seen or n not in members:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False


def replace(agg, ctx):
    table = agg.region.inputs[agg.x_j][1]
    plan = ctx.plan_for(agg, table)
    before = agg.scatter.result
    dtype = val(table).dtype
    if agg.weight is None:
        values = ctx.call(aten.ones_like.default, (plan.perm,), before, dtype=dtype)
    else:
        weight = agg.weight if val(agg.weight).dim() == 1 else ctx.call(aten.view.default, (agg.weight, [-1]), before)
        values = ctx.call(aten.index_select.default, (weight, 0, plan.perm), before)
        if val(values).dtype != dtype:
            values = ctx.call(aten._to_copy.default, (values,), before, dtype=dtype)
    reduce = agg.scatter.reduce
    if reduce == "mean":  # 1 / max(1, deg) folded into the values: structure, so once per graph
        values = ctx.call(aten.mul.Tensor, (values, _inverse_degree(ctx, plan, dtype, before)), before)
        reduce = "sum"
    t_values = ctx.call(aten.index_select.default, (values, 0, plan.t_perm), before)
    csr = (values, t_values, plan.rowptr, plan.col, plan.row, plan.t_rowptr, plan.t_col)
    details = {"reduce": agg.scatter.reduce, "weighted": agg.weight is not None}
    self_term = _self_term(agg, table, ctx)
    if isinstance(self_term, str):
        details["self_term"] = self_term
    elif self_term is not None:
        total, scale = self_term
        before = total
        csr = _with_self_term(csr, scale, ctx, before)
        details["self_term"] = f"folded into the CSR as a diagonal ({total.target}, {source_of(total)['source']})"
    items, t_items = [], []
    if spmm_binding() == "triton":  # other devices ignore the items; built here, they are checked in CI too
        items = ctx.call_parts(torch.ops.gnn_io.work_items.default, (csr[2], csr[3], MAX_EDGES), before, 4)
        t_items = ctx.call_parts(torch.ops.gnn_io.work_items.default, (csr[5], csr[6], MAX_EDGES), before, 4)
    new = ctx.call(torch.ops.gnn_io.spmm.default, (table, *csr, items, t_items, reduce), before)
    if isinstance(self_term, tuple):
        self_term[0].replace_all_uses_with(new)  # the sum is this op now; the old one dies with the scatter
    ctx.record("spmm", "gnn_io.spmm", agg.scatter.node, details, csr[2])
    return new


def _self_term(agg, table: Node, ctx):
    """GIN's ``aggregate + (1 + eps) * x`` (either order of both the sum and the product, or a bare ``+ x``)
    on a square graph: ``(sum node, scale)`` with ``scale`` a number or a one-element tensor node, when it can
    join the SpMM as a diagonal; a string saying why not when the shape is there but it cannot; else None."""
    result = agg.scatter.result
    if len(result.users) != 1:
        return None
    (total,) = result.users
    if total.target != aten.add.Tensor or len(total.args) != 2 or total.kwargs.get("alpha", 1) != 1:
        return None
    other = total.args[1] if total.args[0] is result else total.args[0]
    scale = _scale_of(other, table)
    if scale is None:
        return None
    rv, tv = val(result), val(total)
    if not same_size(val(table).shape[0], rv.shape[0]) or tuple(tv.shape) != tuple(rv.shape) or tv.dtype != rv.dtype:
        return None
    if isinstance(scale, Node) and _needs_grad(scale):
        return ("self term not folded: its scale needs a gradient (GIN train_eps=True), which the SpMM's "
                "edge-value gradient would compute over every edge; Inductor adds it instead")
    if agg.weight is not None and agg.weight not in ctx.structure:
        return "self term not folded: the edge weights are computed per call"
    return total, scale


def _needs_grad(node: Node) -> bool:
    """Whether ``node`` is computed from a graph input that requires grad (the canonical tracer marks each
    placeholder's ``requires_grad``)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and n.meta.get("requires_grad", True):
            return True
        stack.extend(n.all_input_nodes)
    return False


def _scale_of(node, table: Node):
    """``s`` when ``node`` is ``s * table`` (``s`` a number or a one-element floating tensor), 1.0 when it is the
    table itself, else None."""
    if node is table:
        return 1.0
    if not isinstance(node, Node) or node.target != aten.mul.Tensor or len(node.args) != 2:
        return None
    for a, b in (node.args, reversed(node.args)):
        if a is table and (isinstance(b, (int, float)) and not isinstance(b, bool) or _one_number(b)):
            return b
    return None


def _one_number(node) -> bool:
    """A floating tensor of one element, 0-dim or ``[1]`` (PyG's GIN ``eps`` buffer)."""
    v = val(node) if isinstance(node, Node) else None
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() <= 1 and \
        all(same_size(s, 1) for s in v.shape)


def _with_self_term(csr: tuple, scale, ctx, before: Node) -> tuple:
    """The SpMM arguments of ``A + scale * I``: ``gnn_io::self_loop_csr`` (structure, once per graph) and the
    values ``where(diag, scale, base)`` (per call unless ``scale`` is structure too)."""
    values, t_values, rowptr, col, _, t_rowptr, t_col = csr
    rowptr, col, row, diag, base, t_rowptr, t_col, _, t_diag, t_base = ctx.call_parts(
        torch.ops.gnn_io.self_loop_csr.default, (rowptr, col, values, t_rowptr, t_col, t_values), before, 10)
    values, t_values = (ctx.call(aten.where.self, (d, scale, b), before) if isinstance(scale, Node) else
                        ctx.call(aten.where.ScalarSelf, (d, scale, b), before) for d, b in ((diag, base), (t_diag, t_base)))
    return values, t_values, rowptr, col, row, t_rowptr, t_col


def _inverse_degree(ctx, plan, dtype, before) -> Node:
    """``1 / max(1, deg[row_e])`` per CSR entry: the mean's row scale as a factor of each value."""
    upper = ctx.call(aten.slice.Tensor, (plan.rowptr, 0, 1, None), before)
    lower = ctx.call(aten.slice.Tensor, (plan.rowptr, 0, 0, -1), before)
    degree = ctx.call(aten.clamp_min.default, (ctx.call(aten.sub.Tensor, (upper, lower), before), 1), before)
    inverse = ctx.call(aten.reciprocal.default, (ctx.call(aten._to_copy.default, (degree,), before, dtype=dtype),),
                       before)
    return ctx.call(aten.index_select.default, (inverse, 0, plan.row), before)


PATTERN = register_pattern(Pattern("spmm", COVERS, match, replace), priority=30)
