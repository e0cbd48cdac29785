r"""Which attention kernel runs, per graph and per row window: the fused CSR kernel, the block-sparse
Tensor-Core kernel, or a hybrid of both. Decided once per (graph plan, family, precision,
heads x channels) at the first CUDA call, cached with the plan's tensors, and shown in the report.

**Paths.** ``csr``: the fused CSR kernels (``csr_forward``, ``csr_backward``) over the plan's work items. ``block``: ``block_dot`` (dot
family, TransformerConv) over the block format: row windows of 16 destinations, tiles of 16 condensed
source columns. ``hybrid``: each window goes to the kernel the cost model prefers for it; the block kernel
runs over the chosen windows (forward, and the backward's query pass; the source pass over the transposed
format of those windows' edges), the CSR kernels over the work items of the other rows. Both write
disjoint rows of ``out`` / ``lse``, their gradients add up. ``block`` is ``hybrid`` with every window
that has no duplicate edge on Tensor Cores (a window with a repeated (dst, src) pair always goes to CSR:
one cell holds one edge).

**Cost model** (forward + backward, calibrated on the H100 by ``python -m benchmarks.probe``; the
constants and the measurements they come from are in :data:`CALIBRATION`, per family and precision, with
refits for other GPUs in :data:`DEVICE_CALIBRATION` picked by device name, ``GNN_IO_CALIBRATION`` to override),
scaled by ``heads x channels / 128``:

.. math::
    t_\mathrm{csr}(w) = (a + g \cdot T_0 / E) \cdot E_w + b \cdot R_w, \qquad
    t_\mathrm{block}(w) = c \cdot T_w + d \cdot R_w

with ``E_w`` the edges, ``T_w`` the tiles and ``R_w`` the rows of window ``w``, plus a fixed cost per call
for each kernel that runs. ``T_0 / E`` is the graph's tiles per edge in its own node order (the identity
order's block format): the CSR kernel runs in that order whatever order the block format takes, and its gathers
cost more where a window's neighbours scatter over many tiles (TransformerConv in fp32 on the H100: 7.68 ms on
the block model in random order, 6.8M edges and 0.064 tiles per edge, against 7.95 on the 20,000 batched graphs,
16.3M edges and 0.017 tiles per edge). A window is eligible for Tensor Cores when it has no
duplicate pair and at most :data:`MAX_WINDOW_TILES` tiles (a hub window would serialise in one program; the CSR
kernel splits hubs).
The candidates are: all CSR; every eligible window on the block kernel; each eligible window where
``t_block(w) < t_csr(w)``; the cheapest total wins. Where that is block or hybrid, or CSR ahead of it by less
than :data:`PREDICTED_DOUBT` (and no path is forced), the forward and backward of the candidate and of the CSR
kernels are timed at the first call (interleaved, median of 3 each: :func:`_paired_ms`), and the candidate is
kept only when it is at least :data:`MEASURED_MARGIN` faster; the decision records both times.

**Precision.** The block kernel runs fp32 inputs only where the user allowed TF32
(``torch.backends.cuda.matmul.allow_tf32`` or ``torch.set_float32_matmul_precision("high")``),
otherwise the CSR path runs: IEEE fp32 dots on Tensor Cores are 3x slower than TF32. fp16 / bf16 inputs
run their dots in their dtype with fp32 accumulation.

**Node order.** The rows of a window may be any rows: the block format is built along a node order held
in its index arrays only (outputs and gradients stay in the user's order, no node tensor moves). The
policy (``GNN_IO_REORDER``, ``gnn_inductor/plan/orders.py``) considers ``none``, ``degree``, ``rcm`` (and
``partition`` where forced): an order is built when its predicted cost (:data:`ORDER_COST_US_PER_EDGE`
times the edges) is below the best possible gain over the expected calls (``GNN_IO_EXPECTED_CALLS``,
default 1000), and applied when ``expected_calls * (t_none - t_order) > build_ms`` and ``t_none - t_order`` is
at least :data:`ORDER_MIN_GAIN` of ``t_none``. When one is applied, the forward and backward of both orders are
timed once and the decision records predicted and measured gain; the order is dropped again (the identity order
runs) unless the measured gain is at least :data:`ORDER_MIN_GAIN` too. Where the cheapest order misses that
floor, no other order is tried: the identity order runs.

``GNN_IO_ATTENTION_PATH=auto|csr|block|hybrid`` forces a path (``block`` and ``hybrid`` also for fp32
without TF32, with IEEE dots).
"""
from __future__ import annotations

