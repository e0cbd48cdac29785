"""The rewritten graphs' large float32 GEMMs on Tensor Cores at float32 accuracy.

With TF32 off (PyTorch's default), a GNN layer's linear maps run in cuBLAS's float32 kernels on the CUDA cores:
at 2^20 nodes and 128 features each of GATConv's three GEMMs takes 0.68-0.93 ms of its 11 ms step on the H100,
and TransformerConv's fused ``128 -> 512`` map 2.7-3.3 ms each. ``kernels/dense_triton.py`` runs them as the
3xTF32 split (three TF32 Tensor Core products, float32 accumulation), measured no less accurate than cuBLAS's
float32 against float64 and 1.05-1.66x faster at those sizes (``docs/dense.md``); the tall products of an inner
size up to 128 run on its weight-stationary kernel, which splits each program's columns of the weight once
(another 1.1-1.2x on the product, session 27).

This pass, on the graphs AOTAutograd hands Inductor (forward and backward) in graphs the backend rewrote, turns
``aten.mm(a, b)`` and ``aten.addmm(bias, a, b)`` (a bias over rows, default scales) into ``gnn_io::mm(a, b,
bias)`` where the operands are float32 CUDA tensors of fixed sizes that the kernel takes
(:func:`gnn_inductor.kernels.dense_triton.shape_kind`) and TF32 is off. The op checks again when it runs and
falls back to cuBLAS with the same value to rounding (TF32 turned on since, another device). The gnn_io ops that
multiply inside (``addmm_into``, ``gather_scatter_backward_mm``, ``attention_backward_projected``) call the same
:func:`~gnn_inductor.kernels.dense_triton.matmul`. ``GNN_IO_FP32_GEMM=cublas`` keeps cuBLAS everywhere.
"""
from __future__ import annotations

import operator
import os

import torch
from torch import Tensor
from torch.fx import GraphModule

from gnn_inductor.graph_match import tensor_val
from gnn_inductor.kernels import dense_triton

aten = torch.ops.aten

_LIB = torch.library.Library("gnn_io", "FRAGMENT")
_LIB.define("mm(Tensor a, Tensor b, Tensor? bias=None) -> Tensor")


