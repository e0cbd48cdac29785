r"""Which kernel runs ``gnn_io::spmm`` on CUDA: cuSPARSE over the CSR, or the block-sparse Tensor-Core
kernel of ``kernels/spmm/block_sparse.py``, decided once per graph plan.

The block kernel gathers a ``TILE x F`` slab of ``X`` per tile (16 rows) where cuSPARSE gathers one row per
edge, so it moves fewer bytes exactly when a tile holds more than a few edges: locally dense graphs
(batched small graphs, communities in a good node order). The decision, per (plan, dtype, feature width):

1. ``GNN_IO_SPMM_PATH=auto|cusparse|block`` (default ``auto``); ``block`` forces it where it can run.
2. The block format of the plan is built on the device (destination rows in windows of 16 in the
   plan's order, ``gnn_inductor/plan/block_format.py``); it is kept only when every window is ``dense_ok`` (no
   duplicate ``(dst, src)`` pair: one cell cannot hold two edges; such graphs stay on cuSPARSE) and the
   mean edges per tile reach :data:`MIN_EDGES_PER_TILE` (:data:`MIN_EDGES_PER_TILE_HALF` in fp16/bf16). A
   tile's 16 columns are distinct sources with at least one edge each, so a tile holds 16 edges or more; 16
   means each gathered row serves one edge (a scattered sparse graph: the block kernel gathers as many rows as
   cuSPARSE, plus the empty cells), 24 that each serves 1.5 on average.
3. Both paths are timed once, forward plus the backward's ``dX`` product (median of :data:`TIMING_REPS` after a
   warm-up), and the block path is taken only when it is at least :data:`MIN_GAIN` faster: a measured choice, so
   the pick costs at most the timing noise against the better of the two (a forward-only timing picked cuSPARSE
   on a graph where the block step was 1.05x faster, H100, bf16 GCNConv). fp32 features use TF32 dots only where
   the user allowed TF32 (``torch.backends.cuda.matmul.allow_tf32`` / ``torch.set_float32_matmul_precision``), IEEE
   otherwise.

The decision is kept in the graph's state (:func:`~gnn_inductor.kernels.spmm.common.spmm_state`, slot
``decisions``: it lives and is invalidated with the CSR tensors) and listed in the rewrite report with the
attention decisions (family ``spmm``: statistics, format memory, the two measured forwards). The backward runs on
the transposed block format (built once, when the block path is taken): no atomics.

On CPU the op keeps its exact segment-sum path; under ``TRITON_INTERPRET=1`` a forced ``block`` runs the
kernel there too (tests).
"""
from __future__ import annotations

import logging
import statistics
import time

import torch
from gnn_inductor import config
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import decisions as plan_decisions
from gnn_inductor.plan import block_format
from gnn_inductor.kernels.runtime import progress
from gnn_inductor.kernels.spmm import block_sparse as block_sparse_spmm
from gnn_inductor.kernels.spmm.common import row_scale, spmm_state
from gnn_inductor.kernels.spmm.csr_product import csr_matmul
from gnn_inductor.kernels.runtime.cuda_graphs import CAPTURE_REASON, capturing, outside_graph_pool
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from torch import Tensor

log = logging.getLogger(__name__)
PATH_ENV = config.SETTINGS["spmm_path"].env
PATHS = config.SETTINGS["spmm_path"].choices
MIN_EDGES_PER_TILE = 24.0
# Half precision: timed from fewer edges per tile. On the H100 (bf16 GCNConv, the block model in its random
# order, 15.7 edges per tile) the block path's step took 2.23 ms against cuSPARSE's 2.35 (100 interleaved rounds;
# forward 1.20 against 1.16, the backward's dX product ahead), so the gate of 24 left a 1.05x win untimed. Below 12 a window's
# tiles are mostly partial (fewer than 12 distinct sources in its 16 rows).
MIN_EDGES_PER_TILE_HALF = 12.0


def min_edges_per_tile(precision: str) -> float:
    return MIN_EDGES_PER_TILE_HALF if precision == "half" else MIN_EDGES_PER_TILE
