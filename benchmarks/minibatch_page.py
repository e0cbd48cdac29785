"""The results page's mini-batch section: the runs of ``benchmarks/minibatch.py --out`` (``{"meta", "args",
"records"}``), a row per workload (graph, model, layers, seeds, fan-out) with every mode's step, gnn_io's ratio
against the best other mode, its compiles after the warm-up and the peak memory, then each run's command.

``python -m benchmarks.harness --merge results.json run.json ... --out DIR`` joins them into the page
(benchmarks/results_page.py): a workload measured in more than one run keeps the later run's records.
"""
from __future__ import annotations

MODES = ("eager", "inductor", "inductor_cg", "gnn_io", "gnn_io_cg")
BASELINES = ("eager", "inductor", "inductor_cg")
OURS = ("gnn_io", "gnn_io_cg")
MODEL_NAMES = {"sage_mean": "SAGEConv mean", "sage_max": "SAGEConv max", "gcn": "GCNConv", "gat": "GATConv",
               "transformer": "TransformerConv"}


def is_minibatch_run(data: dict) -> bool:
    return isinstance(data, dict) and "args" in data and "records" in data


def workload(args: dict, record: dict) -> tuple:
    return (record.get("graph", args["graph"]), record["model"], args["layers"], args["batch"], args["fanout"])


def latest(runs: list) -> dict:
    """workload -> (run, {mode: record}), a later run's records replacing an earlier one's."""
    out = {}
    for run in runs:
        for record in run["records"]:
            key = workload(run["args"], record)
            if key not in out or out[key][0] is not run:
                out[key] = (run, {})
            out[key][1][record["mode"]] = record
    return out


def _step(record) -> str:
    if record is None:
        return "-"
    if "error" in record:
        return "fails"
    return f"{record['alone_ms']:.2f} / {record['loop_ms']:.2f}"


def _best(modes: dict, names: tuple):
    values = [(modes[m]["loop_ms"], m) for m in names if m in modes and "loop_ms" in modes[m]]
    return min(values) if values else None


def _row(key: tuple, modes: dict) -> str:
    graph, model, layers, batch, fanout = key
    ours, best = _best(modes, OURS), _best(modes, BASELINES)
    ratio = f"{best[0] / ours[0]:.2f}x" if ours and best else "-"
    mine = modes[ours[1]] if ours else {}
    compiles = (f"{mine['recompiles']} / {mine['aot_compiles']}" if "recompiles" in mine else "-") + (
        f" ({len(mine['buckets'])} buckets)" if mine.get("buckets") else "")
    peaks = [modes[m]["peak_mb"] for m in BASELINES if "peak_mb" in modes.get(m, {})]
    peak = f"{mine['peak_mb']:.0f} / {min(peaks):.0f}" if "peak_mb" in mine and peaks else "-"
    cells = [graph, f"{MODEL_NAMES.get(model, model)}, {layers} layers", str(batch), fanout,
             *(_step(modes.get(m)) for m in MODES), ratio, compiles, peak]
    return "| " + " | ".join(cells) + " |"


def minibatch_section(runs: list) -> list:
    """The section's lines (none without runs)."""
    if not runs:
        return []
    lines = ["## Mini-batch training steps", "",
             "Training steps (forward, backward, Adam) on subgraphs sampled as PyG's `NeighborLoader` samples "
             "(`benchmarks/minibatch.py`), pre-sampled, each mode in its own process: ms per step, alone "
             "(synchronised each step) / loop (back to back). `reduce-overhead` is `torch.compile(mode="
             "\"reduce-overhead\")`; gnn_io_cg is `backend=\"gnn_io\", mode=\"reduce-overhead\"`, which pads batches "
             "to shape buckets replayed as CUDA graphs. \"x best\": the best gnn_io loop against the best other "
             "loop. Compiles after the warm-up (Dynamo / AOTAutograd) and the peak memory above the resident graph "
             "(MB: gnn_io's / the lowest other's) are the faster gnn_io mode's. Profiles, the steps with the "
             "sampling in the loop and earlier runs: minibatch.md.", "",
             "| graph | model | seeds | fan-out | PyG eager | `torch.compile` | reduce-overhead | gnn_io | gnn_io_cg "
             "| x best | compiles after warm-up | peak MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = latest(runs)
    lines += [_row(key, modes) for key, (_, modes) in sorted(rows.items(), key=lambda kv: kv[0][:4])]
    lines += ["", "Runs:", ""]
    for run in runs:
        meta = run.get("meta", {})
        where = f"{meta['date']}, {meta['device']}, torch {meta['torch']}: " if meta else ""
        command = meta.get("command") or _command(run["args"])
        lines.append(f"- {where}`{command}`")
    return lines + [""]


def _command(args: dict) -> str:
    """The command of a run that did not record its own (its arguments)."""
    return (f"python -m benchmarks.minibatch --graph {args['graph']} --model {args['model']} --layers "
            f"{args['layers']} --batch {args['batch']} --fanout {args['fanout']} --steps {args['steps']} --warmup "
            f"{args['warmup']} --modes {args['modes']}")
