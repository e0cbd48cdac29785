"""The results page's training-step sections (benchmarks/run_pages.py): the mini-batch and heterogeneous benchmarks'
runs merged into the page with the harness's, a workload's later run replacing its earlier one, and kept through a
second merge."""
import json

from benchmarks import harness


def _harness_run(path):
    meta = {"device": "GPU", "torch": "t", "triton": "tr", "torch_geometric": "pyg", "python": "3", "date": "d0",
            "command": "harness", "dtype": "float32", "features": 8, "copy_gbps": 100.0}
    rows = [{"layer": "gcn", "graph": "g", "mode": mode, "nodes": 10, "edges": 20, "fwdbwd_ms": ms, "peak_gb": 1.0}
            for mode, ms in (("eager", 4.0), ("gnn_io", 2.0))]
    path.write_text(json.dumps({"meta": meta, "results": rows}))
    return str(path)


def _minibatch_run(path, date, model, steps, unpadded=0):
    """A ``benchmarks/minibatch.py --out`` file: ``steps`` maps a mode to (alone, loop, peak MB) or an error;
    ``unpadded``: gnn_io_cg's calls run unpadded after its buckets settled."""
    args = {"graph": "arxiv-like", "model": model, "layers": 3, "batch": 1024, "fanout": "15,10,5", "steps": 20,
            "warmup": 30, "modes": ",".join(steps)}
    records = []
    for mode, value in steps.items():
        record = {"model": model, "mode": mode, "graph": "arxiv-like"}
        if isinstance(value, str):
            record["error"] = value
        else:
            alone, loop, peak = value
            record.update(alone_ms=alone, loop_ms=loop, peak_mb=peak, recompiles=0, aot_compiles=0)
            if mode == "gnn_io_cg":
                record.update(buckets=[[27584, 71488]], unpadded_calls=unpadded)
        records.append(record)
    meta = {"date": date, "device": "GPU", "torch": "t", "command": f"minibatch {date} --out /where/it/wrote.json"}
    path.write_text(json.dumps({"meta": meta, "args": args, "records": records}))
    return str(path)


def _row(page, prefix):
    line = next(line for line in page.splitlines() if line.startswith(prefix))
    return [c.strip() for c in line.strip("|").split("|")]


def test_minibatch_runs_join_the_page_and_survive_a_second_merge(tmp_path):
    first = _minibatch_run(tmp_path / "m1.json", "d1", "gcn", {"eager": (3.0, 3.2, 300.0),
                                                                "inductor": "InductorError",
                                                                "gnn_io_cg": (2.5, 2.5, 250.0)})
    later = _minibatch_run(tmp_path / "m2.json", "d2", "gcn", {"eager": (3.6, 3.75, 299.0),
                                                                "inductor": (3.7, 4.0, 227.0),
                                                                "inductor_cg": (73.6, 4.5, 173.0),
                                                                "gnn_io_cg": (2.2, 2.25, 235.0)})
    other = _minibatch_run(tmp_path / "m3.json", "d3", "sage_max", {"inductor": (3.25, 2.71, 653.0),
                                                                     "gnn_io_cg": (3.32, 2.60, 692.0)}, unpadded=2)
    out = tmp_path / "page"
    assert harness.main(["--merge", _harness_run(tmp_path / "h.json"), first, later, other, "--out", str(out)]) == 0
    page = (out / "results.md").read_text()
    assert "## Mini-batch training steps" in page and "## Sum and mean aggregation" in page
    # graph, model, seeds, fan-out, eager, compile, reduce-overhead, gnn_io, gnn_io_cg, x best, compiles, peak MB
    assert _row(page, "| arxiv-like | GCNConv, 3 layers |") == [
        "arxiv-like", "GCNConv, 3 layers", "1024", "15,10,5", "3.60 / 3.75", "3.70 / 4.00", "73.60 / 4.50", "-",
        "2.20 / 2.25", "1.67x", "0 / 0 (1 buckets)", "235 / 173"]
    sage = _row(page, "| arxiv-like | SAGEConv max, 3 layers |")
    assert sage[4:11] == ["-", "3.25 / 2.71", "-", "-", "3.32 / 2.60", "1.04x", "0 / 0 (1 buckets), 2 calls unpadded"]
    # the commands of the runs shown: d1's only workload is d2's now
    assert all(f"`minibatch {d}`" in page for d in ("d2", "d3")) and "`minibatch d1`" not in page
    # the merged results.json keeps every run: merging it again gives the same section
    data = json.loads((out / "results.json").read_text())
    assert [run["meta"]["date"] for run in data["minibatch"]] == ["d1", "d2", "d3"]
    again = tmp_path / "again"
    assert harness.main(["--merge", str(out / "results.json"), "--out", str(again)]) == 0
    assert (again / "results.md").read_text() == page