import functools
import logging
import re
import time

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.plan import block_format
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import orders as reorder
from gnn_inductor.plan.decisions import PathDecision, format_bytes, precision_of, sync
from gnn_inductor.kernels.attention import block_dot as block_sparse, block_gat as block_sparse_gat
from gnn_inductor.kernels.attention import csr_backward, csr_forward
from gnn_inductor.config import SettingError  # noqa: F401  (this module's API: a bad path or calibration)
from gnn_inductor.kernels.runtime import progress
from gnn_inductor.kernels.runtime.cuda_graphs import CAPTURE_REASON, capturing, outside_graph_pool
from gnn_inductor.plan.work_items import PADDING

log = logging.getLogger(__name__)
PATH_ENV = config.SETTINGS["attention_path"].env
PATHS = config.SETTINGS["attention_path"].choices
CALLS_ENV = config.SETTINGS["expected_calls"].env
DEFAULT_EXPECTED_CALLS = config.default("expected_calls")
MAX_WINDOW_TILES = 64
MEASURED_MARGIN = 0.05   # a block or hybrid pick must measure this much faster than CSR to be kept
# Within this much of the CSR kernel's predicted time, a block or hybrid candidate is timed against CSR
# (MEASURED_MARGIN) instead of dropped: on the TU batch in bf16 GATConv the model put the block path 10% behind CSR
# (2.699 against 2.461 ms); the first call measured CSR 1.22x slower, and the layer ran 1.11x faster on blocks than
# on CSR forced, interleaved (H200).
PREDICTED_DOUBT = 0.15
# An order is applied only where its predicted gain and then its gain measured at the first call are each at least
# this share of the op's forward+backward without it. On the H200 the uniform graph took the degree order for a
# predicted 2% (0.19 ms) and measured 1.00x with it, interleaved; forced block paths took orders for
# predicted 0.05-5.4%, and on MUSAE-github and RMAT 2^17 measured 1.31-1.56x slower.
ORDER_MIN_GAIN = 0.05