MIN_GAIN = 0.05
# From this many edges an automatic choice first estimates the edges per tile from sampled windows and builds the
# format only when the estimate reaches the gate: the build holds about 60 bytes per edge and a kilobyte per tile at
# its peak, so on a billion-edge R-MAT graph (H200, GCNConv) it did not fit beside the plan. Below it the exact
# build is cheap (256 MB at 4M edges) and the tests' graphs keep their exact statistics.
SAMPLE_FROM_EDGES = 1 << 22


def path_setting() -> str:
    return config.get("spmm_path")


def applies(x: Tensor) -> bool:
    """Whether the path choice is made for this call: CUDA, or the Triton interpreter with a forced path."""
    if x.is_cuda:
        return True
    return INTERPRETED and x.device.type == "cpu" and path_setting() == "block"


def decide(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str,
           transposed: tuple | None = None, state: graph_state.GraphState | None = None) -> plan_decisions.PathDecision:
    """The SpMM path for this plan, dtype and width (cached with the plan). ``transposed``: the plan's
    ``(t_values, t_rowptr, t_col)``, with which the timed comparison includes the backward's ``dX`` product;
    ``state``: the graph state of ``(rowptr, col)`` (:func:`~gnn_inductor.kernels.spmm.common.spmm_state`) when the
    caller has it."""
    setting = path_setting()
    precision = plan_decisions.precision_of(x.dtype)
    entry = spmm_state(rowptr, col) if state is None else state
    key = ("spmm", precision, x.dtype, x[0].numel() if x.shape[0] else 0, setting)
    if key not in entry.slot("decisions"):
        if capturing(x.device) and setting != "cusparse":  # no block build, no timing: cuSPARSE, decided later
            return plan_decisions.PathDecision("csr", CAPTURE_REASON, "spmm", precision)
        decision = outside_graph_pool(lambda: _decide(x, values, rowptr, col, reduce, setting, precision,
                                                      transposed), x.device)
        entry.slot("decisions")[key] = decision
        graph_state.record_decision(decision)
    return entry.slot("decisions")[key]


def _decide(x, values, rowptr, col, reduce, setting, precision, t_csr=None) -> plan_decisions.PathDecision:
    def csr(reason, **extra):
        return plan_decisions.PathDecision("csr", reason, "spmm", precision, **extra)

    if setting == "cusparse":
        return csr(f"{PATH_ENV}=cusparse")
    if col.numel() == 0 or x.shape[0] == 0:
        return csr("graph without edges")
    if setting == "auto" and col.numel() >= SAMPLE_FROM_EDGES:
        estimate = col.numel() / max(block_format.sampled_tiles(rowptr, col, x.shape[0]), 1.0)
        if estimate < min_edges_per_tile(precision):
            return csr(f"about {estimate:.1f} edges per 16 x 16 tile, estimated from "
                       f"{block_format.SAMPLED_WINDOWS} sampled windows (< {min_edges_per_tile(precision)}): the block "
                       "kernel would gather about as many rows as cuSPARSE, and the format is not built",
                       stats={"edges": int(col.numel()), "edges_per_tile_estimate": round(estimate, 2)})
    start = time.perf_counter()
    arange = torch.arange(col.numel(), device=col.device, dtype=torch.int32)
    blocks = block_format.build_block_format(rowptr, col, arange, x.shape[0])
    build_ms = (time.perf_counter() - start) * 1e3
    tiles = int(blocks.tile_edge.shape[0])
    stats = {"edges": int(col.numel()), "tiles": tiles, "edges_per_tile": round(col.numel() / max(tiles, 1), 2),
             "windows": int(blocks.window_rows.shape[0]), "dense_windows": int(blocks.dense_windows.shape[0]),
             "format_mb": round(plan_decisions.format_bytes(blocks) / 2**20, 1), "build_ms": round(build_ms, 1)}
    if stats["dense_windows"] < stats["windows"]:
        return csr("duplicate (dst, src) pairs: a window cell holds one edge", stats=stats)
    if setting == "auto" and stats["edges_per_tile"] < min_edges_per_tile(precision):
        return csr(f"{stats['edges_per_tile']} edges per 16 x 16 tile (< {min_edges_per_tile(precision)}): the block "
                   "kernel would gather about as many rows as cuSPARSE", stats=stats)
    transposed = block_format.transpose_block_format(blocks, x.shape[0])
    block = plan_decisions.PathDecision("block", f"{PATH_ENV}=block", "spmm", precision, stats=stats,
                                         blocks=blocks, transposed=transposed)
    if setting == "block":
        return block
    with progress.timed(log, f"SpMM: timing the block kernel against cuSPARSE ({stats['edges']:,} edges)"):
        measured = _measure(block, x, values, rowptr, col, reduce, t_csr)
    what = "forward and backward" if t_csr is not None else "forward"
    if measured["block"] < (1 - MIN_GAIN) * measured["cusparse"]:
        block.reason = (f"block kernel measured {measured['cusparse'] / measured['block']:.2f}x faster than "
                        f"cuSPARSE, {what} ({stats['edges_per_tile']} edges per tile)")
        block.measured_forward_ms = measured
        return block
    return csr(f"cuSPARSE measured faster or within {MIN_GAIN:.0%}, {what} ({stats['edges_per_tile']} edges per "
               "tile)", stats=stats, measured_forward_ms=measured)


