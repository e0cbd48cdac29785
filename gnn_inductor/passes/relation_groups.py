"""Relations of one layer as one SpMM over a typed CSR, and their linear maps as one GEMM.

RGCNConv (and any layer that loops over edge types with the same input) aggregates the same node features once
per relation, each over its own edges, then maps each result by its own weight and sums::

    h_r = spmm(A_r, x)          # one gnn_io::spmm per relation, each with its own graph plan
    out = base + h_0 @ W_0 + h_1 @ W_1 + ... + h_{R-1} @ W_{R-1}

This pass, after the patterns, finds ``R >= 2`` SpMMs into ``N`` rows of features of one width and dtype whose plans
are plain CSRs (``csr_plan(dst_r, src_r, N, M_r)``, no work items, no folded self term) and makes them one: the
edges of all relations in one CSR whose row ``d * R + r`` holds relation ``r``'s edges into ``d`` (structure, built
once per graph with the plan), each edge keeping its value (a mean's ``1 / deg`` per relation included), so that one
SpMM gives ``Y [N * R, F]`` = ``[N, R * F]``, ``h_r = Y[:, r]``. Relations of different inputs (HeteroConv and
``to_hetero`` over edge types whose sources are different node types) read the inputs concatenated, each
relation's columns offset to its own input's rows. Where the ``h_r @ W_r`` are the terms of one chain of
additions, the sum becomes one GEMM, ``base + Y.view(N, R * F) @ cat(W_0 .. W_{R-1})``, whose gradient gives
every ``W_r`` its block. Graphs of symbolic sizes are left as they are (the row count ``N * R`` must be known).

Where the maps do not widen the features, they run before the aggregation instead, which the sum's linearity
allows (``A_r (x W_r) = (A_r x) W_r``, equal up to rounding): the SpMM then moves the mapped rows, and the backward
keeps the inputs, not each relation's aggregation ``h_r`` for its map's gradient. One input whose maps are summed
(RGCNConv) becomes ``base + spmm(A', (x @ cat(W_r, dim=1)).view(M * R, F'))``, entry ``(d, j * R + r)`` of ``A'``
being relation ``r``'s edge ``j -> d``; relations that each feed one map of their own (HeteroConv and ``to_hetero``
of SAGEConv, ``mm`` or ``addmm`` with a bias, of one width narrower than the input's) become one SpMM over their
mapped rows concatenated, row ``d * R + r`` relation ``r``'s result, each map's use reading its row (plus its bias).
"""
from __future__ import annotations

import operator
from collections import defaultdict

import torch
from torch.fx import GraphModule, Node

from gnn_inductor.graph_match import val
from gnn_inductor.passes.patterns import RewriteContext
from gnn_inductor.rewrite_report import DECLINED, source_of

aten = torch.ops.aten
SPMM = torch.ops.gnn_io.spmm.default
CSR_PLAN = torch.ops.gnn_io.csr_plan.default
# gnn_io::spmm's arguments: x, values, t_values, rowptr, col, row, t_rowptr, t_col, items, t_items, reduce
PLAN_PARTS = {3: 0, 4: 1, 5: 2, 6: 4, 7: 5}  # argument position -> csr_plan output


def group_relations(gm: GraphModule, ctx: RewriteContext) -> list:
    """Rewrite every group of the graph (module docstring); one dict per group for the report: ``source``,
    ``relations``, ``gemm`` (whether the maps became one GEMM), ``order``. SpMMs that would form a group but for
    their sizes or their plans get a near miss that says why."""
    groups, kept = defaultdict(list), defaultdict(list)
    for node in gm.graph.nodes:
        plan, why = _plan_of(node)
        if plan is not None:
            x = val(node.args[0])
            key = (str(plan.args[2]), tuple(str(d) for d in x.shape[1:]), x.dtype, x.device, val(node.args[1]).dtype)
            (kept[why, key] if why else groups[key]).append((node, plan))
    done = []
    for candidates in groups.values():
        for members in _independent(candidates):
            if len(members) >= 2:
                done.append(_rewrite(gm, ctx, members[0][1].args[2], members))
    for (why, _), candidates in kept.items():
        for members in _independent(candidates):
            if len(members) >= 2:
                ctx.near_miss("relation_groups", f"{len(members)} SpMMs into the same rows kept one per relation: "
                              f"{why}", members[0][0], kind=DECLINED)
    if done:
        _topological_order(gm.graph)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _independent(candidates: list) -> list:
    """``candidates`` (in graph order) in groups none of whose members reads another's result: a second layer's
    SpMMs (whose input is computed from the first's) form a group of their own."""
    groups = []
    for member in candidates:
        before = _ancestors(member[0])
        for group in groups:
            if not any(spmm in before for spmm, _ in group):
                group.append(member)
                break
        else:
            groups.append([member])
    return groups


