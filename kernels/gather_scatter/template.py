"""The Triton source of the fused gather-scatter kernels: templates of whole kernel bodies with named holes.

Each kernel kind (``fused.py`` and ``backward.py`` describe what they compute) has one template below; a hole on
a line of its own (``$loads``) takes a block of lines, indented as the hole is (none where the block is empty), a
hole inside a line (``$params``) a string: :func:`fill`. The blocks that depend on the edge function (its argument
layouts, its message and VJP lines from :mod:`codegen`) come from :class:`arguments.Arguments` and the functions
below the templates. :func:`kernel_source` fills the template of a :class:`KernelSpec`; ``launches.py`` jits the source.

Every atomic is relaxed: they only combine partial results, ordering comes from the kernel boundaries.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

from gnn_inductor.kernels.gather_scatter import codegen
from gnn_inductor.kernels.gather_scatter.arguments import Arguments
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC

@dataclass(frozen=True)
class KernelSpec:
    kind: str            # "forward", "rows", "count" or "grad"
    walk: str            # "dst" (CSR) or "src" (transposed CSR)
    reduce: str          # forward: its members' reductions joined by "+" (a label; ``members`` holds them)
    grads: tuple = ()    # argument indices whose gradients this kernel writes
    members: tuple = ()  # forward: (reduce, index of its edge function) of each output, all folded in one walk
    accumulate: bool = False  # grad: a stored gradient element adds to what its buffer holds (the gradients
    #                           of the earlier members of a gather_scatter_multi; atomics add anyway)


def fill_lines(template: str, **holes) -> list:
    """The lines of ``template`` with its holes filled: a line that is only ``$name`` with a list value takes
    that block of lines (each indented as the hole), any other ``$name`` the string value."""
    lines = []
    for line in template.strip("\n").split("\n"):
        name = line.strip()[1:]
        if line.strip().startswith("$") and isinstance(holes.get(name), list):
            indent = line[:len(line) - len(line.lstrip())]
            lines.extend(indent + block_line for block_line in holes[name])
        else:
            lines.append(string.Template(line).substitute(holes))
    return lines


def fill(template: str, **holes) -> str:
    """:func:`fill_lines` joined into source text."""
    return "\n".join(fill_lines(template, **holes)) + "\n"


def indented(lines: list) -> list:
    return ["    " + line for line in lines]


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------

PRELUDE = "import triton\nimport triton.language as tl\n\n\n"

# the item (or block of items) and feature slice of a program, the layouts' feature offsets; every kernel starts so
_HEADER = """
@triton.jit
def kernel($params):
    item = tl.program_id(0)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < num_features
    $offsets"""

# BLOCK_E light items per program, one destination row each (its tile row), BLOCK_F features; step s loads the
# s-th edge of every row at once, so a program keeps BLOCK_E rows' gathers in flight where the item kernel keeps
# one row's. Each member folds its messages per row (no reduction across tile rows) and its result is stored:
# light items are whole rows (no atomics). Padding items
# (and a hub item, should one reach this launch) store nothing.
ROWS_KERNEL = _HEADER + """
    items = item * BLOCK_E + tl.arange(0, BLOCK_E)
    imask = items < num_items
    node = tl.load(item_row + items, mask=imask, other=0).to(tl.int64)
    start = tl.load(item_start + items, mask=imask, other=0)
    end = tl.load(item_end + items, mask=imask, other=0)
    stored = imask & (tl.load(item_shared + items, mask=imask, other=1) == 0)
    m2 = stored[:, None] & fmask[None, :]
    zero = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    $loads
    $accumulators
    steps = tl.max(tl.where(stored, end - start, 0), axis=0)
    for step in range(0, steps):
        k = start + step
        emask = stored & (k < end)
        m2 = emask[:, None] & fmask[None, :]
        other = tl.load(nbr + k, mask=emask, other=0).to(tl.int64)
        $edge_loads
        $messages
        $folds
    $degree
    offsets = node[:, None] * num_features + f[None, :]
    m2 = stored[:, None] & fmask[None, :]
    $stores
"""

# one work item (a node's edges from start to end) per program: the forward, the tie count and the gradient walks.
# ``$walked`` is WALKED, under a guard where the kernel skips the item (the count kernel on a light item)
WALK_KERNEL = _HEADER + """
    node = tl.load(item_row + item).to(tl.int64)
    start = tl.load(item_start + item)
    end = tl.load(item_end + item)
    shared = tl.load(item_shared + item)
    $walked
"""

WALKED = """
$invariant
$accumulators
zero = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
$ties
for block_start in range(start, end, BLOCK_E):
    $edge_block
    $step