# Forward+backward cost at 4 heads x 32 channels on the H100 (torch 2.11, Triton 3.6), least-squares fits of
# `python -m benchmarks.probe --parts build,attention` through the op (refit by `python -m benchmarks.fit_attention`):
# nanoseconds per edge / row / tile,
# milliseconds per call. CSR (all heads per program forward and backward): four graphs (block
# model, 20,000 batched graphs, RMAT 2^17, squirrel); a per-row term does not fit (the fit went negative),
# the fixed term is the op's per-call work. Block: the block model in three orders (435k to 155k tiles) and the
# batched graphs (its predictions match the times measured with the all-heads CSR kernel: 8.3 ms predicted
# and measured for TransformerConv in TF32 on the block model in RCM order). GATv2 has no entry: its block
# kernel (a 16 x 16 x C score tile per step) measured 3 to 10 times slower than the CSR kernel on every graph, so it
# stays on CSR.
# The model's pick of block or hybrid is then checked by one timing against CSR (:func:`_measured_against_csr`).
# The block terms are fit for the dot kernels taking every head in one program (op 1.32x faster) and the GAT
# kernels without zero fills and casts: non-negative least squares over the block model (none and
# RCM order) and the 20,000 batched graphs (none and RCM), per family and precision, from
# one probe run on an H200, each graph's times brought to this table's
# H100 scale by the CSR kernel's predicted/measured ratio on that graph in the same call; the block fixed term is
# capped 0.1 ms under the CSR one (a free intercept fit 2.1-2.5 ms in half, above CSR's, which sent every small
# graph to CSR whatever its tiles). The fits are within 4% of the four points.
# The dot family's fp32 CSR kernel (used in TF32 and IEEE) and its TF32 block kernel are fit on four graphs
# (H100, op forward+backward): the CSR kernel per edge plus per tile
# of the identity order (``csr_per_identity_tile``, the locality term above), within 11% of the block model, the
# batched graphs, RMAT 2^17 and squirrel (a per-edge term alone missed by up to 70%: 5.74 ms predicted against 7.68
# on the block model, 9.87 against 7.95 on the batched graphs); the block kernel from its all-block rows (the block
# model and the batched graphs, identity and RCM orders), within 3%, no per-row term (a 3.0 ns per-row term
# predicted 7.97 ms for 5.78 on the batched graphs). The half-precision constants match these graphs within 10%.
_CSR_DOT = {"csr_per_edge": 0.201, "csr_per_identity_tile": 10.9, "csr_per_row": 0.0, "csr_fixed_ms": 1.59}
_CSR_DOT_HALF = {"csr_per_edge": 0.466, "csr_per_row": 0.0, "csr_fixed_ms": 1.97}
_CSR_GAT = {"csr_per_edge": 0.277, "csr_per_row": 0.0, "csr_fixed_ms": 2.23}
_CSR_GAT_HALF = {"csr_per_edge": 0.243, "csr_per_row": 0.0, "csr_fixed_ms": 2.07}
CALIBRATION = {
    "dot": {
        "tf32": {**_CSR_DOT, "block_per_tile": 16.3, "block_per_row": 0.0, "block_fixed_ms": 1.33},
        "half": {**_CSR_DOT_HALF, "block_per_tile": 6.3, "block_per_row": 0.3, "block_fixed_ms": 1.87},
        "ieee": {**_CSR_DOT, "block_per_tile": 100.0, "block_per_row": 4.3, "block_fixed_ms": 0.56},
    },
    "gat": {
        "tf32": {**_CSR_GAT, "block_per_tile": 8.8, "block_per_row": 1.1, "block_fixed_ms": 1.78},
        "half": {**_CSR_GAT_HALF, "block_per_tile": 8.3, "block_per_row": 0.4, "block_fixed_ms": 1.97},
        "ieee": {**_CSR_GAT, "block_per_tile": 95.0, "block_per_row": 3.3, "block_fixed_ms": 0.91},
    },
}
# Refits for other GPUs, matched on the CUDA device's name (:func:`calibration`); an entry replaces its (family,
# precision) constants whole, anything it lacks keeps the H100 table above. The H200 has the dot family's TF32
# terms refit (``python -m benchmarks.fit_attention`` over an H200 probe's ``probe.json``,
# ``--precision tf32 --block-per-row``: the op forward+backward; the CSR terms from the block model, the 20,000 batched
# graphs, RMAT 2^17 and squirrel in fp32, the block terms from the two dense graphs in identity and RCM order, the
# only all-block rows; 4 points for 3 terms each), every point within 1.8%. With the H100 terms the H200's CSR
# kernel ran 28% under its prediction on the block model (5.58 against 7.71 ms) and the predicted RCM gain was 2.4x
# the measured one (2.40 against 0.97 ms). Its half-precision terms still pick right and predict the
# order gain within 6% (1.21 against 1.13 ms); a refit of those (block 4.36 ns per tile, fixed 2.50 ms
# over CSR's 2.32) predicted that gain 25% short and stays out. The GAT family has no H200 probe.
DEVICE_CALIBRATION = {
    "H200": {
        "dot": {
            "tf32": {"csr_per_edge": 0.247, "csr_per_identity_tile": 3.054, "csr_per_row": 0.0, "csr_fixed_ms": 2.548,
                     "block_per_tile": 13.077, "block_per_row": 0.346, "block_fixed_ms": 1.539},
        },
    },
}
# auto (by device name), H100 (the base table), or a DEVICE_CALIBRATION key (config.py lists them)
CALIBRATION_ENV = config.SETTINGS["calibration"].env
# Seconds of CPU/GPU work to build an order, per edge (measured on the device's CPU: rcm 0.07-0.26 us
# per edge on the block model and RMAT 2^20; METIS into parts of 64 nodes 1.5 us per edge on the block
# model, 13-32 us on RMAT graphs): only the predicted cost decides whether the order is tried at all.
ORDER_COST_US_PER_EDGE = {"none": 0.0, "degree": 0.01, "rcm": 0.3, "partition": 15.0}
AUTO_ORDERS = ("none", "degree", "rcm")


def path_setting() -> str:
    return config.get("attention_path")


def expected_calls() -> int:
    return config.get("expected_calls")


def _entry(rowptr: Tensor, col: Tensor, perm: Tensor) -> graph_state.GraphState:
    """The graph state this selector keeps its orders, formats, decisions and transposed CSRs in."""
    return graph_state.state_of(rowptr, col, perm)