def _ancestors(node: Node) -> set:
    seen, stack = set(), list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def _plan_of(node: Node) -> tuple:
    """``(plan, None)``: the ``csr_plan`` node of a sum SpMM that reads it whole and nothing else, with int sizes,
    which a group may take; ``(plan, why)`` for such an SpMM that a group may not take (changing sizes, Triton work
    items); ``(None, None)`` for any other node."""
    if node.op != "call_function" or node.target is not SPMM or len(node.args) != 11 or node.args[10] != "sum":
        return None, None
    plans = set()
    for position, part in PLAN_PARTS.items():
        arg = node.args[position]
        if not (isinstance(arg, Node) and arg.target is operator.getitem and arg.args[1] == part):
            return None, None
        plans.add(arg.args[0])
    (plan,) = plans if len(plans) == 1 else (None,)
    if plan is None or plan.target is not CSR_PLAN:
        return None, None
    if node.args[8] or node.args[9]:  # work items of the Triton binding: per plan, not regrouped here
        return plan, "their plans carry the Triton SpMM's work items (per plan; GNN_IO_SPMM=triton)"
    sizes = [*plan.args[2:], *val(node.args[0]).shape]
    if not all(isinstance(s, int) for s in sizes):
        return plan, ("the graph's sizes change from call to call (the typed CSR's row count, nodes x relations, "
                      "must be known when the graph compiles)")
    if val(node.args[0]).shape[0] != plan.args[3]:
        return None, None
    return plan, None


def _part(gm: GraphModule, plan: Node, index: int) -> Node:
    """The ``getitem`` of ``plan``'s output ``index`` (made after the plan where the graph has none)."""
    for user in plan.users:
        if user.target is operator.getitem and user.args[1] == index:
            return user
    with gm.graph.inserting_after(plan):
        part = gm.graph.call_function(operator.getitem, (plan, index))
    part.meta["val"] = plan.meta["val"][index]
    return part


