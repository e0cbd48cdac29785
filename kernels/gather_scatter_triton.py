r"""Fused degree-split Triton kernels for ``gnn_io::gather_scatter``.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} \phi(a^{(1)}_e, \dots, a^{(k)}_e),
    \qquad \oplus \in \{\sum, \mathrm{mean}, \max, \min\}

the same result as ``gather_scatter_reference`` (``kernels/gather_scatter.py``, the CPU path and the
ground truth of the tests). ``phi`` is generated into the kernels by ``kernels/codegen.py``; the
messages live in registers only, no edge-sized message tensor is ever written.

Shapes: as the op (``kernels/_common.py`` roles); the message features ``M`` are flattened into one
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
to -inf/+inf by a tiny prefill kernel). Hub sums are so order-nondeterministic in the last bits;
max/min are exact.

**Backward.** The cotangent of a message is ``g_e = dY_i`` (sum), ``dY_i / deg_i`` (mean) or, for
max/min, ``[phi_e == out_i] dY_i / count_i`` with ``count_i`` the number of tied messages per
(node, feature): PyG's ``scatter_reduce`` semantics, ties share the gradient equally (and, as there,
the zero base of ``scatter_reduce(include_self=False)`` counts as one more tie where the result is
0). The gradient kernel of a light row counts the ties itself (a first walk over the row's edges,
recomputing the messages; the second walk finds them in cache); a *count* kernel does it for the
hub rows first. The gradient kernels recompute the messages' inputs, evaluate the generated VJP of
``phi`` and reduce each argument's contributions by its role. Sum/mean: SRC arguments through the
transposed CSR (walk by source, accumulated in registers, no atomics except for hub items), DST
arguments through the CSR. Max/min: everything in the CSR walk, SRC rows by atomics masked to the
edges whose message reached the output (about one per output element, not one per edge and
feature). EDGE arguments are stored per edge; DENSE arguments summed per program into one of
``DENSE_SLOTS`` partial rows (spreading the atomics) and summed on the host. Arguments broadcast
over features (an edge weight ``[E, 1]``) sum over the features they are broadcast over too.

Launch: grid ``(num_items, cdiv(F, BLOCK_F))``; ``BLOCK_E``, ``BLOCK_F``, ``num_warps`` from
:data:`LAUNCH` (:data:`AUTOTUNE_CONFIGS` lists the candidates to measure on the GPU). ``max_edges``
(the split threshold) is chosen per graph from its degree profile by :func:`split_threshold`, when
the plan is built (``gnn_io::gather_scatter_items``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from gnn_inductor import edge_functions
from gnn_inductor.kernels import codegen
from gnn_inductor.kernels._common import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.spmm_triton import PADDING, padded_item_count, work_items

# Launch parameters. Measured on an H100 (fp32, F=128, identity message, RMAT 2^20 / 16M edges and 2^17 / 1.1M
# edges, split at 128): 8 edges x 128 features on 2 warps was the fastest of AUTOTUNE_CONFIGS for sum and max,
# forward and backward (e.g. max forward 3.1 ms against 4.5 ms for 8 x 64 on one warp; 32 x 64 on 4 warps 7.1 ms).
# ``block_f`` None: the features rounded up to a power of two, between 16 and MAX_BLOCK_F.
LAUNCH = {"block_e": 8, "block_f": None, "num_warps": 2}
MAX_BLOCK_F = 128
AUTOTUNE_CONFIGS = [
    {"block_e": 8, "block_f": 64, "num_warps": 1},
    {"block_e": 16, "block_f": 64, "num_warps": 2},
    {"block_e": 8, "block_f": 128, "num_warps": 2},
    {"block_e": 32, "block_f": 64, "num_warps": 4},
    {"block_e": 16, "block_f": 128, "num_warps": 4},
]
MIN_MAX_EDGES = 32     # the split threshold is at least this; the padded item count is sized with it
MAX_MAX_EDGES = 1024
DENSE_SLOTS = 64       # partial rows of a dense argument's gradient (programs add into item % DENSE_SLOTS)
# Every atomic is relaxed: they only combine partial results, ordering comes from the kernel boundaries.


# ---------------------------------------------------------------------------------------------
# The split
# ---------------------------------------------------------------------------------------------

def split_threshold(rowptr: Tensor) -> int:
    """``max_edges`` of the work items: 8 times the mean degree rounded up to a power of two,
    clamped to [``MIN_MAX_EDGES``, ``MAX_MAX_EDGES``] (``GNN_IO_GS_MAX_EDGES`` overrides it, clamped
    from below). Rows up to a few times the mean degree stay whole (one program, no atomics); hubs
    are cut into items of a length that bounds every program's work."""
    override = os.environ.get("GNN_IO_GS_MAX_EDGES")
    if override:
        return max(MIN_MAX_EDGES, int(override))
    num_rows = max(1, rowptr.numel() - 1)
    mean_degree = int(rowptr[-1]) / num_rows
    return min(MAX_MAX_EDGES, max(MIN_MAX_EDGES, triton.next_power_of_2(max(1, math.ceil(8 * mean_degree)))))


