"""Filling the output rows a reduction kernel does not store: rows without entries (and hub rows, whose items
add atomically), listed once per graph by the plan (``gnn_inductor.plan.work_items.listed_fill_rows``)."""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2


@fast_launch
@triton.jit
def _zero_empty_rows_kernel(out_ptr, rowptr_ptr, listed_ptr, fill_ptr, num_rows, row_width, row_stride, above,
                            FILL: tl.constexpr, LISTED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """Without ``LISTED``: scan ``rowptr`` for the rows to write. With it: write the ``num_rows`` rows listed at
    ``listed_ptr`` (:func:`rows_to_fill`), no scan."""
    at = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside = at < num_rows
    if LISTED:
        rows = tl.load(listed_ptr + at, mask=inside, other=0)
        empty = inside
    else:
        rows = at
        degree = tl.load(rowptr_ptr + rows + 1, mask=inside, other=0) - tl.load(rowptr_ptr + rows, mask=inside,
                                                                                 other=0)
        empty = inside & ((degree == 0) | ((above > 0) & (degree > above)))
    for start in range(0, row_width, BLOCK_W):
        cols = start + tl.arange(0, BLOCK_W)
        value = tl.zeros([BLOCK_R, BLOCK_W], tl.float32)
        if FILL:
            value += tl.load(fill_ptr + cols, mask=cols < row_width, other=0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * row_stride + cols[None, :], value,
                 mask=empty[:, None] & (cols < row_width)[None, :])


def zero_rows_without_entries(out: Tensor, rowptr: Tensor, above: int = 0, fill: Tensor | None = None,
                              rows: Tensor | None = None) -> None:
    """Write 0 into the rows of the contiguous ``out`` (``[num_rows, ...]``) whose CSR row has no entries (and,
    with ``above > 0``, those with more than ``above`` entries: hub rows whose items add atomically), and nothing
    else: kernels that store every row with an item (and a prefill or a combine for the hub rows) then need no
    memset of the whole output first (512 MiB at 2^20 x 128 float32). With ``fill`` (contiguous, one row's
    elements) those rows get ``fill`` instead of 0 (the attention forward's bias). ``out`` may also be a column
    slice of a wider row-major tensor (each row's elements contiguous, rows ``out.stride(0)`` apart).

    ``rows``: those rows, listed once per graph (:func:`rows_to_fill` of the same ``rowptr`` and ``above``, e.g.
    :func:`listed_fill_rows`): the launch covers them alone, and none runs where there are none (a graph with
    self loops and no hub: GATConv's forward on RMAT 2^20 launched three scans of 2^20 rows, about 26 us each on
    the H100, that wrote nothing). Without it every row is scanned."""
    num_rows = rowptr.numel() - 1
    width = out[0].numel() if num_rows else 0
    if num_rows and not out[0].is_contiguous():
        raise ValueError("zero_rows_without_entries: each row's elements must be contiguous")
    if fill is not None and fill.numel() != width:
        raise ValueError(f"fill of {fill.numel()} elements for rows of {width}")
    count = num_rows if rows is None else rows.numel()
    if count and width:
        _zero_empty_rows_kernel[(cdiv(count, 64),)](out, rowptr, rowptr if rows is None else rows,
                                                    out if fill is None else fill, count, width, out.stride(0), above,
                                                    FILL=fill is not None, LISTED=rows is not None, BLOCK_R=64,
                                                    BLOCK_W=min(128, next_power_of_2(width)))
