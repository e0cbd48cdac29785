"""Launch tables and variant settings of the fused CSR attention kernels: the degree split, each kernel's measured
launch (tile elements and warps by family), which forward (``GNN_IO_ATTENTION_HEADS``) and which backward
(``GNN_IO_ATTENTION_BACKWARD``) run, and the kernels' name in the report.
"""
from __future__ import annotations

from gnn_inductor import config as settings
from gnn_inductor.kernels.runtime.launch import next_power_of_2

MAX_EDGES = 256          # the degree split: a program walks at most this many edges of one row
DENSE_GRAD_SLOTS = 32    # the att gradient is summed into this many slots, then reduced

HEADS_ENV = settings.SETTINGS["attention_heads"].env  # "all": one forward program per work item for every head
HEADS_VARIANTS = settings.SETTINGS["attention_heads"].choices
BACKWARD_ENV = settings.SETTINGS["attention_backward"].env  # split, atomic, one_pass_segment, mass; unset: auto
# one_pass_segment: split, GAT's dst pass folded into the src pass, the dst score terms' gradients stored per edge and
# summed over each destination's CSR row (no atomics on hub rows)
# mass: GAT's dst score terms' gradients from the forward's mass (kernels/attention/op.py's attention_forward_mass: a
# row sum in the D kernel, no per-edge term), where that op runs, else one_pass_segment
# auto (unset): mass, else one_pass_segment, for the GAT family; split for the others
BACKWARD_VARIANTS = settings.SETTINGS["attention_backward"].choices
# the variants that run the split passes over a source CSR (the op's backward builds one for them)
SOURCE_CSR_VARIANTS = ("auto", "split", "one_pass_segment", "mass")
# the variants under which GAT's forward makes the score-term mass where it can (kernels/attention/op.py)
MASS_VARIANTS = ("auto", "mass")

# Launch parameters to measure on the H100 (the defaults come from :func:`launch_config`).
AUTOTUNE_CONFIGS = [
    {"max_edges": 256, "block_e": 16, "num_warps": 2},
    {"max_edges": 256, "block_e": 32, "num_warps": 4},
    {"max_edges": 128, "block_e": 8, "num_warps": 1},
    {"max_edges": 512, "block_e": 32, "num_warps": 4},
    {"max_edges": 1024, "block_e": 64, "num_warps": 8},
]
# The all-heads forward at 4 heads x 32 channels (one [BLOCK_E, 128] tile per step).
ALL_HEADS_AUTOTUNE_CONFIGS = [
    {"max_edges": 256, "block_e": 8, "num_warps": 2},
    {"max_edges": 256, "block_e": 16, "num_warps": 4},
    {"max_edges": 256, "block_e": 32, "num_warps": 4},
    {"max_edges": 512, "block_e": 32, "num_warps": 8},
]


# Per-head forward launch: (tile elements, warps) by family, measured on the H100 (fp32, 4 heads x 32
# channels, RMAT 2^20 / 15.4M edges and 2^17 / 1.1M edges): most rows of a power-law
# graph have a handful of edges, so small edge blocks on one warp keep the lanes busy and many programs in
# flight. About 1024 elements (32 x 32 on 4 warps, the atomic backward's launch) took 1.4-2.0x longer on both
# graphs.
PER_HEAD_LAUNCH = {"gat": (256, 1), "gatv2": (256, 1), "dot": (128, 1)}


