r"""Triton SpMM with a degree split: ``Y = S A X`` for the CSR adjacency of a graph plan.

.. math::
    Y_i = s_i \sum_{k = \text{rowptr}_i}^{\text{rowptr}_{i+1} - 1} \text{values}_k \, X_{\text{col}_k},
    \qquad s_i = 1 \ (\text{reduce='sum'}) \ \text{or} \ 1/\max(1, \deg_i) \ (\text{reduce='mean'})

the same result as :func:`gnn_inductor.kernels.spmm.csr_product.csr_matmul` followed by the row scale of
``gnn_io::spmm`` (the CPU reference the tests compare with).

Shapes: ``x [num_cols, *F]`` (the trailing dims are flattened into one feature dim ``F``),
``values [E]`` and ``col [E]`` in CSR order, ``rowptr [num_rows + 1]``; output ``[num_rows, *F]``.
dtypes: ``rowptr`` and ``col`` int32 or int64; ``x`` float32, float16 or bfloat16; ``values`` any
float dtype, read as float32. Products and sums are float32; the output has ``x``'s dtype (the kernel
accumulates into a float32 buffer, half-precision results are cast once at the end). Rows without
edges are 0. Hub rows are summed with float32 atomics, so their summation order (and the last bits
of the result) can vary from run to run; every other row is deterministic.

Degree split (the load balancing of the IO-aware GNN reduction kernels): :func:`work_items` cuts the
CSR rows once per graph into *work items* ``(row, start, end)`` of at most ``max_edges`` entries.
A light row (``deg <= max_edges``) is one item, a hub of degree ``d`` is ``ceil(d / max_edges)``
items, a row with no edges is none. One Triton program handles one item and one ``BLOCK_F`` slice of
the features: it walks the item's entries ``BLOCK_E`` at a time, gathers the ``BLOCK_E x BLOCK_F``
tile of ``x`` rows, weights it, and accumulates in float32 registers; the single item of a light
row stores its result, the items of a hub row ``atomic_add`` their partial sums into the
zero-initialised output. Every program so does at most ``max_edges`` entries of work, whatever the
degree distribution, and only hub rows pay for atomics. ``max_edges`` is best a multiple of
``BLOCK_E`` (the last block of every full item is then unmasked).

Entry points: :func:`triton_spmm` (plain launcher: allocate, launch, cast; runs on CUDA tensors, and
on CPU tensors when ``TRITON_INTERPRET=1`` was set before this module was imported) and the
``torch.ops.gnn_io.spmm_csr_triton`` operator, a ``torch.library.triton_op`` whose kernel launch
Inductor sees and inlines into compiled code (no autograd formula: ``gnn_io::spmm`` owns the
backward). :data:`AUTOTUNE_CONFIGS` lists the launch and split parameters to measure on the GPU.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from gnn_inductor.plan.work_items import DEFAULT_MAX_EDGES
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2
from gnn_inductor.kernels.spmm.common import SPMM_REDUCTIONS

DEFAULT_BLOCK_E = 8
DEFAULT_NUM_WARPS = 1
_BLOCK_F_BYTES = 256  # one program reads a 256-byte slice of each gathered row

# Candidates to measure on the H100 (the lead picks defaults from them). ``max_edges`` belongs to the
# graph plan (it shapes the work items), the others to the launch. First reading (H100, fp32/bf16, random
# graph of 200k nodes, 2.1M edges, mean degree 10, one hub of degree 100k, F=64 and 256): 8 x 64 tiles on
# one warp won (182 us fp32 F=64 against cuSPARSE's 272 us; 543 us bf16 F=256 with 8 x 128 against 594 us),
# wider tiles and more warps lost up to 3x, and max_edges from 64 to 512 changed nothing there (only the hub
# is split). The larger tiles are for graphs of higher mean degree, not measured yet.
AUTOTUNE_CONFIGS = [
    dict(max_edges=256, block_e=8, block_f=64, num_warps=1),
    dict(max_edges=256, block_e=8, block_f=128, num_warps=1),
    dict(max_edges=256, block_e=16, block_f=64, num_warps=1),
    dict(max_edges=128, block_e=16, block_f=128, num_warps=2),
    dict(max_edges=512, block_e=32, block_f=64, num_warps=2),
    dict(max_edges=1024, block_e=32, block_f=128, num_warps=4),
]


@triton.jit
def _spmm_kernel(x_ptr, values_ptr, rowptr_ptr, col_ptr, item_row_ptr, item_start_ptr, item_end_ptr,
                 item_shared_ptr, out_ptr, num_features, stride_x_row, stride_x_feature,
                 MEAN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    item = tl.program_id(0)
    features = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feature_mask = features < num_features
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)

    # 2-D accumulator, reduced once after the loop: no cross-warp reduction per block of entries
    acc = tl.zeros((BLOCK_E, BLOCK_F), dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        entries = block_start + tl.arange(0, BLOCK_E)
        entry_mask = entries < end
        # int64 offsets: num_cols * F may exceed 2^31 even when the index dtype is int32
        sources = tl.load(col_ptr + entries, mask=entry_mask, other=0).to(tl.int64)
        weights = tl.load(values_ptr + entries, mask=entry_mask, other=0.0).to(tl.float32)
        tile = tl.load(x_ptr + sources[:, None] * stride_x_row + features[None, :] * stride_x_feature,
                       mask=entry_mask[:, None] & feature_mask[None, :], other=0.0).to(tl.float32)
        acc += weights[:, None] * tile
    result = tl.sum(acc, axis=0)

    if MEAN:
        # the degree of the whole row, not of this item: a hub's partial sums are scaled before they add up
        degree = tl.load(rowptr_ptr + row + 1) - tl.load(rowptr_ptr + row)
        result = result / tl.maximum(degree, 1).to(tl.float32)

    out_offsets = row.to(tl.int64) * num_features + features
    shared = tl.load(item_shared_ptr + item)
    if shared == 1:
        tl.atomic_add(out_ptr + out_offsets, result, mask=feature_mask)
    elif shared == 0:
        tl.store(out_ptr + out_offsets, result, mask=feature_mask)
    # shared == PADDING: a padding item of the plan (see work_items_op), nothing to write


def default_block_f(num_features: int, element_size: int) -> int:
    """The feature block when none is given: 256 bytes of a row (64 float32 or 128 half features), less
    when the features are fewer (rounded up to a power of two, at least 16)."""
    return max(16, min(_BLOCK_F_BYTES // element_size, next_power_of_2(num_features)))


def _check(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, items, reduce: str) -> None:
    """Shape and dtype checks only: the op's fake implementation runs this too, on data-less tensors."""
    if reduce not in SPMM_REDUCTIONS:
        raise ValueError(f"spmm supports reduce {SPMM_REDUCTIONS}, got {reduce!r}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"triton spmm needs float32, float16 or bfloat16 features, got {x.dtype}; "
                        "use gnn_io::spmm (the reference) for other dtypes")
    if x.dim() < 1:
        raise ValueError("x must have a node dimension, got a 0-d tensor")
    if not values.is_floating_point():
        raise TypeError(f"values must be floating point, got {values.dtype}")
    if values.dim() != 1 or col.dim() != 1 or values.shape[0] != col.shape[0]:
        raise ValueError(f"values and col must have shape [E] (one per CSR entry), got {tuple(values.shape)} "
                         f"and {tuple(col.shape)}")
    for name, index in (("rowptr", rowptr), ("col", col)):
        if index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32 or int64 tensor, got {index.dtype}")
    if len(items) != 4 or any(t.dim() != 1 or t.shape[0] != items[0].shape[0] for t in items):
        raise ValueError("items must be the four [num_items] tensors of work_items(rowptr, max_edges)")
    devices = {t.device for t in (x, values, rowptr, col, *items)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _spmm(kernel, x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, items, reduce: str,
          block_e: int, block_f: Optional[int], num_warps: int) -> Tensor:
    """Allocate, launch ``kernel`` (the Triton kernel, or its ``wrap_triton`` wrapper), cast."""
    _check(x, values, rowptr, col, items, reduce)
    num_rows = rowptr.shape[0] - 1
    features = x.reshape(x.shape[0], -1)
    num_features = features.shape[1]
    block_f = default_block_f(num_features, x.element_size()) if block_f is None else block_f
    out = torch.zeros((num_rows, num_features), dtype=torch.float32, device=x.device)
    grid = (items[0].shape[0], cdiv(num_features, block_f))
    kernel[grid](features, values, rowptr, col, *items, out, num_features, features.stride(0), features.stride(1),
                 MEAN=reduce == "mean", BLOCK_E=block_e, BLOCK_F=block_f, num_warps=num_warps)
    return out.to(x.dtype).reshape(num_rows, *x.shape[1:])


def triton_spmm(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, items, reduce: str = "sum", *,
                block_e: int = DEFAULT_BLOCK_E, block_f: Optional[int] = None,
                num_warps: int = DEFAULT_NUM_WARPS) -> Tensor:
    """``Y = S A X`` (module docstring) with ``items = work_items(rowptr, max_edges)``.

    ``block_e`` and ``block_f`` (powers of two) are the entry and feature tile of one program;
    ``block_f`` defaults to :func:`default_block_f` of the flattened feature size and ``x``'s element size.
    """
    return _spmm(_spmm_kernel, x, values, rowptr, col, items, reduce, block_e, block_f, num_warps)


@triton_op("gnn_io::spmm_csr_triton", mutates_args=())
def spmm_csr_triton(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, item_row: Tensor, item_start: Tensor,
                    item_end: Tensor, item_shared: Tensor, reduce: str, block_e: int = DEFAULT_BLOCK_E,
                    block_f: Optional[int] = None, num_warps: int = DEFAULT_NUM_WARPS) -> Tensor:
    """:func:`triton_spmm` as an operator: the work items are passed as their four tensors."""
    items = (item_row, item_start, item_end, item_shared)
    return _spmm(wrap_triton(_spmm_kernel), x, values, rowptr, col, items, reduce, block_e, block_f, num_warps)


