"""Segment matmul: rows ``type_ptr[i]:type_ptr[i + 1]`` of ``x`` times ``weight[i]``, the product of PyG's
``HeteroLinear`` (HGTConv's per-relation maps) where pyg-lib's ``segment_matmul`` is not installed.

PyG's own loop slices ``x`` by the values of ``type_ptr``, which Dynamo can only read with ``Tensor.item()``: a graph
break per call. As one op the loop is opaque to the compiler, so the layer around it stays in one graph
(gnn_inductor/frontends/pyg.py). The op reads the segment bounds on the host, as PyG's loop does, so it is tagged
``cudagraph_unsafe``: Inductor keeps it out of CUDA graphs.

- ``gnn_io::segment_matmul(x [N, K], type_ptr [T + 1], weight [T, K, M]) -> [N, M]``
- ``gnn_io::segment_matmul_weight_grad(x [N, K], type_ptr, grad [N, M], types) -> [T, K, M]``: each segment's
  ``x.T @ grad``, zero for an empty one (the weight's gradient).

Both run one Triton kernel each (kernels/dense/segment_triton.py; the setting ``segment_matmul=triton``, the default)
on CUDA, and on CPU tensors under Triton's interpreter for the tests, for float32 and half-precision operands. The
rest runs a loop of GEMMs, one per segment (PyG's products to the bit): the CPU, float64, ``segment_matmul=loop``, and
the weight gradient under ``torch.use_deterministic_algorithms(True)``, since its kernel adds partial products
atomically. On ogbn-mag-shaped mini-batches of HGTConv (H200, 1024 seeds, 28 segments per map) the kernels took the
training step from 21.2 to 13.1 ms (docs/dense.md).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.dense import segment_triton
from gnn_inductor.kernels.dense.gemm import kernel_device


def _kernels_take(x: Tensor, other: Tensor, type_ptr: Tensor, segments_held: int) -> bool:
    """Whether the Triton kernels run this call: the setting, operands of one dtype they take on their device,
    and a segment for each of ``type_ptr``'s bounds among the ``segments_held`` (else the loop, which raises)."""
    return (config.get("segment_matmul") == "triton" and x.dtype in segment_triton.DTYPES and other.dtype == x.dtype
            and x.device == other.device and kernel_device(x.device.type) and x.dim() == 2
            and type_ptr.dim() == 1 and not type_ptr.is_floating_point() and type_ptr.numel() - 1 <= segments_held)


def _bounds(type_ptr: Tensor) -> list:
    bounds = type_ptr.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


@torch.library.custom_op("gnn_io::segment_matmul", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def segment_matmul(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
    if _kernels_take(x, weight, type_ptr, weight.shape[0]):
        return segment_triton.segment_mm(x, type_ptr, weight)
    out = x.new_empty(x.shape[0], weight.shape[-1])
    for i, (start, end) in enumerate(_bounds(type_ptr)):
        # PyG's own products (the same kernels, the same rounding), each written into its rows of ``out``: no
        # product in a tensor of its own and a copy after it, which was half the op's launches (HGTConv on
        # ogbn-mag-shaped mini-batches: 337 device copies per step, H200)
        torch.mm(x[start:end], weight[i], out=out[start:end])
    return out


@segment_matmul.register_fake
def _segment_matmul_fake(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[-1])


@torch.library.custom_op("gnn_io::segment_matmul_weight_grad", mutates_args=(),
                         tags=(torch.Tag.cudagraph_unsafe,))
def segment_matmul_weight_grad(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
    if _kernels_take(x, grad, type_ptr, types) and not torch.are_deterministic_algorithms_enabled():
        return segment_triton.segment_weight_grad(x, type_ptr, grad, types)
    out = x.new_zeros(types, x.shape[1], grad.shape[1])
    for i, (start, end) in enumerate(_bounds(type_ptr)):
        if end > start:
            torch.mm(x[start:end].transpose(0, 1), grad[start:end], out=out[i])
    return out


@segment_matmul_weight_grad.register_fake
def _weight_grad_fake(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
    return x.new_empty(types, x.shape[1], grad.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    x, type_ptr, weight = inputs
    ctx.save_for_backward(x, type_ptr, weight)


def _backward(ctx, grad: Tensor):
    x, type_ptr, weight = ctx.saved_tensors
    grad_x = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_x = segment_matmul(grad.contiguous(), type_ptr, weight.transpose(1, 2))
    if ctx.needs_input_grad[2]:
        grad_weight = segment_matmul_weight_grad(x, type_ptr, grad.contiguous(), weight.shape[0])
    return grad_x, None, grad_weight


segment_matmul.register_autograd(_backward, setup_context=_setup_context)
