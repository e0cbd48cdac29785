"""Attention gradients written into the packed gradient of a fused linear map, instead of concatenated after.

TransformerConv's query, key and value maps read the same ``x``; ``gnn_inductor/passes/linear_fusion.py`` runs them as one
GEMM whose ``[N, 3F]`` output the attention op reads through three column slices. AOTAutograd's backward then
rebuilds the GEMM's output gradient from the op's three separate gradients::

    g = attention_backward(...)                     # g[0], g[1], g[2]: [N, H, C] each, fresh
    full = full([N, 3F], 0)
    d = slice_scatter(full, view(g[2], [N, F]), 1, 2F, 3F) + slice_scatter(full, view(g[0], [N, F]), 1, 0, F)
        + slice_scatter(full, view(g[1], [N, F]), 1, F, 2F)
    mm(d, W), mm(d^T, x), sum(d, 0)                 # the fused map's input, weight and bias gradients

Inductor lowers the sum of slice-scatters to one pointwise kernel: at 2^20 nodes and ``3F = 384`` in float32 it
reads 1.5 GiB and writes 1.5 GiB, and both the three gradients and ``d`` are alive at the step's peak.

This pass replaces the pattern by ``gnn_io::attention_backward_packed`` (kernels/attention/op.py), which returns
``d`` itself, the gradients written in place by the split backward's kernels through a row stride (elsewhere
computed as before and copied into their columns). It applies when the slice-scatters of the op's gradients,
each reached from its ``getitem`` through views only and read by nothing else, over one zero ``full``, are summed by
a chain of additions with no other term, and their column spans do not overlap (columns between them, which
only the zero base fills, the op zeroes). The pass runs on the
graphs AOTAutograd hands Inductor (only the backward has the pattern), in graphs the backend rewrote;
``GNN_IO_PACKED_GRADS=0`` turns it off, to compare.

**The products by blocks of rows.** The packed gradient ``d`` is then read by the fused map's three
products: ``mm(d, W)`` (its input's gradient), ``mm(t(d), x)`` (its weight's) and ``sum(d, [0])`` (its bias's).
Where those are its only readers, :func:`project_all` replaces them by ``gnn_io::attention_backward_projected``,
which makes ``d`` one block of rows at a time and multiplies each block before the next (kernels/attention/op.py), so
the whole ``d`` never exists: TransformerConv's step on RMAT 2^20 3.53 -> 2.79 GiB, 2% slower (measured on
the H100). Only where the sizes are fixed and ``d`` takes more than one block
(``GNN_IO_GRAD_CHUNK_KB``), and for the GATv2 and dot-product families; ``GNN_IO_PROJECTED_GRADS=0`` turns it off.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from gnn_inductor import config
from gnn_inductor.passes import direct_ops
from gnn_inductor.graph_match import tensor_val
from gnn_inductor.kernels.attention.forms import recognise
from gnn_inductor.kernels.attention.dispatch import projection_blocks, span_gaps

aten = torch.ops.aten
ENV = config.SETTINGS["packed_grads"].env
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_OPS = ("attention_backward", "attention_backward_direct")
_PACKED_OPS = ("attention_backward_packed", "attention_backward_packed_direct")
PROJECT_ENV = config.SETTINGS["projected_grads"].env
_NUM_ARGS = 17  # attention_backward's arguments


def _only_user(node: Node) -> Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _scatter_of(item: Node) -> Node | None:
    """The ``slice_scatter`` that ``item`` (an output of the op) reaches through views alone, each read once."""
    node = _only_user(item)
    while node is not None and node.op == "call_function" and node.target in _VIEWS:
        node = _only_user(node)
    if node is None or node.target is not aten.slice_scatter.default or node.kwargs:
        return None
    return node


def _is_zeros(node) -> bool:
    return (isinstance(node, Node) and node.op == "call_function" and node.target is aten.full.default
            and len(node.args) >= 2 and node.args[1] == 0)


def _sum_root(scatters: set) -> Node | None:
    """The last addition of a chain whose leaves are exactly ``scatters`` (every node of it read once), or None."""
    node = next(iter(scatters))
    while True:
        add = _only_user(node)
        if add is None or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
            return None
        node = add
        leaves = _chain_leaves(node)
        if leaves == scatters:
            return node
        if not leaves <= scatters:
            return None


def _chain_leaves(node: Node) -> set:
    """The terms of the addition chain ending at ``node`` (``node`` itself when it is no such addition)."""
    if node.op == "call_function" and node.target is aten.add.Tensor and not node.kwargs and len(node.args) == 2 \
            and all(isinstance(a, Node) and len(a.users) == 1 for a in node.args):
        return _chain_leaves(node.args[0]) | _chain_leaves(node.args[1])
    return {node}


def _match(op: Node):
    """``(root, {argument index: (column offset, getitem)}, width)`` for a packable call, else None."""
    if any(user.op != "call_function" or user.target is not operator.getitem for user in op.users):
        return None
    items = {user.args[1]: user for user in op.users}
    if len(items) != len(op.users):
        return None  # two reads of one output
    num_args = len(op.args[1])
    by_scatter = {}
    for k, item in items.items():
        if k >= num_args:
            continue  # the bias gradient
        scatter = _scatter_of(item)
        if scatter is not None:
            by_scatter[scatter] = (k, item)
    if len(by_scatter) < 2:
        return None
    bases = {scatter.args[0] for scatter in by_scatter}
    if len(bases) != 1 or not _is_zeros(next(iter(bases))):
        return None
    root = _sum_root(set(by_scatter))
    base = tensor_val(next(iter(bases)))
    if root is None or base is None or base.dim() != 2 or tensor_val(root) is None:
        return None
    width, places = base.shape[1], {}
    for scatter, (k, item) in by_scatter.items():
        args = scatter.args
        dim, start, end = (args[2] if len(args) > 2 else 0), (args[3] if len(args) > 3 else None), \
            (args[4] if len(args) > 4 else None)
        grad, step = tensor_val(item), (args[5] if len(args) > 5 else 1)
        if dim not in (1, -1) or step != 1 or not isinstance(start, int) or not isinstance(end, int) or grad is None \
                or grad.dim() < 2 or grad.shape[0] != base.shape[0] or grad.dtype != base.dtype \
                or end - start != grad[0].numel():
            return None
        places[k] = (start, item)
    spans = sorted((start, start + tensor_val(item)[0].numel()) for start, item in places.values())
    if span_gaps(spans, width) is None:
        return None  # overlapping spans; columns between them are the zero base's, and the op zeroes them
    return root, places, width


def _pattern_nodes(root: Node) -> list:
    """The nodes of the matched pattern from ``root`` back to the op's getitems, each before its inputs (the zero
    ``full`` included: it is erased only when nothing else reads it)."""
    order, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if node in seen or node.op != "call_function" or node.target is operator.getitem and \
                getattr(node.args[0].target, "_opname", "") not in _OPS:
            continue
        seen.add(node)
        order.append(node)
        if node.target is operator.getitem:
            continue  # stop at the op's outputs
        stack.extend(a for a in node.args if isinstance(a, Node))
    position = {node: i for i, node in enumerate(root.graph.nodes)}
    return sorted(order, key=position.__getitem__, reverse=True)


def _empty_like_meta(value):
    """An empty 1-D tensor of ``value``'s kind (a fake tensor under its own mode), for a packed argument's slot."""
    mode = getattr(value, "fake_mode", None)
    if mode is None:
        return value.new_empty((0,))
    with mode:
        return value.new_empty((0,))


def _calls(gm: GraphModule, names: tuple) -> list:
    """The graph's calls of the gnn_io ops named ``names``, in graph order (a list: the passes rewrite the graph)."""
    return [node for node in gm.graph.nodes if node.op == "call_function" and
            getattr(node.target, "namespace", None) == "gnn_io" and getattr(node.target, "_opname", "") in names]


