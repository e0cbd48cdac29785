"""The benchmark tools besides the harness: the attention cost-model fit and the A/B timer of two git trees."""
import json

import pytest

from benchmarks import fit_attention, tree_ab


def _probe_rows(csr, block):
    """Probe rows (``benchmarks.probe``'s JSON) timed exactly by the given constants, on three graphs."""
    rows = []
    for graph, edges, identity_tiles in (("a", 6_000_000, 400_000), ("b", 16_000_000, 280_000),
                                         ("c", 1_000_000, 70_000)):
        ms = (csr["csr_per_edge"] * edges + csr["csr_per_identity_tile"] * identity_tiles) * 1e-6 + csr["csr_fixed_ms"]
        rows.append({"part": "attention", "graph": graph, "edges": edges, "family": "dot", "kernel": "csr",
                     "dtype": "fp32", "order": "none", "ms": ms})
        for order, tiles in (("none", identity_tiles), ("rcm", identity_tiles // 2)):
            windows = edges // 400
            ms = (block["block_per_tile"] * tiles + block["block_per_row"] * windows * 16) * 1e-6 \
                + block["block_fixed_ms"]
            rows.append({"part": "attention", "graph": graph, "edges": edges, "family": "dot", "kernel": "block",
                         "dtype": "tf32", "order": order, "ms": ms, "chosen": "block",
                         "stats": {"tiles": tiles, "windows": windows}})
    # a hybrid (both kernels in one time) and a failed variant are not points of either fit
    rows.append({"part": "attention", "graph": "c", "edges": 1, "family": "dot", "kernel": "block", "dtype": "tf32",
                 "order": "rcm", "ms": 99.0, "chosen": "hybrid", "stats": {"tiles": 1, "windows": 1}})
    rows.append({"part": "attention", "graph": "c", "family": "dot", "kernel": "csr", "dtype": "fp32",
                 "order": "none", "error": "RuntimeError: x"})
    return rows


def test_fit_attention_recovers_the_constants_it_was_given(tmp_path, capsys):
    csr = {"csr_per_edge": 0.25, "csr_per_identity_tile": 3.0, "csr_fixed_ms": 2.5}
    block = {"block_per_tile": 13.0, "block_per_row": 0.35, "block_fixed_ms": 1.5}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(_probe_rows(csr, block)))
    assert fit_attention.main([str(path), "--precision", "tf32", "--block-per-row"]) == 0
    out = capsys.readouterr().out
    fitted = eval(out.splitlines()[0].split(": ", 1)[1])  # the printed dict
    for key, value in {**csr, **block}.items():
        assert fitted[key] == pytest.approx(value, rel=1e-3, abs=1e-3), key
    assert out.count("| c | block |") == 2  # the hybrid row is not a point


@pytest.mark.slow  # a developer's A/B tool, about 30 s of two child processes: run with --slow
def test_tree_ab_measures_each_tree_staged_on_its_own(capsys, monkeypatch):
    """Both trees (here the same revision) run in their own interpreter from their staged copy (the child checks the
    package it imported is the staged one) and land in one table."""
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "1")
    assert tree_ab.main(["--base", "HEAD", "--graphs", "rmat-small", "--layers", "gcn", "--device", "cpu",
                         "--steps", "1", "--reps", "1", "--warmup", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| rmat-10-8000 | gcn |")]
    assert len(rows) == 1 and float(rows[0].split("|")[5]) > 0
