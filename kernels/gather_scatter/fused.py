r"""Fused degree-split Triton kernels for ``gnn_io::gather_scatter``: the forward drivers and the split.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} \phi(a^{(1)}_e, \dots, a^{(k)}_e),
    \qquad \oplus \in \{\sum, \mathrm{mean}, \max, \min\}

the same result as ``gather_scatter_reference`` (``op.py``, the CPU path and the ground truth of the tests).
``phi`` is generated into the kernels by ``codegen.py``, the kernels' source filled in from the templates of
``template.py``; the messages live in registers only, no edge-sized message tensor is ever written.

Shapes: as the op (``kernels/runtime/roles.py`` roles); the message features ``M`` are flattened into one
feature dim ``F``. dtypes: float32, float16, bfloat16 arguments (and bool masks), read as float32;
all math and accumulation is float32, the output is cast once at the end. Empty rows are 0.

**Forward (CSR walk, by destination).** The plan's work items (``gnn_inductor.plan.work_items``) cut the
rows into items of at most ``max_edges`` entries. One program handles one item and one ``BLOCK_F``
slice of the features: it walks the item's entries ``BLOCK_E`` at a time, loads each argument
through its role (``col`` row for SRC, the item's row once for DST, ``perm`` row for EDGE, once for
DENSE), computes the message tile and folds it into a ``[BLOCK_E, BLOCK_F]`` float32 accumulator
(sum, max or min), reduced over the edges once after the loop. A light row (one item) stores its
result; the items of a hub row combine with ``atomic_add`` (sum, mean: scaled by the whole row's
degree first) or ``atomic_max``/``atomic_min`` on float32 (the rows of shared items are first set
to 0 or -inf/+inf by a small prefill kernel). The output is not memset: a row kernel writes the 0 of the
rows without edges (they have no item), the prefill the hub rows, the light rows' items the rest. Hub sums
are so order-nondeterministic in the last bits; max/min are exact.

**Several members, one walk** (:func:`forward_multi`, ``gnn_io::gather_scatter_multi``). The forward
kernel takes a list of members, each an edge function and a reduce over the same arguments: per edge
block it loads the arguments once, computes each distinct edge function once and folds it into one
accumulator per member; the epilogue above runs per member (its own result and output). The single
op's forward is the one-member case. The members' functions must give the same message shape and
argument layouts (:func:`launches.lowered_members`).

Launch: ``launches.py`` (its docstring): the hub items and the light items apart where that pays.
``max_edges`` (the split threshold) is chosen per graph by :func:`split_threshold` when the plan is built
(``gnn_io::gather_scatter_items``): measured per device and degree profile on CUDA (``split_tuning.py``, which
times :func:`probe_ms`), from the mean degree elsewhere.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import torch
from torch import Tensor

from gnn_inductor.kernels.gather_scatter import launches, split_tuning
from gnn_inductor.kernels.gather_scatter.split_tuning import MIN_MAX_EDGES
from gnn_inductor.kernels.gather_scatter.template import KernelSpec
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from gnn_inductor.kernels.runtime.launch import cdiv
from gnn_inductor.kernels.runtime.op_layout import contiguous_results
from gnn_inductor.kernels.runtime.roles import ROLE_SRC
from gnn_inductor.plan.work_items import (
    PADDING, hub_item_count, listed_fill_rows, padded_item_count, remember_hubs, work_items,
)

FILL = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf")}  # a hub row before its items' atomics


# ---------------------------------------------------------------------------------------------
# The split
# ---------------------------------------------------------------------------------------------

def split_threshold(rowptr: Tensor, col: Tensor | None = None) -> int:
    """``max_edges`` of the work items: measured per device and degree profile on CUDA, 8 times the mean
    degree (a power of two in [``MIN_MAX_EDGES``, ``MAX_MAX_EDGES``]) elsewhere; ``GNN_IO_GS_MAX_EDGES``
    overrides it (clamped from below). See ``split_tuning.py``."""
    return split_choice(rowptr, col)["max_edges"]


def split_choice(rowptr: Tensor, col: Tensor | None = None) -> dict:
    """The threshold with how it was chosen (:func:`split_tuning.choose`, measuring with :func:`probe_ms`); without
    ``col`` (no probe possible) the measurement of an earlier call or the rule."""
    if col is None:
        col = torch.zeros(0, dtype=torch.int32, device=rowptr.device)
    return split_tuning.choose(rowptr, col, probe_ms)


def split_summary(rowptr: Tensor, col: Tensor | None = None) -> dict:
    """The degree split the kernels use on this CSR, for the rewrite report: ``max_edges`` (a row longer
    than that is a hub, cut into items whose partial results meet through atomics), how it was chosen
    (``source``, with the probe's times per candidate when measured), the hub rows, their share of the
    edges, and the work items."""
    choice = split_choice(rowptr, col)
    max_edges = choice["max_edges"]
    degree = (rowptr[1:] - rowptr[:-1]).long()
    hubs = degree > max_edges
    edges = max(1, int(rowptr[-1]))
    summary = {"max_edges": max_edges, "source": choice["source"], "hub_rows": int(hubs.sum()),
               "hub_edge_share": round(float(degree[hubs].sum()) / edges, 4),
               "work_items": int(work_items(rowptr, max_edges).row.numel())}
    if "probe_ms" in choice:
        summary["probe_ms"] = choice["probe_ms"]
    return summary


@functools.cache
def _identity_key() -> str:
    return edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))


def probe_ms(rowptr: Tensor, col: Tensor, max_edges: int, x: Tensor) -> float:
    """The split probe (:func:`split_tuning.choose`): median time of the identity-message sum forward on the work
    items of ``max_edges`` (``split_tuning.PROBE_REPS`` runs after a warm-up, CUDA events)."""
    w = work_items(rowptr, max_edges)
    items = (w.row, w.start, w.end, w.shared)
    plan = Plan(rowptr, col, col, col, rowptr, col, col, items, items)  # the forward walk reads rowptr/col/items
    key = _identity_key()

    def run():
        forward([x], [ROLE_SRC], plan, key, "sum")

    run()
    times = []
    for _ in range(split_tuning.PROBE_REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.library.custom_op("gnn_io::gather_scatter_items", mutates_args=())
@contiguous_results
def gather_scatter_items(rowptr: Tensor, col: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Work items of ``rowptr`` split at :func:`split_threshold`, padded to a bound that depends on
    sizes only (skipped items, ``shared == PADDING``), so compiled graphs see no data-dependent size.

    The items of hub rows come first (a row's items stay adjacent, the light rows stay in row order after them),
    and their number is remembered for this ``shared`` tensor (:func:`hub_item_count`): a kernel that works on
    hub rows alone (the max/min tie count) is launched over them, not over every item. At 2^20 rows a launch of
    one program per item costs about 0.9 ms on an H100 even when every program ends at once."""
    max_edges = split_threshold(rowptr, col)
    items = work_items(rowptr, max_edges)
    is_hub = items.shared == 1
    order = torch.sort(~is_hub, stable=True).indices
    count = padded_item_count(rowptr.numel() - 1, col.numel(), MIN_MAX_EDGES)
    pad = count - items.row.numel()
    zeros = items.row.new_zeros((pad,))
    shared = torch.cat([items.shared[order], torch.full((pad,), PADDING, dtype=torch.int8, device=rowptr.device)])
    remember_hubs(shared, max_edges, rowptr)
    return (torch.cat([items.row[order], zeros]), torch.cat([items.start[order], zeros]),
            torch.cat([items.end[order], zeros]), shared)


@gather_scatter_items.register_fake
def _(rowptr, col):
    count = padded_item_count(rowptr.shape[0] - 1, col.shape[0], MIN_MAX_EDGES)
    return (rowptr.new_empty((count,), dtype=torch.int32), rowptr.new_empty((count,), dtype=torch.int32),
            rowptr.new_empty((count,), dtype=torch.int32), rowptr.new_empty((count,), dtype=torch.int8))


# ---------------------------------------------------------------------------------------------
# The forward
# ---------------------------------------------------------------------------------------------

@dataclass
class Plan:
    """The plan tensors the kernels walk (see ``gnn_inductor/plan/csr.py``) and the two sets of work items."""
    rowptr: Tensor
    col: Tensor
    row: Tensor
    perm: Tensor
    t_rowptr: Tensor
    t_col: Tensor
    t_perm: Tensor
    items: tuple
    t_items: tuple


def make_plan(rowptr, col, row, perm, num_src: int, t_rowptr=None, t_col=None, t_perm=None, items=None,
              t_items=None) -> Plan:
    """A :class:`Plan`, computing what the caller did not pass (the transposed CSR, the items)."""
    if t_rowptr is None:
        t_perm = torch.sort(col.long(), stable=True).indices
        t_col = row.long().index_select(0, t_perm)
        t_rowptr = torch.zeros(num_src + 1, dtype=torch.long, device=col.device)
        torch.cumsum(torch.bincount(col.long(), minlength=num_src), 0, out=t_rowptr[1:])
    if not items:
        items = gather_scatter_items(rowptr, col)
    if not t_items:
        t_items = gather_scatter_items(t_rowptr, t_col)
    return Plan(rowptr, col, row, perm, t_rowptr, t_col, t_perm, tuple(items), tuple(t_items))


def forward(args, roles, plan: Plan, fn_key: str, reduce: str, launch=None) -> Tensor:
    """``out`` of the op as float32 ``[num_dst, F]`` (the caller casts and reshapes)."""
    return forward_multi(args, roles, plan, [fn_key], [reduce], launch)[0]


def forward_multi(args, roles, plan: Plan, fn_keys: list, reduces: list, launch=None) -> list:
    """One output per member ``(fn_keys[j], reduces[j])``, each as :func:`forward`'s, from one walk over the
    edges: every edge's arguments are loaded once, each distinct edge function is computed once per edge
    and each member folds it into its own accumulator."""
    explicit_launch = launch is not None
    launch = launch or launches.LAUNCH
    fns, fn_index = launches.lowered_members(list(fn_keys), launches.argument_specs(args, roles))
    num_features = math.prod(fns[0].message_shape)
    num_dst = plan.rowptr.numel() - 1
    device = plan.rowptr.device
    # light rows are stored by their item; only the others are written first: rows of hub items start at 0 (sum,
    # mean) or -inf/+inf (max, min) for their atomics (64 items per program), and with the plan's own items (every
    # row with edges has one: the item op remembered them, hub_item_count) the rows without edges are zeroed
    # instead of a memset of the whole output; items from elsewhere may leave rows out, so they get the memset
    complete = hub_item_count(plan.items) is not None
    allocate = torch.empty if complete else torch.zeros
    outs = [allocate((num_dst, num_features), dtype=torch.float32, device=device) for _ in reduces]
    num_items = plan.items[0].shape[0]
    for out, reduce in zip(outs, reduces):
        if not (num_dst and num_features):
            continue
        if complete:
            zero_rows_without_entries(out, plan.rowptr, rows=listed_fill_rows(plan.items))
        if num_items:
            launches.prefill_kernel()[(cdiv(num_items, 64),)](
                out, plan.items[0], plan.items[3], num_items, num_features, FILL[reduce], BLOCK_I=64,
                BLOCK_F=launches.block_f(num_features, launch))
    spec = KernelSpec("forward", "dst", "+".join(reduces), members=tuple(zip(reduces, fn_index)))
    kernel = launches.kernel(fns, spec)
    tensors = [*launches.prepare(args, roles), *outs, plan.rowptr, plan.col, plan.col, plan.perm]
    light = not explicit_launch and launches.light_launch("forward", num_items)
    rows = None
    if light and launches.light_rows(num_items):
        rows = launches.kernel(fns, KernelSpec("rows", "dst", spec.reduce, members=spec.members))
    launches.launch_items(kernel, plan.items, tensors, num_features, launch, light, rows)
    return outs
