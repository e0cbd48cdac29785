"""The relations of a layer in a padded mini-batch as one pass over the edges, sorted by relation.

RGCNConv in a padded bucket (gnn_inductor/buckets.py) keeps every edge slot per relation: relation ``r`` aggregates
over ``where(edge_type == r, edge_index, pad_ids)``, the other relations' edges sent to padded nodes, and maps the
result of every node by its own weight::

    h_r = mean_{e: dst_e = d, edge_type_e = r} x[src_e]        # R aggregations over all E slots
    out = base + h_0 @ W_0 + ... + h_{R-1} @ W_{R-1}           # R GEMMs over all N rows

On a sampled batch the edges are about as many as the nodes (ogbn-mag-shaped, 1024 seeds: 262k edges, 211k nodes),
so the R GEMMs over every node do R times the work of one product per edge. This pass, in a bucket's fixed-size
graph only, rewrites such a group into that product per edge, the edges sorted by relation on the device::

    perm = sort(edge_type)                                      # edges of relation r: ptr[r] to ptr[r + 1]
    m = device_segment_matmul(x[src[perm]], ptr, stack(W_r))   # x_src @ W_type, one Triton launch
    out = base + index_add(zeros, dst[perm], m / count[dst, type])  # count only for a mean

equal to the group's sum up to rounding (``(sum x) W = sum (x W)``). Nothing is read on the host, so the CUDA graph
of the bucket holds it. The real rows are the same; the padded rows (cut off from every output) no longer receive
the other relations' redirected slots. An edge whose type is none of the group's relations goes to one more segment
of zero weights, so it adds nothing, as in the loop.

A group is ``R >= 2`` aggregations (a sum, or PyG's mean) of ``x[src_r]`` into the rows of ``dst_r``, where
``(src_r, dst_r)`` are the rows of ``where(edge_type == r, edge_index, pad_ids)`` of one ``edge_index``, one
``edge_type`` and the padding's own ``pad_ids`` input, for the relations ``0 .. R-1`` each once, each aggregation
used only by its ``mm`` and the products the terms of one chain of additions (``relation_groups.gemm_chain``).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch
from torch.fx import GraphModule, Node

from gnn_inductor.graph_match import Scatter, as_gather, as_scatter, fold_mean, val
from gnn_inductor.passes.patterns import RewriteContext
from gnn_inductor.passes.relation_groups import gemm_chain, replace_chain
from gnn_inductor.rewrite_report import source_of

aten = torch.ops.aten
SEGMENT_MM = torch.ops.gnn_io.device_segment_matmul.default
PAD_IDS = "gnn_io_pad_ids"  # the padding's input of padded node ids (gnn_inductor/buckets.py, redirect_filters)


@dataclass(frozen=True)
class _Term:
    result: Node      # the aggregation's value (the scatter, or a mean's division)
    relation: int
    key: tuple        # what the group's members share: x, edge_index, edge_type, pad_ids, reduce, rows


def _relation_edges(index: Node, row: int) -> Optional[tuple]:
    """``(edge_index, edge_type, relation, pad_ids)`` where ``index`` is row ``row`` of
    ``where(edge_type == relation, edge_index, pad_ids)``, else None."""
    if not (isinstance(index, Node) and index.target is aten.select.int and index.args[1:] == (0, row)):
        return None
    where = index.args[0]
    if not (isinstance(where, Node) and where.target is aten.where.self):
        return None
    cond, edge_index, pad = where.args
    if not (isinstance(cond, Node) and cond.target is aten.eq.Scalar and isinstance(cond.args[1], int)
            and not isinstance(cond.args[1], bool)):
        return None
    if not (isinstance(pad, Node) and pad.op == "placeholder" and pad.meta.get("dynamo_name") == PAD_IDS):
        return None
    return edge_index, cond.args[0], cond.args[1], pad


def _term(node: Node) -> Optional[_Term]:
    """The relation term a scatter node computes, or None."""
    scatter = as_scatter(node)
    if not isinstance(scatter, Scatter) or scatter.reduce != "sum":
        return None
    scatter = fold_mean(scatter)
    gather = as_gather(scatter.src)
    if gather is None or val(gather.table) is None or val(gather.table).dim() != 2:
        return None
    dst, src = _relation_edges(scatter.index, 1), _relation_edges(gather.index, 0)
    if dst is None or dst != src:
        return None
    edge_index, edge_type, relation, pad = dst
    return _Term(scatter.result, relation,
                 (gather.table, edge_index, edge_type, pad, scatter.reduce, val(scatter.node).shape[0]))


def segment_relations(gm: GraphModule, ctx: RewriteContext) -> list:
    """Rewrite every group of ``gm`` (module docstring); one dict per group for the report: ``source``,
    ``relations``, ``reduce``."""
    groups = defaultdict(dict)
    for node in list(gm.graph.nodes):
        term = _term(node)
        if term is not None and term.relation not in groups[term.key]:
            groups[term.key][term.relation] = term
    done = []
    for key, by_relation in groups.items():
        if len(by_relation) < 2 or sorted(by_relation) != list(range(len(by_relation))):
            continue
        terms = [by_relation[r] for r in range(len(by_relation))]
        chain = gemm_chain([(t.result, None) for t in terms], list(val(key[0]).shape[1:]))
        if chain is None:
            continue
        source = source_of(chain[0][0])
        if _rewrite(gm, ctx, key, chain):
            done.append({"source": source, "relations": len(terms), "reduce": key[4]})
    if done:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _rewrite(gm: GraphModule, ctx: RewriteContext, key: tuple, chain: tuple) -> bool:
    x, edge_index, edge_type, _, reduce, rows = key
    maps, steps, _ = chain
    end = steps[-1]
    count = len(maps)

    def call(target, *args, **kwargs):
        return ctx.call(target, args, end, **kwargs)

    types = call(aten._to_copy.default, edge_type, dtype=torch.int64)
    known = call(aten.bitwise_and.Tensor, call(aten.ge.Scalar, types, 0), call(aten.lt.Scalar, types, count))
    # relation ids 0 .. R-1, and R for an edge of none of them (a segment of zero weights)
    segment = call(aten.where.ScalarOther, known, types, count)
    ordered, perm = ctx.call_parts(aten.sort.default, (segment,), end, 2)
    bounds = call(aten.arange.default, count + 2, dtype=torch.int64, device=val(types).device)
    ptr = call(aten.searchsorted.Tensor, ordered, bounds)
    src = call(aten.index_select.default, call(aten.select.int, edge_index, 0, 0), 0, perm)
    dst = call(aten.index_select.default, call(aten.select.int, edge_index, 0, 1), 0, perm)
    weights = [m.args[1] for m in maps]
    weights.append(call(aten.zeros_like.default, weights[0]))
    messages = call(SEGMENT_MM, call(aten.index_select.default, x, 0, src), ptr, call(aten.stack.default, weights))
    if reduce == "mean":  # each edge divided by its destination's edges of its relation, at least 1
        slot = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten._to_copy.default, dst, dtype=torch.int64),
                                          count + 1), ordered)
        ones = call(aten.ones_like.default, slot, dtype=val(messages).dtype)
        counts = call(aten.index_add.default, call(aten.zeros.default, [rows * (count + 1)],
                                                   dtype=val(messages).dtype, device=val(messages).device),
                      0, slot, ones)
        per_edge = call(aten.clamp_min.default, call(aten.index_select.default, counts, 0, slot), 1)
        messages = call(aten.div.Tensor, messages, call(aten.unsqueeze.default, per_edge, 1))
    total = call(aten.index_add.default, call(aten.zeros.default, [rows, val(messages).shape[1]],
                                              dtype=val(messages).dtype, device=val(messages).device),
                 0, dst, messages)
    return replace_chain(gm, ctx, chain, total)