def test_a_failed_mode_shows_as_failing(tmp_path):
    run = _minibatch_run(tmp_path / "m.json", "d", "gat", {"eager": (4.0, 4.2, 163.0), "inductor": "InductorError",
                                                            "gnn_io_cg": (1.7, 1.7, 147.0)})
    out = tmp_path / "page"
    assert harness.main(["--merge", _harness_run(tmp_path / "h.json"), run, "--out", str(out)]) == 0
    row = _row((out / "results.md").read_text(), "| arxiv-like | GATConv, 3 layers |")
    assert row[5] == "fails" and row[9] == "2.47x" and row[11] == "147 / 163"


def _hetero_run(path, date, records):
    args = {"graphs": "rec-like", "models": "to_hetero_sage", "modes": "eager,inductor,gnn_io", "batch": 0}
    meta = {"date": date, "device": "GPU", "torch": "t", "command": f"hetero {date}"}
    path.write_text(json.dumps({"meta": meta, "args": args, "records": records}))
    return str(path)


def test_heterogeneous_runs_get_their_own_section(tmp_path):
    def record(model, mode, ms, peak, batch=0, **more):
        return {"graph": "rec-like", "model": model, "mode": mode, "ms": ms, "peak_gb": peak, "recompiles": 0,
                **({"batch": batch, "fanout": "10,10"} if batch else {}), **more}
    full = _hetero_run(tmp_path / "h1.json", "d1", [record("to_hetero_sage", "inductor", 26.72, 3.44),
                                                     record("to_hetero_sage", "gnn_io", 21.80, 4.77),
                                                     {"graph": "rec-like", "model": "rgcn", "mode": "eager",
                                                      "error": "OutOfMemoryError"}])
    batches = _hetero_run(tmp_path / "h2.json", "d2", [
        record("hetero_sage", "eager", 10.10, 0.63, 1024), record("hetero_sage", "inductor", 10.59, 0.65, 1024),
        record("hetero_sage", "gnn_io_cg", 5.17, 0.83, 1024, buckets=[[1, 2], [3, 4]])])
    out = tmp_path / "page"
    assert harness.main(["--merge", _harness_run(tmp_path / "h.json"), full, batches, "--out", str(out)]) == 0
    page = (out / "results.md").read_text()
    assert "## Heterogeneous graphs" in page and "`hetero d1`" in page and "`hetero d2`" in page
    # graph, model, steps on, eager, compile, reduce-overhead, gnn_io, gnn_io_cg, x best, compiles, peak GB
    assert _row(page, "| rec-like | `to_hetero(GraphSAGE)` |") == [
        "rec-like", "`to_hetero(GraphSAGE)`", "full graph", "-", "26.72", "-", "21.80", "-", "1.23x", "0",
        "4.77 / 3.44"]
    assert _row(page, "| rec-like | HeteroConv(SAGEConv) |")[2:] == [
        "1024 seeds, 10,10", "10.10", "10.59", "-", "-", "5.17", "1.95x", "0 (2 buckets)", "0.83 / 0.63"]
    assert _row(page, "| rec-like | RGCNConv |")[3] == "fails"
    assert [run["meta"]["date"] for run in json.loads((out / "results.json").read_text())["hetero"]] == ["d1", "d2"]
