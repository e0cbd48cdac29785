r"""Block-sparse Tensor-Core SpMM (GCN-like layers): ``gnn_io::spmm``'s product over the block format of
``gnn_inductor/plan/block_format.py``, forward and backward.

.. math::
    Y_i = s_i \sum_{e = (j \to i)} a_e X_j, \qquad
    dX_j = \sum_{e = (j \to i)} a_e \, s_i \, dY_i, \qquad
    da_e = s_i \langle dY_i, X_j \rangle

with ``s`` the optional row scale (``1 / max(1, deg_i)`` for ``reduce='mean'``, none for a sum; it multiplies
``Y`` and ``dY`` by destination row, as in ``kernels/spmm/op.py``). Shapes: ``x [num_src, *F]`` (trailing dims
flattened to ``F``), ``edge_values [E]``, ``row_scale [num_dst]``, ``Y [num_dst, *F]``.

**Format and indexing.** Destination rows in windows of ``WINDOW`` along a node order, each window's distinct
source columns condensed into tiles of ``TILE``; ``tile_edge[t, r, j]`` holds the id the builder was given for the
edge ``tile_col[t, j] -> window_rows[w, r]`` (``-1`` where there is none). ``build_block_format(rowptr, col,
perm, ...)`` with the CSR plan's ``perm`` stores **original edge ids**, so ``edge_values`` must be in original
edge-id order: ``edge_values[perm[k]]`` is the value of CSR edge ``k``. :func:`values_by_edge_id` maps
``gnn_io::spmm``'s CSR-order values there (a differentiable ``index_copy``); the values' gradient comes back in
the same edge-id order (``grad[perm]`` is it in CSR order). Built with ``perm = arange(E)`` instead, the
format's ids are CSR positions and CSR-order values are read as they are.

**Forward** (:func:`block_spmm_forward`): one program per (``dense_ok`` window, block of ``BLOCK_F`` feature
columns). Per tile of the window it builds the ``WINDOW x TILE`` value tile ``A[r, j] = a[tile_edge[t, r, j]]``
(0 off the edges), gathers the ``TILE x BLOCK_F`` rows of ``x`` at ``tile_col`` and accumulates ``A @ X`` with
``tl.dot`` in float32; the window's rows (any rows of the node order, through ``window_rows``) are scaled by
``s`` and stored. Rows of windows that are not ``dense_ok`` (a duplicate ``(dst, src)`` pair: one cell cannot
hold two edges) are left untouched, 0 in the fresh output: a hybrid fills them from the CSR kernel
(:func:`dense_rows` is the mask of the rows computed here).

**Backward** (:func:`block_spmm_backward`): ``dX`` runs the same kernel over the transposed format
(:func:`block_format.transpose_block_format`: source nodes in windows, destination rows condensed into tiles,
``tile_edge`` the same edge ids, only the edges of ``dense_ok`` windows), with ``s`` folded into the value
tile by column (``A^T[r, j] = a_e s_j``): one program per (source window, feature block), each source row
written by one program, no atomics. ``da`` is a sampled dense-dense product over the forward format's tiles:
one program per tile, ``(dY[rows] @ X[cols]^T)`` accumulated over feature blocks with ``tl.dot``, scaled by
``s`` by row and stored at the cells' edge ids; each edge id sits in one cell of a ``dense_ok`` window, so plain
masked stores, and the edges of other windows keep a 0 gradient (the CSR backward's).

**Precision.** fp32 inputs: IEEE dots unless ``allow_tf32`` (then TF32). fp16/bf16 inputs: the value tile, ``x``
and ``dY`` in that dtype for the dots (values are cast to it), float32 accumulation, ``Y`` and ``dX`` in the
input dtype; ``da`` in ``edge_values``' dtype. Tested against a float64 reference (``gnn_io::spmm`` on CPU) at
rtol 1e-5 for fp32 IEEE, 2e-3 for TF32 and 1.6e-2 for bf16, atol the same times ``max(1, max |ref|)``
(``tests/kernels/spmm/test_block_sparse_spmm.py``).

**Non-finite features** spread further than in the CSR kernel: ``0 * inf`` and ``0 * nan`` are NaN in a dot,
so a non-finite ``x_j`` reaches every row of each window whose tiles hold column ``j``, its true neighbours
included (a NaN is never dropped, but rows without an edge from ``j`` may turn NaN too).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from gnn_inductor.kernels.runtime.launch import cdiv, dot_precision, fast_launch, next_power_of_2
from gnn_inductor.plan.block_format import TILE, WINDOW, BlockFormat, covers_every_row
from torch import Tensor

MAX_BLOCK_F = 128  # feature columns per program: a WINDOW x 128 float32 accumulator, 16 registers per thread
# Launch parameters of the product kernel (forward and dX); benchmarks/probe.py times alternatives.
LAUNCH = {"block_f": None, "num_warps": 4, "num_stages": 3}


def _feature_block(num_features: int) -> int:
    """Feature columns per program: the power of two covering ``num_features``, within ``[16, MAX_BLOCK_F]``
    (16 is ``tl.dot``'s smallest N and K)."""
    return min(MAX_BLOCK_F, max(16, next_power_of_2(num_features)))


def values_by_edge_id(csr_values: Tensor, perm: Tensor) -> Tensor:
    """``gnn_io::spmm``'s CSR-order values in original edge-id order, the order ``tile_edge`` indexes:
    ``out[perm[k]] = csr_values[k]`` (``perm`` the CSR plan's, ``gnn_inductor/plan/csr.py``); differentiable."""
    return torch.empty_like(csr_values).index_copy(0, perm.long(), csr_values)


def dense_rows(blocks: BlockFormat, num_rows: int) -> Tensor:
    """``[num_rows]`` bool: the rows of ``blocks``' ``dense_ok`` windows, those the block kernels compute."""
    rows = blocks.window_rows.long()
    # the padding slots (-1) land on an extra entry that is cut off
    slots = torch.where(rows >= 0, rows, num_rows).flatten()
    mask = torch.zeros(num_rows + 1, dtype=torch.bool, device=rows.device)
    mask[slots] = blocks.dense_ok[:, None].expand(-1, WINDOW).flatten()
    return mask[:num_rows]


@fast_launch
@triton.jit
def _block_spmm_kernel(
        windows_ptr, window_rows_ptr, tile_ptr_ptr, tile_col_ptr, tile_edge_ptr, values_ptr,
        x_ptr, xr, xc, scale_ptr, out_ptr, num_features,
        ROW_SCALE: tl.constexpr, COLUMN_SCALE: tl.constexpr, PRECISION: tl.constexpr,
        WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_F: tl.constexpr):
    """``out[rows] = (A o S) @ X`` for one (window, feature block): ``A`` the window's value tiles, ``S`` the scale
    by row (``ROW_SCALE``, the forward's ``s``) or by tile column (``COLUMN_SCALE``, the backward's ``s`` of the
    destination columns of the transposed format)."""
    window = tl.load(windows_ptr + tl.program_id(0)).to(tl.int64)
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    feats = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = feats < num_features
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0

    acc = tl.zeros([WINDOW, BLOCK_F], dtype=tl.float32)
    first = tl.load(tile_ptr_ptr + window)
    last = tl.load(tile_ptr_ptr + window + 1)
    for tile in range(first, last):
        cols = tl.load(tile_col_ptr + tile * TILE + lanes).to(tl.int64)
        cmask = cols >= 0
        x = tl.load(x_ptr + cols[:, None] * xr + feats[None, :] * xc, mask=cmask[:, None] & fmask[None, :], other=0)
        eid = tl.load(tile_edge_ptr + (tile * WINDOW + slots[:, None]) * TILE + lanes[None, :]).to(tl.int64)
        a = tl.load(values_ptr + eid, mask=eid >= 0, other=0).to(tl.float32)
        if COLUMN_SCALE:
            a = a * tl.load(scale_ptr + cols, mask=cmask, other=0).to(tl.float32)[None, :]
        acc += tl.dot(a.to(x.dtype), x, input_precision=PRECISION)
    if ROW_SCALE:
        acc = acc * tl.load(scale_ptr + rows, mask=rmask, other=0).to(tl.float32)[:, None]
    tl.store(out_ptr + rows[:, None] * num_features + feats[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rmask[:, None] & fmask[None, :])


@fast_launch
@triton.jit
def _values_grad_kernel(
        tile_window_ptr, dense_ok_ptr, window_rows_ptr, tile_col_ptr, tile_edge_ptr,
        grad_y_ptr, x_ptr, xr, xc, scale_ptr, grad_values_ptr, num_features,
        ROW_SCALE: tl.constexpr, PRECISION: tl.constexpr,
        WINDOW: tl.constexpr, TILE: tl.constexpr, BLOCK_F: tl.constexpr):
    """``da[tile_edge] = s_r <dY_r, X_j>`` over one tile's cells; tiles of windows that are not ``dense_ok`` do
    nothing (their feature loop is empty and their stores masked)."""
    tile = tl.program_id(0).to(tl.int64)
    window = tl.load(tile_window_ptr + tile).to(tl.int64)
    dense = tl.load(dense_ok_ptr + window) != 0
    slots = tl.arange(0, WINDOW)
    lanes = tl.arange(0, TILE)
    rows = tl.load(window_rows_ptr + window * WINDOW + slots).to(tl.int64)
    rmask = rows >= 0
    cols = tl.load(tile_col_ptr + tile * TILE + lanes).to(tl.int64)
    cmask = cols >= 0

    acc = tl.zeros([WINDOW, TILE], dtype=tl.float32)
    for start in range(0, tl.where(dense, num_features, 0), BLOCK_F):
        feats = start + tl.arange(0, BLOCK_F)
        fmask = feats < num_features
        x = tl.load(x_ptr + cols[:, None] * xr + feats[None, :] * xc, mask=cmask[:, None] & fmask[None, :], other=0)
        grad_y = tl.load(grad_y_ptr + rows[:, None] * num_features + feats[None, :],
                         mask=rmask[:, None] & fmask[None, :], other=0)
        acc += tl.dot(grad_y, tl.trans(x), input_precision=PRECISION)
    if ROW_SCALE:
        acc = acc * tl.load(scale_ptr + rows, mask=rmask, other=0).to(tl.float32)[:, None]
    eid = tl.load(tile_edge_ptr + (tile * WINDOW + slots[:, None]) * TILE + lanes[None, :]).to(tl.int64)
    tl.store(grad_values_ptr + eid, acc.to(grad_values_ptr.dtype.element_ty), mask=(eid >= 0) & dense)


def _rows(t: Tensor) -> Tensor:
    """``t [n, *F]`` as ``[n, prod(F)]``."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def _check(x: Tensor, edge_values: Tensor, row_scale: Tensor | None, num_rows: int) -> None:
    if not x.is_floating_point() or x.dim() < 1:
        raise TypeError(f"block_spmm needs floating point features [num_src, *F], got {x.dtype} {tuple(x.shape)}")
    if edge_values.dim() != 1:
        raise ValueError(f"edge_values must be one value per edge id, [E], got shape {tuple(edge_values.shape)}")
    if row_scale is not None and row_scale.shape != (num_rows,):
        raise ValueError(f"row_scale must have shape [{num_rows}] (one per destination row), "
                         f"got {tuple(row_scale.shape)}")


def _launch_product(blocks: BlockFormat, values: Tensor, x: Tensor, scale: Tensor | None, column_scale: bool,
                    out: Tensor, allow_tf32: bool) -> None:
    """``out[rows of the dense windows] = A @ x`` (scaled), ``x`` and ``out`` two-dimensional."""
    num_features = x.shape[1]
    if not blocks.dense_windows.shape[0] or not num_features:
        return
    block_f = min(LAUNCH["block_f"] or MAX_BLOCK_F, _feature_block(num_features))
    _block_spmm_kernel[(blocks.dense_windows.shape[0], cdiv(num_features, block_f))](
        blocks.dense_windows, blocks.window_rows, blocks.tile_ptr, blocks.tile_col, blocks.tile_edge, values,
        x, *x.stride(), values if scale is None else scale, out, num_features,
        ROW_SCALE=scale is not None and not column_scale, COLUMN_SCALE=scale is not None and column_scale,
        PRECISION=dot_precision(allow_tf32, x.dtype), WINDOW=WINDOW, TILE=TILE, BLOCK_F=block_f,
        num_warps=LAUNCH["num_warps"], num_stages=LAUNCH["num_stages"])


def _fresh_rows(blocks: BlockFormat, num_rows: int, num_features: int, like: Tensor) -> Tensor:
    """The output the kernel stores into: uninitialised where ``blocks`` covers every one of ``num_rows`` rows
    (:func:`block_format.covers_every_row`; the kernel then stores every row, 0 for a row without edges, and the
    SpMM path takes the block kernel only so), zeros otherwise (the rows of the other windows stay 0). On the
    H200 (GCNConv in TF32 on the 20,000 batched graphs) the zero fill took 0.11 of the forward's 0.76 ms."""
    new = torch.empty if covers_every_row(blocks, num_rows) else torch.zeros
    return new((num_rows, num_features), dtype=like.dtype, device=like.device)


def block_spmm_forward(x: Tensor, edge_values: Tensor, blocks: BlockFormat, num_dst: int, allow_tf32: bool,
                       row_scale: Tensor | None = None) -> Tensor:
    """``Y [num_dst, *F] = s * (A @ x)`` (module docstring) for the rows of ``blocks``' ``dense_ok`` windows,
    0 elsewhere; ``edge_values [E]`` in the order of ``blocks.tile_edge``'s ids (:func:`values_by_edge_id`),
    ``row_scale [num_dst]`` or None; ``Y`` in ``x``'s dtype."""
    _check(x, edge_values, row_scale, num_dst)
    flat = _rows(x)
    out = _fresh_rows(blocks, num_dst, flat.shape[1], x)
    _launch_product(blocks, edge_values, flat, row_scale, False, out, allow_tf32)
    return out.view(num_dst, *x.shape[1:])


def block_spmm_backward(grad_y: Tensor, x: Tensor, edge_values: Tensor, blocks: BlockFormat,
                        transposed: BlockFormat, num_src: int, allow_tf32: bool, row_scale: Tensor | None = None,
                        need_values_grad: bool = False, need_x_grad: bool = True) -> tuple:
    """``(dX [num_src, *F] or None, da [E] or None)`` of :func:`block_spmm_forward` through the edges of
    ``blocks``' ``dense_ok`` windows (the rest is the CSR backward's): ``dX = A^T (s * dY)`` over
    ``transposed = transpose_block_format(blocks, num_src)``, ``da_e = s_i <dY_i, X_j>`` per edge id (0 for
    edges of other windows). ``dX`` in ``x``'s dtype, ``da`` in ``edge_values``'.
    """
    _check(x, edge_values, row_scale, grad_y.shape[0])
    flat_x = _rows(x)
    num_features = flat_x.shape[1]
    # the dots take dY in the inputs' dtype
    flat_grad = _rows(grad_y).to(x.dtype).contiguous()
    grad_x = grad_values = None
    if need_x_grad:
        grad_x = _fresh_rows(transposed, num_src, num_features, x)
        _launch_product(transposed, edge_values, flat_grad, row_scale, True, grad_x, allow_tf32)
        grad_x = grad_x.view(num_src, *x.shape[1:])
    if need_values_grad:
        grad_values = torch.zeros_like(edge_values)
        num_tiles = blocks.tile_edge.shape[0]
        if num_tiles and num_features:
            _values_grad_kernel[(num_tiles,)](
                blocks.tile_window, blocks.dense_ok, blocks.window_rows, blocks.tile_col, blocks.tile_edge,
                flat_grad, flat_x, *flat_x.stride(), edge_values if row_scale is None else row_scale, grad_values,
                num_features, ROW_SCALE=row_scale is not None, PRECISION=dot_precision(allow_tf32, x.dtype),
                WINDOW=WINDOW, TILE=TILE, BLOCK_F=_feature_block(num_features))
    return grad_x, grad_values


class BlockSparseSpmm(torch.autograd.Function):
    """``Y = apply(x, edge_values, blocks, transposed, num_dst, allow_tf32, row_scale)``:
    :func:`block_spmm_forward` with :func:`block_spmm_backward` as its backward (gradients of ``x`` and
    ``edge_values`` as needed; ``row_scale`` is structure, not differentiated). Only the rows of ``blocks``'
    ``dense_ok`` windows are computed, forward and backward."""

    @staticmethod
    def forward(ctx, x, edge_values, blocks, transposed, num_dst, allow_tf32, row_scale):
        ctx.save_for_backward(x, edge_values, row_scale)
        ctx.meta = (blocks, transposed, allow_tf32)
        return block_spmm_forward(x, edge_values, blocks, num_dst, allow_tf32, row_scale)

    @staticmethod
    def backward(ctx, grad_y):
        x, edge_values, row_scale = ctx.saved_tensors
        blocks, transposed, allow_tf32 = ctx.meta
        grad_x, grad_values = block_spmm_backward(
            grad_y, x, edge_values, blocks, transposed, x.shape[0], allow_tf32, row_scale,
            need_values_grad=ctx.needs_input_grad[1], need_x_grad=ctx.needs_input_grad[0])
        return grad_x, grad_values, None, None, None, None, None
