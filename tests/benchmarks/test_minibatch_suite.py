"""The mini-batch suite: its rows, their commands and GPUs, and one row run end to end on the CPU."""
import json
import os

import pytest

from benchmarks import minibatch_suite as suite
from gnn_inductor import buckets


def test_rows_take_each_models_shape_and_are_dealt_over_the_gpus(tmp_path):
    args = suite.parse(["--models", "gcn,gat,sage_max", "--batches", "1024,4096", "--gpus", "2",
                        "--out", str(tmp_path), "--", "--profile", "5"])
    rows = suite.rows(args)
    assert rows == [("gcn", 1024), ("gat", 1024), ("sage_max", 1024), ("gcn", 4096), ("gat", 4096),
                    ("sage_max", 4096)]
    chains = suite.lanes(rows, args.gpus)
    assert chains == [rows[0::2], rows[1::2]] and sorted(sum(chains, [])) == sorted(rows)
    assert [len(c) for c in suite.lanes(rows[:1], 4)] == [1] and suite.lanes(rows, 0) == [rows]
    cmd = suite.command(args, "gat", 4096)
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert cmd[1:3] == ["-m", "benchmarks.minibatch"] and cmd[-2:] == ["--profile", "5"]
    assert (flags["--layers"], flags["--fanout"], flags["--batch"]) == ("2", "10,10", "4096")
    assert flags["--out"] == os.path.join(str(tmp_path), "gat-4096.json")
    assert suite.SHAPES["gcn"] == (3, "15,10,5") and flags["--modes"] == suite.MODES
    assert flags["--pool"] == "0"  # a new batch every step unless --pool says otherwise


def test_unknown_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        suite.parse(["--models", "gcn,gin", "--out", str(tmp_path)])
    assert "unknown --models gin" in capsys.readouterr().err


def test_one_row_end_to_end_on_the_cpu(tmp_path, capsys):
    tiny = ["--hidden", "16", "--features", "8", "--classes", "4", "--pool", "3", "--device", "cpu",
            "--train-fraction", "0.05", "--same-process"]
    runs = suite.main(["--models", "sage_mean", "--batches", "16", "--modes", "eager,gnn_io", "--graph",
                       "rmat-small", "--steps", "2", "--warmup", "2", "--gpus", "0", "--out", str(tmp_path), "--",
                       *tiny])
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "sage_mean-16.json").read_text())
    assert len(runs) == 1 and {r["mode"] for r in data["records"]} == {"eager", "gnn_io"}
    assert data["args"]["layers"] == 3 and data["args"]["fanout"] == "15,10,5"
    assert "| SAGEConv mean, 3 layers | 16 | 15,10,5 | " in printed and "no result" not in printed
    # a row stopped by --timeout is reported missing, its log says why
    suite.main(["--models", "gcn", "--batches", "16", "--gpus", "0", "--timeout", "0.01", "--out", str(tmp_path)])
    assert "no result (see the logs in --out): gcn at 16 seeds" in capsys.readouterr().out
    assert "stopped after --timeout" in (tmp_path / "gcn-16.log").read_text()


def test_the_warm_up_covers_the_buckets_settling():
    assert suite.parse(["--out", "x"]).warmup > buckets.SETTLE_CALLS + 1
