"""When a rewrite pays: the cost model the patterns consult before they fire on a device.

On CUDA, the gnn_io SpMM (Triton or cuSPARSE, plus the custom-op call it costs) beats Inductor's
fused gather-scatter only from a few million edges on; below that, launch and dispatch overhead
dominate and Inductor's own kernels are as fast or faster (docs/benchmarks/results.md, H100). The
structure work (self loops, normalisation, CSR) is hoisted into the graph plan either way.

``GNN_IO_FORCE=1`` rewrites whatever matches, whatever the size (for tests and comparisons);
``GNN_IO_SPMM_MIN_EDGES`` moves the SpMM threshold.
"""
from __future__ import annotations

import os
from typing import Optional

# Measured on the H100 (docs/benchmarks/results.md): SAGE-mean and GIN lose to Inductor at 0.2M-1.1M
# edges and win from 4M; GCN wins from 0.2M on (its normalisation is hoisted either way).
SPMM_MIN_EDGES_CUDA = 2_000_000


def spmm_min_edges() -> int:
    return int(os.environ.get("GNN_IO_SPMM_MIN_EDGES", SPMM_MIN_EDGES_CUDA))


def forced() -> bool:
    return os.environ.get("GNN_IO_FORCE", "0") == "1"


def spmm_declined(device_type: str, num_edges: Optional[int]) -> Optional[str]:
    """Why an SpMM rewrite would not pay here (None when it does)."""
    if device_type != "cuda" or forced() or num_edges is None:
        return None
    threshold = spmm_min_edges()
    if num_edges < threshold:
        return (f"cost model: {num_edges} edges < {threshold} (GNN_IO_SPMM_MIN_EDGES); Inductor's fused "
                "gather-scatter is as fast at this size, so the aggregation is left to it (structure work "
                "stays in the graph plan)")
    return None