def _order(entry: graph_state.GraphState, name: str):
    if name not in entry.slot("orders"):
        rowptr, col, _ = entry.tensors
        if name == "none":
            entry.slot("orders")[name] = (None, 0.0)
        else:
            reorder.load_libraries(name)  # once per process: not this graph's build cost
            sync(rowptr.device)
            start = time.perf_counter()
            order = reorder.CANDIDATES[name](rowptr, col).to(rowptr.device)
            sync(rowptr.device)
            seconds = time.perf_counter() - start
            progress.done(log, f"node order {name!r} ({col.numel():,} edges)", seconds)
            entry.slot("orders")[name] = (order, seconds * 1e3)
    return entry.slot("orders")[name]


def _format(entry: graph_state.GraphState, name: str) -> block_format.BlockFormat:
    if name not in entry.slot("formats"):
        rowptr, col, perm = entry.tensors
        order, _ = _order(entry, name)
        entry.slot("formats")[name] = block_format.build_block_format(rowptr, col, perm, rowptr.numel() - 1, order)
    return entry.slot("formats")[name]


def calibration_name(device) -> str:
    """Which table prices this device: ``GNN_IO_CALIBRATION`` when set (``H100`` for :data:`CALIBRATION`, or a key
    of :data:`DEVICE_CALIBRATION`), else the first key of :data:`DEVICE_CALIBRATION` in the CUDA device's name, else
    ``H100``. A CPU device (the interpreter's tests) is priced by the H100 table."""
    setting = config.get("calibration")
    if setting != "auto":
        return setting
    if device is None or torch.device(device).type != "cuda":
        return "H100"
    index = torch.device(device).index
    return _table_for(_cuda_name(torch.cuda.current_device() if index is None else index))


@functools.lru_cache(maxsize=None)
def _cuda_name(index) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=None)
def _table_for(name: str) -> str:
    """The first key of :data:`DEVICE_CALIBRATION` that is a whole word of the device name ("H200" is not "GH200", a
    Grace Hopper module with another memory system), else ``H100``; once per name (:func:`decide` asks every call)."""
    return next((key for key in DEVICE_CALIBRATION if re.search(rf"\b{key}\b", name)), "H100")


def calibration(family: str, precision: str, device=None) -> dict:
    """The cost model's constants for ``family`` and ``precision`` on ``device`` (:func:`calibration_name`); a
    family without its own (GATv2, run only when forced) borrows GAT's."""
    family = family if family in CALIBRATION else "gat"
    refit = DEVICE_CALIBRATION.get(calibration_name(device), {}).get(family, {}).get(precision)
    return refit if refit is not None else CALIBRATION[family][precision]


def window_costs(blocks: block_format.BlockFormat, rowptr: Tensor, precision: str, scale: float,
                 family: str = "dot", identity_tiles_per_edge: float = 0.0) -> tuple:
    """``(csr_ms [W], block_ms [W], edges [W], tiles [W])`` per row window (module docstring);
    ``identity_tiles_per_edge`` is the graph's ``T_0 / E`` (:func:`identity_tiles_per_edge`)."""
    k = calibration(family, precision, rowptr.device)
    rows = blocks.window_rows.long()
    valid = rows >= 0
    degree = (rowptr[1:] - rowptr[:-1]).long()
    edges = torch.where(valid, degree[rows.clamp(min=0)], 0).sum(1)
    row_count = valid.sum(1)
    tiles = (blocks.tile_ptr[1:] - blocks.tile_ptr[:-1])
    per_edge = k["csr_per_edge"] + k.get("csr_per_identity_tile", 0.0) * identity_tiles_per_edge
    csr = (per_edge * edges + k["csr_per_row"] * row_count) * scale * 1e-6
    block = (k["block_per_tile"] * tiles + k["block_per_row"] * row_count) * scale * 1e-6
    return csr, block, edges, tiles


def identity_tiles_per_edge(entry: graph_state.GraphState) -> float:
    """The graph's tiles per edge in its own node order (the CSR cost's locality term), from the identity order's
    block format (built if it is not there), kept with the plan entry."""
    if "identity_tiles_per_edge" not in entry.slots:
        edges = max(1, entry.tensors[1].numel())
        entry.slots["identity_tiles_per_edge"] = _format(entry, "none").stats["tiles"] / edges
    return entry.slots["identity_tiles_per_edge"]