@torch.library.custom_op("gnn_io::gather_scatter_items", mutates_args=())
def gather_scatter_items(rowptr: Tensor, col: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Work items of ``rowptr`` split at :func:`split_threshold`, padded to a bound that depends on
    sizes only (skipped items, ``shared == PADDING``), so compiled graphs see no data-dependent size."""
    items = work_items(rowptr, split_threshold(rowptr))
    count = padded_item_count(rowptr.numel() - 1, col.numel(), MIN_MAX_EDGES)
    pad = count - items.row.numel()
    zeros = items.row.new_zeros((pad,))
    return (torch.cat([items.row, zeros]), torch.cat([items.start, zeros]), torch.cat([items.end, zeros]),
            torch.cat([items.shared, torch.full((pad,), PADDING, dtype=torch.int8, device=rowptr.device)]))


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
    kind: str            # "forward", "count" or "grad"
    walk: str            # "dst" (CSR) or "src" (transposed CSR)
    reduce: str
    grads: tuple = ()    # argument indices whose gradients this kernel writes


_PRELUDE = "import triton\nimport triton.language as tl\n\n\n"


def _signature(lowered: codegen.Lowered, spec: KernelSpec) -> list:
    params = [f"A{i}" for i in range(len(lowered.layouts))] + [f"G{i}" for i in spec.grads]
    return params + ["RES", "COT", "CNT", "rowptr", "nbr", "pos", "perm", "item_row", "item_start", "item_end",
                     "item_shared", "num_features", "BLOCK_E: tl.constexpr", "BLOCK_F: tl.constexpr"]


def kernel_source(lowered: codegen.Lowered, spec: KernelSpec) -> str:
    """Source of one ``triton.jit`` kernel named ``kernel`` (module docstring for the walks)."""
    M = lowered.message_shape
    layouts = lowered.layouts
    kinds = [layout.kind(M) for layout in layouts]
    node_role = ROLE_DST if spec.walk == "dst" else ROLE_SRC
    L = []
    add = L.append
    add("@triton.jit")
    add(f"def kernel({', '.join(_signature(lowered, spec))}):")
    body = []
    b = body.append
    b("item = tl.program_id(0)")
    b("f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)")
    b("fmask = f < num_features")
    b("node = tl.load(item_row + item).to(tl.int64)")
    b("start = tl.load(item_start + item)")
    b("end = tl.load(item_end + item)")
    b("shared = tl.load(item_shared + item)")
    for i, layout in enumerate(layouts):
        offsets = codegen.layout_offsets(layout, M, "f")
        if offsets is not None:
            b(f"off{i} = {offsets}")

    def off(i):
        return {"full": "f", "scalar": None, "partial": f"off{i}"}[kinds[i]]

    def load(i, index, emask):
        """Tile of argument i at node/edge ``index`` (a [BLOCK_E] vector, a scalar or None for dense)."""
        layout, o = layouts[i], off(i)
        row = layout.numel

        def conv(expr):
            return f"({expr} != 0)" if layout.is_bool else f"{expr}.to(tl.float32)"
        if index is None:  # dense
            if o is None:
                return conv(f"tl.load(A{i})")
            return conv(f"tl.load(A{i} + {o}[None, :], mask=fmask[None, :], other=0)")
        if emask is None:  # one node for the whole item
            if o is None:
                return conv(f"tl.load(A{i} + {index} * {row})")
            return conv(f"tl.load(A{i} + {index} * {row} + {o}[None, :], mask=fmask[None, :], other=0)")
        if o is None:
            return conv(f"tl.load(A{i} + {index}, mask={emask}, other=0)") + "[:, None]"
        return conv(f"tl.load(A{i} + {index}[:, None] * {row} + {o}[None, :], mask=m2, other=0)")

    # loop-invariant loads: the item's node and dense arguments
    for i, layout in enumerate(layouts):
        if layout.role == ROLE_DENSE:
            b(f"a{i} = {load(i, None, None)}")
        elif layout.role == node_role:
            b(f"a{i} = {load(i, 'node', None)}")
    max_like = spec.reduce in ("max", "min")
    if spec.walk == "dst":
        if spec.kind == "grad":
            b("cot = tl.load(COT + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
        if spec.kind == "count" or (spec.kind == "grad" and max_like):
            b("res = tl.load(RES + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
    init = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}[spec.reduce]
    if spec.kind == "forward":
        b(f"acc = tl.full([BLOCK_E, BLOCK_F], {init}, tl.float32)")
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
        needs_edge = any(layout.role == ROLE_EDGE for layout in layouts)
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
        b("    count = tl.load(CNT + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
        # scatter_reduce(include_self=False) still counts its zero base as a tie where the result is 0
        # (PyG eager does the same): messages equal to a 0 max share the gradient with it
        b("cot = tl.where(count > 0, cot / tl.maximum(count + tl.where(res == 0.0, 1.0, 0.0), 1.0), 0.0)")

    loop = edge_block()
    c = loop.append
    if spec.kind == "forward" or spec.kind == "count" or (spec.kind == "grad" and max_like):
        loop.extend(lowered.forward)
        c(f"msg = {lowered.forward_result} + zero")
    if spec.kind == "forward":
        if spec.reduce in ("sum", "mean"):
            c("acc = acc + tl.where(m2, msg, 0.0)")
        else:
            fold = "tl.maximum" if spec.reduce == "max" else "tl.minimum"
            c(f"acc = {fold}(acc, tl.where(m2, msg, {init}))")
    elif spec.kind == "count":
        c("acc = acc + tl.where(m2 & (msg == res), 1.0, 0.0)")
    else:
        if spec.walk == "src":
            c("cot = tl.load(COT + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
            if max_like:
                c("res = tl.load(RES + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
        c("live = m2 & (msg == res)" if max_like else "live = m2")  # edges whose message reached the output
        c("g = tl.where(live, cot, 0.0)")
        loop.extend(lowered.vjp)
        for i in spec.grads:
            contribution = f"tl.where(live, {lowered.vjp_results[i]} + zero, 0.0)"
            row = layouts[i].numel
            if i in accumulated:
                c(f"acc{i} = acc{i} + {contribution}")
                continue
            # an edge argument (one write per edge), or a node of the other end of the edge (atomics,
            # issued only for live edges: for max/min about one per output element)
            index = "edge" if layouts[i].role == ROLE_EDGE else "other"
            c(f"c{i} = {contribution}")
            if kinds[i] == "full" and index == "edge":
                c(f"tl.store(G{i} + edge[:, None] * {row} + f[None, :], c{i}, mask=m2)")
            elif kinds[i] == "full":
                c(f"tl.atomic_add(G{i} + other[:, None] * {row} + f[None, :], c{i}, mask=live, sem='relaxed')")
            elif kinds[i] == "scalar":
                c(f"tl.atomic_add(G{i} + {index}, tl.sum(c{i}, axis=1), mask=emask, sem='relaxed')")
            else:
                c(f"tl.atomic_add(G{i} + {index}[:, None] * {row} + off{i}[None, :], c{i}, mask=live, sem='relaxed')")
    if spec.kind == "count":  # only hub rows: light rows count their ties in the gradient kernel
        b("end = tl.where(shared == 1, end, start)")
    b("for block_start in range(start, end, BLOCK_E):")
    body.extend("    " + line for line in loop)

    # epilogue
    if spec.kind in ("forward", "count"):
        fold = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}[spec.reduce]
        if spec.kind == "count":
            fold = "tl.sum"
        b(f"result = {fold}(acc, axis=0)")
        if spec.kind == "forward" and spec.reduce == "mean":
            b("degree = tl.load(rowptr + node + 1) - tl.load(rowptr + node)")
            b("result = result / tl.maximum(degree, 1).to(tl.float32)")
        atomic = {"max": "tl.atomic_max", "min": "tl.atomic_min"}.get(spec.reduce, "tl.atomic_add")
        if spec.kind == "count":
            atomic = "tl.atomic_add"
        target = "RES" if spec.kind == "forward" else "COT"  # count: RES is the forward result it compares with
        b("offsets = node * num_features + f")
        b("if shared == 1:")
        b(f"    {atomic}({target} + offsets, result, mask=fmask, sem='relaxed')")
        if spec.kind == "forward":
            b("elif shared == 0:")
            b(f"    tl.store({target} + offsets, result, mask=fmask)")
    for i in accumulated:
        row = layouts[i].numel
        b(f"r{i} = tl.sum(acc{i}, axis=0)")
        if layouts[i].role == ROLE_DENSE:
            b(f"slot{i} = (item % {DENSE_SLOTS}) * {row}")
            if kinds[i] == "scalar":
                b(f"tl.atomic_add(G{i} + slot{i}, tl.sum(r{i}, axis=0), sem='relaxed')")
            else:
                b(f"tl.atomic_add(G{i} + slot{i} + {off(i)}, r{i}, mask=fmask, sem='relaxed')")
        elif kinds[i] == "full":
            b("if shared == 1:")
            b(f"    tl.atomic_add(G{i} + node * {row} + f, r{i}, mask=fmask, sem='relaxed')")
            b("elif shared == 0:")
            b(f"    tl.store(G{i} + node * {row} + f, r{i}, mask=fmask)")
        elif kinds[i] == "scalar":
            b(f"tl.atomic_add(G{i} + node, tl.sum(r{i}, axis=0), sem='relaxed')")
        else:
            b(f"tl.atomic_add(G{i} + node * {row} + off{i}, r{i}, mask=fmask, sem='relaxed')")
    L.extend("    " + line for line in body)
    return "\n".join(L) + "\n"


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


def unsupported_reason(args, roles, fn_key: str) -> str | None:
    """Why the fused kernels cannot run these arguments (None when they can)."""
    if any(a.dtype == torch.float64 for a in args):
        return "float64 arguments (the kernels compute in float32)"
    found = lowering(fn_key, _specs(args, roles))
    return str(found) if isinstance(found, codegen.Unsupported) else None


_KERNELS: dict = {}


def _kernel(lowered: codegen.Lowered, spec: KernelSpec):
    """The jitted kernel of ``spec`` (source generated and imported once per process; ``lowered``
    objects live in ``_LOWERED`` for the process, so their ids are stable keys)."""
    key = (id(lowered), spec)
    if key not in _KERNELS:
        _KERNELS[key] = codegen.load_kernels(_PRELUDE + kernel_source(lowered, spec)).kernel
    return _KERNELS[key]


def _prefill_kernel():
    return codegen.load_kernels(_PRELUDE + _PREFILL).prefill


def _prepare(args, roles):
    """Contiguous arguments, bool masks viewed as bytes (no copy)."""
    prepared = []
    for a in args:
        a = a.contiguous()
        prepared.append(a.view(torch.uint8) if a.dtype == torch.bool else a)
    return prepared


def _block_f(num_features: int, launch) -> int:
    return launch["block_f"] or max(16, min(MAX_BLOCK_F, triton.next_power_of_2(num_features)))


def _launch(kernel, lowered, items, tensors, num_features, launch):
    block_f = _block_f(num_features, launch)
    num_items = items[0].shape[0]
    if num_items == 0 or num_features == 0:
        return
    grid = (num_items, triton.cdiv(num_features, block_f))
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


def forward(args, roles, plan: Plan, fn_key: str, reduce: str, launch=None) -> Tensor:
    """``out`` of the op as float32 ``[num_dst, F]`` (the caller casts and reshapes)."""
    launch = launch or LAUNCH
    lowered = lowering(fn_key, _specs(args, roles))
    num_features = math.prod(lowered.message_shape)
    num_dst = plan.rowptr.numel() - 1
    device = plan.rowptr.device
    out = torch.zeros((num_dst, num_features), dtype=torch.float32, device=device)
    if reduce in ("max", "min") and plan.items[0].numel() and num_features:
        # rows of hub items start at -inf/+inf for their atomics; 64 items per program
        num_items = plan.items[0].shape[0]
        _prefill_kernel()[(triton.cdiv(num_items, 64),)](
            out, plan.items[0], plan.items[3], num_items, num_features,
            float("-inf") if reduce == "max" else float("inf"), BLOCK_I=64, BLOCK_F=_block_f(num_features, launch))
    kernel = _kernel(lowered, KernelSpec("forward", "dst", reduce))
    tensors = [*_prepare(args, roles), out, out, out, plan.rowptr, plan.col, plan.col, plan.perm, *plan.items]
    _launch(kernel, lowered, plan.items, tensors, num_features, launch)
    return out


def _grad_walks(layouts, needs_grad, reduce: str) -> dict:
    """Which walk computes each needed gradient. Sum/mean: SRC by source (transposed CSR, no
    atomics), DST by destination; EDGE and DENSE ride along with the walk that runs anyway (by
    destination when there is no SRC gradient). Max/min: everything by destination, where the
    output and cotangent rows are loaded once per item, and SRC rows get atomics only from the
    edges whose message is the max/min (about one per output element)."""
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
             launch=None) -> list:
    """Gradients of the arguments flagged in ``needs_grad`` (None for the others), in their dtypes.
    ``out`` is the forward result (float32, ``[num_dst, F]``) for max/min; recomputed when None."""
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
        res = forward(args, roles, plan, fn_key, reduce, launch) if out is None else \
            out.reshape(num_dst, num_features).float()
        count = torch.zeros_like(res)  # ties of hub rows (the gradient kernel counts light rows itself)
        kernel = _kernel(lowered, KernelSpec("count", "dst", reduce))
        tensors = [*_prepare(args, roles), res, count, count, plan.rowptr, plan.col, plan.col, plan.perm,
                   *plan.items]
        _launch(kernel, lowered, plan.items, tensors, num_features, launch)
    cot, res = cot.contiguous(), res.contiguous()
    if reduce not in ("max", "min"):
        count = cot  # unused
    prepared = _prepare(args, roles)
    grads = {}
    for i, layout in enumerate(layouts):
        if needs_grad[i] and not layout.is_bool:
            if layout.role == ROLE_DENSE:
                shape = (DENSE_SLOTS, layout.numel)
            else:
                shape = (args[i].shape[0], layout.numel)
            grads[i] = torch.zeros(shape, dtype=torch.float32, device=device)
    for walk, indices in _grad_walks(layouts, needs_grad, reduce).items():
        if not indices:
            continue
        kernel = _kernel(lowered, KernelSpec("grad", walk, reduce, indices))
        if walk == "dst":
            index = [plan.rowptr, plan.col, plan.col, plan.perm, *plan.items]
            items = plan.items
        else:
            index = [plan.t_rowptr, plan.t_col, plan.t_perm, plan.perm, *plan.t_items]
            items = plan.t_items
        tensors = [*prepared, *(grads[i] for i in indices), res, cot, count, *index]
        _launch(kernel, lowered, items, tensors, num_features, launch)
    result = []
    for i, arg in enumerate(args):
        if i not in grads:
            result.append(None)
            continue
        grad = grads[i].sum(0) if layouts[i].role == ROLE_DENSE else grads[i]
        result.append(grad.reshape(arg.shape).to(arg.dtype))
    return result
