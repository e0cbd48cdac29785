"""When a rewrite pays: the cost model the patterns consult before they fire on a device.

On CUDA, the gnn_io SpMM (Triton or cuSPARSE, plus the custom-op call it costs) beats Inductor's
fused gather-scatter only from a few million edges on; below that, launch and dispatch overhead
dominate and Inductor's own kernels are as fast or faster (docs/benchmarks/results.md, H100). The
structure work (self loops, normalisation, CSR) is hoisted into the graph plan either way.

The fused gather-scatter kernels (SAGEConv max, GINEConv, any pointwise message) have the same
shape of trade-off: on the H100 they lost to Inductor on a 6.6k-edge graph (2.2-3.2 ms against
1.4-1.9 ms forward+backward, launch and dispatch bound) and at 0.4-0.6M edges, won in 4 of 5 measurements at
1.1M edges and from 4.2M edges on (13.7 against 53 ms at 15.4M); below
``GATHER_SCATTER_MIN_EDGES_CUDA`` they are left to Inductor.

Fused attention in float32 has a threshold per family (TransformerConv, GATConv, GATv2Conv; with TF32 allowed,
TransformerConv and GATConv only); the
backend then hands the whole graph to Inductor as Dynamo captured it (``pipeline.attention_declined``),
since its edge softmax was rewritten before the family was known.

On CPU the ops run their exact references (segment reductions in CSR order, written for semantics), which
are slower than Inductor's C++ code for the same layers: 0.48-0.95x of ``torch.compile``'s speed on 10k-396k
edges, every family (on a 2-core CPU). So on CPU every aggregation is left to Inductor, with the
structure work still hoisted into the plan, unless ``GNN_IO_CPU_REWRITE=1`` (what the project's tests set, to
check the rewrites' semantics on CPU) or ``GNN_IO_FORCE=1``.

Under ``GNN_IO_CUDAGRAPHS=1`` the edge thresholds are off (:func:`replayed`): they exist because below them a
step is bound by the per-call CPU work of the ops, which a CUDA graph replay does not have, and with it the fused
kernels' smaller GPU time decides. Measured (H100, float32, 128 features, forward+backward, interleaved
A/B, both replayed, the declined graph's Inductor kernels against the fused ones): ca-AstroPh / 396k edges
TransformerConv 1.36 -> 1.16 ms, GATConv 1.64 -> 1.18, SAGEConv max 1.14 -> 0.73, GCNConv 0.91 -> 0.87; Cora /
10.6k edges TransformerConv 0.75 -> 0.74, SAGEConv max 1.05 -> 1.04.

``GNN_IO_FORCE=1`` rewrites whatever matches, whatever the size (for tests and comparisons);
``GNN_IO_SPMM_MIN_EDGES``, ``GNN_IO_GS_MIN_EDGES`` and ``GNN_IO_ATTENTION_MIN_EDGES`` move the thresholds (also
under CUDA graphs, where they are set).
"""
from __future__ import annotations

from typing import Optional

from gnn_inductor import config
from gnn_inductor.rewrite_report import Declined

# Measured on the H100 (docs/benchmarks/results.md): SAGE-mean and GIN lose to Inductor at 0.2M-1.1M
# edges and win from 4M; GCN wins from 0.2M on (its normalisation is hoisted either way).
SPMM_MIN_EDGES_CUDA = config.default("spmm_min_edges")
# H100, SAGEConv max, harness latency per step, the ops called through ``torch.ops``: ours lost at ca-AstroPh /
# 396k edges (2.51 against 1.39 ms), MUSAE-github / 578k (2.19 against 1.85) and RMAT 2^17 / 1.1M (3.89 against
# 3.37), won at soc-Slashdot0902 / 1.1M (2.05 against 3.01) and from 4.2M edges on (grid 11.45 against 15.68, RMAT
# 2^20 13.70 against 53.39). Mid-size graphs are bound by the ops' per-call CPU work. With the compiled graphs
# calling the ops' direct twins (gnn_inductor/passes/direct_ops.py), forced against Inductor at 1.1M edges, three runs on
# two H100 machines: RMAT 2^17 2.72 / 2.76 / 2.35 ms against 3.52 / 3.46 / 3.41, soc-Slashdot0902 2.52 against 3.07.
# So the fused kernels take graphs from 1M edges; the 0.4-0.6M graphs that lost stay with Inductor.
GATHER_SCATTER_MIN_EDGES_CUDA = config.default("gs_min_edges")