def _choose_windows(blocks, rowptr, precision, scale, path: str, family: str, locality: float = 0.0) -> tuple:
    """``(chosen [W] bool, predicted {csr, block, hybrid} ms)`` for one block format; ``locality`` is the graph's
    :func:`identity_tiles_per_edge`."""
    k = calibration(family, precision, rowptr.device)
    csr, block, edges, tiles = window_costs(blocks, rowptr, precision, scale, family, locality)
    eligible = blocks.dense_ok & (tiles <= MAX_WINDOW_TILES) & (tiles > 0)

    def total(on_block):
        """Predicted ms: each kernel that runs adds its fixed cost per call."""
        rest = ~on_block & (edges > 0)
        return (float(torch.where(on_block, block, 0.0).sum()) + (k["block_fixed_ms"] if bool(on_block.any()) else 0.0)
                + float(torch.where(rest, csr, 0.0).sum()) + (k["csr_fixed_ms"] if bool(rest.any()) else 0.0))
    by_window = eligible & (block < csr)
    predicted = {"csr": total(torch.zeros_like(eligible)), "block": total(eligible), "hybrid": total(by_window)}
    # "hybrid": windows by their own cost, or every eligible window when that is cheaper overall (one kernel's
    # fixed cost less)
    if path == "block" or predicted["block"] <= predicted["hybrid"]:
        predicted["hybrid"] = predicted["block"]
        return eligible, predicted
    return by_window, predicted


def _restricted(blocks: block_format.BlockFormat, chosen: Tensor) -> block_format.BlockFormat:
    return blocks._replace(dense_ok=chosen, dense_windows=torch.nonzero(chosen).flatten().to(torch.int32))


def _csr_items(blocks, chosen: Tensor, items: list, num_rows: int) -> list:
    """The plan's work items whose rows are not in a chosen window (padding items dropped)."""
    on_block = torch.zeros(num_rows + 1, dtype=torch.bool, device=chosen.device)
    rows = blocks.window_rows[chosen].flatten().long()
    on_block[torch.where(rows >= 0, rows, num_rows)] = True
    item_row, _, _, shared = items
    keep = ~on_block[item_row.long()] & (shared != PADDING)
    index = torch.nonzero(keep).flatten()
    return [t.index_select(0, index).contiguous() for t in items]


def decide(layout, rowptr: Tensor, col: Tensor, perm: Tensor, items: list, dtype: torch.dtype,
           forward_fn=None) -> PathDecision:
    """The path for this call's graph and attention (cached per plan); ``forward_fn(decision, backward=False)`` runs
    the forward (and with ``backward``, the backward) of a candidate decision, for the one-off timings, both
    forward+backward: the pick against CSR and, when a reordering is applied, the order's gain."""
    form = layout.form
    precision = precision_of(dtype)
    setting = path_setting()
    entry = _entry(rowptr, col, perm)
    key = (form.family, precision, layout.heads, layout.channels, setting, config.get("reorder"),
           calibration_name(rowptr.device))
    if key in entry.slot("decisions"):
        return entry.slot("decisions")[key]
    if capturing(rowptr.device) and setting != "csr":  # no format build, no timing: the CSR kernel, decided later
        return PathDecision("csr", CAPTURE_REASON, form.family, precision)
    decision = outside_graph_pool(lambda: _decide(entry, layout, items, precision, setting, forward_fn),
                                  rowptr.device)
    entry.slot("decisions")[key] = decision
    graph_state.record_decision(decision)
    return decision


def _not_block(layout, precision: str, setting: str) -> str | None:
    if setting == "csr":
        return f"{PATH_ENV}=csr"
    family = layout.form.family
    if family not in ("dot",) + block_sparse_gat.FAMILIES:
        return f"{family} family: no block-sparse kernel for it"
    if family not in CALIBRATION and setting != "block":
        return (f"{family} family: its block-sparse kernel measured 3-10x slower than the CSR kernel on the H100 "
                f"(run it with {PATH_ENV}=block to compare)")
    reason = block_sparse.dot_form_reason(layout) if family == "dot" else block_sparse_gat.gat_form_reason(layout)
    if reason is not None:
        return reason
    if precision == "ieee" and setting == "auto":
        return "fp32 inputs without TF32 allowed (torch.backends.cuda.matmul.allow_tf32): IEEE dots on Tensor " \
               "Cores lose to the CSR kernel"
    return None


