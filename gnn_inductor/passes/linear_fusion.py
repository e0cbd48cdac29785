"""One GEMM for the linear maps that read the same node features.

TransformerConv projects ``x`` four times (query, key, value, skip) and GATv2Conv twice (``lin_l``,
``lin_r``), each a ``[N, F] x [F, F_out]`` GEMM that reads all of ``x`` and, in the backward, adds its
own ``dX`` term. On a large graph these maps are most of the layer's dense time. Concatenating the
weights gives one ``[N, F] x [F, sum F_out]`` GEMM: ``x`` is read once, the backward's ``dX`` is one
GEMM with inner size ``sum F_out`` instead of ``k`` GEMMs and ``k - 1`` additions, and ``dW`` is one
GEMM whose rows are the separate weights' gradients.

The pass works on the canonical ATen graph (``gnn_inductor.canonical``) after the message-passing
rewrites, so the pattern matchers never see it. A member is ``mm(x, t(W))`` or ``addmm(b, x, t(W))``
with ``x`` 2-D and ``W`` (and ``b``) graph inputs (parameters); members are grouped by ``x``, by whether they
have a bias, and by dtype. Each member's output becomes a column slice of the fused result: a strided
view, which the fused kernels and Inductor read through its strides. ``GNN_IO_FUSE_LINEARS=0`` turns the
pass off.

**Saved and short-lived maps apart.** A slice of the fused output keeps the whole ``[N, sum F_out]``
buffer alive while any slice is. When some members feed a gnn_io op (which saves them for its backward:
TransformerConv's query, key and value) and others do not (its skip map, read once by an addition), only the
saved ones are fused, so the short-lived map's output is freed after the forward instead of living on in the
fused buffer until the backward: 512 MiB less at the peak of TransformerConv on RMAT 2^20 (128 features, fp32,
measured on the H100). ``GNN_IO_FUSE_LINEARS=all`` fuses every member, saved or not.

Only groups of at least :data:`MIN_GROUP` maps are fused. The backward pays for the fusion with one copy:
the members' output gradients are concatenated into the fused GEMM's ``[N, sum F_out]`` gradient. Measured
on the H100 (RMAT 2^20 / 15.4M edges, 128 features, fp32, forward+backward of the layer):
TransformerConv's four maps fused 25.00 ms against 25.80 unfused; GATv2Conv's two 20.41 against 20.06.
Where every member feeds an attention op, that copy is gone (``gnn_inductor/passes/packed_grads.py``: the attention
backward writes the packed gradient itself), and :data:`ATTENTION_MIN_GROUP` maps suffice: GATv2Conv's two maps
fused took 17.80 ms against 18.13 apart (H100, same graph, 12 interleaved rounds, all won).
``GNN_IO_FUSE_MIN_GROUP`` sets one minimum for every group instead (to measure).
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch.fx import GraphModule, Node

from gnn_inductor import config
from gnn_inductor.graph_match import tensor_val
from gnn_inductor.rewrite_report import source_of

aten = torch.ops.aten
ENV = config.SETTINGS["fuse_linears"].env
MIN_GROUP = 3   # maps per fused GEMM (module docstring: two measured slower, four faster)
ATTENTION_MIN_GROUP = 2  # ... when every member feeds an attention op, whose backward packs the gradients
MIN_GROUP_ENV = config.SETTINGS["fuse_min_group"].env


def min_group(members: list, settings) -> int:
    """The least number of maps fused into one GEMM (module docstring), for a group of ``members``, under the
    compile's ``settings`` (``config.snapshot()``)."""
    value = settings["fuse_min_group"]
    if value is not None:
        return value
    if settings["packed_grads"] and members and all(feeds_gnn_io_op(m[0], _is_attention) for m in members):
        return ATTENTION_MIN_GROUP
    return MIN_GROUP


def _is_attention(target) -> bool:
    return getattr(target, "_opname", "") in ("attention", "attention_direct", "attention_forward",
                                               "attention_forward_direct", "attention_forward_mass",
                                               "attention_forward_mass_direct")


_VIEWS = {aten.slice.Tensor, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
          aten.permute.default, aten.transpose.int, aten.t.default, aten.select.int, aten.unsqueeze.default,
          aten.squeeze.dim, aten.expand.default, aten.alias.default}