# Fused CSR attention in float32 without TF32, against Inductor's own kernels, H100, forward+backward, 128 features,
# 4 heads, the forward at its measured launch (kernels/attention/csr_*.py). Small graphs are bound by per-call CPU
# work (custom-op dispatch, launches), where Inductor's fused code wins; large ones by memory, where ours wins:
# - TransformerConv: Inductor wins from Cora (2.13 against 5.63 ms) to ca-AstroPh (2.27 against 4.70); ours
#   8.6x ahead at 4.2M edges. The all-heads split backward moves the crossover down: at RMAT 2^17 / 1.1M edges
#   ours takes 3.55 ms against Inductor's 4.32 (5.59 against 4.38 without it). Threshold 1M.
#   On the H200, interleaved, Inductor's time over the fused path's: RMAT 2^17 / 1.09M edges 1.09x (0.91x and 1.00x
#   in two H100 runs), soc-Slashdot0902 / 1.09M 0.97x (1.04x on the H100), RMAT 2^17 / 1.41M 1.19x, RMAT 2^18 /
#   1.93M 1.32x: ties at 1.1M edges, wins from 1.4M, so the threshold is 1M.
# - GATConv: Inductor wins on the small graphs (Cora 1.74 against 3.10) and failed to launch at 4.2M and 15.4M
#   edges ("CUDA driver error: invalid argument"). At 1.1M edges the measurements fall on both sides of
#   the line: RMAT 2^17 2.64-3.18 ms ours against 2.93-3.11, soc-Slashdot0902 3.83-3.91 against 2.63.
#   Threshold 1.5M, above both.
# - GATv2Conv: Inductor wins on Cora (1.85 against 4.37) and ca-AstroPh / 396k edges (3.85 against 4.77); ours
#   from MUSAE-github / 578k edges on (3.19 against 6.40; 4.41 against 10.19 at 1.1M).
# Half precision is declined only for bfloat16 TransformerConv on small graphs (:data:`HALF_ATTENTION_MIN_EDGES_CUDA`).
# TF32 is declined as float32 is for TransformerConv and GATConv (:data:`TF32_DECLINED_FAMILIES`): TF32 changes the
# dense GEMMs, which both sides run alike, and the fused kernels do not pay back the per-call CPU work of small
# graphs. H200, TF32, forward+backward, the harness's isolated runs, Inductor against gnn_io's pick and its fastest
# mode:
# - TransformerConv: road-luxembourg-osm / 239k edges 1.85 against 2.55 (block) and 2.14 (block
#   forced), ca-AstroPh / 396k 2.14 against 3.23 and 2.52, MUSAE-github / 578k 2.17 against 3.65 and 2.36; RMAT
#   2^17 / 1.09M 3.76 against 3.24 and 2.86.
# - GATConv: road-luxembourg-osm 2.39 against 2.79 and 2.63, ca-AstroPh 1.75 against 2.42 and 2.00,
#   MUSAE-github 1.73 against 3.09 and 2.04; RMAT 2^17 / 1.09M (131k rows, taken by the mid-size rule below) 2.43
#   against 2.60 and 2.56.
# - GATv2Conv stays on the fused kernels in TF32 at every size measured: 2.74-3.41 ms against
#   Inductor's 3.60-9.18 on the same four graphs, ca-AstroPh (under the float32 threshold) included.
ATTENTION_MIN_EDGES_CUDA = {"dot": 1_000_000, "gat": 1_500_000, "gatv2": 500_000}
TF32_DECLINED_FAMILIES = ("dot", "gat")
# bfloat16 TransformerConv under this many edges goes to Inductor too. H200, bf16, forward+backward, interleaved
# A/B of 100 rounds, Inductor's time over gnn_io's pick: SNAP facebook /
# 176k edges 0.68x, road-luxembourg-osm / 239k 0.89x, ca-AstroPh / 396k 0.97x, MUSAE squirrel / 397k 0.85x; from
# MUSAE-github / 578k on the fused kernels win (1.12x; RMAT 2^17 / 1.09M 1.63x). Only the dot family: Inductor's
# bf16 GATConv crashed on every graph of the suite ("misaligned address", "CUDA driver error", a dead compile
# worker); its bf16 GATv2Conv crashed on the dense graphs and the uniform one, and where it ran the fused kernels
# were ahead in the harness (2.13-4.28 ms against 2.79-14.82; SNAP facebook 2.74 against
# 2.79, one run, not interleaved). float16 was not measured. ``GNN_IO_ATTENTION_MIN_EDGES`` moves this threshold
# too.
HALF_ATTENTION_MIN_EDGES_CUDA = {("dot", "bfloat16"): 500_000}
# Below that threshold, a graph of at least these many edges and destination rows still takes the fused kernels.
# GATConv (H100, interleaved A/B, 40 rounds, Inductor's time over the fused path forced, with the segment
# backward): RMAT 2^18 / 1.17M edges 1.40x, RMAT 2^17 / 1.09M 1.08x (1.32x in an earlier run), RMAT 2^16 /
# 914k 1.05x; soc-Slashdot0902 (82k rows) / 1.09M 0.98x (0.96x in an earlier run), RMAT 2^17 / 581k 0.90x,
# RMAT 2^16 / 472k 0.73x, MUSAE-github, ca-AstroPh and road-luxembourg-osm 0.71x. Every graph the rule takes won;
# RMAT 2^16 at 914k, a 5% win, is left out with soc-Slashdot0902.
ATTENTION_MIN_EDGES_AND_ROWS_CUDA = {"gat": (1_000_000, 100_000)}


