"""Segment matmul: rows ``type_ptr[i]:type_ptr[i + 1]`` of ``x`` times ``weight[i]``, the product of PyG's
``HeteroLinear`` (HGTConv's per-relation maps) where pyg-lib's ``segment_matmul`` is not installed.

PyG's own loop slices ``x`` by the values of ``type_ptr``, which Dynamo can only read with ``Tensor.item()``: a graph
break per call. As one op the loop is opaque to the compiler, so the layer around it stays in one graph
(gnn_inductor/frontends/pyg.py). The op reads the segment bounds on the host, as PyG's loop does, so it is tagged
``cudagraph_unsafe``: Inductor keeps it out of CUDA graphs.

- ``gnn_io::segment_matmul(x [N, K], type_ptr [T + 1], weight [T, K, M]) -> [N, M]``
- ``gnn_io::segment_matmul_weight_grad(x [N, K], type_ptr, grad [N, M], types) -> [T, K, M]``: each segment's
  ``x.T @ grad``, zero for an empty one (the weight's gradient).

- ``gnn_io::device_segment_matmul`` and ``gnn_io::device_segment_matmul_weight_grad``: the same with ``type_ptr`` on
  the device, read there by the kernels (never on the host), so that a CUDA graph may hold them; on CUDA they raise
  where the kernels cannot run (:func:`device_kernels_take`, checked before a graph uses them).

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
    return _loop_mm(x, type_ptr, weight)


def _loop_mm(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
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
    return _loop_weight_grad(x, type_ptr, grad, types)


def _loop_weight_grad(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
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


def _backward_by(product, weight_grad):
    """The backward of a segment matmul whose gradients are the ops ``product`` and ``weight_grad``."""
    def backward(ctx, grad: Tensor):
        x, type_ptr, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = product(grad.contiguous(), type_ptr, weight.transpose(1, 2))
        if ctx.needs_input_grad[2]:
            grad_weight = weight_grad(x, type_ptr, grad.contiguous(), weight.shape[0])
        return grad_x, None, grad_weight
    return backward


segment_matmul.register_autograd(_backward_by(segment_matmul, segment_matmul_weight_grad),
                                 setup_context=_setup_context)


# -- bounds on the device: what a CUDA graph may hold -------------------------------------------------------------------

def device_kernels_take(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`device_segment_matmul` runs ``x`` by ``weight`` on the device: the Triton kernels take their
    dtype there and the results may vary in the last bits (no deterministic algorithms asked for); checked when a
    graph is compiled, since at run time on CUDA the op raises instead of reading the bounds on the host."""
    return (x.dtype in segment_triton.DTYPES and weight.dtype == x.dtype and kernel_device(x.device.type)
            and config.get("segment_matmul") == "triton" and not torch.are_deterministic_algorithms_enabled())


def _device_bounds(x: Tensor, type_ptr: Tensor, other: Tensor, segments: int) -> bool:
    """True where the Triton kernels run this call; False on the CPU (the loop); raises on CUDA otherwise."""
    if _kernels_take(x, other, type_ptr, segments) and type_ptr.device == x.device:
        return True
    if x.is_cuda:
        raise RuntimeError(
            f"gnn_io::device_segment_matmul: its Triton kernels cannot take {x.dtype} x {other.dtype} with "
            f"{type_ptr.numel() - 1} bounds ({type_ptr.device}) for {segments} segments, and reading the bounds "
            "on the host would break the CUDA graph that holds this op")
    return False


@torch.library.custom_op("gnn_io::device_segment_matmul", mutates_args=())
def device_segment_matmul(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
    """:func:`segment_matmul` with the bounds on the device, which the Triton kernels read there: nothing waits on
    the host, so a CUDA graph may record it (the relations of a padded mini-batch, gnn_inductor/passes/
    relation_segments.py). Rows outside every segment are left as they are."""
    if _device_bounds(x, type_ptr, weight, weight.shape[0]):
        return segment_triton.segment_mm(x, type_ptr, weight)
    return _loop_mm(x, type_ptr, weight)


@device_segment_matmul.register_fake
def _device_segment_matmul_fake(x: Tensor, type_ptr: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[-1])


@torch.library.custom_op("gnn_io::device_segment_matmul_weight_grad", mutates_args=())
def device_segment_matmul_weight_grad(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
    if _device_bounds(x, type_ptr, grad, types):
        return segment_triton.segment_weight_grad(x, type_ptr, grad, types)
    return _loop_weight_grad(x, type_ptr, grad, types)


@device_segment_matmul_weight_grad.register_fake
def _device_weight_grad_fake(x: Tensor, type_ptr: Tensor, grad: Tensor, types: int) -> Tensor:
    return x.new_empty(types, x.shape[1], grad.shape[1])


device_segment_matmul.register_autograd(
    _backward_by(device_segment_matmul, device_segment_matmul_weight_grad), setup_context=_setup_context)
