"""The benchmark harness still runs end to end (tiny graph, CPU): a smoke check, not a benchmark."""
import json
from pathlib import Path

from benchmarks import harness
from benchmarks.graphs import grid, real, rmat, uniform

# the project's real graphs, next to the repository (as examples/gat_cora.py reads them)
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def test_harness_writes_results(tmp_path):
    harness.main(["--device", "cpu", "--graphs", "rmat-small", "--layers", "gcn", "--modes", "eager,gnn_io",
                  "--reps", "1", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    modes = {r["mode"]: r for r in data["results"]}
    assert set(modes) == {"eager", "gnn_io"} and not any("error" in r for r in data["results"])
    assert modes["gnn_io"]["rel_err"] < 1e-5
    assert "| rmat-10-8000 |" in (tmp_path / "results.md").read_text()


def test_graph_generators_are_seeded_and_coalesced():
    a, b = rmat(8, 2000, seed=3), rmat(8, 2000, seed=3)
    assert a.edge_index.equal(b.edge_index)
    for g in (a, uniform(100, 500), grid(5)):
        key = g.edge_index[0] * g.num_nodes + g.edge_index[1]
        assert key.unique().numel() == g.num_edges and int(g.edge_index.max()) < g.num_nodes
    cora = real("Planetoid-Cora", str(SHARED_DATA))
    assert (cora.num_nodes, cora.num_edges) == (2708, 10556)