def feeds_gnn_io_op(node: Node, which=None) -> bool:
    """Whether ``node``'s value reaches a gnn_io op (one whose target ``which`` accepts, when given), directly or
    through views of it (the op may save it)."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user in seen or user.op != "call_function":
                continue
            seen.add(user)
            if getattr(user.target, "namespace", None) == "gnn_io" and (which is None or which(user.target)):
                return True
            if user.target in _VIEWS:
                stack.append(user)
    return False


def _saved_members(members: list, settings) -> list:
    """The members to fuse: all of them, or (module docstring) only those that feed a gnn_io op when the
    others do not."""
    saved = [m for m in members if feeds_gnn_io_op(m[0])]
    if settings["fuse_linears"] == "all" or not saved or len(saved) == len(members) \
            or len(saved) < min_group(saved, settings):
        return members
    return saved


def _transposed_weight(node) -> Node | None:
    """``W`` when ``node`` is ``t(W)`` or ``permute(W, [1, 0])`` of a 2-D graph input."""
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0]):
        weight = node.args[0]
        if isinstance(weight, Node) and weight.op == "placeholder" and tensor_val(weight) is not None \
                and tensor_val(weight).dim() == 2:
            return weight
    return None



def linear_map(node: Node):
    """``(x, W, bias or None)`` of a linear map node (``mm(x, t(W))`` or ``addmm(b, x, t(W))``, ``x`` 2-D, ``W``
    and ``b`` graph inputs of ``x``'s dtype), else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.mm.default:
        bias, (x, wt) = None, node.args
    elif node.target is aten.addmm.default and not node.kwargs and len(node.args) == 3:
        bias, x, wt = node.args
        if not isinstance(bias, Node) or bias.op != "placeholder" or tensor_val(bias) is None \
                or tensor_val(bias).dim() != 1:
            return None
    else:
        return None
    weight = _transposed_weight(wt)
    if weight is None or tensor_val(x) is None or tensor_val(x).dim() != 2 or tensor_val(node) is None:
        return None
    if tensor_val(weight).dtype != tensor_val(x).dtype:
        return None
    return x, weight, bias


def fuse_shared_input_linears(gm: GraphModule, settings) -> list:
    """Fuse each group of at least :data:`MIN_GROUP` linear maps of the same input (module docstring) in place, under
    the compile's ``settings`` (``config.snapshot()``; whether to fuse at all is the pipeline's ``fuse_linears``
    switch). Returns one ``{"source", "weights", "widths"}`` per fused group, in graph order (``source``: the first
    member's place in the user's code, as the rewrite report gives it)."""
    groups = defaultdict(list)
    for node in gm.graph.nodes:
        member = linear_map(node)
        if member is not None:
            x, weight, bias = member
            groups[(x, bias is None, tensor_val(x).dtype, tensor_val(x).device)].append((node, weight, bias))
    fused = []
    for (x, no_bias, _, _), members in groups.items():
        members = _saved_members(members, settings)
        if len(members) < min_group(members, settings):
            continue
        first = members[0][0]
        source = source_of(first)
        widths = [tensor_val(weight).shape[0] for _, weight, _ in members]
        with gm.graph.inserting_before(first):
            weight = call_node(gm, aten.cat.default, ([w for _, w, _ in members], 0))
            weight_t = call_node(gm, aten.t.default, (weight,))
            if no_bias:
                out = call_node(gm, aten.mm.default, (x, weight_t))
            else:
                bias = call_node(gm, aten.cat.default, ([b for _, _, b in members], 0))
                out = call_node(gm, aten.addmm.default, (bias, x, weight_t))
            out.meta["stack_trace"] = first.meta.get("stack_trace")
            start = 0
            for (node, _, _), width in zip(members, widths):
                piece = call_node(gm, aten.slice.Tensor, (out, 1, start, start + width))
                piece.meta.update({k: v for k, v in node.meta.items() if k != "val"})
                node.replace_all_uses_with(piece)
                start += width
        for node, _, _ in members:
            gm.graph.erase_node(node)
        fused.append({"source": source, "weights": [parameter_name(w) for _, w, _ in members], "widths": widths})
    if fused:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return fused


def parameter_name(placeholder: Node) -> str:
    """``lin_key.weight`` from Dynamo's ``L_self_modules_lin_key_parameters_weight_`` (``bias`` from
    ``L_self_parameters_bias_``); the node name otherwise."""
    name = placeholder.meta.get("dynamo_name", placeholder.name)
    name = re.sub(r"^[Ll]_(self_)?", "", name).rstrip("_")
    return re.sub(r"^parameters_", "", name).replace("modules_", "").replace("_parameters_", ".")


def call_node(gm: GraphModule, target, args) -> Node:
    """A new node with its fake value (``meta["val"]``) computed from its inputs' fake values."""
    node = gm.graph.call_function(target, args)
    fake_args = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
    node.meta["val"] = target(*fake_args)
    return node