$epilogue
"""

# one block of the item's edges: indices, per-edge argument tiles
EDGE_BLOCK = """
k = block_start + tl.arange(0, BLOCK_E)
emask = k < end
m2 = emask[:, None] & fmask[None, :]
other = tl.load(nbr + k, mask=emask, other=0).to(tl.int64)
$edges
$loads
"""

# the row of a hub item's tie counts: its row's first item (hub items lead, a row's items are adjacent and all but
# its last ``count_width`` entries wide), or the node where the hub items are not known (count_width 0); row 0 for
# the padding items (no edges), which reach the hub branch of the gradient kernel
COUNT_ROW = ("crow = tl.where(shared != 1, 0, tl.where(count_width > 0, "
             "item - (start - tl.load(rowptr + node)) // tl.maximum(count_width, 1), node))")

# max/min gradient: ties per (node, feature), counted here for a light row (one item, its edges are about to be read
# again by the loop) and read from the count kernel's result for a hub row. scatter_reduce(include_self=False)
# still counts its zero base as a tie where the result is 0 (PyG eager does the same): messages equal to a 0 max
# share the gradient with it
TIES = """
if shared == 0:
    ties = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        $edge_block
        $forward
        msg = $forward_result + zero
        ties = ties + tl.where(m2 & (msg == res), 1.0, 0.0)
    count = tl.sum(ties, axis=0)[None, :]
else:
    $count_row
    count = tl.load(CNT + crow * num_features + f[None, :], mask=fmask[None, :], other=0.0)
cot = tl.where(count > 0, cot / tl.maximum(count + tl.where(res == 0.0, 1.0, 0.0), 1.0), 0.0)
"""

# a hub item combines into its row by atomics, a light item stores
FORWARD_EPILOGUE = """
$degree
$results
offsets = node * num_features + f
if shared == 1:
    $atomics
elif shared == 0:
    $stores
"""

# COT is the count here (RES the forward result it compares with)
COUNT_EPILOGUE = """
result = tl.sum(acc, axis=0)
$count_row
if shared == 1:
    tl.atomic_add(COT + crow * num_features + f, result, mask=fmask, sem='relaxed')
"""

# a full-layout gradient of the walk's node: atomics from a hub item, a store (or load, add, store) from a light one
NODE_GRAD = """
r{i} = tl.sum(acc{i}, axis=0)
if shared == 1:
    tl.atomic_add(G{i} + node * {row} + f, r{i}, mask=fmask, sem='relaxed')
elif shared == 0:
    tl.store(G{i} + node * {row} + f, {stored}, mask=fmask)