def replayed(setting: str) -> bool:
    """Whether the edge threshold ``setting`` is off because steps replay as CUDA graphs: ``GNN_IO_CUDAGRAPHS=1``
    and ``setting`` not set (module docstring)."""
    return config.get("cuda_graphs") and not config.is_set(setting)


def _min_edges(setting: str) -> int:
    return 0 if replayed(setting) else config.get(setting)


def spmm_min_edges() -> int:
    return _min_edges("spmm_min_edges")


def forced() -> bool:
    return config.get("force")


def spmm_declined(device_type: str, num_edges: Optional[int]) -> Optional[str]:
    """Why an SpMM rewrite would not pay here (None when it does)."""
    return _declined(device_type, num_edges, spmm_min_edges(), "GNN_IO_SPMM_MIN_EDGES")


def gather_scatter_min_edges() -> int:
    return _min_edges("gs_min_edges")


def gather_scatter_declined(device_type: str, num_edges: Optional[int]) -> Optional[str]:
    """Why a fused gather-scatter rewrite would not pay here (None when it does)."""
    return _declined(device_type, num_edges, gather_scatter_min_edges(), "GNN_IO_GS_MIN_EDGES")


_AGGREGATION_LEFT = ("Inductor's fused gather-scatter is as fast at this size, so the aggregation is left to it "
                     "(structure work stays in the graph plan)")


CPU_REWRITE_ENV = config.SETTINGS["cpu_rewrite"].env
# 2-core CPU, float32, 64 features, forward+backward, interleaved A/B (benchmarks/ab.py --device cpu):
# torch.compile's time over gnn_io's with every rewrite taken, Cora / ca-AstroPh (396k edges): GCNConv 0.95 /
# 0.65, GINConv 0.78 / 0.58, SAGEConv mean 0.89 / 0.61, SAGEConv max 0.64 / 0.54, GATConv 0.55 / 0.59,
# TransformerConv 0.74 / 0.48.
_CPU_LEFT = (f"on CPU Inductor's C++ code beats the ops' references (gnn_io took 1.05-2.1x its time), "
             f"so this is left to it; {CPU_REWRITE_ENV}=1 rewrites it")


