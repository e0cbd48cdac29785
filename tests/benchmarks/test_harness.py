"""The benchmark harness still runs end to end (tiny graph, CPU): a smoke check, not a benchmark."""
import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks import harness, layers
from benchmarks.graphs import graph_suite, grid, real, rmat, rmat_multi, uniform

# the project's real graphs: GNN_IO_DATA, else next to the repository (as the harness reads them)
SHARED_DATA = Path(os.environ.get("GNN_IO_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data")


def test_harness_writes_results(tmp_path):
    harness.main(["--device", "cpu", "--graphs", "rmat-small", "--layers", "gcn", "--modes", "eager,gnn_io",
                  "--reps", "1", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    modes = {r["mode"]: r for r in data["results"]}
    assert set(modes) == {"eager", "gnn_io"} and not any("error" in r for r in data["results"])
    assert modes["gnn_io"]["rel_err"] < 1e-5
    assert "| rmat-10-8000 |" in (tmp_path / "results.md").read_text()


def test_the_multigraph_generator_keeps_every_draw():
    """rmat-multi-NODES-EDGES: exactly EDGES power-law draws, seeded, in chunks of any size."""
    (graph,) = graph_suite(["rmat-multi-300-5000"], str(SHARED_DATA), torch.device("cpu"))
    assert (graph.num_nodes, graph.num_edges, graph.name) == (300, 5000, "rmat-multi-300-5000")
    assert int(graph.edge_index.min()) >= 0 and int(graph.edge_index.max()) < 300
    assert rmat_multi(300, 5000, chunk=777).edge_index.shape == (2, 5000)
    assert rmat_multi(300, 5000).edge_index.equal(graph.edge_index)
    degree = torch.bincount(graph.edge_index[1], minlength=300).sort(descending=True).values
    assert degree[:3].sum() > 10 * degree[150:153].sum()  # a power-law head, not uniform


def test_graph_generators_are_seeded_and_coalesced():
    a, b = rmat(8, 2000, seed=3), rmat(8, 2000, seed=3)
    assert a.edge_index.equal(b.edge_index)
    for g in (a, uniform(100, 500), grid(5)):
        key = g.edge_index[0] * g.num_nodes + g.edge_index[1]
        assert key.unique().numel() == g.num_edges and int(g.edge_index.max()) < g.num_nodes
    cora = real("Planetoid-Cora", str(SHARED_DATA))
    assert (cora.num_nodes, cora.num_edges) == (2708, 10556)


def test_isolated_cases_survive_a_dying_process(monkeypatch, tmp_path):
    """--isolate: each (graph, layer) runs in a child harness. The modes a child finished before it died keep
    their numbers; the modes after the one it died in run again in a fresh child (a CUDA error leaves the
    process unusable for every later mode); a mode that kills a fresh child as its first mode gets an error
    record naming the exit status, and the modes after it still run."""
    import subprocess
    import types

    commands, references = [], []

    def child(command, **kwargs):
        # a fake child: "inductor" records its own CUDA error and poisons the process (the next mode dies),
        # "bad" always kills it
        assert command[command.index("--layers") + 1] == "gcn"
        commands.append(command[command.index("--modes") + 1])
        references.append("--reference-eager" in command)
        lines, poisoned = ["noise"], False
        for mode in commands[-1].split(","):
            if poisoned or mode == "bad":
                return types.SimpleNamespace(returncode=-6, stdout="\n".join(lines) + "\n",
                                             stderr="Fatal Python error: Aborted\n")
            record = {"layer": "gcn", "graph": "rmat-10-8000", "mode": mode, "nodes": 1024, "edges": 8000}
            record.update({"error": "AcceleratorError: misaligned address"} if mode == "inductor"
                          else {"fwdbwd_ms": 1.0})
            lines.append(json.dumps(record))
            poisoned = mode == "inductor"
        return types.SimpleNamespace(returncode=0, stdout="\n".join(lines) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", child)
    args = types.SimpleNamespace(modes="eager,inductor,gnn_io,bad,gnn_io_csr", layers="gcn", features=8,
                                 dtype="float32", reps=1, device="cpu", data_root=".", isolate=True, tf32=False)
    records = harness._isolated_records(args, ["rmat-small"])
    assert commands == ["eager,inductor,gnn_io,bad,gnn_io_csr", "gnn_io,bad,gnn_io_csr", "bad,gnn_io_csr",
                        "gnn_io_csr"]
    by_mode = {r["mode"]: r for r in records}
    assert len(records) == len(by_mode) == 5
    for mode in ("eager", "gnn_io", "gnn_io_csr"):
        assert by_mode[mode]["fwdbwd_ms"] == 1.0 and "error" not in by_mode[mode]
    assert by_mode["inductor"]["error"].startswith("AcceleratorError")
    assert by_mode["bad"]["graph"] == "rmat-10-8000"
    assert by_mode["bad"]["error"] == "process died (exit -6): Fatal Python error: Aborted"
    # the reruns run eager first, unrecorded, as the reference of rel_err
    assert references == [False, True, True, True]

    # a child that dies before its first mode prints: the error record still names the graph as the modes that
    # finished resolved it (one row per case in the table)
    commands.clear()
    references.clear()
    args.modes = "bad,gnn_io"
    records = harness._isolated_records(args, ["rmat-small"])
    assert commands == ["bad,gnn_io", "gnn_io"] and references == [False, False]
    assert {(r["graph"], r["mode"]) for r in records} == {("rmat-10-8000", "bad"), ("rmat-10-8000", "gnn_io")}
    assert next(r for r in records if r["mode"] == "bad")["nodes"] == 1024


@pytest.mark.slow  # three child harness processes, about 25 s on a 2-core CPU: run with --slow
def test_isolated_run_end_to_end(tmp_path):
    harness.main(["--device", "cpu", "--graphs", "rmat-small", "--layers", "gcn", "--modes", "eager,gnn_io",
                  "--reps", "1", "--isolate", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["mode"] for r in data["results"]} == {"eager", "gnn_io"}
    assert not any("error" in r for r in data["results"])
    # a rerun without eager among its modes (after a crash) still checks against eager: --reference-eager
    harness.main(["--device", "cpu", "--graphs", "rmat-small", "--layers", "gcn", "--modes", "gnn_io",
                  "--reps", "1", "--reference-eager", "--out", str(tmp_path / "rerun")])
    rerun = json.loads((tmp_path / "rerun" / "results.json").read_text())["results"]
    assert [r["mode"] for r in rerun] == ["gnn_io"] and rerun[0]["rel_err"] < 1e-4


def test_every_listed_layer_builds():
    """``--layers all`` is every name make_layer knows."""
    for name in layers.LAYERS:
        assert isinstance(layers.make_layer(name, 8), torch.nn.Module), name


def test_a_stacked_model_runs_its_layers_with_relu_between(tmp_path):
    """``NAME:DEPTH`` is a model of DEPTH layers on one graph; the harness compiles and times it like a layer."""
    model = layers.make_layer("gcn:3", 8)
    assert [type(m).__name__ for m in model.layers] == ["GCNConv"] * 3
    x, edge_index = torch.randn(6, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    expected = model.layers[0](x, edge_index)
    for layer in model.layers[1:]:
        expected = layer(torch.relu(expected), edge_index)
    torch.testing.assert_close(model(x, edge_index), expected)
    assert harness.min_bytes("gcn:3", 10, 20, 8, 4) == tuple(3 * b for b in harness.min_bytes("gcn", 10, 20, 8, 4))
    harness.main(["--device", "cpu", "--graphs", "rmat-like-300-2000", "--layers", "sage_mean:2", "--modes",
                  "eager,gnn_io", "--reps", "1", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "results.json").read_text())["results"]
    assert {(r["layer"], r["graph"], r["edges"]) for r in records} == {("sage_mean:2", "rmat-like-300-2000", 2000)}
    assert not any("error" in r for r in records) and records[1]["rel_err"] < 1e-5


def test_dense_floor_runs_the_layers_linear_maps():
    import torch

    for layer, count in (("gcn", 1), ("sage_mean", 2), ("gin", 1), ("transformer", 4)):
        floor = layers.DenseFloor(layers.make_layer(layer, 8))
        assert len(floor.maps) == count, layer
        x = torch.randn(5, 8)
        torch.testing.assert_close(floor(x, None), sum(m(x) for m in floor.maps))


def test_an_interrupted_run_keeps_the_cases_it_finished(monkeypatch, tmp_path):
    """Results are written after every case: a run killed by a time limit (here: interrupted at its second
    case) still leaves the first case's numbers in results.json and results.md."""
    import subprocess
    import types

    import pytest

    calls = []

    def child(command, **kwargs):
        calls.append(command)
        if len(calls) == 2:
            raise KeyboardInterrupt
        record = {"layer": "gcn", "graph": "rmat-10-8000", "mode": "gnn_io", "nodes": 1024, "edges": 8000,
                  "fwdbwd_ms": 2.5}
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(record) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", child)
    with pytest.raises(KeyboardInterrupt):
        harness.main(["--device", "cpu", "--graphs", "rmat-small", "--layers", "gcn,gin", "--modes", "gnn_io",
                      "--reps", "1", "--isolate", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert [(r["layer"], r["fwdbwd_ms"]) for r in data["results"]] == [("gcn", 2.5)]
    assert "| rmat-10-8000 |" in (tmp_path / "results.md").read_text()


def test_merge_joins_runs_into_one_table(tmp_path):
    """``--merge``: the results of runs split across device calls in one results.json / results.md (the results
    page): every run's command and date listed, a case measured twice keeps the later record, the layer's family
    table shows the ratios, and runs of another dtype are rows of their own."""
    def run(name, records, command, dtype="float32"):
        path = tmp_path / name
        meta = {"device": "GPU", "torch": "t", "triton": "tr", "torch_geometric": "pyg", "python": "3",
                "date": f"{name}-date", "command": command, "dtype": dtype, "features": 8, "copy_gbps": 100.0}
        rows = [{"layer": layer, "graph": "g", "mode": mode, "nodes": 10, "edges": 20, "fwdbwd_ms": ms,
                 "peak_gb": 1.0, **({"csr_build_ms": 7.5, "csr_build_gb": 0.25} if mode == "gnn_io" else {})}
                for layer, mode, ms in records]
        path.write_text(json.dumps({"meta": meta, "results": rows}))
        return str(path)

    out = tmp_path / "merged"
    assert harness.main(["--merge", run("a.json", [("gcn", "eager", 4.0), ("gcn", "gnn_io", 9.0)], "first"),
                         run("b.json", [("gcn", "gnn_io", 2.0), ("gcn", "inductor", 3.0)], "second"),
                         run("c.json", [("gat", "eager", 6.0), ("gat", "gnn_io", 3.0)], "third", "bfloat16"),
                         "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert sorted((r["layer"], r["mode"], r["fwdbwd_ms"]) for r in data["results"]) == [
        ("gat", "eager", 6.0), ("gat", "gnn_io", 3.0), ("gcn", "eager", 4.0), ("gcn", "gnn_io", 2.0),
        ("gcn", "inductor", 3.0)]
    assert [r["command"] for r in data["meta"]["runs"]] == ["first", "second", "third"]
    page = (out / "results.md").read_text()
    assert "`first`" in page and "`third`" in page and "## Attention" in page

    def cells(prefix):
        row = next(line for line in page.splitlines() if line.startswith(prefix))
        return [c.strip() for c in row.strip("|").split("|")]

    # graph, nodes, edges, layer, dtype, eager, compile, gnn_io, turbo-gnn, vs eager, vs compile, vs turbo-gnn
    assert cells("| g | 10 | 20 | GCNConv |")[4:12] == ["float32", "4.00", "3.00", "2.00", "-", "2.00x", "1.50x", "-"]
    assert cells("| g | 10 | 20 | GATConv |")[4:11] == ["bfloat16", "6.00", "-", "3.00", "-", "2.00x", "-"]
    # the detail table: graph, layer, dtype, fwd x3, step GB, plan build, CSR build (gnn_io's record)
    assert cells("| g | gcn | float32 |")[8] == "7.50 / 0.25"


def test_cases_under_cuda_graphs_have_a_table_of_their_own(tmp_path):
    """A case measured with gnn_io under CUDA graphs and not without (a small graph's training) is a row of the
    CUDA-graph table: every mode's step, gnn_io_cg against the best of the other three, each mode's peak; it is no
    row of its family's table, whose gnn_io column it would leave empty."""
    meta = {"device": "GPU", "torch": "t", "triton": "tr", "torch_geometric": "pyg", "python": "3", "date": "d",
            "command": "c", "dtype": "float32", "features": 8, "copy_gbps": 100.0}
    rows = [{"layer": "gcn:3", "graph": "g", "mode": mode, "nodes": 10, "edges": 20, "fwdbwd_ms": ms, "peak_gb": gb}
            for mode, ms, gb in (("eager", 4.0, 0.5), ("inductor", 3.0, 0.4), ("inductor_cg", 2.5, 0.3),
                                 ("gnn_io_cg", 1.0, 0.2))]
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"meta": meta, "results": rows}))
    assert harness.main(["--merge", str(path), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "results.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| g | 10 | 20 |"))
    assert [c.strip() for c in row.strip("|").split("|")][5:] == [
        "4.00", "3.00", "2.50", "1.00", "2.50x", "0.500 / 0.400 / 0.300 / 0.200"]
    assert "## Under CUDA graphs" in page and "## Other layers" not in page


def test_ab_compiles_each_mode_under_its_own_environment():
    """Two gnn_io modes in one process (``benchmarks/ab.py --modes``): each is compiled under its own environment
    (here with and without the GEMM-accumulate pass), not one reusing the other's compiled code."""
    import torch

    import gnn_inductor
    from benchmarks import ab

    (graph,) = harness.graph_suite(["rmat-small"], str(SHARED_DATA), torch.device("cpu"))
    first = len(gnn_inductor.rewrite_report.reports())
    steps = ab._built("sage_max", graph, ("gnn_io_no_gemm_acc", "gnn_io"), 16, torch.device("cpu"))
    assert set(steps) == {"gnn_io_no_gemm_acc", "gnn_io"}
    folded = [r.gemm_accumulates for r in gnn_inductor.rewrite_report.reports()[first:]]
    assert len(folded) == 2 and not any(folded[0].values()) and folded[1] == {"forward": 1, "backward": 1}


def test_edge_feature_layers_get_seeded_features_for_their_graph():
    """The ``gat_edge`` layers read seeded random edge features made for the graph by ``with_graph`` (the same in
    every mode), refuse to run without them, and follow the layer's dtype."""
    import pytest

    edge_index = uniform(50, 300, seed=0).edge_index
    layer = layers.make_layer("gat_edge", 16)
    with pytest.raises(ValueError, match="with_graph"):
        layer(torch.randn(50, 16), edge_index)
    layers.with_graph(layer, edge_index)
    assert layer.edge_attr.shape == (edge_index.shape[1], layers.EDGE_DIM)
    again = layers.with_graph(layers.make_layer("gat_edge", 16), edge_index)
    assert torch.equal(layer.edge_attr, again.edge_attr)
    assert layer(torch.randn(50, 16), edge_index).shape == (50, 16)
    wide = layers.with_graph(layers.make_layer("gat_edge64", 16).to(torch.float64), edge_index)
    assert wide.edge_attr.shape[1] == 64 and wide.edge_attr.dtype == torch.float64



def test_torch_compile_modes_run_with_dynamos_default_capture(monkeypatch):
    """Importing gnn_inductor turns on Dynamo's capture of data-dependent output shapes for the process; the
    harness's ``torch.compile`` modes run with Dynamo's default, as in a process without the backend, and the
    gnn_io modes with the backend's setting."""
    seen = {}
    monkeypatch.setattr(harness, "_run_case", lambda layer, graph, mode, *args: seen.setdefault(
        mode, torch._dynamo.config.capture_dynamic_output_shape_ops))
    for mode in ("inductor", "inductor_cg", "gnn_io"):
        harness.run_case("gcn", None, mode, 8, torch.float32, torch.device("cpu"), 1)
    assert seen == {"inductor": False, "inductor_cg": False, "gnn_io": True}
    assert torch._dynamo.config.capture_dynamic_output_shape_ops