def pack(gm: GraphModule) -> int:
    """Rewrite each packable attention backward (module docstring); returns how many were rewritten."""
    packed = 0
    for op in _calls(gm, _OPS):
        found = _match(op)
        if found is None:
            continue
        root, places, width = found
        offsets = [places[k][0] if k in places else -1 for k in range(len(op.args[1]))]
        target = torch.ops.gnn_io.attention_backward_packed.default
        if direct_ops.is_direct(op):
            target = direct_ops.twin(target) or target
        with gm.graph.inserting_before(op):
            new = gm.graph.call_function(target, (*op.args[:_NUM_ARGS], offsets, width))
            total = gm.graph.call_function(operator.getitem, (new, 0))
        total.meta["val"] = tensor_val(root)
        old_vals = op.meta.get("val")
        if old_vals is not None:
            new.meta["val"] = [tensor_val(root)] + [_empty_like_meta(v) if k in places else v
                                              for k, v in enumerate(old_vals)]
        dead = _pattern_nodes(root)
        root.replace_all_uses_with(total)
        for user in list(op.users):
            k = user.args[1]
            if k in places:
                continue
            with gm.graph.inserting_after(new):
                moved = gm.graph.call_function(operator.getitem, (new, k + 1))
            moved.meta.update(user.meta)
            user.replace_all_uses_with(moved)
            gm.graph.erase_node(user)
        for node in dead + [op]:  # the additions, slice-scatters, views and getitems, users first; then the op
            if not node.users:
                gm.graph.erase_node(node)
        packed += 1
    if packed:
        gm.graph.lint()
        gm.recompile()
    return packed