def cpu_rewrites() -> bool:
    """Whether rewrites are taken on CPU (``GNN_IO_CPU_REWRITE=1`` or ``GNN_IO_FORCE=1``)."""
    return forced() or config.get("cpu_rewrite")


def cpu_declined(device_type: str) -> Optional[str]:
    """Why a rewrite is not taken on this CPU device (None elsewhere, or when CPU rewrites are on)."""
    if device_type != "cpu" or cpu_rewrites():
        return None
    return Declined(f"cost model: {_CPU_LEFT}", (("cpu_rewrite", True), ("force", True)))


def _declined(device_type: str, num_edges: Optional[int], threshold: int, variable: str,
              outcome: str = _AGGREGATION_LEFT) -> Optional[str]:
    on_cpu = cpu_declined(device_type)
    if on_cpu is not None:
        return on_cpu
    if device_type != "cuda" or forced() or num_edges is None:
        return None
    if num_edges < threshold:
        setting = next(s.name for s in config.SETTINGS.values() if s.env == variable)
        return Declined(f"cost model: {num_edges} edges < {threshold} ({variable}); {outcome}",
                        ((setting, num_edges), ("force", True)))
    return None


_ATTENTION_LEFT = "so the whole graph goes to Inductor as Dynamo captured it"


def attention_declined(device_type: str, num_edges: Optional[int], family: Optional[str], dtype: str,
                       tf32: bool, num_rows: Optional[int] = None) -> Optional[str]:
    """Why the fused attention would not pay for this graph (None when it does): float32 under the family's
    threshold (with TF32 allowed, for the families in :data:`TF32_DECLINED_FAMILIES` only), unless the graph has
    the edges and destination rows (``num_rows``) of :data:`ATTENTION_MIN_EDGES_AND_ROWS_CUDA`; bfloat16
    TransformerConv under :data:`HALF_ATTENTION_MIN_EDGES_CUDA`. ``GNN_IO_ATTENTION_MIN_EDGES`` sets one threshold
    for every case that has one, without the rows rule; under CUDA graphs no threshold applies unless it is set.
    On CUDA, at any size and precision, a form no kernel covers is declined too (``family`` None: the op would run
    its reference, torch ops close to eager PyG with a recomputing backward, where Inductor fuses the same math).
    A path forced with ``GNN_IO_ATTENTION_PATH=csr|block|hybrid`` is never declined for size (the harness's forced
    modes measure those kernels, not Inductor)."""
    on_cpu = cpu_declined(device_type)
    if on_cpu is not None:
        return on_cpu
    if family is None and device_type == "cuda" and not forced():
        return Declined("no fused kernel for this attention form (scores or message outside the GAT, GATv2 and "
                        f"dot-product families, e.g. PyG's SoftmaxAggregation), {_ATTENTION_LEFT}", (("force", True),))
    if config.get("attention_path") != "auto" or replayed("attention_min_edges"):
        return None  # a forced kernel path (csr, block, hybrid) is what the user asked to run, at any size
    if dtype != "float32":
        threshold, mid_size = HALF_ATTENTION_MIN_EDGES_CUDA.get((family, dtype)), None
    elif tf32 and family not in TF32_DECLINED_FAMILIES:
        threshold, mid_size = None, None
    else:
        threshold, mid_size = ATTENTION_MIN_EDGES_CUDA.get(family), ATTENTION_MIN_EDGES_AND_ROWS_CUDA.get(family)
    if threshold is None:
        return None
    if config.is_set("attention_min_edges"):
        threshold, mid_size = config.get("attention_min_edges"), None
    if mid_size is not None and num_edges is not None and num_rows is not None and num_edges >= mid_size[0] \
            and num_rows >= mid_size[1]:
        return None
    return _declined(device_type, num_edges, threshold, "GNN_IO_ATTENTION_MIN_EDGES",
                     f"Inductor's own code for {dtype} {family} attention is faster at this size, {_ATTENTION_LEFT}")