def _mm(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    return dense_triton.matmul(a, b, bias)


def _mm_meta(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


_LIB.impl("mm", _mm, "CompositeExplicitAutograd")
_LIB.impl("mm", _mm_meta, "Meta")  # fake tensors: shapes only (a fake CUDA tensor would otherwise reach Triton)
_LIB.impl("mm", torch.library.fallthrough_kernel, "Autograd")  # only inside compiled graphs: no autograd
MM = torch.ops.gnn_io.mm.default

_LIB.define("mm_rowsum(Tensor a, Tensor b) -> (Tensor, Tensor)")


def _mm_rowsum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return dense_triton.mm_rowsum(a, b)


def _mm_rowsum_meta(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return a.new_empty((a.shape[0], b.shape[1])), a.new_empty((a.shape[0],))


_LIB.impl("mm_rowsum", _mm_rowsum, "CompositeExplicitAutograd")
_LIB.impl("mm_rowsum", _mm_rowsum_meta, "Meta")
_LIB.impl("mm_rowsum", torch.library.fallthrough_kernel, "Autograd")  # only inside compiled graphs
MM_ROWSUM = torch.ops.gnn_io.mm_rowsum.default
SUMS_SETTING = "GNN_IO_GEMM_SUMS"


def enabled() -> bool:
    return dense_triton.setting() == "x3"


def _qualifies(a, b, bias, out) -> bool:
    if a is None or b is None or out is None:
        return False
    if not (a.dtype == b.dtype == out.dtype == torch.float32 and a.device == b.device
            and dense_triton.kernel_device(a.device.type)):
        return False
    sizes = (*a.shape, b.shape[1])
    if a.dim() != 2 or b.dim() != 2 or not all(isinstance(s, int) for s in sizes):
        return False  # symbolic sizes: the thresholds cannot be read at compile time
    if bias is not None and (bias.dim() != 1 or bias.dtype != torch.float32 or bias.shape[0] != sizes[2]):
        return False
    return dense_triton.shape_kind(*sizes) is not None


def rewrite(gm: GraphModule) -> int:
    """Turn the qualifying ``mm``/``addmm`` calls of ``gm`` into ``gnn_io::mm``; returns how many. Nothing when
    TF32 is on or the setting says cuBLAS."""
    if not enabled() or not dense_triton.float32_exact():
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.mm.default and len(node.args) == 2:
            bias, (a, b) = None, node.args
        elif node.target is aten.addmm.default and len(node.args) == 3:
            bias, a, b = node.args
        else:
            continue
        vals = [tensor_val(x) if isinstance(x, torch.fx.Node) else None for x in (a, b)]
        bias_val = tensor_val(bias) if isinstance(bias, torch.fx.Node) else None
        if bias is not None and bias_val is None:
            continue
        if not _qualifies(*vals, bias_val, tensor_val(node)):
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(MM, (a, b, bias))
        new.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def sums_enabled() -> bool:
    """``GNN_IO_GEMM_SUMS`` (default on; ``0`` keeps Inductor's reductions): :func:`fold_sums`."""
    return os.environ.get(SUMS_SETTING, "1").strip() != "0"


def _transposed(node) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and (node.target is aten.t.default
                 or (node.target is aten.permute.default and list(node.args[1]) == [1, 0])))


def _weight_gradient_of(grad) -> torch.fx.Node | None:
    """A ``gnn_io::mm(grad^T, b)`` of this graph (a weight gradient on the split kernel, no bias), or None."""
    for transposed in grad.users:
        if not _transposed(transposed):
            continue
        for user in transposed.users:
            if (user.op == "call_function" and user.target is MM and user.args[0] is transposed
                    and (len(user.args) < 3 or user.args[2] is None)):
                sizes = tensor_val(transposed).shape
                if dense_triton.shape_kind(sizes[0], sizes[1], tensor_val(user).shape[1]) == "wide":
                    return user
    return None


def fold_sums(gm: GraphModule) -> int:
    """A linear layer's backward reads its output gradient ``dY`` ``[N, F]`` twice: the weight gradient ``dY^T x``
    and the bias gradient ``dY.sum(0)``, an Inductor reduction (0.18 ms per 128-wide layer at 2^20 rows on the
    H100, session 19's SAGEConv max profile). Where the weight gradient runs on the split kernel (a ``gnn_io::mm``
    of :func:`rewrite`), turn the pair into one ``gnn_io::mm_rowsum(dY^T, x)``, which sums the tiles of ``dY`` it
    loads anyway. Returns how many pairs; nothing with ``GNN_IO_GEMM_SUMS=0``."""
    from gnn_inductor.linear_fusion import _call

    if not sums_enabled():
        return 0
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.sum.dim_IntList or node.kwargs:
            continue
        grad, dims = node.args[0], node.args[1]
        keepdim = len(node.args) > 2 and bool(node.args[2])
        grad_val = tensor_val(grad) if isinstance(grad, torch.fx.Node) else None
        if grad_val is None or grad_val.dim() != 2 or grad_val.dtype != torch.float32 or list(dims) not in ([0], [-2]):
            continue
        mm = _weight_gradient_of(grad)
        if mm is None:
            continue
        transposed, b = mm.args[0], mm.args[1]
        first = min(mm, node, key=order.__getitem__)  # the fused op goes before both
        if isinstance(b, torch.fx.Node) and order[b] >= order[first]:
            continue  # x made after the sum: leave the pair as it is
        with gm.graph.inserting_before(first):
            if order[transposed] >= order[first]:  # the sum comes first: transpose dY again before it
                transposed = _call(gm, aten.permute.default, (grad, [1, 0]))
            fused = _call(gm, MM_ROWSUM, (transposed, b))
            product = _call(gm, operator.getitem, (fused, 0))
            sums = _call(gm, operator.getitem, (fused, 1))
            total = _call(gm, aten.view.default, (sums, [1, grad_val.shape[1]])) if keepdim else sums
        product.meta.update({k: v for k, v in mm.meta.items() if k != "val"})
        mm.replace_all_uses_with(product)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(mm)
        gm.graph.erase_node(node)
        count += 1
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
