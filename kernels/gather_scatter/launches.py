"""The compiled gather-scatter kernels and their launches, shared by the forward (``fused.py``) and backward
(``backward.py``) drivers.

- **Lowering cache**: an edge function lowered for the argument specs it is called with (:func:`lowering`), or
  the :class:`codegen.Unsupported` reason it cannot be (the op runs the reference then).
- **Kernel cache**: the source of a :class:`template.KernelSpec` generated, imported and jitted once per process
  (:func:`kernel`), behind :func:`fast_launch`.
- **Launch**: grid ``(num_items, cdiv(F, BLOCK_F))``; ``BLOCK_E``, ``BLOCK_F``, ``num_warps`` from :data:`LAUNCH`
  (:data:`AUTOTUNE_CONFIGS` lists the candidates to measure on the GPU). Where the plan's hub items are known and
  the graph is large enough for it to pay (or under CUDA graphs; :func:`light_launch`), a walk launches twice
  (:func:`launch_items`): the hub items with :data:`LAUNCH`, the light items with :data:`LIGHT_LAUNCH` (smaller
  tiles on one warp: a light row has a few edges) or by the *rows* kernel with :data:`ROWS_LAUNCH`.
"""
from __future__ import annotations

import torch

from gnn_inductor import config
from gnn_inductor.kernels.gather_scatter import codegen
from gnn_inductor.kernels.gather_scatter.template import PREFILL, PRELUDE, KernelSpec, kernel_source
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE
from gnn_inductor.plan.work_items import hub_item_count

# Launch parameters. Measured on an H100 (fp32, F=128, identity message, RMAT 2^20 / 16M edges and 2^17 / 1.1M
# edges, split at 128): 8 edges x 128 features on 2 warps was the fastest of AUTOTUNE_CONFIGS for sum and max,
# forward and backward (e.g. max forward 3.1 ms against 4.5 ms for 8 x 64 on one warp; 32 x 64 on 4 warps 7.1 ms).
# ``block_f`` None: the features rounded up to a power of two, between 16 and MAX_BLOCK_F.
LAUNCH = {"block_e": 8, "block_f": None, "num_warps": 2}
# The forward's light items (rows at or below the split threshold, a few edges each) in a launch of their own: 4 edges
# x 128 features on one warp. Measured on the H100 (a sweep of launches, the kernel timed alone, max,
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
# on the H100 (a sweep of launches, the kernel timed alone, max, fp32, F=128): 2 rows on one warp was its
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


# ---------------------------------------------------------------------------------------------
# Lowering cache
# ---------------------------------------------------------------------------------------------

_LOWERED: dict = {}


def argument_specs(args, roles) -> list:
    """``(role, feature shape, dtype)`` per argument, what :func:`lowering` lowers an edge function for (a dense
    argument's whole shape)."""
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
    found = lowered_members([fn_keys] if isinstance(fn_keys, str) else list(fn_keys), argument_specs(args, roles))
    return str(found) if isinstance(found, codegen.Unsupported) else None


# ---------------------------------------------------------------------------------------------
# Kernel cache and launches
# ---------------------------------------------------------------------------------------------

_KERNELS: dict = {}


def kernel(lowered, spec: KernelSpec):
    """The jitted kernel of ``spec`` (source generated and imported once per process; ``lowered``
    objects, one or a tuple of them, live in ``_LOWERED`` for the process, so their ids are stable keys)."""
    key = (tuple(map(id, lowered)) if isinstance(lowered, tuple) else id(lowered), spec)
    if key not in _KERNELS:
        _KERNELS[key] = fast_launch(codegen.load_kernels(PRELUDE + kernel_source(lowered, spec)).kernel)
    return _KERNELS[key]


def prefill_kernel():
    """The kernel setting the rows of hub items to a reduction's start value before their atomics."""
    if "prefill" not in _KERNELS:
        _KERNELS["prefill"] = fast_launch(codegen.load_kernels(PRELUDE + PREFILL).prefill)
    return _KERNELS["prefill"]


def prepare(args, roles):
    """Contiguous arguments, bool masks viewed as bytes (no copy)."""
    prepared = []
    for a in args:
        a = a.contiguous()
        prepared.append(a.view(torch.uint8) if a.dtype == torch.bool else a)
    return prepared


def block_f(num_features: int, params) -> int:
    """``BLOCK_F`` of the launch parameters ``params``."""
    return params["block_f"] or max(16, min(MAX_BLOCK_F, next_power_of_2(num_features)))


def launch(kernel, num_programs: int, tensors, num_features, params):
    """``kernel`` on the grid ``(num_programs, cdiv(F, BLOCK_F))`` (work items, or blocks of them: the rows
    kernel)."""
    features = block_f(num_features, params)
    if num_programs == 0 or num_features == 0:
        return
    grid = (num_programs, cdiv(num_features, features))
    kernel[grid](*tensors, num_features, BLOCK_E=params["block_e"], BLOCK_F=features, num_warps=params["num_warps"])


def light_rows(num_items: int) -> bool:
    """Whether the forward's light items, where they get a launch of their own, run the *rows* kernel
    (:data:`ROWS_LAUNCH`: several light rows per program, ``template.ROWS_KERNEL``) instead of the item kernel with
    :data:`LIGHT_LAUNCH`. ``GNN_IO_GS_LIGHT_ROWS`` (read at each call): ``1`` always, ``0`` never, unset from
    :data:`LIGHT_LAUNCH_MIN_ITEMS` work items (the plan's ``num_items``), where it measured faster."""
    forced = config.get("gs_light_rows")
    return num_items >= LIGHT_LAUNCH_MIN_ITEMS if forced is None else forced


def light_launch(kind: str, num_items: int) -> bool:
    """Whether ``kind`` (``forward``, ``backward``) launches its light items with :data:`LIGHT_LAUNCH`, from
    ``GNN_IO_GS_LIGHT_LAUNCH`` (read at each call): ``auto`` (the default) the forward where it measured faster, from
    :data:`LIGHT_LAUNCH_MIN_ITEMS` work items or under CUDA graphs; ``forward`` the forward always; ``both`` the
    forward and the gradient walks; ``off`` neither (one launch over every item)."""
    value = config.get("gs_light_launch")
    if value == "auto":
        return kind == "forward" and (num_items >= LIGHT_LAUNCH_MIN_ITEMS or config.get("cuda_graphs"))
    return value == "both" or value == kind


def launch_items(kernel, items, tensors, num_features, params, light: bool, rows=None) -> None:
    """``kernel`` over the work ``items`` (appended to ``tensors``). ``light``, with the items' hub count known:
    the degree split, the hub items (they lead, so their indices within the launch are the plan's) with ``params``
    and the light items with :data:`LIGHT_LAUNCH`, or by the ``rows`` kernel (``template.ROWS_KERNEL``) with
    :data:`ROWS_LAUNCH` where one is given; else one launch over every item."""
    num_items = items[0].shape[0]
    hubs = hub_item_count(items) if light else None
    if hubs is None:
        launch(kernel, num_items, [*tensors, *items], num_features, params)
        return
    if hubs:
        launch(kernel, hubs, [*tensors, *(t[:hubs] for t in items)], num_features, params)
    if num_items == hubs:
        return
    light_items = [*tensors, *(t[hubs:] for t in items)]
    if rows is None:
        launch(kernel, num_items - hubs, light_items, num_features, LIGHT_LAUNCH)
    else:
        launch(rows, cdiv(num_items - hubs, ROWS_LAUNCH["block_e"]), [*light_items, num_items - hubs], num_features,
               ROWS_LAUNCH)
