r"""Triton SpMM with a degree split: ``Y = S A X`` for the CSR adjacency of a graph plan.

.. math::
    Y_i = s_i \sum_{k = \text{rowptr}_i}^{\text{rowptr}_{i+1} - 1} \text{values}_k \, X_{\text{col}_k},
    \qquad s_i = 1 \ (\text{reduce='sum'}) \ \text{or} \ 1/\max(1, \deg_i) \ (\text{reduce='mean'})

the same result as :func:`gnn_inductor.kernels.spmm.csr_matmul` followed by the row scale of
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

import weakref
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from gnn_inductor.kernels.op_layout import contiguous_results
from torch.library import triton_op, wrap_triton

from gnn_inductor.kernels._common import kept_outside_graph_pool
from gnn_inductor.kernels.launch import cdiv, fast_launch, next_power_of_2
from gnn_inductor.kernels.spmm import SPMM_REDUCTIONS

DEFAULT_MAX_EDGES = 256
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


class WorkItems(NamedTuple):
    """Work items of a CSR matrix, in row order (the items of one row adjacent, by position)."""
    row: Tensor     # [num_items] int32, the CSR row the item belongs to
    start: Tensor   # [num_items] int32, first CSR entry of the item
    end: Tensor     # [num_items] int32, one past its last CSR entry
    shared: Tensor  # [num_items] int8, 1 where the row has more than one item (accumulated atomically)


def work_items(rowptr: Tensor, max_edges: int = DEFAULT_MAX_EDGES) -> WorkItems:
    """Split the rows of a CSR matrix into work items of at most ``max_edges`` entries (see the
    module docstring); the items come in row order, so the items of one row are adjacent and a row's
    entries are covered in CSR order. Rows with no entries get no item. Row order rather than heavy
    items first: no item exceeds ``max_edges``, so the tail of the launch is bounded either way, and
    neighbouring programs then write neighbouring output rows.

    Vectorised torch ops on ``rowptr``'s device; the number of items is data-dependent (one device
    sync on CUDA), so this runs once per graph, with the plan.
    """
    if max_edges < 1:
        raise ValueError(f"max_edges must be at least 1, got {max_edges}")
    if rowptr.dim() != 1 or rowptr.numel() < 1:
        raise ValueError(f"rowptr must be one-dimensional with num_rows + 1 entries, got shape {tuple(rowptr.shape)}")
    rowptr = rowptr.long()
    degree = rowptr[1:] - rowptr[:-1]
    items_per_row = (degree + (max_edges - 1)) // max_edges
    num_entries, num_items = torch.stack([rowptr[-1], items_per_row.sum()]).tolist()  # the one sync
    if num_entries >= 2**31:
        raise ValueError(f"work items index CSR entries with int32; got {num_entries} entries (at most 2^31 - 1)")
    rows = torch.arange(degree.numel(), device=rowptr.device)
    row = torch.repeat_interleave(rows, items_per_row, output_size=num_items)
    first_item = torch.cumsum(items_per_row, 0) - items_per_row
    rank = torch.arange(row.numel(), device=rowptr.device) - first_item[row]
    start = rowptr[row] + rank * max_edges
    end = torch.minimum(start + max_edges, rowptr[row + 1])
    shared = items_per_row[row] > 1
    return WorkItems(row.int(), start.int(), end.int(), shared.to(torch.int8))


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


PADDING = 2  # ``shared`` flag of a padding item: the kernel skips it


def padded_item_count(num_rows, num_entries, max_edges: int):
    """An upper bound on the number of work items that depends on sizes only (each row adds at most
    one item beyond ``deg / max_edges``), so compiled graphs see no data-dependent size."""
    return num_rows + (num_entries + max_edges - 1) // max_edges


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


def _fill_mask(rowptr: Tensor, above: int) -> Tensor:
    degree = rowptr[1:] - rowptr[:-1]
    return (degree == 0) | (degree > above) if above > 0 else degree == 0


def rows_to_fill(rowptr: Tensor, above: int = 0, count: int | None = None) -> Tensor:
    """int32 indices of the CSR rows :func:`zero_rows_without_entries` writes: those without entries and, with
    ``above > 0``, those of more than ``above`` entries. Data-dependent size (one device sync on CUDA, none when
    their ``count`` is given): built once per graph, where the plan's structure is built."""
    wanted = _fill_mask(rowptr, above)
    found = torch.nonzero(wanted) if count is None else torch.nonzero_static(wanted, size=count)
    return found.flatten().int()


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


