"""Work items: the degree split of a CSR matrix, made once per graph with its plan.

:func:`work_items` cuts the CSR rows into items ``(row, start, end)`` of at most ``max_edges`` entries: a light row
is one item, a hub of degree ``d`` is ``ceil(d / max_edges)`` items (accumulated atomically, ``shared == 1``), a
row without entries is none. The reduction kernels (SpMM, gather-scatter, attention) run one program per item.
``gnn_io::work_items`` makes them inside a plan's structure function, padded to a size-only bound
(:func:`padded_item_count`), and records in the graph's state (:mod:`gnn_inductor.plan.state`) how many hub items
there are and which rows a kernel must fill, so that launches over hub items alone cover their real number.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gnn_inductor.kernels.runtime.cuda_graphs import kept_outside_graph_pool
from gnn_inductor.kernels.runtime.op_layout import contiguous_results
from gnn_inductor.plan import state as graph_state

DEFAULT_MAX_EDGES = 256


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


PADDING = 2  # ``shared`` flag of a padding item: the kernel skips it


def padded_item_count(num_rows, num_entries, max_edges: int):
    """An upper bound on the number of work items that depends on sizes only (each row adds at most
    one item beyond ``deg / max_edges``), so compiled graphs see no data-dependent size."""
    return num_rows + (num_entries + max_edges - 1) // max_edges


def fill_mask(rowptr: Tensor, above: int) -> Tensor:
    degree = rowptr[1:] - rowptr[:-1]
    return (degree == 0) | (degree > above) if above > 0 else degree == 0


def rows_to_fill(rowptr: Tensor, above: int = 0, count: int | None = None) -> Tensor:
    """int32 indices of the CSR rows :func:`zero_rows_without_entries` writes: those without entries and, with
    ``above > 0``, those of more than ``above`` entries. Data-dependent size (one device sync on CUDA, none when
    their ``count`` is given): built once per graph, where the plan's structure is built."""
    wanted = fill_mask(rowptr, above)
    found = torch.nonzero(wanted) if count is None else torch.nonzero_static(wanted, size=count)
    return found.flatten().int()


def remember_hubs(shared: Tensor, max_edges: int, rowptr: Tensor | None = None) -> None:
    """Record in the state of the items whose ``shared`` flags are ``shared`` how many hub items (``shared == 1``)
    the item op returned, and its split (:func:`hub_item_count`). The item ops sync anyway (``work_items``); a
    launch of one program per item costs about 0.9 ms on an H100 at 2^20 rows even when every program ends at
    once, so kernels about hub items alone are launched over their real number where it is known. With the
    ``rowptr`` the items were made of, the rows a kernel fills (``zero_rows_without_entries``) are listed too, for
    ``above`` 0 and the split (:func:`listed_fill_rows`)."""
    derived = {}
    if rowptr is None:
        hubs = int((shared == 1).sum())
    else:  # one sync for the three counts; the lists then have known sizes
        counts = [(shared == 1).sum(), fill_mask(rowptr, 0).sum(), fill_mask(rowptr, max_edges).sum()]
        hubs, num_empty, num_filled = torch.stack(counts).tolist()
        derived[("fill_rows", 0)] = rows_to_fill(rowptr, 0, num_empty)
        derived[("fill_rows", max_edges)] = rows_to_fill(rowptr, max_edges, num_filled)
    state = graph_state.state_of(shared)
    state.slots["hubs"] = (hubs, max_edges)
    state.slots["items_derived"] = derived


def _known(items):
    """The state recorded for ``items`` by :func:`remember_hubs`, None when there is none."""
    state = graph_state.known_state(items[3])
    return state if state is not None and "hubs" in state.slots else None


def listed_fill_rows(items, above: int = 0) -> Tensor | None:
    """The rows of the CSR ``items`` were made of that ``zero_rows_without_entries`` writes with ``above``
    (``rows``), listed when the item op made them; None when not known."""
    state = _known(items)
    return None if state is None else state.slots["items_derived"].get(("fill_rows", above))


def hub_items(items) -> tuple | None:
    """``(hub item count, split threshold)`` of ``items`` (from ``gnn_io::gather_scatter_items`` or
    ``gnn_io::work_items``; every hub item but a row's last is the threshold wide), None when unknown (items made
    elsewhere, or a copy of them): a launch for hub items then covers every item."""
    state = _known(items)
    return None if state is None else state.slots["hubs"]


def items_memo(items, what, build):
    """``build()`` kept with a plan's ``items`` (those :func:`remember_hubs` knows) under the hashable ``what``:
    structure derived from the items alone (the attention forward's hub slots), computed at the first call, not
    at every one, and gone with the items. Items made elsewhere get ``build()`` each time. What ``build``
    allocates stays out of a CUDA-graph pool, and nothing is kept while one is captured
    (:func:`kept_outside_graph_pool`)."""
    state = _known(items)
    if state is None:
        return build()
    return kept_outside_graph_pool(state.slots["items_derived"], what, build, items[3].device)


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