def _transposed(node: Node, of: Node) -> bool:
    """Whether ``node`` is ``of`` transposed (2-D): ``permute(of, [1, 0])`` or ``t(of)``."""
    if node.op != "call_function" or node.kwargs or not node.args or node.args[0] is not of:
        return False
    if node.target is aten.t.default:
        return len(node.args) == 1
    return node.target is aten.permute.default and len(node.args) == 2 and list(node.args[1]) == [1, 0]


def _projection(total: Node):
    """``(input GEMM, (transpose, weight GEMM), row sum)`` reading the packed gradient ``total`` (each None when
    absent, at least one GEMM), where these are its only readers: ``mm(total, W)``, ``mm(t(total), x)`` and
    ``sum(total, [0])``; else None."""
    grad_x = grad_w = row_sum = None
    for user in total.users:
        if user.op != "call_function" or user.kwargs:
            return None
        if user.target is aten.mm.default and user.args[0] is total and user.args[1] is not total and grad_x is None:
            grad_x = user
        elif _transposed(user, total) and len(user.users) == 1 and grad_w is None:
            gemm = next(iter(user.users))
            if gemm.target is not aten.mm.default or gemm.kwargs or gemm.args[0] is not user or \
                    gemm.args[1] is total:
                return None
            grad_w = (user, gemm)
        elif user.target is aten.sum.dim_IntList and row_sum is None and len(user.args) >= 2 and \
                list(user.args[1]) in ([0], [-2]) and len(user.args) <= 3:
            row_sum = user
        else:
            return None
    if grad_x is None and grad_w is None:
        return None
    packed = tensor_val(total)
    if packed is None or packed.dim() != 2:
        return None
    for node, rows in ((grad_x and grad_x.args[1], packed.shape[1]), (grad_w and grad_w[1].args[1], packed.shape[0])):
        value = tensor_val(node) if node is not None else None
        if node is not None and (value is None or value.dim() != 2 or value.shape[0] != rows or
                                 value.dtype != packed.dtype):
            return None
    if row_sum is not None and (tensor_val(row_sum) is None or tensor_val(row_sum).dtype != packed.dtype):
        return None
    return grad_x, grad_w, row_sum


