r"""Fused degree-split Triton kernels for ``gnn_io::gather_scatter``.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} \phi(a^{(1)}_e, \dots, a^{(k)}_e),
    \qquad \oplus \in \{\sum, \mathrm{mean}, \max, \min\}

the same result as ``gather_scatter_reference`` (``kernels/gather_scatter.py``, the CPU path and the
ground truth of the tests). ``phi`` is generated into the kernels by ``kernels/codegen.py``; the
messages live in registers only, no edge-sized message tensor is ever written.

Shapes: as the op (``kernels/runtime/roles.py`` roles); the message features ``M`` are flattened into one
feature dim ``F``. dtypes: float32, float16, bfloat16 arguments (and bool masks), read as float32;
all math and accumulation is float32, the output is cast once at the end. Empty rows are 0.

**Forward (CSR walk, by destination).** The plan's work items (``spmm_triton.work_items``) cut the
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
accumulator per member; the epilogue above runs per member (its own result, arg and output). The single
op's forward is the one-member case. The members' functions must give the same message shape and
argument layouts (:func:`lowered_members`).

**The max/min arg** (opt-in, ``GNN_IO_MAXMIN_BACKWARD=arg``: measured slower than the walk on the
H100, :func:`maxmin_backward`). Asked for (``with_arg``: the op does when gradients are wanted and the
switch is set), the max/min forward also writes an int32 ``arg [num_dst, F]``:
the CSR position (index into ``col``) of the one edge whose message is the result of that (node,
feature), or -1 where no single edge is: ties (two or more messages equal to the result), a result
of 0 (the zero base ties with it, below), empty rows, NaN results and every row of a hub (its items
meet through atomics and none sees the whole row). Next to each accumulator lane's best message the
kernel keeps the position of the edge holding it (-2 once two edges hold it, -1 before the lane's
first edge), one int32 ``[BLOCK_E, BLOCK_F]`` tile more; after the loop, the lanes at the row's
result tell whether exactly one edge holds it.

**Backward.** The cotangent of a message is ``g_e = dY_i`` (sum), ``dY_i / deg_i`` (mean) or, for
max/min, ``[phi_e == out_i] dY_i / count_i`` with ``count_i`` the number of tied messages per
(node, feature): PyG's ``scatter_reduce`` semantics, ties share the gradient equally (and, as there,
the zero base of ``scatter_reduce(include_self=False)`` counts as one more tie where the result is
0). The gradient kernel of a light row counts the ties itself (a first walk over the row's edges,
recomputing the messages; the second walk finds them in cache); a *count* kernel does it for the
hub rows first, launched over the hub items alone (they lead the plan's items, :func:`hub_item_count`)
and adding into one row of counts per hub row (at the row's first item) rather than one per node. The
gradient kernels recompute the messages' inputs, evaluate the generated VJP of ``phi`` and reduce
each argument's contributions by its role. Sum/mean: SRC arguments through the transposed CSR (walk by source, accumulated in registers, no atomics except for hub items), DST
arguments through the CSR. Max/min: everything in the CSR walk, SRC rows by atomics masked to the
edges whose message reached the output (about one per output element, not one per edge and
feature). EDGE arguments are stored per edge; DENSE arguments summed per program into one of
``DENSE_SLOTS`` partial rows (spreading the atomics) and summed on the host. Arguments broadcast
over features (an edge weight ``[E, 1]``) sum over the features they are broadcast over too.

**Max/min backward with the arg** (opt-in with the arg above; the walk just described is the
default). A pair whose arg is an edge has ``count_i = 1`` and a nonzero result, so that edge takes the whole ``dY_i`` and no walk is needed to find it: the
*arg kernel* (``BLOCK_E`` rows x ``BLOCK_F`` features per program) loads each such pair's edge
inputs by the arg (one edge per element: the SRC row ``col[arg]``, the EDGE row ``perm[arg]``, the
pair's DST row, DENSE), evaluates the VJP of ``phi`` there with cotangent ``dY_i`` and adds into the
gradients: SRC rows and partial layouts by atomics (one per pair, as the walk's), full EDGE and
DST elements by plain stores (they have no other writer), DENSE into the slots. The count kernel
(hub rows) and the gradient kernel run as before for the other pairs only: the gradient kernel
narrows its feature mask to the pairs whose arg is negative and skips the item where none is left,
so it walks the rows with ties, zero results or a split only. The two kernels write disjoint
elements of full-layout gradients and add into the others, in either order. Kernels generated with
``KernelSpec.accumulate`` load, add and store where the others store, so several backward calls can add into one
buffer (``gather_scatter_multi``'s members, ``backward(..., into=...)``).

Launch: grid ``(num_items, cdiv(F, BLOCK_F))``; ``BLOCK_E``, ``BLOCK_F``, ``num_warps`` from
:data:`LAUNCH` (:data:`AUTOTUNE_CONFIGS` lists the candidates to measure on the GPU). Where the plan's hub items
are known and the graph is large enough for it to pay (or under CUDA graphs; :func:`_light_launch`), the forward
launches twice: the hub items with :data:`LAUNCH`, the light items with :data:`LIGHT_LAUNCH` (smaller tiles on one
warp: a light row has a few edges). ``max_edges``
(the split threshold) is chosen per graph by :func:`split_threshold` when the plan is built
(``gnn_io::gather_scatter_items``): measured per device and degree profile on CUDA (``kernels/split_tuning.py``),
from the mean degree elsewhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results

from gnn_inductor import config
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import codegen, split_tuning
from gnn_inductor.kernels.gather_scatter.split_tuning import MAX_MAX_EDGES, MIN_MAX_EDGES  # noqa: F401  (the split's bounds)
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2
from gnn_inductor.plan.work_items import (
    PADDING, hub_item_count, hub_items, listed_fill_rows, padded_item_count, remember_hubs, work_items,
)

# Launch parameters. Measured on an H100 (fp32, F=128, identity message, RMAT 2^20 / 16M edges and 2^17 / 1.1M
# edges, split at 128): 8 edges x 128 features on 2 warps was the fastest of AUTOTUNE_CONFIGS for sum and max,
# forward and backward (e.g. max forward 3.1 ms against 4.5 ms for 8 x 64 on one warp; 32 x 64 on 4 warps 7.1 ms).
# ``block_f`` None: the features rounded up to a power of two, between 16 and MAX_BLOCK_F.
LAUNCH = {"block_e": 8, "block_f": None, "num_warps": 2}
# The forward's light items (rows at or below the split threshold, a few edges each) in a launch of their own: 4 edges
# x 128 features on one warp. Measured on the H100 (``python -m benchmarks.gather_launch_probe``, max,
# fp32, F=128): RMAT 2^20 light items 1.159 ms against 1.415 with LAUNCH, RMAT 2^17 0.162 against 0.209; the hub
# items keep LAUNCH (0.731 and 0.079 ms, within 8% of the best candidate on both graphs). Per SAGEConv max step
# (interleaved A/B, 6 rounds): RMAT 2^20 (1.44M light items) 10.32 -> 10.11 ms, every round won; RMAT 2^17 (161k),
# a step bound by the CPU that issues it, 1.76 -> 1.83 ms, 2 rounds of 6 won: the second launch costs CPU there and
# the 0.05 ms of GPU it saves does not show. So by default (``auto``) the forward splits from LIGHT_LAUNCH_MIN_ITEMS
# work items, or under CUDA graphs (GNN_IO_CUDAGRAPHS=1: a replay has no per-launch CPU cost).
LIGHT_LAUNCH = {"block_e": 4, "block_f": None, "num_warps": 1}
LIGHT_LAUNCH_MIN_ITEMS = 1 << 19
LIGHT_LAUNCH_ENV = config.SETTINGS["gs_light_launch"].env
LIGHT_LAUNCH_SETTINGS = config.SETTINGS["gs_light_launch"].choices
# The rows kernel for the light items: BLOCK_E light rows per program, the s-th edge of each loaded at step s. Measured
# on the H100 (``python -m benchmarks.gather_launch_probe``, max, fp32, F=128): 2 rows on one warp was its
# best candidate, RMAT 2^20 light items 0.931 ms against 1.118 for the item kernel with LIGHT_LAUNCH, but RMAT 2^17
# 0.157 against 0.139-0.146. Per SAGEConv max step with this launch (H100, interleaved A/B): RMAT 2^20 10.41 ->
# 10.31 ms, 6 rounds of 6 won; RMAT 2^17 under CUDA graphs 1.43 -> 1.41 ms, 14 of 20 won (within the kernel-level
# loss above: noise). So by default (unset) the rows kernel takes the light items from LIGHT_LAUNCH_MIN_ITEMS work
# items, where it measured faster kernel by kernel and step by step; ``GNN_IO_GS_LIGHT_ROWS=1`` / ``0`` forces it.
ROWS_LAUNCH = {"block_e": 2, "block_f": None, "num_warps": 1}
LIGHT_ROWS_ENV = config.SETTINGS["gs_light_rows"].env
MAX_BLOCK_F = 128
AUTOTUNE_CONFIGS = [
    {"block_e": 8, "block_f": 64, "num_warps": 1},
    {"block_e": 16, "block_f": 64, "num_warps": 2},
    {"block_e": 8, "block_f": 128, "num_warps": 2},
    {"block_e": 32, "block_f": 64, "num_warps": 4},
    {"block_e": 16, "block_f": 128, "num_warps": 4},
]
DENSE_SLOTS = 64       # partial rows of a dense argument's gradient (programs add into item % DENSE_SLOTS)
MAXMIN_BACKWARD_ENV = config.SETTINGS["maxmin_backward"].env
MAXMIN_BACKWARDS = config.SETTINGS["maxmin_backward"].choices
# Every atomic is relaxed: they only combine partial results, ordering comes from the kernel boundaries.


# ---------------------------------------------------------------------------------------------
# The split
# ---------------------------------------------------------------------------------------------

def split_threshold(rowptr: Tensor, col: Tensor | None = None) -> int:
    """``max_edges`` of the work items: measured per device and degree profile on CUDA, 8 times the mean
    degree (a power of two in [``MIN_MAX_EDGES``, ``MAX_MAX_EDGES``]) elsewhere; ``GNN_IO_GS_MAX_EDGES``
    overrides it (clamped from below). See ``kernels/split_tuning.py``."""
    return split_choice(rowptr, col)["max_edges"]


def split_choice(rowptr: Tensor, col: Tensor | None = None) -> dict:
    """The threshold with how it was chosen (:func:`split_tuning.choose`); without ``col`` (no probe
    possible) the measurement of an earlier call or the rule."""
    if col is None:
        col = torch.zeros(0, dtype=torch.int32, device=rowptr.device)
    return split_tuning.choose(rowptr, col)


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
# Kernel source
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    kind: str            # "forward", "count", "grad" or "arg"
    walk: str            # "dst" (CSR) or "src" (transposed CSR)
    reduce: str          # forward: its members' reductions joined by "+" (a label; ``members`` holds them)
    grads: tuple = ()    # argument indices whose gradients this kernel writes
    with_arg: bool = False  # max/min: the forward writes the arg (of each max/min member), the gradient walk
    #                         skips the pairs it resolves
    members: tuple = ()  # forward: (reduce, index of its edge function) of each output, all folded in one walk
    accumulate: bool = False  # grad/arg: a stored gradient element adds to what its buffer holds (the gradients
    #                           of the earlier members of a gather_scatter_multi; atomics add anyway)


_PRELUDE = "import triton\nimport triton.language as tl\n\n\n"
# the row of a hub item's tie counts: its row's first item (hub items lead, a row's items are adjacent and all but
# its last ``count_width`` entries wide), or the node where the hub items are not known (count_width 0); row 0 for
# the padding items (no edges), which reach the hub branch of the gradient kernel
_COUNT_ROW = ("crow = tl.where(shared != 1, 0, tl.where(count_width > 0, "
              "item - (start - tl.load(rowptr + node)) // tl.maximum(count_width, 1), node))")
_WALK_PARAMS = ["rowptr", "nbr", "pos", "perm", "item_row", "item_start", "item_end", "item_shared", "num_features",
                "BLOCK_E: tl.constexpr", "BLOCK_F: tl.constexpr"]
_INIT = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
_FILL = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf")}  # a hub row before its items' atomics
_FOLD = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}
_ATOMIC = {"sum": "tl.atomic_add", "mean": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}


def _signature(lowered: codegen.Lowered, spec: KernelSpec) -> list:
    params = [f"A{i}" for i in range(len(lowered.layouts))] + [f"G{i}" for i in spec.grads]
    if spec.kind == "arg":
        return params + ["COT", "ARG", "nbr", "perm", "num_rows", "num_features", "BLOCK_E: tl.constexpr",
                         "BLOCK_F: tl.constexpr"]
    if spec.kind in ("forward", "rows"):  # one result (and arg) per member
        members = range(len(spec.members))
        walk = _WALK_PARAMS if spec.kind == "forward" else [*_WALK_PARAMS[:8], "num_items", *_WALK_PARAMS[8:]]
        return params + [f"RES{j}" for j in members] + [f"ARG{j}" for j in members] + walk
    return params + ["RES", "COT", "CNT", "ARG", "count_width"] + _WALK_PARAMS


def kernel_source(lowered, spec: KernelSpec) -> str:
    """Source of one ``triton.jit`` kernel named ``kernel`` (module docstring for the walks and the
    arg kernel). ``lowered`` is the :class:`codegen.Lowered` edge function or, for the forward, a tuple
    of them (the members' distinct functions, sharing their argument layouts: ``spec.members`` index it)."""
    fns = lowered if isinstance(lowered, tuple) else (lowered,)
    lowered = fns[0]
    M = lowered.message_shape
    layouts = lowered.layouts
    kinds = [layout.kind(M) for layout in layouts]
    node_role = ROLE_DST if spec.walk == "dst" else ROLE_SRC
    max_like = spec.reduce in ("max", "min")
    needs_edge = any(layout.role == ROLE_EDGE for layout in layouts)
    L = []
    add = L.append
    add("@triton.jit")
    add(f"def kernel({', '.join(_signature(lowered, spec))}):")
    body = []
    b = body.append

    def off(i):
        return {"full": "f", "scalar": None, "partial": f"off{i}"}[kinds[i]]

    def load(i, index, emask, tile=False):
        """Tile of argument i at node/edge ``index``: None for dense, a scalar (``emask`` None), a
        [BLOCK_E] vector (one per tile row, ``emask`` its mask) or, ``tile``, a [BLOCK_E, BLOCK_F] tile
        of them (one per (row, feature) pair, ``emask`` its 2-D mask)."""
        layout, o = layouts[i], off(i)
        row = layout.numel

        def conv(expr):
            return f"({expr} != 0)" if layout.is_bool else f"{expr}.to(tl.float32)"
        if index is None:  # dense
            if o is None:
                return conv(f"tl.load(A{i})")
            return conv(f"tl.load(A{i} + {o}[None, :], mask=fmask[None, :], other=0)")
        if tile:
            at = index if o is None else f"{index} * {row} + {o}[None, :]"
            return conv(f"tl.load(A{i} + {at}, mask={emask}, other=0)")
        if emask is None:  # one node for the whole item
            if o is None:
                return conv(f"tl.load(A{i} + {index} * {row})")
            return conv(f"tl.load(A{i} + {index} * {row} + {o}[None, :], mask=fmask[None, :], other=0)")
        if o is None:
            return conv(f"tl.load(A{i} + {index}, mask={emask}, other=0)") + "[:, None]"
        return conv(f"tl.load(A{i} + {index}[:, None] * {row} + {o}[None, :], mask=m2, other=0)")

    def contribution(i):
        """Argument i's contribution of the pairs in ``live`` (a [BLOCK_E, BLOCK_F] tile)."""
        return f"tl.where(live, {lowered.vjp_results[i]} + zero, 0.0)"

    def add_grad(i, index, emask=None, store=False):
        """The line adding the contributions ``c{i}`` into ``G{i}`` at node/edge ``index``: a [BLOCK_E]
        vector (one per tile row, ``emask`` its mask) or, without ``emask``, a [BLOCK_E, BLOCK_F] tile
        (one per pair). ``store`` where the full-layout gradient element has no other writer (an edge's,
        a destination row's in the arg kernel); else relaxed atomics issued for the live pairs, a scalar
        argument's summed over the features first when the index is per row."""
        row, o = layouts[i].numel, off(i)
        at = index if emask is None else f"{index}[:, None]"
        if store and spec.accumulate:  # no other writer: load, add, store
            target = f"G{i} + {at} * {row} + f[None, :]"
            return f"tl.store({target}, tl.load({target}, mask=live, other=0) + c{i}, mask=live)"
        if store:
            return f"tl.store(G{i} + {at} * {row} + f[None, :], c{i}, mask=live)"
        if o is None and emask is not None:
            return f"tl.atomic_add(G{i} + {index}, tl.sum(c{i}, axis=1), mask={emask}, sem='relaxed')"
        target = at if o is None else f"{at} * {row} + {o}[None, :]"
        return f"tl.atomic_add(G{i} + {target}, c{i}, mask=live, sem='relaxed')"

    def dense_grad(i):
        """Lines adding ``r{i}`` (the program's sum over its rows) into one of the ``DENSE_SLOTS`` partial
        rows of a dense argument's gradient."""
        row = layouts[i].numel
        lines = [f"slot{i} = (item % {DENSE_SLOTS}) * {row}"]
        if kinds[i] == "scalar":
            lines.append(f"tl.atomic_add(G{i} + slot{i}, tl.sum(r{i}, axis=0), sem='relaxed')")
        else:
            lines.append(f"tl.atomic_add(G{i} + slot{i} + {off(i)}, r{i}, mask=fmask, sem='relaxed')")
        return lines

    b("item = tl.program_id(0)")
    b("f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)")
    b("fmask = f < num_features")
    for i, layout in enumerate(layouts):
        offsets = codegen.layout_offsets(layout, M, "f")
        if offsets is not None:
            b(f"off{i} = {offsets}")

    if spec.kind == "arg":
        # BLOCK_E destination rows x BLOCK_F features, each pair's one edge (its arg) or none
        b("node = (item * BLOCK_E + tl.arange(0, BLOCK_E)).to(tl.int64)")
        b("rmask = node < num_rows")
        b("offsets = node[:, None] * num_features + f[None, :]")
        b("k = tl.load(ARG + offsets, mask=rmask[:, None] & fmask[None, :], other=-1)")
        b("live = k >= 0")
        b("m2 = live")  # what the row loads read
        if any(layout.role == ROLE_SRC for layout in layouts):
            b("other = tl.load(nbr + k, mask=live, other=0).to(tl.int64)")
        if needs_edge:
            b("edge = tl.load(perm + k, mask=live, other=0).to(tl.int64)")
        b("g = tl.load(COT + offsets, mask=live, other=0.0)")
        b("zero = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")
        tiles = {ROLE_SRC: "other", ROLE_EDGE: "edge"}
        for i, layout in enumerate(layouts):
            if layout.role == ROLE_DENSE:
                b(f"a{i} = {load(i, None, None)}")
            elif layout.role == ROLE_DST:
                b(f"a{i} = {load(i, 'node', 'rmask')}")
            else:
                b(f"a{i} = {load(i, tiles[layout.role], 'live', tile=True)}")
        body.extend(lowered.vjp)
        for i in spec.grads:
            role = layouts[i].role
            b(f"c{i} = {contribution(i)}")
            if role == ROLE_DENSE:
                b(f"r{i} = tl.sum(c{i}, axis=0)")
                body.extend(dense_grad(i))
            elif role == ROLE_DST:
                b(add_grad(i, "node", "rmask", store=kinds[i] == "full"))
            else:
                b(add_grad(i, tiles[role], store=kinds[i] == "full" and role == ROLE_EDGE))
        L.extend("    " + line for line in body)
        return "\n".join(L) + "\n"

    if spec.kind == "rows":
        body.extend(_rows_body(fns, spec, layouts, load, needs_edge))
        L.extend("    " + line for line in body)
        return "\n".join(L) + "\n"

    b("node = tl.load(item_row + item).to(tl.int64)")
    b("start = tl.load(item_start + item)")
    b("end = tl.load(item_end + item)")
    b("shared = tl.load(item_shared + item)")
    # per forward member: whether it tracks the arg (the op asks for it for every max/min member or none)
    tracks = [spec.kind == "forward" and spec.with_arg and reduce in ("max", "min") for reduce, _ in spec.members]
    skips_arg = spec.kind == "grad" and spec.with_arg and max_like
    if skips_arg:
        # the pairs whose arg is an edge are the arg kernel's: the walk keeps the others' features only,
        # and runs (everything below) only where one is left
        b("fmask = fmask & (tl.load(ARG + node * num_features + f, mask=fmask, other=0) < 0)")
    walked_from = len(body)

    # loop-invariant loads: the item's node and dense arguments
    for i, layout in enumerate(layouts):
        if layout.role == ROLE_DENSE:
            b(f"a{i} = {load(i, None, None)}")
        elif layout.role == node_role:
            b(f"a{i} = {load(i, 'node', None)}")
    if spec.walk == "dst":
        if spec.kind == "grad":
            b("cot = tl.load(COT + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
        if spec.kind == "count" or (spec.kind == "grad" and max_like):
            b("res = tl.load(RES + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
    if spec.kind == "forward":
        for j, (reduce, _) in enumerate(spec.members):
            b(f"acc{j} = tl.full([BLOCK_E, BLOCK_F], {_INIT[reduce]}, tl.float32)")
            if tracks[j]:
                # per lane (tile row, feature): CSR position of the one edge at the lane's best so far, -2 where
                # two or more are, -1 before the lane's first edge
                b(f"best_at{j} = tl.full([BLOCK_E, BLOCK_F], -1, tl.int32)")
    elif spec.kind == "count":
        b("acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")
    accumulated = [i for i in spec.grads if layouts[i].role in (node_role, ROLE_DENSE)]
    for i in accumulated:
        b(f"acc{i} = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")
    b("zero = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")

    def edge_block() -> list:
        """One block of the item's edges: indices, per-edge argument tiles."""
        lines = ["k = block_start + tl.arange(0, BLOCK_E)", "emask = k < end", "m2 = emask[:, None] & fmask[None, :]",
                 "other = tl.load(nbr + k, mask=emask, other=0).to(tl.int64)"]
        if spec.walk == "dst":
            if needs_edge:
                lines.append("edge = tl.load(perm + k, mask=emask, other=0).to(tl.int64)")
        else:
            lines.append("position = tl.load(pos + k, mask=emask, other=0).to(tl.int64)")
            if needs_edge:
                lines.append("edge = tl.load(perm + position, mask=emask, other=0).to(tl.int64)")
        for i, layout in enumerate(layouts):
            if layout.role == ROLE_EDGE:
                lines.append(f"a{i} = {load(i, 'edge', 'emask')}")
            elif layout.role in (ROLE_SRC, ROLE_DST) and layout.role != node_role:
                lines.append(f"a{i} = {load(i, 'other', 'emask')}")
        return lines

    if spec.kind == "grad" and max_like:
        # ties per (node, feature): counted here for a light row (one item, its edges are about to be read
        # again by the loop below), read from the count kernel's result for a hub row
        b("if shared == 0:")
        b("    ties = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")
        b("    for block_start in range(start, end, BLOCK_E):")
        body.extend("        " + line for line in edge_block() + list(lowered.forward))
        b(f"        msg = {lowered.forward_result} + zero")
        b("        ties = ties + tl.where(m2 & (msg == res), 1.0, 0.0)")
        b("    count = tl.sum(ties, axis=0)[None, :]")
        b("else:")
        b(f"    {_COUNT_ROW}")
        b("    count = tl.load(CNT + crow * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
        # scatter_reduce(include_self=False) still counts its zero base as a tie where the result is 0
        # (PyG eager does the same): messages equal to a 0 max share the gradient with it
        b("cot = tl.where(count > 0, cot / tl.maximum(count + tl.where(res == 0.0, 1.0, 0.0), 1.0), 0.0)")

    loop = edge_block()
    c = loop.append
    if spec.kind == "forward":
        # each distinct edge function once per edge block; each member's accumulator folds its messages
        loop.extend(_message_lines(fns))
        for j, (reduce, k) in enumerate(spec.members):
            if tracks[j]:  # max/min only
                beyond = ">" if reduce == "max" else "<"
                c(f"best_at{j} = tl.where(m2 & (msg{k} {beyond} acc{j}), k[:, None], "
                  f"tl.where(m2 & (msg{k} == acc{j}), -2, best_at{j}))")
            c(_fold_line(j, reduce, k))
    elif spec.kind == "count" or max_like:
        loop.extend(lowered.forward)
        c(f"msg = {lowered.forward_result} + zero")
    if spec.kind == "count":
        c("acc = acc + tl.where(m2 & (msg == res), 1.0, 0.0)")
    elif spec.kind == "grad":
        if spec.walk == "src":
            c("cot = tl.load(COT + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
            if max_like:
                c("res = tl.load(RES + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
        c("live = m2 & (msg == res)" if max_like else "live = m2")  # edges whose message reached the output
        c("g = tl.where(live, cot, 0.0)")
        loop.extend(lowered.vjp)
        for i in spec.grads:
            if i in accumulated:
                c(f"acc{i} = acc{i} + {contribution(i)}")
                continue
            # an edge argument (one write per edge), or a node of the other end of the edge (atomics,
            # issued only for live edges: for max/min about one per output element)
            role = layouts[i].role
            c(f"c{i} = {contribution(i)}")
            c(add_grad(i, "edge" if role == ROLE_EDGE else "other", "emask",
                       store=kinds[i] == "full" and role == ROLE_EDGE))
    b("for block_start in range(start, end, BLOCK_E):")
    body.extend("    " + line for line in loop)

    # epilogue
    if spec.kind == "forward":
        if any(reduce == "mean" for reduce, _ in spec.members):
            b("degree = tl.maximum(tl.load(rowptr + node + 1) - tl.load(rowptr + node), 1).to(tl.float32)")
        for j, (reduce, _) in enumerate(spec.members):
            b(f"result{j} = {_FOLD[reduce]}(acc{j}, axis=0)")
            if reduce == "mean":
                b(f"result{j} = result{j} / degree")
            if tracks[j]:
                # edges at the result per lane: 1, 2 standing for two or more, 0; the arg is the position of the
                # row's one edge there, -1 for ties, for the zero base's tie (result 0) and where no lane holds it
                b(f"at_best = acc{j} == result{j}[None, :]")
                b(f"held = tl.sum(tl.where(at_best, tl.where(best_at{j} >= 0, 1, tl.where(best_at{j} == -2, 2, 0)), "
                  "0), axis=0)")
                b(f"arg{j} = tl.where((held == 1) & (result{j} != 0.0), "
                  f"tl.max(tl.where(at_best, best_at{j}, -1), axis=0), -1)")
        b("offsets = node * num_features + f")
        b("if shared == 1:")
        for j, (reduce, _) in enumerate(spec.members):
            b(f"    {_ATOMIC[reduce]}(RES{j} + offsets, result{j}, mask=fmask, sem='relaxed')")
        b("elif shared == 0:")
        for j in range(len(spec.members)):
            b(f"    tl.store(RES{j} + offsets, result{j}, mask=fmask)")
            if tracks[j]:  # a hub row's items keep the -1 the host filled in
                b(f"    tl.store(ARG{j} + offsets, arg{j}, mask=fmask)")
    elif spec.kind == "count":  # COT is the count here (RES the forward result it compares with)
        b("result = tl.sum(acc, axis=0)")
        b(_COUNT_ROW)
        b("if shared == 1:")
        b("    tl.atomic_add(COT + crow * num_features + f, result, mask=fmask, sem='relaxed')")
    for i in accumulated:
        row = layouts[i].numel
        b(f"r{i} = tl.sum(acc{i}, axis=0)")
        if layouts[i].role == ROLE_DENSE:
            body.extend(dense_grad(i))
        elif kinds[i] == "full":
            b("if shared == 1:")
            b(f"    tl.atomic_add(G{i} + node * {row} + f, r{i}, mask=fmask, sem='relaxed')")
            b("elif shared == 0:")
            stored = f"tl.load(G{i} + node * {row} + f, mask=fmask, other=0) + r{i}" if spec.accumulate else f"r{i}"
            b(f"    tl.store(G{i} + node * {row} + f, {stored}, mask=fmask)")
        elif kinds[i] == "scalar":
            b(f"tl.atomic_add(G{i} + node, tl.sum(r{i}, axis=0), sem='relaxed')")
        else:
            b(f"tl.atomic_add(G{i} + node * {row} + off{i}, r{i}, mask=fmask, sem='relaxed')")
    if skips_arg:
        walked = ["    " + line for line in body[walked_from:]]
        body[walked_from:] = ["if tl.max(fmask.to(tl.int32), axis=0) > 0:", *walked]
    if spec.kind == "count":
        # only hub rows (light rows count their ties in the gradient kernel): the other programs end after the
        # item's loads (the launch covers the hub items alone where their number is known, hub_item_count)
        walked = ["    " + line for line in body[walked_from:]]
        body[walked_from:] = ["if shared == 1:", *walked]
    L.extend("    " + line for line in body)
    return "\n".join(L) + "\n"


def _message_lines(fns) -> list:
    """Lines computing each distinct edge function's message tile ``msg{k}`` (``[BLOCK_E, BLOCK_F]``) from the
    loaded arguments, once per edge block (or step)."""
    lines = []
    for k, fn in enumerate(fns):
        body, result = codegen.renamed_forward(fn, f"m{k}_")
        lines.extend(body)
        lines.append(f"msg{k} = {result} + zero")
    return lines


def _fold_line(j: int, reduce: str, k: int) -> str:
    """The line folding message ``msg{k}`` into member ``j``'s accumulator, masked by ``m2``."""
    if reduce in ("sum", "mean"):
        return f"acc{j} = acc{j} + tl.where(m2, msg{k}, 0.0)"
    fold = "tl.maximum" if reduce == "max" else "tl.minimum"
    return f"acc{j} = {fold}(acc{j}, tl.where(m2, msg{k}, {_INIT[reduce]}))"


def _rows_body(fns, spec: KernelSpec, layouts, load, needs_edge) -> list:
    """The body of the *rows* forward kernel (``spec.kind == "rows"``): ``BLOCK_E`` light items per program, one
    destination row each (its tile row), ``BLOCK_F`` features; step ``s`` loads the ``s``-th edge of every row at
    once, so a program keeps ``BLOCK_E`` rows' gathers in flight where the item kernel keeps one row's. Each member
    folds its messages per row (no reduction across tile rows) and its result is stored: light items are whole rows
    (no atomics, no arg: a forward asked for the arg keeps the item kernel)."""
    body = ["items = item * BLOCK_E + tl.arange(0, BLOCK_E)",
            "imask = items < num_items",
            "node = tl.load(item_row + items, mask=imask, other=0).to(tl.int64)",
            "start = tl.load(item_start + items, mask=imask, other=0)",
            "end = tl.load(item_end + items, mask=imask, other=0)",
            # padding items (and a hub item, should one reach this launch) store nothing
            "stored = imask & (tl.load(item_shared + items, mask=imask, other=1) == 0)",
            "m2 = stored[:, None] & fmask[None, :]",
            "zero = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)"]
    b = body.append
    for i, layout in enumerate(layouts):
        if layout.role == ROLE_DENSE:
            b(f"a{i} = {load(i, None, None)}")
        elif layout.role == ROLE_DST:
            b(f"a{i} = {load(i, 'node', 'stored')}")
    for j, (reduce, _) in enumerate(spec.members):
        b(f"acc{j} = tl.full([BLOCK_E, BLOCK_F], {_INIT[reduce]}, tl.float32)")
    b("steps = tl.max(tl.where(stored, end - start, 0), axis=0)")
    b("for step in range(0, steps):")
    loop = ["k = start + step", "emask = stored & (k < end)", "m2 = emask[:, None] & fmask[None, :]",
            "other = tl.load(nbr + k, mask=emask, other=0).to(tl.int64)"]
    if needs_edge:
        loop.append("edge = tl.load(perm + k, mask=emask, other=0).to(tl.int64)")
    for i, layout in enumerate(layouts):
        if layout.role == ROLE_EDGE:
            loop.append(f"a{i} = {load(i, 'edge', 'emask')}")
        elif layout.role == ROLE_SRC:
            loop.append(f"a{i} = {load(i, 'other', 'emask')}")
    loop.extend(_message_lines(fns))
    loop.extend(_fold_line(j, reduce, k) for j, (reduce, k) in enumerate(spec.members))
    body.extend("    " + line for line in loop)
    if any(reduce == "mean" for reduce, _ in spec.members):
        b("degree = tl.maximum(end - start, 1).to(tl.float32)[:, None]")
    b("offsets = node[:, None] * num_features + f[None, :]")
    b("m2 = stored[:, None] & fmask[None, :]")
    for j, (reduce, _) in enumerate(spec.members):
        b(f"tl.store(RES{j} + offsets, acc{j}{' / degree' if reduce == 'mean' else ''}, mask=m2)")
    return body


_PREFILL = '''
@triton.jit
def prefill(RES, item_row, item_shared, num_items, num_features, value, BLOCK_I: tl.constexpr,
            BLOCK_F: tl.constexpr):
    items = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    hub = tl.load(item_shared + items, mask=items < num_items, other=0) == 1
    rows = tl.load(item_row + items, mask=hub, other=0).to(tl.int64)
    for start in range(0, num_features, BLOCK_F):
        f = start + tl.arange(0, BLOCK_F)
        tl.store(RES + rows[:, None] * num_features + f[None, :], tl.full([BLOCK_I, BLOCK_F], value, tl.float32),
                 mask=hub[:, None] & (f < num_features)[None, :])
'''


# ---------------------------------------------------------------------------------------------
# Lowering cache and launches
# ---------------------------------------------------------------------------------------------

_LOWERED: dict = {}


def _specs(args, roles) -> list:
    return [(role, tuple(a.shape) if role == ROLE_DENSE else tuple(a.shape[1:]), a.dtype)
            for a, role in zip(args, roles)]


def lowering(fn_key: str, specs: list):
    """The :class:`codegen.Lowered` function, or the :class:`codegen.Unsupported` reason (cached)."""
    key = (fn_key, tuple((r, s, d) for r, s, d in specs))
    if key not in _LOWERED:
        try:
            _LOWERED[key] = codegen.lower(edge_functions.lookup(fn_key), specs)
        except codegen.Unsupported as exc:
            _LOWERED[key] = exc
    return _LOWERED[key]


def lowered_members(fn_keys: list, specs: list):
    """``(functions, index)`` for a forward of several edge functions over the same arguments: the distinct
    functions of ``fn_keys`` lowered (in first-seen order) and each key's position among them; or the
    :class:`codegen.Unsupported` reason why they cannot share one kernel (one does not lower, or they
    broadcast the arguments into different message shapes)."""
    distinct = list(dict.fromkeys(fn_keys))
    fns = []
    for key in distinct:
        found = lowering(key, specs)
        if isinstance(found, codegen.Unsupported):
            return found
        fns.append(found)
    for key, fn in zip(distinct[1:], fns[1:]):
        if (fn.message_shape, fn.layouts) != (fns[0].message_shape, fns[0].layouts):
            return codegen.Unsupported(f"edge functions {distinct[0]} and {key} give messages of different shapes "
                                       f"({fns[0].message_shape} and {fn.message_shape}) or argument layouts")
    return tuple(fns), [distinct.index(key) for key in fn_keys]


def unsupported_reason(args, roles, fn_keys) -> str | None:
    """Why the fused kernels cannot run these arguments through the edge function ``fn_keys`` (a key, or
    a list of keys computed in one pass), None when they can."""
    if any(a.dtype == torch.float64 for a in args):
        return "float64 arguments (the kernels compute in float32)"
    found = lowered_members([fn_keys] if isinstance(fn_keys, str) else list(fn_keys), _specs(args, roles))
    return str(found) if isinstance(found, codegen.Unsupported) else None


_KERNELS: dict = {}


def _kernel(lowered, spec: KernelSpec):
    """The jitted kernel of ``spec`` (source generated and imported once per process; ``lowered``
    objects, one or a tuple of them, live in ``_LOWERED`` for the process, so their ids are stable keys)."""
    key = (tuple(map(id, lowered)) if isinstance(lowered, tuple) else id(lowered), spec)
    if key not in _KERNELS:
        _KERNELS[key] = fast_launch(codegen.load_kernels(_PRELUDE + kernel_source(lowered, spec)).kernel)
    return _KERNELS[key]


def _prefill_kernel():
    if "prefill" not in _KERNELS:
        _KERNELS["prefill"] = fast_launch(codegen.load_kernels(_PRELUDE + _PREFILL).prefill)
    return _KERNELS["prefill"]




def _prepare(args, roles):
    """Contiguous arguments, bool masks viewed as bytes (no copy)."""
    prepared = []
    for a in args:
        a = a.contiguous()
        prepared.append(a.view(torch.uint8) if a.dtype == torch.bool else a)
    return prepared


def _block_f(num_features: int, launch) -> int:
    return launch["block_f"] or max(16, min(MAX_BLOCK_F, next_power_of_2(num_features)))


def _launch(kernel, num_programs: int, tensors, num_features, launch):
    """``kernel`` on the grid ``(num_programs, cdiv(F, BLOCK_F))`` (work items, or row blocks for the arg kernel)."""
    block_f = _block_f(num_features, launch)
    if num_programs == 0 or num_features == 0:
        return
    grid = (num_programs, cdiv(num_features, block_f))
    kernel[grid](*tensors, num_features, BLOCK_E=launch["block_e"], BLOCK_F=block_f, num_warps=launch["num_warps"])


@dataclass
class Plan:
    """The plan tensors the kernels walk (see ``kernels/csr.py``) and the two sets of work items."""
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


def forward(args, roles, plan: Plan, fn_key: str, reduce: str, launch=None, arg=None) -> Tensor:
    """``out`` of the op as float32 ``[num_dst, F]`` (the caller casts and reshapes). ``arg``: for
    max/min, an int32 tensor of ``num_dst * F`` elements filled with -1, where the kernel writes the
    arg of the light rows (module docstring)."""
    return forward_multi(args, roles, plan, [fn_key], [reduce], launch, None if arg is None else [arg])[0]


def forward_multi(args, roles, plan: Plan, fn_keys: list, reduces: list, launch=None, arg=None) -> list:
    """One output per member ``(fn_keys[j], reduces[j])``, each as :func:`forward`'s, from one walk over the
    edges: every edge's arguments are loaded once, each distinct edge function is computed once per edge
    and each member folds it into its own accumulator. ``arg``: None, or one int32 tensor per member
    (filled with -1; read for the max/min members only, where the kernel writes their args)."""
    explicit_launch = launch is not None
    launch = launch or LAUNCH
    fns, fn_index = lowered_members(list(fn_keys), _specs(args, roles))
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
            _prefill_kernel()[(cdiv(num_items, 64),)](
                out, plan.items[0], plan.items[3], num_items, num_features, _FILL[reduce], BLOCK_I=64,
                BLOCK_F=_block_f(num_features, launch))
    max_like = [reduce in ("max", "min") for reduce in reduces]
    with_arg = arg is not None and any(max_like)
    spec = KernelSpec("forward", "dst", "+".join(reduces), with_arg=with_arg, members=tuple(zip(reduces, fn_index)))
    kernel = _kernel(fns, spec)
    args_out = [a if with_arg and like else out for a, like, out in zip(arg or outs, max_like, outs)]
    tensors = [*_prepare(args, roles), *outs, *args_out, plan.rowptr, plan.col, plan.col, plan.perm]
    light = not explicit_launch and _light_launch("forward", num_items)
    rows = None
    if light and not with_arg and light_rows(num_items):
        rows = _kernel(fns, KernelSpec("rows", "dst", spec.reduce, members=spec.members))
    _launch_items(kernel, plan.items, tensors, num_features, launch, light, rows)
    return outs


def light_rows(num_items: int) -> bool:
    """Whether the forward's light items, where they get a launch of their own, run the *rows* kernel
    (:data:`ROWS_LAUNCH`: several light rows per program, :func:`_rows_body`) instead of the item kernel with
    :data:`LIGHT_LAUNCH`. ``GNN_IO_GS_LIGHT_ROWS`` (read at each call): ``1`` always, ``0`` never, unset from
    :data:`LIGHT_LAUNCH_MIN_ITEMS` work items (the plan's ``num_items``), where it measured faster."""
    forced = config.get("gs_light_rows")
    return num_items >= LIGHT_LAUNCH_MIN_ITEMS if forced is None else forced


def _light_launch(kind: str, num_items: int) -> bool:
    """Whether ``kind`` (``forward``, ``backward``) launches its light items with :data:`LIGHT_LAUNCH`, from
    ``GNN_IO_GS_LIGHT_LAUNCH`` (read at each call): ``auto`` (the default) the forward where it measured faster, from
    :data:`LIGHT_LAUNCH_MIN_ITEMS` work items or under CUDA graphs; ``forward`` the forward always; ``both`` the
    forward and the gradient walks; ``off`` neither (one launch over every item)."""
    value = config.get("gs_light_launch")
    if value == "auto":
        return kind == "forward" and (num_items >= LIGHT_LAUNCH_MIN_ITEMS or config.get("cuda_graphs"))
    return value == "both" or value == kind


def _launch_items(kernel, items, tensors, num_features, launch, light: bool, rows=None) -> None:
    """``kernel`` over the work ``items`` (appended to ``tensors``). ``light``, with the items' hub count known:
    the degree split, the hub items (they lead, so their indices within the launch are the plan's) with ``launch``
    and the light items with :data:`LIGHT_LAUNCH`, or by the ``rows`` kernel (:func:`_rows_body`) with
    :data:`ROWS_LAUNCH` where one is given; else one launch over every item."""
    num_items = items[0].shape[0]
    hubs = hub_item_count(items) if light else None
    if hubs is None:
        _launch(kernel, num_items, [*tensors, *items], num_features, launch)
        return
    if hubs:
        _launch(kernel, hubs, [*tensors, *(t[:hubs] for t in items)], num_features, launch)
    if num_items == hubs:
        return
    light_items = [*tensors, *(t[hubs:] for t in items)]
    if rows is None:
        _launch(kernel, num_items - hubs, light_items, num_features, LIGHT_LAUNCH)
    else:
        _launch(rows, cdiv(num_items - hubs, ROWS_LAUNCH["block_e"]), [*light_items, num_items - hubs], num_features,
                ROWS_LAUNCH)


def maxmin_backward() -> str:
    """How the max/min backward finds the edges that reached the output: ``"walk"`` (default: no arg,
    every edge walked) or ``"arg"`` (the forward saves the arg, module docstring), from the
    ``GNN_IO_MAXMIN_BACKWARD`` environment variable, read when the op's forward runs (or is traced).
    The walk is the default because it measured faster on the H100 (SAGEConv max, 128 features, forward+
    backward: RMAT 2^20 / 15.4M edges 13.83 ms against 15.91 ms with the arg, RMAT 2^17 / 1.1M edges 2.22
    against 2.57 ms): the arg costs the forward a 4-byte fill and store per output
    element, and hub rows, 64% of that graph's edges, are walked either way."""
    return config.get("maxmin_backward")


def _grad_walks(layouts, needs_grad, reduce: str) -> dict:
    """Which walk computes each needed gradient. Sum/mean: SRC by source (transposed CSR, no
    atomics), DST by destination; EDGE and DENSE ride along with the walk that runs anyway (by
    destination when there is no SRC gradient). Max/min: everything by destination, where the
    output and cotangent rows are loaded once per item, and SRC rows get atomics only from the
    edges whose message is the max/min (about one per output element); the arg kernel, when it
    runs, writes the same gradients."""
    wanted = [i for i, (layout, need) in enumerate(zip(layouts, needs_grad)) if need and not layout.is_bool]
    if reduce in ("max", "min"):
        return {"src": (), "dst": tuple(wanted)}
    src = [i for i in wanted if layouts[i].role == ROLE_SRC]
    dst = [i for i in wanted if layouts[i].role == ROLE_DST]
    other = [i for i in wanted if layouts[i].role in (ROLE_EDGE, ROLE_DENSE)]
    if src and not dst:
        src += other
    else:
        dst += other
    return {"src": tuple(src), "dst": tuple(dst)}


def backward(grad_out: Tensor, args, roles, plan: Plan, fn_key: str, reduce: str, needs_grad, out=None,
             arg=None, launch=None, into: dict | None = None) -> list:
    """Gradients of the arguments flagged in ``needs_grad`` (None for the others), in their dtypes.
    ``out`` is the forward result (float32, ``[num_dst, F]``) for max/min; recomputed when None.
    ``arg`` is the forward's max/min arg (int32, ``num_dst * F`` elements): the pairs with an edge
    there take the arg kernel, the walks only the others; None walks every edge. ``into``: float32 buffers
    (argument index -> ``[rows, numel]``, from :func:`gradient_buffers`) the kernels add this call's gradients
    to, for those arguments; then the result holds None there."""
    explicit_launch = launch is not None
    launch = launch or LAUNCH
    lowered = lowering(fn_key, _specs(args, roles))
    layouts = lowered.layouts
    num_features = math.prod(lowered.message_shape)
    num_dst = plan.rowptr.numel() - 1
    device = plan.rowptr.device
    cot = grad_out.reshape(num_dst, num_features).float()
    res = cot  # unused by sum/mean kernels
    if reduce == "mean":
        degree = (plan.rowptr[1:] - plan.rowptr[:-1]).clamp(min=1).float()
        cot = cot / degree[:, None]
    elif reduce in ("max", "min"):
        res = forward(args, roles, plan, fn_key, reduce, launch if explicit_launch else None) if out is None else \
            out.reshape(num_dst, num_features).float()
        # ties of hub rows (the gradient kernel counts light rows itself): one row per hub row where the hub items
        # are known (at the row's first item), else one per node
        hubs, width = hub_items(plan.items) or (None, 0)
        count = torch.zeros((num_dst if hubs is None else max(hubs, 1), num_features), dtype=torch.float32,
                            device=device)
        kernel = _kernel(lowered, KernelSpec("count", "dst", reduce))
        tensors = [*_prepare(args, roles), res, count, count, count, width, plan.rowptr, plan.col, plan.col,
                   plan.perm, *plan.items]
        _launch(kernel, plan.items[0].shape[0] if hubs is None else hubs, tensors, num_features, launch)
    cot, res = cot.contiguous(), res.contiguous()
    if reduce not in ("max", "min"):
        count, width = cot, 0  # unused
    with_arg = arg is not None and reduce in ("max", "min")
    arg = arg.reshape(num_dst, num_features).contiguous() if with_arg else cot  # cot: unused
    prepared = _prepare(args, roles)
    into = into or {}
    grads = {i: into[i] if i in into else torch.zeros(_grad_shape(args[i], layout), dtype=torch.float32,
                                                      device=device)
             for i, layout in enumerate(layouts) if needs_grad[i] and not layout.is_bool}
    accumulate = bool(into)
    walks = _grad_walks(layouts, needs_grad, reduce)
    for walk, indices in walks.items():
        if not indices:
            continue
        kernel = _kernel(lowered, KernelSpec("grad", walk, reduce, indices, with_arg, accumulate=accumulate))
        if walk == "dst":
            index = [plan.rowptr, plan.col, plan.col, plan.perm, *plan.items]
            items = plan.items
        else:
            index = [plan.t_rowptr, plan.t_col, plan.t_perm, plan.perm, *plan.t_items]
            items = plan.t_items
        tensors = [*prepared, *(grads[i] for i in indices), res, cot, count, arg, width, *index[:-len(items)]]
        # only a hub item's program needs its index within the plan's items (its tie-count row); a light item's
        # index only spreads the dense slots, so the light items may run in a launch of their own
        _launch_items(kernel, items, tensors, num_features, launch,
                      not explicit_launch and _light_launch("backward", items[0].shape[0]))
    if with_arg and walks["dst"]:
        # the pairs whose arg is an edge: that edge's VJP with the whole dY, blocks of BLOCK_E rows
        kernel = _kernel(lowered, KernelSpec("arg", "dst", reduce, walks["dst"], accumulate=accumulate))
        tensors = [*prepared, *(grads[i] for i in walks["dst"]), cot, arg, plan.col, plan.perm, num_dst]
        _launch(kernel, cdiv(num_dst, launch["block_e"]), tensors, num_features, launch)
    result = []
    for i, a in enumerate(args):
        if i not in grads or i in into:
            result.append(None)
            continue
        grad = grads[i].sum(0) if layouts[i].role == ROLE_DENSE else grads[i]
        result.append(grad.reshape(a.shape).to(a.dtype))
    return result


def _grad_shape(arg: Tensor, layout) -> tuple:
    """The float32 buffer the kernels write an argument's gradient into (a dense one: ``DENSE_SLOTS`` partial
    rows, summed after)."""
    return (DENSE_SLOTS, layout.numel) if layout.role == ROLE_DENSE else (arg.shape[0], layout.numel)


def gradient_buffers(args, roles, fn_key: str, needs_grad) -> dict:
    """Zeroed float32 gradient buffers for :func:`backward`'s ``into``, for the wanted arguments that are not
    dense (whose partial rows stay per call): argument index -> buffer."""
    layouts = lowering(fn_key, _specs(args, roles)).layouts
    return {i: torch.zeros(_grad_shape(args[i], layout), dtype=torch.float32, device=args[i].device)
            for i, layout in enumerate(layouts) if needs_grad[i] and not layout.is_bool and layout.role != ROLE_DENSE}


def from_buffer(buffer: Tensor, arg: Tensor) -> Tensor:
    """An argument's gradient from its :func:`gradient_buffers` buffer."""
    return buffer.reshape(arg.shape).to(arg.dtype)
