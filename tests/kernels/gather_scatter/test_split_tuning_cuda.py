"""The measured degree split on CUDA (kernels/gather_scatter/split_tuning.py): the probe runs, its pick is one of the
candidates and the fastest of its own times, the items op cuts at the pick, and a second process reads it
back from the cache file (skipped without CUDA; ``python tests/run.py`` on a GPU machine)."""
import json

import pytest
import torch

import gnn_inductor.kernels  # noqa: F401
from gnn_inductor.kernels.gather_scatter import fused, split_tuning
from gnn_inductor.plan.work_items import PADDING
from gnn_inductor.testing import random_graph

pytestmark = pytest.mark.cuda


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_IO_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv(split_tuning.OVERRIDE_ENV, raising=False)
    monkeypatch.delenv(split_tuning.SPLIT_ENV, raising=False)
    split_tuning.PICKS.clear()
    yield tmp_path
    split_tuning.PICKS.clear()


def test_measured_pick_on_a_hub_graph(fresh_cache):
    num_nodes, hub = 20_000, 50_000
    src, dst = random_graph(num_nodes, 200_000, seed=3, hub_degree=hub).cuda()
    rowptr, col = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)[:2]
    pick = split_tuning.choose(rowptr, col, fused.probe_ms)
    max_degree = int((rowptr[1:] - rowptr[:-1]).max())
    assert pick["source"] == "measured"
    assert sorted(pick["probe_ms"]) == split_tuning.candidates(max_degree)
    assert all(t > 0 for t in pick["probe_ms"].values())
    assert pick["max_edges"] == min(pick["probe_ms"], key=pick["probe_ms"].get)
    print(f"\nsplit probe on {torch.cuda.get_device_name()} ({pick['key']}): {pick['probe_ms']} -> {pick['max_edges']}")

    items = torch.ops.gnn_io.gather_scatter_items(rowptr, col)
    real = items[3] != PADDING
    hub_row = int((rowptr[1:] - rowptr[:-1]).argmax())
    assert int(((items[0] == hub_row) & real).sum()) == -(-max_degree // pick["max_edges"])

    stored = json.loads((fresh_cache / split_tuning.CACHE_FILE).read_text())
    assert stored[pick["key"]]["max_edges"] == pick["max_edges"]
    split_tuning.PICKS.clear()
    again = split_tuning.choose(rowptr, col, fused.probe_ms)
    assert again["source"] == "measured (cached)" and again["max_edges"] == pick["max_edges"]
    summary = fused.split_summary(rowptr, col)
    assert summary["source"] == "measured (cached)" and summary["max_edges"] == pick["max_edges"]
