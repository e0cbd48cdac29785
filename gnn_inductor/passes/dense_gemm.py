"""The rewritten graphs' large float32 GEMMs on Tensor Cores at float32 accuracy.

With TF32 off (PyTorch's default), a GNN layer's linear maps run in cuBLAS's float32 kernels on the CUDA cores:
at 2^20 nodes and 128 features each of GATConv's three GEMMs takes 0.68-0.93 ms of its 11 ms step on the H100,
and TransformerConv's fused ``128 -> 512`` map 2.7-3.3 ms each. ``kernels/dense/gemm.py`` runs them as the
3xTF32 split (three TF32 Tensor Core products, float32 accumulation), measured no less accurate than cuBLAS's
float32 against float64 and 1.05-1.66x faster at those sizes (``docs/dense.md``); the tall products of an inner
size up to 128 run on its weight-stationary kernel, which splits each program's columns of the weight once
(another 1.1-1.2x on the product, H100).

This pass, on the graphs AOTAutograd hands Inductor (forward and backward) in graphs the backend rewrote, turns
``aten.mm(a, b)`` and ``aten.addmm(bias, a, b)`` (a bias over rows, default scales) into ``gnn_io::mm(a, b,
bias)`` where the operands are float32 CUDA tensors of fixed sizes that the kernel takes
(:func:`gnn_inductor.kernels.dense.gemm.shape_kind`) and TF32 is off. The op checks again when it runs and
falls back to cuBLAS with the same value to rounding (TF32 turned on since, another device). The gnn_io ops that
multiply inside (``addmm_into``, ``gather_scatter_backward_mm``, ``attention_backward_projected``) call the same
:func:`~gnn_inductor.kernels.dense.gemm.matmul`. ``GNN_IO_FP32_GEMM=cublas`` keeps cuBLAS everywhere.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from gnn_inductor.graph_match import tensor_val
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.dense.ops import MM

aten = torch.ops.aten


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
