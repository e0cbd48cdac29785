"""Edge softmax: PyG's ``torch_geometric.utils.softmax(src, index)``, per head.

Search::

    src_max = scatter(src.detach(), index, reduce='max')       # scatter_reduce_(amax)
    out = (src - src_max.index_select(0, index)).exp()
    out_sum = scatter(out, index, reduce='sum') + eps          # eps = 1e-16 in PyG
    alpha = out / out_sum.index_select(0, index)

Replacement: ``torch.ops.gnn_io.edge_softmax(src, *csr_plan, eps)``; ``src`` may carry any
trailing (head) dimensions.

Near misses: the max/exp half found but the normaliser is not a segment sum of the same
exponentials by the same index; an index computed from features.
"""
from dataclasses import dataclass

import torch
from torch.fx import Node

from gnn_inductor.cost import cpu_declined
from gnn_inductor.graph_match import Scatter, aten, as_gather, as_scatter, index_key, strip_index, val
from gnn_inductor.passes.patterns import Pattern, register_pattern

COVERS = ("torch_geometric.utils.softmax(src, index) (scatter amax, subtract, exp, scatter sum + eps, divide)",)

_DETACH = (aten.detach.default, aten.alias.default)


@dataclass
class SoftmaxMatch:
    result: Node
    scores: Node
    index: Node
    num_dst_node: Node
    eps: float


def _undetach(node):
    while isinstance(node, Node) and node.target in _DETACH:
        node = node.args[0]
    return node


def match(node, ctx):
    if node.target != aten.div.Tensor or not isinstance(node.args[1], Node):
        return None
    numer, denom = node.args
    if not (isinstance(numer, Node) and numer.target == aten.exp.default and numer.args[0].target == aten.sub.Tensor):
        return None
    scores, shift = numer.args[0].args
    shift_gather = as_gather(shift) if isinstance(shift, Node) else None
    top = as_scatter(shift_gather.table) if shift_gather else None
    if not (isinstance(top, Scatter) and top.reduce == "max" and _undetach(top.src) is scores
            and index_key(top.index) == index_key(shift_gather.index)):
        return None
    key = index_key(top.index)
    total_gather = as_gather(denom)
    eps, total = 0.0, total_gather.table if total_gather else None
    if isinstance(total, Node) and total.target == aten.add.Tensor and not isinstance(total.args[1], Node):
        total, eps = total.args[0], float(total.args[1])
    total = as_scatter(total) if isinstance(total, Node) else None
    if not (isinstance(total, Scatter) and total.reduce == "sum" and total.src is numer
            and index_key(total.index) == key and index_key(total_gather.index) == key):
        return "max-shifted exp found, but the normaliser is not a segment sum of the same exponentials"
    if strip_index(top.index) not in ctx.structure:
        return "softmax index is computed from features, not graph structure"
    # On CPU the attention is left to Inductor before anything is rewritten, so the structure work is still
    # hoisted and the rest compiles as one graph (cost.cpu_declined)
    declined = cpu_declined(val(node).device.type)
    if declined is not None:
        return declined
    return SoftmaxMatch(node, scores, top.index, top.node, eps)


def replace(found, ctx):
    num_dst = ctx.size_arg(found.num_dst_node, 0)
    plan = ctx.csr(found.index, found.index, num_dst, num_dst)
    new = ctx.call(torch.ops.gnn_io.edge_softmax.default, (found.scores, plan.rowptr, plan.row, plan.perm, found.eps),
                   before=found.result)
    ctx.record("edge_softmax", "gnn_io.edge_softmax", found.result, {"eps": found.eps}, plan.rowptr)
    return new


PATTERN = register_pattern(Pattern("edge_softmax", COVERS, match, replace), priority=10)
