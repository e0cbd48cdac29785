"""SpMM: the sum/mean aggregation whose message is a (possibly weighted) copy of the source row.

Search::

    x_j = x.index_select(0, src)
    msg = x_j                          # or edge_weight.view(-1, 1) * x_j  (either operand order)
    out = scatter(msg, dst, reduce='sum' | 'mean')

Covers GCNConv (normalisation weights computed from structure, hoisted into the graph plan),
GraphConv add/mean, SAGEConv mean/sum, GINConv and any weighted copy-and-sum.

Replacement: ``values = edge_weight[perm]`` (or ones), ``t_values = values[t_perm]`` and
``torch.ops.gnn_io.spmm(x, values, t_values, rowptr, col, row, t_rowptr, t_col, reduce)``. When
the weights are structure (GCN's normalisation, no weights at all) the values are hoisted into the
graph plan with the CSR: the cached matrix of the paper's design, built once per graph.

Checks: one source table, at most one 1-D per-edge weight, nothing else in the message; else the
aggregation goes on to the gather-scatter family (no near miss is recorded here).
"""
import torch

from gnn_inductor.graph_match import aten, match_aggregation, strip_index, val
from gnn_inductor.kernels._common import ROLE_EDGE, ROLE_SRC
from gnn_inductor.rewrite import Pattern

COVERS = ("scatter(x.index_select(0, src), dst, 'sum'|'mean')",
          "scatter(edge_weight.view(-1, 1) * x_j, dst, 'sum'|'mean')")


def match(node, ctx):
    agg = match_aggregation(node, ctx.structure)
    if not hasattr(agg, "region") or agg.scatter.reduce not in ("sum", "mean"):
        return None
    region = agg.region
    srcs = [n for n, (role, _) in region.inputs.items() if role == ROLE_SRC]
    edges = [n for n, (role, _) in region.inputs.items() if role == ROLE_EDGE]
    if len(srcs) != 1 or len(edges) > 1 or len(srcs) + len(edges) != len(region.inputs):
        return None
    (x_j,) = srcs
    agg.weight = None
    if region.root is x_j and not edges:
        return agg
    root = region.root
    if not edges or root.target != aten.mul.Tensor or x_j not in root.args:
        return None
    other = root.args[1] if root.args[0] is x_j else root.args[0]
    view_chain = _view_chain(other, edges[0])
    weight = strip_index(edges[0])
    if view_chain is None or set(region.nodes) != {root, *view_chain}:
        return None
    if val(weight).dim() != 1 or not val(weight).is_floating_point():
        return None
    agg.weight = weight
    return agg


def _view_chain(node, edge_input):
    """Region nodes between ``edge_input`` and ``node`` when they are only views; else None."""
    chain = []
    while node is not edge_input:
        if node.target not in (aten.view.default, aten.unsqueeze.default, aten.expand.default, aten.reshape.default,
                               aten.view_copy.default, aten.expand_copy.default, aten.unsqueeze_copy.default):
            return None
        chain.append(node)
        node = node.args[0]
    return chain


def replace(agg, ctx):
    plan = ctx.plan_for(agg)
    (table,) = [t for _, (role, t) in agg.region.inputs.items() if role == ROLE_SRC]
    before = agg.scatter.result
    dtype = val(table).dtype
    if agg.weight is None:
        values = ctx.call(aten.ones_like.default, (plan.perm,), before, dtype=dtype)
    else:
        values = ctx.call(aten.index_select.default, (agg.weight, 0, plan.perm), before)
        if val(values).dtype != dtype:
            values = ctx.call(aten._to_copy.default, (values,), before, dtype=dtype)
    t_values = ctx.call(aten.index_select.default, (values, 0, plan.t_perm), before)
    new = ctx.call(torch.ops.gnn_io.spmm.default, (table, values, t_values, plan.rowptr, plan.col, plan.row,
                                                   plan.t_rowptr, plan.t_col, agg.scatter.reduce), before)
    ctx.record("spmm", "gnn_io.spmm", agg.scatter.node,
               {"reduce": agg.scatter.reduce, "weighted": agg.weight is not None}, plan.rowptr)
    return new


PATTERN = Pattern("spmm", COVERS, match, replace)