def _decide(entry: graph_state.GraphState, layout, items: list, precision: str, setting: str, forward_fn) -> PathDecision:
    family = layout.form.family
    reason = _not_block(layout, precision, setting)
    if reason is not None:
        return PathDecision("csr", reason, family, precision)
    rowptr, col, _ = entry.tensors
    num_edges = col.numel()
    scale = layout.heads * layout.channels / 128
    mode = "block" if setting == "block" else "hybrid"

    forced = reorder.forced_order()
    if forced in ("off", "none"):
        names = ["none"]
    elif forced is not None:
        names = [forced]
    else:
        names = ["none"]
    candidates = {}
    locality = identity_tiles_per_edge(entry)
    for name in names:
        candidates[name] = _choose_windows(_format(entry, name), rowptr, precision, scale, mode, family, locality)
    if forced is None:
        base = candidates["none"][1][mode]
        calls = expected_calls()
        for name in AUTO_ORDERS[1:]:
            predicted_build_ms = ORDER_COST_US_PER_EDGE[name] * num_edges * 1e-3
            if predicted_build_ms < calls * base * 0.9:
                candidates[name] = _choose_windows(_format(entry, name), rowptr, precision, scale, mode, family,
                                                   locality)
        best = min(candidates, key=lambda n: candidates[n][1][mode] * calls + _order(entry, n)[1])
        gain = base - candidates[best][1][mode]
        if best != "none" and (calls * gain <= _order(entry, best)[1] or gain < ORDER_MIN_GAIN * base):
            best = "none"
    else:
        best = names[0]
    order_build = {n: _order(entry, n)[1] for n in candidates if n != "none"}
    timed_later = forward_fn is not None
    decision = _assembled(entry, best, candidates, mode, setting, items, family, precision, order_build, timed_later)
    sources_before = set(entry.slot("csr_by_src"))
    dropped = ""
    if best != "none" and decision.path != "csr" and forward_fn is not None and forced is None:
        with progress.timed(log, f"{family} attention: timing the {best} order against none"):
            timed = _measure_order_gain(entry, decision, forward_fn, layout, items, precision, scale, mode)
        without = next(v for k, v in timed.items() if k.startswith("none"))
        if timed[f"{best} fwd+bwd"] <= without * (1 - ORDER_MIN_GAIN):
            entry.slot("formats").pop("none", None)  # rebuilt for the timing: memory, not kept with the order
        else:  # the identity order's format, built for the timing, serves the decision
            decision = _assembled(entry, "none", candidates, mode, setting, items, family, precision, order_build,
                                  timed_later)
            dropped = (f"; the {best} order dropped: measured {timed[f'{best} fwd+bwd']:.3f} ms with it against "
                       f"{without:.3f} without (under {ORDER_MIN_GAIN:.0%} gained)")
            decision.reason += dropped
        decision.measured_forward_ms = timed
    if decision.path != "csr" and setting == "auto" and forward_fn is not None:
        with progress.timed(log, f"{family} attention: timing the {decision.path} path against CSR"):
            decision = _measured_against_csr(entry, decision, forward_fn)
        if dropped and not decision.reason.endswith(dropped):  # CSR won: the order's record stays in the reason
            decision.reason += dropped
    if decision.path != "csr":  # a source CSR the timings' CSR backward built (once for both): not used, memory
        for key in set(entry.slot("csr_by_src")) - sources_before:
            del entry.slot("csr_by_src")[key]
    return decision


