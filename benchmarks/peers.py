"""The paper's own kernels (turbo-gnn) wrapped into the harness's layers, when installed.

turbo-gnn is a peer to measure against, never code to copy: only its public ``spmm_aggr`` is
called. Its graph format (int32 CSR, destination rows) is built once per graph outside the timed
region, as it would be in a user's training loop. Layers mirror PyG's: GCN adds self loops and uses
``norm='both'`` (``D_out^-1/2 A D_in^-1/2``, equal to PyG's normalisation on symmetric graphs, not on
the directed RMAT graphs, so ``rel_err`` is not reported for it), SAGE-mean ``norm='right'``,
GIN ``norm='none'``.
"""
from __future__ import annotations

import importlib

import torch


LAYERS = ("gcn", "sage_mean", "gin")  # the harness layers with a turbo-gnn counterpart


def available() -> bool:
    try:
        importlib.import_module("turbo_gnn")
    except Exception:  # not installed, or no CUDA build
        return False
    return True


def missing(layer: str, device) -> str | None:
    """Why the harness's ``turbo_gnn`` mode cannot run ``layer`` here, or None when it can."""
    if layer not in LAYERS:
        return f"no turbo-gnn wrapper for {layer}"
    if torch.device(device).type != "cuda":
        return "turbo-gnn runs on CUDA only"
    if not available():
        return "turbo-gnn is not installed (benchmarks/README.md)"
    return None


def _csr(edge_index: torch.Tensor, num_nodes: int, self_loops: bool):
    src, dst = edge_index
    if self_loops:
        keep = src != dst
        loops = torch.arange(num_nodes, device=edge_index.device)
        src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
    order = torch.argsort(dst * num_nodes + src)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return indptr.int(), src[order].int()


class TurboLayer(torch.nn.Module):
    """GCN / SAGE-mean / GIN on turbo-gnn's SpMM; the CSR is built at construction."""

    def __init__(self, kind: str, features: int, edge_index: torch.Tensor, num_nodes: int):
        super().__init__()
        if kind not in LAYERS:
            raise ValueError(f"no turbo-gnn wrapper for {kind}")
        self.kind = kind
        self.indptr, self.indices = _csr(edge_index, num_nodes, self_loops=kind == "gcn")
        self.lin = torch.nn.Linear(features, features, bias=kind != "gcn")
        self.bias = torch.nn.Parameter(torch.zeros(features)) if kind == "gcn" else None
        self.lin_root = torch.nn.Linear(features, features, bias=False) if kind == "sage_mean" else None

    def aggregate(self, x, norm):
        from turbo_gnn import spmm_aggr

        return spmm_aggr(x, self.indptr, self.indices, norm, -1, 256)

    def forward(self, x, edge_index=None):
        if self.kind == "gcn":
            return self.aggregate(self.lin(x), "both") + self.bias
        if self.kind == "sage_mean":
            return self.lin(self.aggregate(x, "right")) + self.lin_root(x)
        return self.lin(x + self.aggregate(x, "none"))
