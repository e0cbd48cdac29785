"""The measured degree split (kernels/gather_scatter/split_tuning.py): candidates, the pick, its cache on disk, and the
fallbacks. The probe kernel's clock is faked here (CPU); tests/kernels/gather_scatter/test_split_tuning_cuda.py measures."""
import json

import pytest
import torch

from gnn_inductor.kernels.gather_scatter import fused, split_tuning
from gnn_inductor.plan.work_items import PADDING


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    """A clean pick table and cache folder, with measurement enabled on CPU tensors."""
    monkeypatch.setenv("GNN_IO_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv(split_tuning.OVERRIDE_ENV, raising=False)
    monkeypatch.delenv(split_tuning.SPLIT_ENV, raising=False)
    monkeypatch.setattr(split_tuning, "can_measure", lambda rowptr: True)
    split_tuning.PICKS.clear()
    yield tmp_path
    split_tuning.PICKS.clear()


def _hub_csr(hub_degree=3000, rows=200):
    degree = torch.full((rows,), 4, dtype=torch.long)
    degree[7] = hub_degree
    rowptr = torch.zeros(rows + 1, dtype=torch.long)
    rowptr[1:] = degree.cumsum(0)
    col = torch.randint(0, rows, (int(rowptr[-1]),), generator=torch.Generator().manual_seed(0))
    return rowptr, col


def test_candidates_stop_at_the_first_threshold_that_splits_nothing():
    assert split_tuning.candidates(100) == [32, 64, 128]
    assert split_tuning.candidates(128) == [32, 64, 128]
    assert split_tuning.candidates(10**6) == [32, 64, 128, 256, 512, 1024]


def test_the_fastest_candidate_wins_and_is_cached_on_disk(tuning, monkeypatch):
    calls = []

    def fake_probe(rowptr, col, max_edges, x):
        calls.append(max_edges)
        return abs(max_edges - 256) / 100 + 1.0  # fastest at 256

    rowptr, col = _hub_csr()
    pick = split_tuning.choose(rowptr, col, fake_probe)
    assert pick["max_edges"] == 256 and pick["source"] == "measured"
    assert sorted(calls) == split_tuning.candidates(3000)
    assert fused.split_threshold(rowptr, col) == 256  # same profile: no second probe
    assert len(calls) == len(split_tuning.candidates(3000))
    stored = json.loads((tuning / split_tuning.CACHE_FILE).read_text())
    assert [v["max_edges"] for v in stored.values()] == [256]

    split_tuning.PICKS.clear()  # a new process: the pick comes from disk, nothing is timed
    again = split_tuning.choose(rowptr, col, lambda *a: pytest.fail("measured again"))
    assert again["max_edges"] == 256 and again["source"] == "measured (cached)"
    items = torch.ops.gnn_io.gather_scatter_items(rowptr, col)
    hub_items = int(((items[0] == 7) & (items[3] != PADDING)).sum())
    assert hub_items == -(-3000 // 256)  # the items op cuts the hub at the pick


def test_a_different_degree_profile_is_measured_on_its_own(tuning, monkeypatch):
    rowptr, col = _hub_csr(hub_degree=3000)
    assert split_tuning.choose(rowptr, col, lambda r, c, t, x: 1.0 / t)["max_edges"] == 1024  # largest wins
    rowptr2, col2 = _hub_csr(hub_degree=200_000)
    assert split_tuning.choose(rowptr2, col2, lambda r, c, t, x: float(t))["max_edges"] == 32  # smallest wins


def test_fallbacks_rule_env_no_hubs_and_failed_probe(tuning, monkeypatch):
    rowptr, col = _hub_csr()
    rule = split_tuning.rule_threshold(int(rowptr[-1]) / 200)

    def broken(*args):
        raise RuntimeError("no device")

    failed = split_tuning.choose(rowptr, col, broken)
    assert failed["max_edges"] == rule and failed["source"].startswith("rule (probe failed")
    monkeypatch.setenv(split_tuning.SPLIT_ENV, "rule")
    assert split_tuning.choose(rowptr, col, broken) == {"max_edges": rule, "source": "rule"}
    monkeypatch.setenv(split_tuning.OVERRIDE_ENV, "100")
    assert split_tuning.choose(rowptr, col, broken) == {"max_edges": 100, "source": "env"}
    monkeypatch.delenv(split_tuning.OVERRIDE_ENV)
    monkeypatch.delenv(split_tuning.SPLIT_ENV)
    light = torch.arange(0, 801, 4)  # 200 rows of degree 4: every candidate gives the same items
    assert split_tuning.choose(light, torch.zeros(800, dtype=torch.long), broken)["source"] == "no hubs"
    assert split_tuning.choose(rowptr, col[:0], broken)["source"] == "rule (not measured)"  # no neighbours to probe


def test_without_a_gpu_the_rule_holds(monkeypatch):
    monkeypatch.delenv(split_tuning.OVERRIDE_ENV, raising=False)
    rowptr, col = _hub_csr()
    if not split_tuning.can_measure(rowptr):
        assert split_tuning.choose(rowptr, col, fused.probe_ms)["source"] == "rule"