def _rewrite(gm, ctx, num_dst, members) -> dict:
    count = len(members)
    last = max((spmm for spmm, _ in members), key=_order(gm))
    # the layer's own code (the first relation's use of its aggregation) names the group in the report
    source = source_of(next(iter(members[0][0].users), members[0][0]))
    anchor = last
    # the sources: one input, or the inputs of the relations (node types) one after another
    offsets, inputs, num_src = {}, [], 0
    for spmm, plan in members:
        if spmm.args[0] not in offsets:
            offsets[spmm.args[0]] = num_src
            inputs.append(spmm.args[0])
            num_src += plan.args[3]
    features = list(val(inputs[0]).shape[1:])
    chain = gemm_chain(members, features)
    # the maps before the aggregation where they do not widen the features: the SpMM then moves the mapped rows, and
    # its backward needs the inputs alone, where aggregating first keeps each relation's aggregation for its map's
    # gradient (RGCNConv on the ogbn-mag-shaped graph, 7 relations, two layers of 64: 7 GB of the 13 GB step).
    # "sum": one input whose maps' results are summed (RGCNConv), one GEMM by the weights side by side and one SpMM
    # whose row d sums every relation; "each": a map per relation (HeteroConv, to_hetero), a GEMM each and one SpMM
    # whose row d * R + r is relation r's
    if (chain is not None and len(inputs) == 1 and val(chain[0][0].args[1]).shape[1] <= features[0]
            and plain_sum(chain, val(inputs[0]).dtype)):
        maps_first = "sum"
    else:
        each = _relation_maps(members, features)
        maps_first = "each" if each is not None else None
    x = inputs[0] if len(inputs) == 1 else None
    if maps_first == "sum":
        maps, steps, _ = chain
        weights = ctx.call(aten.cat.default, ([m.args[1] for m in maps], 1), steps[-1])
        mapped = ctx.call(aten.mm.default, (x, weights), steps[-1])
        x = ctx.call(aten.view.default, (mapped, [num_src * count, val(maps[0]).shape[1]]), steps[-1])
    elif maps_first == "each":
        last_map = max((use for use, _, _ in each), key=_order(gm))
        mapped = [ctx.call(aten.mm.default, (spmm.args[0], weight), last_map)
                  for (spmm, _), (_, weight, _) in zip(members, each)]
        x = ctx.call(aten.cat.default, (mapped,), last_map)
        offsets, num_src = {}, 0
        for r, (_, plan) in enumerate(members):  # each relation its own mapped rows
            offsets[r], num_src = num_src, num_src + plan.args[3]
    elif x is None:
        x = ctx.call(aten.cat.default, (inputs,), anchor)
    # the typed CSR. Relation r's edge (j -> d) is entry (d * R + r, the offset of r's rows + j), or with one map sum
    # entry (d, j * R + r), row j * R + r of the mapped rows being x_j @ W_r
    dst, src, values = [], [], []
    for r, (spmm, plan) in enumerate(members):
        dst_r = ctx.call(aten._to_copy.default, (plan.args[0],), anchor, dtype=torch.int64)
        src_r = ctx.call(aten._to_copy.default, (plan.args[1],), anchor, dtype=torch.int64)
        if maps_first == "sum":
            src_r = ctx.call(aten.add.Tensor, (ctx.call(aten.mul.Tensor, (src_r, count), anchor), r), anchor)
        else:
            dst_r = ctx.call(aten.add.Tensor, (ctx.call(aten.mul.Tensor, (dst_r, count), anchor), r), anchor)
            offset = offsets[r if maps_first == "each" else spmm.args[0]]
            if offset:
                src_r = ctx.call(aten.add.Tensor, (src_r, offset), anchor)
        dst.append(dst_r)
        src.append(src_r)
        # the relation's values from its CSR order back to its edges' order
        in_order = ctx.call(aten.zeros_like.default, (spmm.args[1],), anchor)
        perm = ctx.call(aten._to_copy.default, (_part(gm, plan, 3),), anchor, dtype=torch.int64)  # int32 on CUDA
        values.append(ctx.call(aten.index_copy.default, (in_order, 0, perm, spmm.args[1]), anchor))
    dst = ctx.call(aten.cat.default, (dst,), anchor)
    src = ctx.call(aten.cat.default, (src,), anchor)
    values = ctx.call(aten.cat.default, (values,), anchor)
    rows, cols = (num_dst, num_src * count) if maps_first == "sum" else (num_dst * count, num_src)
    plan = ctx.csr(dst, src, rows, cols)
    csr_values = ctx.call(aten.index_select.default, (values, 0, plan.perm), anchor)
    t_values = ctx.call(aten.index_select.default, (csr_values, 0, plan.t_perm), anchor)
    if maps_first == "sum":
        anchor = chain[1][-1]
    elif maps_first == "each":
        anchor = last_map
    grouped = ctx.call(SPMM, (x, csr_values, t_values, plan.rowptr, plan.col, plan.row, plan.t_rowptr, plan.t_col,
                              [], [], "sum"), anchor)
    gemm = False
    if maps_first == "sum":
        gemm = replace_chain(gm, ctx, chain, grouped)
    elif maps_first == "each":
        by_node = ctx.call(aten.view.default, (grouped, [num_dst, count, val(x).shape[1]]), anchor)
        for r, (use, _, bias) in enumerate(each):
            result = ctx.call(aten.select.int, (by_node, 1, r), use)
            use.replace_all_uses_with(result if bias is None else ctx.call(aten.add.Tensor, (bias, result), use))
            gm.graph.erase_node(use)
    else:
        by_node = ctx.call(aten.view.default, (grouped, [num_dst, count, *features]), anchor)
        if chain is not None:  # base + Y.view(N, R * F) @ cat(W_r)
            maps, steps, _ = chain
            flat = ctx.call(aten.view.default, (by_node, [num_dst, count * features[0]]), steps[-1])
            weights = ctx.call(aten.cat.default, ([m.args[1] for m in maps],), steps[-1])
            gemm = replace_chain(gm, ctx, chain, ctx.call(aten.mm.default, (flat, weights), steps[-1]))
        if not gemm:
            for r, (spmm, _) in enumerate(members):
                spmm.replace_all_uses_with(ctx.call(aten.select.int, (by_node, 1, r), anchor))
    for spmm, _ in members:
        if not spmm.users:
            gm.graph.erase_node(spmm)
    ctx.refresh_structure()
    return {"source": source, "relations": count, "gemm": gemm,
            "order": "maps first" if maps_first else "aggregation first"}