def _blocks_run(packed_op: Node) -> bool:
    """Whether the attention's kernels can make its packed gradient by blocks (the GATv2 and dot-product
    families: every packed gradient a row sum of its own pass); the GAT family's one-pass backward writes its
    destination terms from the source pass, so the op would make the whole gradient anyway, and the GEMMs stay
    Inductor's."""
    score_key, message_key, roles = packed_op.args[7], packed_op.args[8], packed_op.args[2]
    try:
        form = recognise(score_key, message_key, roles)
    except KeyError:  # edge functions this process does not know
        return False
    return not isinstance(form, str) and form.family != "gat"


def project(gm: GraphModule, packed_op: Node, total: Node) -> bool:
    """Replace the products of ``packed_op``'s packed gradient ``total`` (its ``getitem`` 0) with
    ``gnn_io::attention_backward_projected`` (module docstring), where the packed gradient has no other reader and
    the new call can stand where every reader of the old one comes after it; True when it did."""
    found = _projection(total)
    if found is None:
        return False
    packed = tensor_val(total)
    if not isinstance(packed.shape[0], int) or not isinstance(packed.shape[1], int):
        return False  # sizes that change from call to call (mini-batches): small gradients, host-bound steps
    if len(projection_blocks(packed.shape[0], packed.shape[1], packed.dtype)) <= 2:
        return False  # one block: Inductor's own products (the op would add only its calls' cost)
    if not _blocks_run(packed_op):
        return False
    grad_x, grad_w, row_sum = found
    weight = grad_x.args[1] if grad_x is not None else None
    x = grad_w[1].args[1] if grad_w is not None else None
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    anchor = max([packed_op, *(n for n in (weight, x) if isinstance(n, Node))], key=order.__getitem__)
    others = [user for user in packed_op.users if user is not total]
    replaced = [(grad_x, 0), (grad_w and grad_w[1], 1), (row_sum, 2)]
    replaced += [(item, item.args[1] + 2) for item in others]  # the op's other outputs, after the three
    if any(order[reader] <= order[anchor] for node, _ in replaced if node is not None for reader in node.users):
        return False
    keepdim = row_sum is not None and len(row_sum.args) > 2 and bool(row_sum.args[2])
    bias_dims = -1 if row_sum is None else int(keepdim)
    target = torch.ops.gnn_io.attention_backward_projected.default
    if direct_ops.is_direct(packed_op):
        target = direct_ops.twin(target) or target
    with gm.graph.inserting_after(anchor):
        new = gm.graph.call_function(target, (*packed_op.args, x, weight, bias_dims))
    vals = packed_op.meta.get("val")
    if vals is not None:
        empty = _empty_like_meta(vals[0])
        new.meta["val"] = [tensor_val(grad_x) if grad_x is not None else empty,
                           tensor_val(grad_w[1]) if grad_w is not None else empty,
                           tensor_val(row_sum) if row_sum is not None else empty, *vals[1:]]
    with gm.graph.inserting_after(new):
        for node, k in replaced:
            if node is None:
                continue
            item = gm.graph.call_function(operator.getitem, (new, k))
            item.meta.update(node.meta)
            node.replace_all_uses_with(item)
    for node in (grad_x, *(grad_w[::-1] if grad_w else ()), row_sum, *others, total, packed_op):  # readers first
        if node is not None and not node.users:
            gm.graph.erase_node(node)
    return True


def project_all(gm: GraphModule) -> int:
    """:func:`project` every packed attention backward of ``gm`` whose packed gradient qualifies; returns how many."""
    projected = 0
    for op in _calls(gm, _PACKED_OPS):
        totals = [user for user in op.users if user.target is operator.getitem and user.args[1] == 0]
        if len(totals) == 1 and project(gm, op, totals[0]):
            projected += 1
    if projected:
        gm.graph.lint()
        gm.recompile()
    return projected