"""

PREFILL = '''
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

_WALK_PARAMS = ["rowptr", "nbr", "pos", "perm", "item_row", "item_start", "item_end", "item_shared", "num_features",
                "BLOCK_E: tl.constexpr", "BLOCK_F: tl.constexpr"]
_INIT = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
_FOLD = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}
_ATOMIC = {"sum": "tl.atomic_add", "mean": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}


def _signature(lowered: codegen.Lowered, spec: KernelSpec) -> list:
    params = [f"A{i}" for i in range(len(lowered.layouts))] + [f"G{i}" for i in spec.grads]
    if spec.kind in ("forward", "rows"):  # one result per member
        walk = _WALK_PARAMS if spec.kind == "forward" else [*_WALK_PARAMS[:8], "num_items", *_WALK_PARAMS[8:]]
        return params + [f"RES{j}" for j in range(len(spec.members))] + walk
    return params + ["RES", "COT", "CNT", "count_width"] + _WALK_PARAMS


# ---------------------------------------------------------------------------------------------
# Filling the templates
# ---------------------------------------------------------------------------------------------

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


def kernel_source(lowered, spec: KernelSpec) -> str:
    """Source of one ``triton.jit`` kernel named ``kernel`` (``fused.py`` and ``backward.py`` for the walks).
    ``lowered`` is the :class:`codegen.Lowered` edge function or, for the forward, a tuple
    of them (the members' distinct functions, sharing their argument layouts: ``spec.members`` index it)."""
    fns = lowered if isinstance(lowered, tuple) else (lowered,)
    arguments = Arguments(fns[0], spec.accumulate)
    header = {"params": ", ".join(_signature(fns[0], spec)), "offsets": arguments.offsets()}
    if spec.kind == "rows":
        return fill(ROWS_KERNEL, **header, **_rows_holes(fns, spec, arguments))
    return fill(WALK_KERNEL, **header, **_walk_holes(fns, spec, arguments))


def _rows_holes(fns, spec: KernelSpec, a: Arguments) -> dict:
    loads, edge_loads = [], []
    for i, layout in enumerate(a.layouts):
        if layout.role == ROLE_DENSE:
            loads.append(f"a{i} = {a.load(i, None, None)}")
        elif layout.role == ROLE_DST:
            loads.append(f"a{i} = {a.load(i, 'node', 'stored')}")
    if a.needs_edge:
        edge_loads.append("edge = tl.load(perm + k, mask=emask, other=0).to(tl.int64)")
    for i, layout in enumerate(a.layouts):
        if layout.role == ROLE_EDGE:
            edge_loads.append(f"a{i} = {a.load(i, 'edge', 'emask')}")
        elif layout.role == ROLE_SRC:
            edge_loads.append(f"a{i} = {a.load(i, 'other', 'emask')}")
    means = any(reduce == "mean" for reduce, _ in spec.members)
    return {
        "loads": loads,
        "accumulators": [f"acc{j} = tl.full([BLOCK_E, BLOCK_F], {_INIT[reduce]}, tl.float32)"
                         for j, (reduce, _) in enumerate(spec.members)],
        "edge_loads": edge_loads,
        "messages": _message_lines(fns),
        "folds": [_fold_line(j, reduce, k) for j, (reduce, k) in enumerate(spec.members)],
        "degree": ["degree = tl.maximum(end - start, 1).to(tl.float32)[:, None]"] if means else [],
        "stores": [f"tl.store(RES{j} + offsets, acc{j}{' / degree' if reduce == 'mean' else ''}, mask=m2)"
                   for j, (reduce, _) in enumerate(spec.members)],
    }


def _edge_block(spec: KernelSpec, a: Arguments, node_role: int) -> list:
    edges = []
    if spec.walk == "dst":
        if a.needs_edge:
            edges.append("edge = tl.load(perm + k, mask=emask, other=0).to(tl.int64)")
    else:
        edges.append("position = tl.load(pos + k, mask=emask, other=0).to(tl.int64)")
        if a.needs_edge:
            edges.append("edge = tl.load(perm + position, mask=emask, other=0).to(tl.int64)")
    loads = []
    for i, layout in enumerate(a.layouts):
        if layout.role == ROLE_EDGE:
            loads.append(f"a{i} = {a.load(i, 'edge', 'emask')}")
        elif layout.role in (ROLE_SRC, ROLE_DST) and layout.role != node_role:
            loads.append(f"a{i} = {a.load(i, 'other', 'emask')}")
    return fill_lines(EDGE_BLOCK, edges=edges, loads=loads)


def _walk_holes(fns, spec: KernelSpec, a: Arguments) -> dict:
    """The item kernel (forward), the tie count of hub rows (count) and the gradient walks (grad)."""
    lowered, layouts = a.lowered, a.layouts
    node_role = ROLE_DST if spec.walk == "dst" else ROLE_SRC
    max_like = spec.reduce in ("max", "min")
    accumulated = [i for i in spec.grads if layouts[i].role in (node_role, ROLE_DENSE)]

    # loop-invariant loads: the item's node and dense arguments, its rows of the cotangent and result
    invariant = []
    for i, layout in enumerate(layouts):
        if layout.role == ROLE_DENSE:
            invariant.append(f"a{i} = {a.load(i, None, None)}")
        elif layout.role == node_role:
            invariant.append(f"a{i} = {a.load(i, 'node', None)}")
    if spec.walk == "dst":
        if spec.kind == "grad":
            invariant.append("cot = tl.load(COT + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")
        if spec.kind == "count" or (spec.kind == "grad" and max_like):
            invariant.append("res = tl.load(RES + node * num_features + f[None, :], mask=fmask[None, :], other=0.0)")

    accumulators = []
    if spec.kind == "forward":
        for j, (reduce, _) in enumerate(spec.members):
            accumulators.append(f"acc{j} = tl.full([BLOCK_E, BLOCK_F], {_INIT[reduce]}, tl.float32)")
    elif spec.kind == "count":
        accumulators.append("acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)")
    accumulators.extend(f"acc{i} = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)" for i in accumulated)

    edge_block = _edge_block(spec, a, node_role)
    ties = []
    if spec.kind == "grad" and max_like:
        ties = fill_lines(TIES, edge_block=edge_block, forward=list(lowered.forward),
                          forward_result=lowered.forward_result, count_row=COUNT_ROW)

    step = []
    if spec.kind == "forward":
        # each distinct edge function once per edge block; each member's accumulator folds its messages
        step.extend(_message_lines(fns))
        step.extend(_fold_line(j, reduce, k) for j, (reduce, k) in enumerate(spec.members))
    elif spec.kind == "count" or max_like:
        step.extend(lowered.forward)
        step.append(f"msg = {lowered.forward_result} + zero")
    if spec.kind == "count":
        step.append("acc = acc + tl.where(m2 & (msg == res), 1.0, 0.0)")
    elif spec.kind == "grad":
        step.extend(_grad_step(spec, a, accumulated, max_like))

    epilogue = []
    if spec.kind == "forward":
        epilogue = _forward_epilogue(spec)
    elif spec.kind == "count":
        epilogue = fill_lines(COUNT_EPILOGUE, count_row=COUNT_ROW)
    for i in accumulated:
        epilogue.extend(_accumulated_grad(a, i))

    walked = fill_lines(WALKED, invariant=invariant, accumulators=accumulators, ties=ties, edge_block=edge_block,
                        step=step, epilogue=epilogue)
    if spec.kind == "count":
        # only hub rows (light rows count their ties in the gradient kernel): the other programs end after the
        # item's loads (the launch covers the hub items alone where their number is known, hub_item_count)
        walked = ["if shared == 1:", *indented(walked)]
    return {"walked": walked}


def _grad_step(spec: KernelSpec, a: Arguments, accumulated: list, max_like: bool) -> list:
    """The gradient walk's lines per edge block, after its messages: the live pairs' VJP, each gradient's
    contributions accumulated (the walk's node, dense) or added at the other end of the edge (atomics, issued only
    for live edges: for max/min about one per output element) or at the edge (one write per edge)."""
    lines = []
    if spec.walk == "src":
        lines.append("cot = tl.load(COT + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
        if max_like:
            lines.append("res = tl.load(RES + other[:, None] * num_features + f[None, :], mask=m2, other=0.0)")
    lines.append("live = m2 & (msg == res)" if max_like else "live = m2")  # edges whose message reached the output
    lines.append("g = tl.where(live, cot, 0.0)")
    lines.extend(a.lowered.vjp)
    for i in spec.grads:
        if i in accumulated:
            lines.append(f"acc{i} = acc{i} + {a.contribution(i)}")
            continue
        role = a.layouts[i].role
        lines.append(f"c{i} = {a.contribution(i)}")
        lines.append(a.add_grad(i, "edge" if role == ROLE_EDGE else "other", "emask",
                                store=a.kinds[i] == "full" and role == ROLE_EDGE))
    return lines


def _forward_epilogue(spec: KernelSpec) -> list:
    degree = []
    if any(reduce == "mean" for reduce, _ in spec.members):
        degree.append("degree = tl.maximum(tl.load(rowptr + node + 1) - tl.load(rowptr + node), 1).to(tl.float32)")
    results, atomics, stores = [], [], []
    for j, (reduce, _) in enumerate(spec.members):
        results.append(f"result{j} = {_FOLD[reduce]}(acc{j}, axis=0)")
        if reduce == "mean":
            results.append(f"result{j} = result{j} / degree")
        atomics.append(f"{_ATOMIC[reduce]}(RES{j} + offsets, result{j}, mask=fmask, sem='relaxed')")
        stores.append(f"tl.store(RES{j} + offsets, result{j}, mask=fmask)")
    return fill_lines(FORWARD_EPILOGUE, degree=degree, results=results, atomics=atomics, stores=stores)


def _accumulated_grad(a: Arguments, i: int) -> list:
    """The lines adding the walk's accumulated contributions to argument ``i`` (its node's row, or dense) into
    ``G{i}``."""
    row = a.layouts[i].numel
    if a.layouts[i].role == ROLE_DENSE:
        return [f"r{i} = tl.sum(acc{i}, axis=0)", *a.dense_grad(i)]
    if a.kinds[i] == "full":
        stored = f"tl.load(G{i} + node * {row} + f, mask=fmask, other=0) + r{i}" if a.accumulate else f"r{i}"
        return NODE_GRAD.strip("\n").format(i=i, row=row, stored=stored).split("\n")
    if a.kinds[i] == "scalar":
        return [f"r{i} = tl.sum(acc{i}, axis=0)", f"tl.atomic_add(G{i} + node, tl.sum(r{i}, axis=0), sem='relaxed')"]
    return [f"r{i} = tl.sum(acc{i}, axis=0)",
            f"tl.atomic_add(G{i} + node * {row} + off{i}, r{i}, mask=fmask, sem='relaxed')"]