def _assembled(entry: graph_state.GraphState, best: str, candidates: dict, mode: str, setting: str, items: list, family: str,
               precision: str, order_build: dict, timed_later: bool) -> PathDecision:
    """The decision for order ``best``: its block format restricted to the windows the cost model chose, and the
    transposed format and CSR items that run with it; or the CSR decision where no window was chosen, or (left to
    the chooser) where the CSR kernel is predicted faster. With ``timed_later`` (a first call that can time), a
    candidate behind CSR by less than :data:`PREDICTED_DOUBT` is built instead, for ``_measured_against_csr`` to
    time against CSR."""
    rowptr = entry.tensors[0]
    num_rows = rowptr.numel() - 1
    chosen, predicted = candidates[best]
    blocks = _format(entry, best)
    for name in [n for n in entry.slot("formats") if n != best]:  # the losing orders' formats: memory, not kept
        del entry.slot("formats")[name]
    n_chosen = int(chosen.sum())
    stats = {"windows": blocks.stats["windows"], "tiles": blocks.stats["tiles"],
             "mean_tile_fill": blocks.stats["mean_tile_fill"],
             "duplicate_window_fraction": blocks.stats["duplicate_window_fraction"],
             "block_windows": n_chosen, "format_bytes": format_bytes(blocks),
             "calibration": calibration_name(rowptr.device)}
    predicted_all = {f"{mode}[{n}]": c[1][mode] for n, c in candidates.items()}
    predicted_all["csr"] = predicted["csr"]
    in_doubt = timed_later and predicted[mode] < predicted["csr"] * (1 + PREDICTED_DOUBT)
    if n_chosen == 0 or (setting == "auto" and predicted[mode] >= predicted["csr"] and not in_doubt):
        # the format only served the prediction: kept, it held 0.9 GB on the block model (GAT, H200)
        entry.slot("formats").clear()
        return PathDecision("csr", "cost model: the CSR kernel is predicted faster on every window"
                            if n_chosen == 0 else "cost model: the CSR kernel is predicted faster",
                            family, precision, "none", stats, predicted_all, order_build)
    order, _ = _order(entry, best)
    restricted = _restricted(blocks, chosen)
    transposed = block_format.transpose_block_format(restricted, num_rows, order)
    path = "block" if n_chosen == blocks.stats["windows"] else "hybrid"
    csr_items = None if path == "block" else _csr_items(blocks, chosen, items, num_rows)
    if setting != "auto":
        why = f"{PATH_ENV}={setting}"
    elif predicted[mode] >= predicted["csr"]:
        why = (f"cost model: the CSR kernel predicted faster by {predicted[mode] / predicted['csr'] - 1:.0%}, "
               f"within PREDICTED_DOUBT ({PREDICTED_DOUBT:.0%}): {path} ({n_chosen} of "
               f"{blocks.stats['windows']} windows on Tensor Cores) timed against it")
    else:
        why = f"cost model: {n_chosen} of {blocks.stats['windows']} windows predicted faster on Tensor Cores"
    return PathDecision(path, why, family, precision, best, stats, predicted_all, order_build,
                        blocks=restricted, transposed=transposed, csr_items=csr_items)


def _paired_ms(device, runs: dict) -> dict:
    """``{name: ms}``: the median of 3 timed calls of each of ``runs`` (name -> callable) after one warm-up each,
    the candidates interleaved round by round (A B A B ...), so a drift of the GPU's clocks or of the allocator
    over the timing hits every candidate alike (wall clock, synchronised)."""
    times = {name: [] for name in runs}
    for i in range(4):
        for name, run in runs.items():
            sync(device)
            start = time.perf_counter()
            run()
            sync(device)
            if i:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(t)[1] for name, t in times.items()}


def _measured_against_csr(entry: graph_state.GraphState, decision: PathDecision, forward_fn) -> PathDecision:
    """The cost model's block or hybrid pick (or a candidate within :data:`PREDICTED_DOUBT` behind CSR), kept only
    when its training step (forward and backward of the op) measures at least :data:`MEASURED_MARGIN` faster than
    the CSR kernels' on this graph (timed once, at the first call); else the CSR decision, with both times
    recorded. The model's constants drift whenever a kernel changes (when the CSR kernels became 2-4x faster,
    the block path the model still predicted faster measured 1.2-2.3x slower), so the choice is checked where it is
    made. The backward is timed too: the choice is made for training
    steps, and the two paths' backwards differ more than their forwards (op forward+backward on the block model,
    H200: block 2.20 ms against CSR's 3.67)."""
    device = entry.tensors[0].device
    csr = PathDecision("csr", "timing", decision.family, decision.precision)
    measured = _paired_ms(device, {"csr": lambda: forward_fn(csr, backward=True),
                                   decision.path: lambda: forward_fn(decision, backward=True)})
    decision.measured_forward_ms = {**decision.measured_forward_ms,
                                    **{f"{k} fwd+bwd (vs csr)": v for k, v in measured.items()}}
    if measured[decision.path] * (1 + MEASURED_MARGIN) <= measured["csr"]:
        return decision
    entry.slot("formats").clear()  # not used: memory
    return PathDecision("csr", f"measured at the first call: the CSR forward+backward {measured['csr']:.3f} ms "
                        f"against {decision.path} {measured[decision.path]:.3f} ms (the cost model's candidate: "
                        f"{decision.path})", decision.family, decision.precision, "none", decision.stats,
                        decision.predicted_ms, decision.order_build_ms, decision.measured_forward_ms)