# id of a plan's items' ``shared`` tensor -> (weak reference to it, its hub item count, the split threshold, a dict
# of structure derived from those items, items_memo)
_HUB_ITEMS: dict = {}


def remember_hubs(shared: Tensor, max_edges: int, rowptr: Tensor | None = None) -> None:
    """Remember how many hub items (``shared == 1``) the item op that made ``shared`` returned, and its split, for
    this tensor only (:func:`hub_item_count`). The item ops sync anyway (``work_items``); a launch of one
    program per item costs about 0.9 ms on an H100 at 2^20 rows even when every program ends at once, so
    kernels about hub items alone are launched over their real number where it is known. With the ``rowptr`` the
    items were made of, the rows :func:`zero_rows_without_entries` writes are listed too, for ``above`` 0 and the
    split (:func:`listed_fill_rows`)."""
    key = id(shared)  # the entry goes with the tensor
    memo = {}
    if rowptr is None:
        hubs = int((shared == 1).sum())
    else:  # one sync for the three counts; the lists then have known sizes
        counts = [(shared == 1).sum(), _fill_mask(rowptr, 0).sum(), _fill_mask(rowptr, max_edges).sum()]
        hubs, num_empty, num_filled = torch.stack(counts).tolist()
        memo[("fill_rows", 0)] = rows_to_fill(rowptr, 0, num_empty)
        memo[("fill_rows", max_edges)] = rows_to_fill(rowptr, max_edges, num_filled)
    _HUB_ITEMS[key] = (weakref.ref(shared, lambda _: _HUB_ITEMS.pop(key, None)), hubs, max_edges, memo)


def listed_fill_rows(items, above: int = 0) -> Tensor | None:
    """The rows of the CSR ``items`` were made of that :func:`zero_rows_without_entries` writes with ``above``
    (``rows``), listed when the item op made them; None when not known."""
    entry = _entry(items)
    return None if entry is None else entry[3].get(("fill_rows", above))


def _entry(items) -> tuple | None:
    entry = _HUB_ITEMS.get(id(items[3]))
    return entry if entry is not None and entry[0]() is items[3] else None


def hub_items(items) -> tuple | None:
    """``(hub item count, split threshold)`` of ``items`` (from ``gnn_io::gather_scatter_items`` or
    ``gnn_io::work_items``; every hub item but a row's last is the threshold wide), None when unknown (items made
    elsewhere, or a copy of them): a launch for hub items then covers every item."""
    entry = _entry(items)
    return None if entry is None else entry[1:3]


def items_memo(items, what, build):
    """``build()`` kept with a plan's ``items`` (those :func:`remember_hubs` knows) under the hashable ``what``:
    structure derived from the items alone (the attention forward's hub slots), computed at the first call, not
    at every one, and gone with the items. Items made elsewhere get ``build()`` each time. What ``build``
    allocates stays out of a CUDA-graph pool, and nothing is kept while one is captured
    (:func:`kept_outside_graph_pool`)."""
    entry = _entry(items)
    if entry is None:
        return build()
    return kept_outside_graph_pool(entry[3], what, build, items[3].device)


def hub_item_count(items) -> int | None:
    """How many hub items ``items`` hold, None when unknown (:func:`hub_items`)."""
    known = hub_items(items)
    return None if known is None else known[0]


@torch.library.custom_op("gnn_io::work_items", mutates_args=())
@contiguous_results
def work_items_op(rowptr: Tensor, col: Tensor, max_edges: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`work_items` as an op for the graph plan, padded to :func:`padded_item_count` items
    with skipped items (``shared == PADDING``); their hub count is remembered (:func:`remember_hubs`)."""
    items = work_items(rowptr, max_edges)
    count = padded_item_count(rowptr.numel() - 1, col.numel(), max_edges)
    pad = count - items.row.numel()
    zeros = items.row.new_zeros((pad,))
    shared = torch.cat([items.shared, torch.full((pad,), PADDING, dtype=torch.int8, device=rowptr.device)])
    remember_hubs(shared, max_edges, rowptr)
    return (torch.cat([items.row, zeros]), torch.cat([items.start, zeros]), torch.cat([items.end, zeros]), shared)


@work_items_op.register_fake
def _(rowptr, col, max_edges):
    count = padded_item_count(rowptr.shape[0] - 1, col.shape[0], max_edges)
    return (rowptr.new_empty((count,), dtype=torch.int32), rowptr.new_empty((count,), dtype=torch.int32),
            rowptr.new_empty((count,), dtype=torch.int32), rowptr.new_empty((count,), dtype=torch.int8))
