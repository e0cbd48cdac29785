"""The block format's sampled tile count (gnn_inductor/plan/block_format.py) against the exact build, and the SpMM
selector declining the block path from the estimate on a scattered graph without building the format."""
import torch

from gnn_inductor.plan import block_format
from gnn_inductor.testing import random_graph
from kernels.spmm import selector

ops = torch.ops.gnn_io


def _plan(src, dst, n):
    return ops.csr_plan(dst, src, n, n)


def _scattered(n=4000, e=40000):
    src, dst = random_graph(n, e, seed=2, hub_degree=800)
    return _plan(src, dst, n), n


def _block_dense(n=4096, block=16):
    """Every node linked to all 16 nodes of its own block of 16: 16 edges per tile, each window one full tile."""
    nodes = torch.arange(n)
    src = (nodes.view(-1, 1) // block * block + torch.arange(block)).flatten()
    dst = nodes.repeat_interleave(block)
    return _plan(src, dst, n), n


def test_sampled_tiles_estimate_the_exact_count():
    for plan, n in (_scattered(), _block_dense()):
        rowptr, col = plan[0], plan[1]
        exact = block_format.build_block_format(rowptr, col, torch.arange(col.numel()), n).stats["tiles"]
        estimate = block_format.sampled_tiles(rowptr, col, n)
        assert abs(estimate - exact) <= 0.1 * exact, (estimate, exact)


def test_sampled_tiles_of_a_graph_without_edges():
    empty = torch.zeros(0, dtype=torch.long)
    plan = _plan(empty, empty, 10)
    assert block_format.sampled_tiles(plan[0], plan[1], 10) == 0.0


def test_the_selector_declines_a_scattered_graph_from_the_estimate(monkeypatch):
    monkeypatch.setattr(selector, "SAMPLE_FROM_EDGES", 0)
    built = []
    monkeypatch.setattr(block_format, "build_block_format", lambda *a, **k: built.append(a))
    (rowptr, col, *_), n = _scattered()
    x = torch.randn(n, 8)
    decision = selector._decide(x, torch.ones(col.numel()), rowptr, col, "sum", "auto", "ieee")
    assert decision.path == "csr" and "estimated from 4096 sampled windows" in decision.reason, decision.reason
    assert decision.stats["edges_per_tile_estimate"] < selector.MIN_EDGES_PER_TILE
    assert not built
