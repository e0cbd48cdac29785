"""The heterogeneous-graph benchmark's graphs have the scaled sizes they claim and valid indices, and the benchmark
runs end to end on a tiny graph on the CPU (eager and gnn_io with the CPU rewrites): a check of the workload and
the records, not a benchmark."""
import json

import pytest
import torch

from benchmarks import hetero

SCALE = 0.0005
# max(1, round(count * SCALE)), written out
EXPECTED = {
    "mag-like": ({"paper": 368, "author": 567, "institution": 4, "field_of_study": 30},
                 {("author", "writes", "paper"): 3573, ("paper", "rev_writes", "author"): 3573,
                  ("paper", "cites", "paper"): 2708,
                  ("paper", "has_topic", "field_of_study"): 3753, ("field_of_study", "rev_has_topic", "paper"): 3753,
                  ("author", "affiliated_with", "institution"): 522,
                  ("institution", "rev_affiliated_with", "author"): 522}),
    "rec-like": ({"user": 1000, "item": 250},
                 {("user", "rates", "item"): 5000, ("item", "rated_by", "user"): 5000}),
}


@pytest.fixture
def one_thread():
    """One intra-op thread: on a 2-core machine two OpenMP threads made eager steps of this tiny graph 10-100x
    slower and erratic. Timing only; restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_graph_has_the_scaled_counts_and_valid_indices(name):
    nodes, edges = EXPECTED[name]
    data = hetero.make_graph(name, SCALE, "cpu", seed=0)
    assert data.node_types == list(nodes) and set(data.edge_types) == set(edges)
    assert {t: data[t].num_nodes for t in data.node_types} == nodes
    features = hetero.GRAPHS[name]["features"]
    for t in data.node_types:
        assert data[t].x.shape == (nodes[t], features) and data[t].x.dtype == torch.float32
    for (src, rel, dst), count in edges.items():
        edge_index = data[src, rel, dst].edge_index
        assert edge_index.shape == (2, count) and edge_index.dtype == torch.int64
        assert int(edge_index.min()) >= 0
        assert int(edge_index[0].max()) < nodes[src] and int(edge_index[1].max()) < nodes[dst]
    for src, rel, dst, _, reverse in hetero.GRAPHS[name]["edges"]:
        if reverse is not None:  # the reverse relation holds the same edges flipped
            assert torch.equal(data[dst, reverse, src].edge_index, data[src, rel, dst].edge_index.flip(0))
    again = hetero.make_graph(name, SCALE, "cpu", seed=0)
    assert all(torch.equal(again[e].edge_index, data[e].edge_index) for e in data.edge_types)
    # power law: the busiest destination of the largest relation far above the mean degree
    src, rel, dst, _, _ = max(hetero.GRAPHS[name]["edges"], key=lambda e: e[3])
    degree = torch.bincount(data[src, rel, dst].edge_index[1], minlength=nodes[dst]).float()
    assert float(degree.max()) > 5 * float(degree.mean())


def test_full_scale_counts():
    """The docstring's totals at --scale 1."""
    for name, (nodes, edges) in {"mag-like": (1_939_743, 36_805_743), "rec-like": (2_500_000, 20_000_000)}.items():
        spec = hetero.GRAPHS[name]
        assert sum(spec["nodes"].values()) == nodes
        assert sum(c * (2 if rev else 1) for _, _, _, c, rev in spec["edges"]) == edges


# graph, model, nodes, edges: to_hetero over mag-like's seven edge types (one of them paper to paper); RGCNConv over
# rec-like's homogeneous form (two relations: RGCNConv's loop over relations compiles once per relation)
# (the first in the slow tier: 38 s on a 2-core CPU; tests/passes/test_relation_groups.py compiles to_hetero smaller)
RUNS = [pytest.param("mag-like", "to_hetero_sage", 969, 18404, marks=pytest.mark.slow, id="mag-like-to_hetero_sage"),
        pytest.param("rec-like", "rgcn", 1250, 10000, id="rec-like-rgcn")]


# the mini-batch benchmark test runs the same harness in the default tier; the full-graph runs with --slow
@pytest.mark.slow
@pytest.mark.parametrize("graph,model,nodes,edges", RUNS)
def test_benchmark_runs_and_matches_eager(graph, model, nodes, edges, tmp_path, one_thread, capsys):
    out = tmp_path / "hetero.json"
    records = hetero.main(["--graphs", graph, "--models", model, "--modes", "eager,gnn_io", "--cpu-rewrites",
                           "--device", "cpu", "--scale", str(SCALE), "--steps", "1", "--warmup", "1",
                           "--hidden", "16", "--classes", "8", "--out", str(out)])
    by = {r["mode"]: r for r in records}
    assert len(records) == 2 and set(by) == {"eager", "gnn_io"}
    for mode, r in by.items():
        assert "error" not in r, r
        assert (r["graph"], r["model"], r["nodes"], r["edges"]) == (graph, model, nodes, edges)
        assert r["ms"] > 0 and r["first_step_s"] > 0
    assert by["eager"]["rel_err"] == 0.0
    assert by["gnn_io"]["rel_err"] < 1e-4, by["gnn_io"]
    assert by["gnn_io"]["rewrites"].get("gnn_io.spmm"), by["gnn_io"]  # --cpu-rewrites: the backend's SpMM
    saved = json.loads(out.read_text())
    assert saved["records"] == json.loads(json.dumps(records))
    assert {"device", "torch", "torch_geometric", "triton", "date", "command"} <= set(saved["meta"])
    assert saved["meta"]["command"].startswith(f"python -m benchmarks.hetero --graphs {graph}")
    assert f"| {graph} | {model} |" in capsys.readouterr().out


