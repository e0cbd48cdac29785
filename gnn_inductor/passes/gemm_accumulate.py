"""GEMMs that add into a fresh buffer instead of into a copy of it.

A message-passing layer often ends in a sum of a GEMM and another fresh ``[N, F]`` tensor:

- SAGEConv's forward, ``lin_l(aggr) + lin_r(x)``: ``addmm(b, aggr, W_l^T) + mm(x, W_r^T)``;
- its backward, ``dX = mm(dY, W_r) + (gradient of the aggregation)``: the second term is the output of a
  gnn_io backward op (the gather-scatter walk, the transposed SpMM);

and GraphConv and any ``conv(x) + lin(x)`` layer the same. Inductor lowers ``add(mm(a, b), t)`` to
``addmm(t, a, b)``, a functional call: ATen copies ``t`` into the fresh result before cuBLAS adds the
product (``beta = 1``). At 2^20 x 128 float32 that copy moves 1 GiB (0.36 ms on the H100, two per SAGEConv
step: the ``Memcpy DtoD`` rows of ``benchmarks/profile_layer.py``).

When ``t`` is a tensor nobody else reads (its only user is the add) and that this graph made (the result
of a GEMM or of a gnn_io op, never an input, a view or a parameter), the add can happen in ``t``'s own
memory: ``gnn_io::addmm_into(t, a, b)``, which runs ``t.addmm_(a, b)``, with the same value (the product is
accumulated onto ``t`` by cuBLAS with ``beta = 1``; float32 results match ``t + a @ b`` to rounding). Inductor
lowers the call as a fallback kernel that mutates ``t``, ordered after ``t``'s producer and before its readers.
It is our own op rather than ``aten.addmm_`` because ATen's in-place op has a decomposition: Inductor refuses to
lower it as a fallback when the environment variable ``CI`` is set (``make_fallback(aten.addmm_.default): a
decomposition exists``), and would otherwise decompose it back into the copy this pass removes.

When ``t`` is a gradient of ``gnn_io::gather_scatter_backward``, the op itself takes the GEMM instead:
``gnn_io::gather_scatter_backward_mm(a, b, k, ...)`` computes ``a @ b`` first and lets its kernels add the
gradient of argument ``k`` into that product, so the backward also skips the zero-filled buffer its atomics
would otherwise start from (512 MiB at 2^20 x 128 float32). Off the kernels' path it adds the two.

The pass runs on the graphs AOTAutograd hands Inductor (forward and backward), only in graphs the backend
rewrote; ``GNN_IO_GEMM_ACCUMULATE=0`` turns it off, to compare.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from gnn_inductor import config
from gnn_inductor.passes import direct_ops
from gnn_inductor.graph_match import tensor_val
from gnn_inductor.kernels.dense.ops import ADDMM_INTO

aten = torch.ops.aten
ENV = config.SETTINGS["gemm_accumulate"].env
_GEMMS = (aten.mm.default, aten.addmm.default)


def _fresh(node: Node) -> bool:
    """Whether ``node``'s tensor is memory of its own, made in this graph: a GEMM's result, or an output of a
    gnn_io op (custom ops return fresh tensors: ``torch.library`` refuses outputs that alias inputs)."""
    if node.op != "call_function":
        return False
    if node.target in _GEMMS:
        return True
    if node.target is operator.getitem and isinstance(node.args[0], Node):
        producer = node.args[0].target
    else:
        producer = node.target
    return getattr(producer, "namespace", None) == "gnn_io"


def _accumulable(gemm: Node, other: Node, add: Node) -> bool:
    if not (isinstance(gemm, Node) and isinstance(other, Node) and gemm is not other):
        return False
    if gemm.target is not aten.mm.default or len(gemm.users) != 1 or len(other.users) != 1:
        return False
    if not _fresh(other):
        return False
    out, target = tensor_val(add), tensor_val(other)
    if out is None or target is None or tensor_val(gemm) is None:
        return False
    # the same shape and dtype (no broadcasting, no promotion), a plain row-major buffer
    return (tuple(target.shape) == tuple(out.shape) == tuple(tensor_val(gemm).shape) and target.dim() == 2
            and target.dtype == out.dtype == tensor_val(gemm).dtype and target.is_contiguous())


def _backward_op(node: Node):
    """The ``gather_scatter_backward`` call whose output ``node`` indexes, or None."""
    if node.target is not operator.getitem or not isinstance(node.args[0], Node):
        return None
    producer = node.args[0]
    name = getattr(producer.target, "_opname", "")
    if getattr(producer.target, "namespace", None) == "gnn_io" and name in ("gather_scatter_backward",
                                                                             "gather_scatter_backward_direct"):
        return producer
    return None


def _into_backward(gm: GraphModule, gemm: Node, other: Node, add: Node) -> bool:
    """Fold ``add(mm(a, b), gather_scatter_backward(...)[k])`` into ``gather_scatter_backward_mm(a, b, k, ...)``,
    when the new call can stand where every reader of the old one comes after it; False otherwise."""
    backward = _backward_op(other)
    if backward is None:
        return False
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    anchor = max([backward, *(x for x in gemm.args if isinstance(x, Node))], key=order.__getitem__)
    readers = list(backward.users)
    if any(order[r] <= order[anchor] for r in readers) or order[add] <= order[anchor]:
        return False
    op = torch.ops.gnn_io.gather_scatter_backward_mm.default
    # a twin, as the graph's other gnn_io calls
    target = direct_ops.twin(op) if direct_ops.is_direct(backward) else None
    with gm.graph.inserting_after(anchor):
        fused = gm.graph.call_function(target or op, (*gemm.args, other.args[1], *backward.args),
                                       dict(backward.kwargs))
    fused.meta["val"] = backward.meta.get("val")  # not the rest: e.g. its recorded argument values, by position
    for reader in readers:
        reader.replace_input_with(backward, fused)
    add.replace_all_uses_with(other)
    gm.graph.erase_node(add)
    gm.graph.erase_node(gemm)
    gm.graph.erase_node(backward)
    return True


def fold(gm: GraphModule) -> int:
    """Rewrite ``add(mm(a, b), t)`` (either order) where ``t`` qualifies (module docstring): into the
    gather-scatter backward that made ``t`` where it can, else into ``addmm_into(t, a, b)``; returns how many adds
    were folded."""
    folded = 0
    for add in list(gm.graph.nodes):
        if add.op != "call_function" or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
            continue
        first, second = add.args
        for gemm, other in ((first, second), (second, first)):
            if _accumulable(gemm, other, add):
                if not _into_backward(gm, gemm, other, add):
                    with gm.graph.inserting_before(add):
                        gm.graph.call_function(ADDMM_INTO, (other, *gemm.args))  # returns nothing: t is the sum
                    add.replace_all_uses_with(other)
                    gm.graph.erase_node(add)
                    gm.graph.erase_node(gemm)
                folded += 1
                break
    if folded:
        gm.graph.lint()
        gm.recompile()
    return folded