def _relation_maps(members, features: list):
    """Per relation ``(use, weight, bias)`` where each relation's aggregation feeds one linear map alone,
    ``mm(h_r, W_r)`` or ``addmm(bias_r, h_r, W_r)`` (a bias over rows: ``bias_r + h_r @ W_r``), of one output width
    narrower than the input's; None otherwise."""
    if len(features) != 1:
        return None
    found, widths = [], set()
    for spmm, _ in members:
        users = list(spmm.users)
        if len(users) != 1 or users[0].kwargs:
            return None
        use = users[0]
        if use.target is aten.mm.default and len(use.args) == 2 and use.args[0] is spmm:
            bias, weight = None, use.args[1]
        elif use.target is aten.addmm.default and len(use.args) == 3 and use.args[1] is spmm:
            bias, weight = use.args[0], use.args[2]
            if not isinstance(bias, Node) or val(bias).dim() != 1:
                return None
        else:
            return None
        w = val(weight)
        if w.dim() != 2 or w.dtype != val(spmm).dtype or w.shape[0] != features[0]:
            return None
        widths.add(w.shape[1])
        found.append((use, weight, bias))
    (width,) = widths if len(widths) == 1 else (None,)
    return found if width is not None and width < features[0] else None


def gemm_chain(members, features: list):
    """``(maps, chain, base)`` where ``base + sum_r h_r @ W_r`` is the relations' use of their results (``members``:
    ``(h_r, anything)`` pairs, ``h_r`` the node of relation ``r``'s aggregation): each ``h_r`` feeds only its ``mm``,
    and the ``mm`` results are the added terms of one ``chain`` of additions, in any order; None otherwise. Nothing
    is changed; ``maps`` are in the order of ``members``."""
    if len(features) != 1:
        return None
    maps = []
    for spmm, _ in members:
        users = list(spmm.users)
        if len(users) != 1 or users[0].target is not aten.mm.default or users[0].args[0] is not spmm:
            return None
        maps.append(users[0])
    terms, chain = set(maps), []
    node = maps[0]
    # walk down from one term: each addition takes the running sum and one term, until every term is in
    while len(chain) < len(members):
        users = list(node.users)
        if len(users) != 1 or users[0].target is not aten.add.Tensor or users[0].kwargs or len(users[0].args) != 2:
            return None
        step = users[0]
        chain.append(step)
        node = step
    first, rest = chain[0], chain[1:]
    base = first.args[0] if first.args[1] in terms else first.args[1]
    added = {first.args[1] if first.args[0] is base else first.args[0]}
    for step, previous in zip(rest, chain):
        other = step.args[1] if step.args[0] is previous else step.args[0] if step.args[1] is previous else None
        if other is None or other not in terms:
            return None
        added.add(other)
    if added != terms or base in terms or any(len(step.users) != 1 for step in chain[:-1]):
        return None
    return maps, chain, base


def plain_sum(chain, dtype: torch.dtype) -> bool:
    """Whether ``base + product`` (``product`` of ``dtype`` and the sum's shape) has the chain's shape and dtype:
    a base of the sum's shape (no broadcast; RGCNConv's float32 zeros under a float64 layer promote as before)."""
    base, end = val(chain[2]), val(chain[1][-1])
    return (isinstance(base, torch.Tensor) and base.shape == end.shape
            and torch.promote_types(base.dtype, dtype) == end.dtype)


def replace_chain(gm, ctx, chain, product: Node) -> bool:
    """The chain's sum replaced by ``base + product`` (``product`` the relations' terms together); True when done,
    False where that sum would not have the chain's shape and dtype (a broadcasting base: the chain stays, and the
    new nodes die with the dead code)."""
    maps, steps, base = chain
    end = steps[-1]
    total = ctx.call(aten.add.Tensor, (base, product), end)
    if val(total).shape != val(end).shape or val(total).dtype != val(end).dtype:
        return False
    end.replace_all_uses_with(total)
    for step in reversed(steps):
        gm.graph.erase_node(step)
    for m in maps:
        gm.graph.erase_node(m)
    return True


def _order(gm):
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    return position.__getitem__


def _topological_order(graph) -> None:
    """Reorder ``graph``'s nodes so that each comes after its inputs, keeping the present order otherwise (the
    typed CSR's structure is built from every relation's nodes, some of which came after an earlier relation's
    uses)."""
    placed, open_, order = set(), set(), []
    for root in list(graph.nodes):
        stack = [(root, False)]
        while stack:
            node, ready = stack.pop()
            if node in placed:
                continue
            if ready:
                open_.discard(node)
                placed.add(node)
                order.append(node)
                continue
            if node in open_:  # the pass's grouping would read its own result: the pipeline's fallback takes it
                raise RuntimeError(f"relation_groups: {node.name} depends on itself")
            open_.add(node)
            stack.append((node, True))
            stack.extend((n, False) for n in reversed(node.all_input_nodes) if n not in placed)
    previous = None
    for node in order:
        if previous is not None and previous.next is not node:
            previous.append(node)
        previous = node