def test_mini_batches_train_on_sampled_subgraphs_and_match_eager(tmp_path, one_thread):
    """``--batch``: steps on a pool of sampled subgraphs (seeds of the first node type), the first against eager's
    on the same batch; the RGCN models on each batch's homogeneous form."""
    records = hetero.main(["--graphs", "rec-like", "--models", "hetero_sage,rgcn", "--modes", "eager,gnn_io",
                           "--cpu-rewrites", "--device", "cpu", "--scale", str(SCALE), "--steps", "2", "--warmup",
                           "1", "--hidden", "16", "--classes", "8", "--batch", "16", "--fanout", "3,2", "--pool", "3",
                           "--out", str(tmp_path / "hetero.json")])
    by = {(r["model"], r["mode"]): r for r in records}
    for model in ("hetero_sage", "rgcn"):
        for mode in ("eager", "gnn_io"):
            r = by[model, mode]
            assert "error" not in r, r
            assert r["batch"] == 16 and r["fanout"] == "3,2" and r["ms"] > 0 and r["recompiles"] >= 0
            assert 16 < r["batch_nodes"][0] <= r["batch_nodes"][1] < 1250 and 0 < r["batch_edges"][0]
        assert by[model, "gnn_io"]["rel_err"] < 1e-4


def test_a_batchs_homogeneous_form_is_heterodatas():
    """The RGCN models' mini-batch inputs: each sampled batch's ``(edge_index, edge_type)`` (and ``x``, for the
    ``rgcn_flat`` models) as PyG's ``HeteroData.to_homogeneous`` gives them for the same batch."""
    from torch_geometric.data import HeteroData

    args = hetero.parse(["--graphs", "mag-like", "--device", "cpu", "--scale", str(SCALE), "--batch", "8",
                         "--fanout", "3,2", "--pool", "2"])
    work = hetero.Workload("mag-like", args, homogeneous=True)
    for i in range(2):
        (x_dict, edge_index, edge_type), _ = work.step("rgcn", i)
        _, edge_index_dict, _, _ = work.pool[i]
        data = HeteroData()
        for t in work.node_types:
            data[t].x = x_dict[t]
        for e in work.data.edge_types:
            data[e].edge_index = edge_index_dict[e]
        want = data.to_homogeneous(node_attrs=[], edge_attrs=[])
        assert torch.equal(edge_index, want.edge_index) and torch.equal(edge_type, want.edge_type)
        (x, flat_index, flat_type), _ = work.step("rgcn_flat", i)  # the features too, node types in turn
        assert torch.equal(x, data.to_homogeneous(node_attrs=["x"], edge_attrs=[]).x)
        assert torch.equal(flat_index, edge_index) and torch.equal(flat_type, edge_type)
        assert edge_index.shape[1] > 0 and int(edge_type.max()) < len(work.data.edge_types)


def test_cuda_graph_modes_are_skipped_off_cuda_with_the_reason(tmp_path, one_thread, capsys):
    """``inductor_cg`` and ``gnn_io_cg`` (``mode="reduce-overhead"``) are known modes; on the CPU their records say
    why they did not run and the table lists them, while the other modes run (``--profile``: with a profile)."""
    records = hetero.main(["--graphs", "rec-like", "--models", "hetero_sage", "--modes", "eager,inductor_cg,gnn_io_cg",
                           "--device", "cpu", "--scale", str(SCALE), "--steps", "1", "--warmup", "1", "--hidden", "16",
                           "--classes", "8", "--batch", "16", "--fanout", "3,2", "--pool", "2", "--profile", "1",
                           "--out", str(tmp_path / "hetero.json")])
    by = {r["mode"]: r for r in records}
    assert "error" not in by["eager"] and by["eager"]["ms"] > 0
    # on the CPU the profile has the host's ranges and no GPU op
    assert by["eager"]["profiled_ms"] > 0 and by["eager"]["top_host"] and by["eager"]["gpu_kinds"] == {}
    for mode in ("inductor_cg", "gnn_io_cg"):
        assert by[mode]["skipped"] == f"{mode} records CUDA graphs: it needs --device cuda" and "ms" not in by[mode]
    out = capsys.readouterr().out
    assert "| rec-like | hetero_sage |" in out and "gnn_io_cg skipped: gnn_io_cg records CUDA graphs" in out
    assert "- rec-like hetero_sage eager: " in out.split("profiles (per step):")[1]