def _measure(block, x, values, rowptr, col, reduce, t_csr) -> dict:
    """Milliseconds of each path's forward, plus its backward's ``dX`` product when ``t_csr`` (the plan's
    transposed CSR, which cuSPARSE's backward reads) is given. On the H100 (bf16 GCNConv on the block model)
    the block forward was 3% slower than cuSPARSE's, its step 1.05x faster, all of it in the backward; a
    forward-only choice took cuSPARSE there."""
    measured = {"cusparse": _time(lambda: csr_matmul(x, values, rowptr, col, None, (), reduce), x.device),
                "block": _time(lambda: forward(block, x, values, rowptr, reduce), x.device)}
    if t_csr is None:
        return measured
    t_values, t_rowptr, t_col = t_csr
    grad = torch.ones((rowptr.numel() - 1, *x.shape[1:]), dtype=x.dtype, device=x.device)
    scale = row_scale(rowptr, reduce, grad)

    def cusparse_backward():
        return csr_matmul(grad if scale is None else grad * scale, t_values, t_rowptr, t_col, None, ())
    measured["cusparse"] += _time(cusparse_backward, x.device)
    measured["block"] += _time(lambda: backward(block, grad, x, values, rowptr, reduce, [True, False]), x.device)
    return measured


TIMING_REPS = 10  # per path and pass at the first call (at 5, two plans of one graph picked different paths)


def _time(fn, device, reps: int = TIMING_REPS) -> float:
    fn()
    times = []
    for _ in range(reps):
        plan_decisions.sync(device)
        start = time.perf_counter()
        fn()
        plan_decisions.sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _flat_row_scale(rowptr: Tensor, reduce: str) -> Tensor | None:
    """The op's row scale (``kernels/spmm/common.py``), float32 and flat, as the block kernels read it."""
    scale = row_scale(rowptr, reduce, rowptr.new_empty((0,), dtype=torch.float32))
    return None if scale is None else scale.view(-1)


def _allow_tf32(decision) -> bool:
    return decision.precision == "tf32"


def forward(decision, x: Tensor, values: Tensor, rowptr: Tensor, reduce: str) -> Tensor:
    """``Y = s * (A x)`` on the block kernel (every window is dense: the whole output)."""
    return block_sparse_spmm.block_spmm_forward(x, values, decision.blocks, rowptr.numel() - 1,
                                                _allow_tf32(decision), _flat_row_scale(rowptr, reduce))


def backward(decision, grad_out: Tensor, x: Tensor, values: Tensor, rowptr: Tensor, reduce: str,
             needs_grad: list) -> tuple:
    """``(dX or None, dvalues or None)`` over the transposed block format."""
    return block_sparse_spmm.block_spmm_backward(
        grad_out, x, values, decision.blocks, decision.transposed, x.shape[0], _allow_tf32(decision),
        _flat_row_scale(rowptr, reduce), need_values_grad=bool(needs_grad[1]), need_x_grad=bool(needs_grad[0]))


def kernel_name() -> str:
    return ("path per graph at the first call (kernels/spmm/selector.py): cuSPARSE, or the block-sparse "
            "Tensor-Core SpMM where the graph is locally dense and it measured faster")