def _measure_order_gain(entry, decision: PathDecision, forward_fn, layout, items, precision, scale, mode) -> dict:
    """Forward+backward time with the chosen order and without (:func:`_paired_ms`), once: the measured gain, in
    the unit of the predicted one. Without the order, what runs is what the cost model predicted for the identity
    order (``hybrid[none]``): its windows on the block kernel and the other rows on the CSR kernel, or, where it
    picks no window, the CSR path alone (key ``"none fwd+bwd (csr)"``). A hybrid of zero
    windows timed there would run its CSR rows on the hybrid's atomic backward (14.8 ms against the CSR path's
    7.5 on the block model, TransformerConv in TF32): a gain 16x the predicted one that no path would give. The
    identity order's format stays in ``entry.slot("formats")`` for the caller: dropped with a kept order, reused where the
    order is dropped."""
    rowptr = entry.tensors[0]
    blocks = _format(entry, "none")
    chosen, _ = _choose_windows(blocks, rowptr, precision, scale, mode, decision.family,
                                identity_tiles_per_edge(entry))
    num_rows = rowptr.numel() - 1
    if bool(chosen.any()):
        restricted = _restricted(blocks, chosen)
        # the backward runs too: the source pass needs the transposed format of the kept windows (identity order)
        plain = PathDecision("hybrid", "timing", decision.family, precision, blocks=restricted,
                             transposed=block_format.transpose_block_format(restricted, num_rows),
                             csr_items=_csr_items(blocks, chosen, items, num_rows))
        name = "none fwd+bwd"
    else:
        plain, name = PathDecision("csr", "timing", decision.family, precision), "none fwd+bwd (csr)"
    return _paired_ms(rowptr.device, {n: lambda c=candidate: forward_fn(c, backward=True)
                                      for n, candidate in ((name, plain), (f"{decision.order} fwd+bwd", decision))})


def run_forward(decision: PathDecision, layout, args, roles, rowptr: Tensor, col: Tensor, perm: Tensor,
                score_key: str, message_key: str, eps: float, max_edges: int) -> tuple:
    """``(out, lse)`` of a ``block`` or ``hybrid`` decision: the block kernel over its windows, the CSR
    kernel over the rest (disjoint rows, so the two results add)."""
    forward = block_sparse.dot_forward if decision.family == "dot" else block_sparse_gat.gat_forward
    out, lse = forward(args, roles, perm, score_key, message_key, decision.blocks, rowptr.numel() - 1, eps,
                       decision.precision == "tf32", layout.dropout)
    if decision.csr_items is not None and decision.csr_items[0].numel():
        csr_out, csr_lse = csr_forward.forward(layout, rowptr, col, perm, eps, decision.csr_items, max_edges)
        out += csr_out
        lse += csr_lse
    return out, lse


def run_backward(decision: PathDecision, layout, grad_out: Tensor, delta: Tensor, lse: Tensor, args, roles,
                 rowptr: Tensor, col: Tensor, perm: Tensor, score_key: str, message_key: str, needs_grad,
                 max_edges: int, pack: dict | None = None):
    """Gradients of a ``block`` or ``hybrid`` decision (the two kernels' contributions summed; both regenerate
    the forward's dropout mask from ``layout.dropout``); ``delta`` is ``D = <dout, out>`` per (row, head).
    ``pack`` (kernels/attention/op.py's ``attention_backward_packed``): where only the dot-product block kernels
    run, they store the gradients into it (``block_sparse.dot_backward``); a hybrid's are summed, then copied."""
    hybrid = decision.csr_items is not None and decision.csr_items[0].numel()
    if decision.family == "dot":
        grads = block_sparse.dot_backward(grad_out, delta, lse, args, roles, perm, score_key, message_key,
                                          decision.blocks, decision.transposed, needs_grad,
                                          decision.precision == "tf32", layout.dropout, None if hybrid else pack)
    else:
        grads = block_sparse_gat.gat_backward(grad_out, delta, lse, args, roles, perm, score_key, message_key,
                                              decision.blocks, decision.transposed, needs_grad,
                                              decision.precision == "tf32", layout.dropout)
    if hybrid:
        csr = csr_backward.backward(layout, grad_out, delta, lse, rowptr, col, perm, needs_grad,
                                    decision.csr_items, max_edges)
        grads = [a if b is None else (b if a is None else a + b) for a, b in zip(grads, csr)]
    return grads


def kernel_name() -> str:
    return ("path per graph at the first call (cost model, kernels/attention/selector.py): fused CSR, "
            "block-sparse Tensor-Core for the dot family in TF32/half, or a hybrid by row window")