def launch_config(family: str, head_dim: int, phase: str = "forward") -> dict:
    """Block sizes of the per-head kernels by family, phase and head dim: the whole head in one tile row
    (``BLOCK_C``, a power of two of at least 16) and ``BLOCK_E`` edges. ``phase``: ``"forward"``
    (``BLOCK_E * BLOCK_C`` near the measured tile of :data:`PER_HEAD_LAUNCH`, ``BLOCK_E`` between 2 and 32) or
    ``"atomic"`` (the atomic backward: the earlier rule, about 1024 elements, not re-measured)."""
    block_c = max(16, next_power_of_2(head_dim))
    if phase == "atomic":
        block_e = max(8, min(32, 1024 // block_c))
        return {"block_e": block_e, "block_c": block_c, "num_warps": 2 if block_e * block_c <= 512 else 4}
    tile, warps = PER_HEAD_LAUNCH[family]
    return {"block_e": max(2, min(32, tile // block_c)), "block_c": block_c, "num_warps": warps}


# All-heads forward: (tile elements, warps) by family, measured on the H100 as PER_HEAD_LAUNCH (4 x 32: the
# forward took 3.1 / 3.5 / 4.0 ms for GAT / GATv2 / TransformerConv on RMAT 2^20 against 4.4 / 5.1 / 5.4 ms
# per head, and 0.47 / 0.52-0.59 / 0.53 ms against 0.68 / 0.69 / 0.73 ms on RMAT 2^17).
ALL_HEADS_FORWARD_LAUNCH = {"gat": (256, 1), "gatv2": (256, 2), "dot": (256, 2)}


# The split backward (all heads per program): ((tile elements, warps) of the dst pass, of the src pass) by family.
# All heads per program at one launch shared by both passes (256 elements on 1 warp for GAT, on 2 for GATv2 and
# TransformerConv: 2 edges per block at 4 x 32) took 5.25 / 8.77 / 8.94 ms for GAT / GATv2 / TransformerConv on the
# H100 (fp32, 4 heads x 32 channels, RMAT 2^20 / 15.4M edges; the backward alone, benchmarks/probe.py attn_launch)
# against 7.69 / 12.07 / 10.67 ms for a program per (item, head); whole layers, forward and backward, 13.78 / 20.41 /
# 25.90 ms against 16.24 / 24.30 / 27.61 ms. Each pass's own launch was then measured on the H200 (fp32, 4 x 32,
# RMAT 2^20, the whole backward timed with one pass's launch swept and the other's at that shared launch;
# benchmarks/probe.py --parts split_sweep): GAT's dst pass at 4 edges per block took the backward from 4.59 to
# 4.36 ms; GATv2's passes at 1 edge per block each 7.70 -> 7.21 (src) and 7.29 ms (dst); TransformerConv's dst
# pass at 1 edge 6.97 -> 6.59 ms (its src pass kept 2 edges on 2 warps: 1 edge took 7.05). The src pass gathers
# every edge's destination ``dout`` row, ``D`` and ``lse``; the dst pass reads them once per row. Whole layers ran
# 1.01-1.03x faster at these launches than at the shared one in both passes (H200, GAT, GATv2 and TransformerConv
# on RMAT 2^20 and 2^17, 10 interleaved rounds each).
SPLIT_BACKWARD_LAUNCH = {"gat": ((512, 1), (256, 1)), "gatv2": ((128, 1), (128, 1)), "dot": ((128, 1), (256, 2))}


def all_heads_launch_config(heads: int, head_dim: int, measured: tuple | None = None, min_block_c: int = 1,
                            min_block_e: int = 2) -> dict:
    """Block sizes of the all-heads kernels: every head in one tile row (``BLOCK_H x BLOCK_C``, each rounded up
    to a power of two, ``BLOCK_C`` at least ``min_block_c``). With ``measured = (tile elements, warps)`` (the
    forward's :data:`ALL_HEADS_FORWARD_LAUNCH`, the split backward's :data:`SPLIT_BACKWARD_LAUNCH`):
    ``BLOCK_E`` edges with ``BLOCK_E * BLOCK_H * BLOCK_C`` near that tile (between ``min_block_e`` and 32), the
    warps scaled with the tile. Without (the all-heads atomic backward, not re-measured): about 2048 elements."""
    block_h, block_c = next_power_of_2(heads), max(min_block_c, next_power_of_2(head_dim))
    width = block_h * block_c
    if measured is not None:
        tile, warps = measured
        block_e = max(min_block_e, min(32, tile // width))
        warps = min(8, warps * max(1, block_e * width // tile))
        return {"block_e": block_e, "block_h": block_h, "block_c": block_c, "num_warps": warps}
    block_e = max(8, min(32, 2048 // width))
    tile = block_e * width
    return {"block_e": block_e, "block_h": block_h, "block_c": block_c,
            "num_warps": 2 if tile <= 512 else 4 if tile <= 2048 else 8}


# a register cap (ptxas maxnreg) for the split backward's src pass, opt-in (0 or unset: none). H100, GATConv,
# 4 x 32, fp32 (probe part mass_launch): on RMAT 2^20 the src pass took 2.67 ms at 56 registers (55
# used, no spill) against 3.00 uncapped (61 used), 2.81 at 64, 3.06-3.29 at 48 and 40, and the step 9.80 against
# 9.91 ms (12 interleaved rounds, 92% won); but on the uniform graph of 16M edges the step took 12.15 against 12.09
# (8 rounds, 25% won) and on the grid 5.50 against 5.50. So there is no default cap.
SRC_MAXNREG_ENV = settings.SETTINGS["src_maxnreg"].env


def heads_variant(default: str = "all") -> str:
    """Which kernel runs: ``"all"`` (grid ``(items,)``, one program walks an item's edges once for every head)
    or ``"per_head"`` (grid ``(items, H)``), from the ``GNN_IO_ATTENTION_HEADS`` environment variable, read
    at each call; unset, ``default``: the forward runs all heads per program (measured faster on the H100),
    the atomic backward per head (its all-heads form is not measured)."""
    return settings.get("attention_heads") or default


def backward_variant() -> str:
    """Which backward the op runs: ``"auto"`` (default: ``"mass"`` where it runs, else ``"one_pass_segment"``,
    for the GAT family; ``"split"`` for the others), ``"split"``, ``"atomic"``, ``"one_pass_segment"`` (the split
    backward with the one-pass GAT form of :func:`kernels.attention.csr_backward.backward`) or ``"mass"``
    (kernels/attention/op.py's ``attention_forward_mass``), from the ``GNN_IO_ATTENTION_BACKWARD`` environment
    variable, read at each call (kernels/attention/csr_backward.py's docstring)."""
    return settings.get("attention_backward")


def kernel_name(family: str) -> str:
    """The CSR kernels of ``family`` under the current settings (for the report)."""
    heads = ", all heads per program (forward)" if heads_variant() == "all" else ""
    variant = backward_variant()
    if variant == "atomic":
        backward = "atomic backward"
    elif family == "gat" and variant in MASS_VARIANTS:
        backward = ("one-pass split backward (src pass over the transposed CSR, all heads per program); the dst "
                    "score terms' gradients from the forward's score-term mass, summed in the D kernel (float32 "
                    "with TF32 off; else stored per edge and summed per destination by the SpMM)")
    elif family == "gat" and variant == "one_pass_segment":
        backward = ("one-pass split backward (src pass over the transposed CSR, all heads per program, the dst "
                    "score terms' gradients stored per edge and summed per destination by the SpMM)")
    else:
        backward = "split backward (dst pass, src pass over the transposed CSR, all heads per program)"
    return (f"fused CSR attention (Triton, {family} family{heads}): online softmax, saved LSE, degree-split work "
            f"items, {backward}")
