"""The results page's sections for the training-step benchmarks' runs: ``benchmarks/minibatch.py --out`` and
``benchmarks/hetero.py --out`` files (``{"meta", "args", "records"}``). A row per workload with every mode's step,
gnn_io's ratio against the best other mode, its compiles after the warm-up and the peak memory, then each run's
command.

``python -m benchmarks.harness --merge results.json run.json ... --out DIR`` joins them into the page
(benchmarks/results_page.py): a workload measured in more than one run keeps the later run's records.
"""
from __future__ import annotations

import re

MODES = ("eager", "inductor", "inductor_cg", "gnn_io", "gnn_io_cg")
BASELINES = ("eager", "inductor", "inductor_cg")
OURS = ("gnn_io", "gnn_io_cg")
MODEL_NAMES = {"sage_mean": "SAGEConv mean", "sage_max": "SAGEConv max", "gcn": "GCNConv", "gat": "GATConv",
               "transformer": "TransformerConv"}


HETERO_NAMES = {"rgcn": "RGCNConv", "rgcn_bases": "RGCNConv, bases", "rgcn_flat": "RGCNConv on homogeneous `x`",
                "rgcn_flat_bases": "RGCNConv on homogeneous `x`, bases", "hgt": "HGTConv",
                "hetero_sage": "HeteroConv(SAGEConv)", "hetero_gat": "HeteroConv(GATConv)",
                "to_hetero_sage": "`to_hetero(GraphSAGE)`", "to_hetero_gat": "`to_hetero(GAT)`"}


def kind_of_run(data) -> str | None:
    """``"minibatch"`` or ``"hetero"`` for a file of either benchmark, else None."""
    args = data.get("args") if isinstance(data, dict) and "records" in data else None
    if not isinstance(args, dict):
        return None
    return "minibatch" if "model" in args and "graph" in args else "hetero" if "models" in args else None


def _minibatch_workload(args: dict, record: dict) -> tuple:
    return (record.get("graph", args["graph"]), record["model"], args["layers"], args["batch"], args["fanout"])


def _hetero_workload(args: dict, record: dict) -> tuple:
    return (record["graph"], record["model"], record.get("batch") or 0, record.get("fanout") or "-")


def latest(runs: list, workload) -> dict:
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


def _best(modes: dict, names: tuple, field: str):
    values = [(modes[m][field], m) for m in names if m in modes and modes[m].get(field)]
    return min(values) if values else None


def _comparison(modes: dict, field: str, peak: str, digits: int) -> list:
    """The x best, compiles and peak cells: the faster gnn_io mode against the best other mode by ``field``."""
    ours, best = _best(modes, OURS, field), _best(modes, BASELINES, field)
    ratio = f"{best[0] / ours[0]:.2f}x" if ours and best else "-"
    mine = modes[ours[1]] if ours else {}
    compiles = (f"{mine['recompiles']}" + (f" / {mine['aot_compiles']}" if "aot_compiles" in mine else "")
                if "recompiles" in mine else "-") + (f" ({len(mine['buckets'])} buckets)" if mine.get("buckets") else "")
    if mine.get("unpadded_calls"):  # calls of a rare size after the buckets settled
        compiles += f", {mine['unpadded_calls']} calls unpadded"
    peaks = [modes[m][peak] for m in BASELINES if peak in modes.get(m, {})]
    memory = f"{mine[peak]:.{digits}f} / {min(peaks):.{digits}f}" if peak in mine and peaks else "-"
    return [ratio, compiles, memory]


def _row(key: tuple, modes: dict) -> str:
    graph, model, layers, batch, fanout = key
    cells = [graph, f"{MODEL_NAMES.get(model, model)}, {layers} layers", str(batch), fanout,
             *(_step(modes.get(m)) for m in MODES), *_comparison(modes, "loop_ms", "peak_mb", 0)]
    return "| " + " | ".join(cells) + " |"


def _hetero_row(key: tuple, modes: dict) -> str:
    graph, model, batch, fanout = key
    steps = ["fails" if "error" in modes.get(m, {}) else f"{modes[m]['ms']:.2f}" if modes.get(m, {}).get("ms")
             else "-" for m in MODES]
    cells = [graph, HETERO_NAMES.get(model, model), "full graph" if not batch else f"{batch} seeds, {fanout}",
             *steps, *_comparison(modes, "ms", "peak_gb", 2)]
    return "| " + " | ".join(cells) + " |"


def _run_lines(runs: list) -> list:
    lines = ["", "Runs:", ""]
    for run in runs:
        meta = run.get("meta", {})
        where = f"{meta['date']}, {meta['device']}, torch {meta['torch']}: " if meta else ""
        command = re.sub(r" --out \S+", "", meta.get("command") or _command(run["args"]))  # where it wrote: not news
        lines.append(f"- {where}`{command}`")
    return lines + [""]


def _section(runs: list, workload, sort_width: int, row, title: str, text: str, columns: list) -> list:
    """A section (none without runs): its title and text, a table of ``columns`` with a ``row(key, modes)`` per
    workload (:func:`latest`; sorted by the key's first ``sort_width`` fields), then the commands of the runs those
    rows come from, in run order."""
    if not runs:
        return []
    shown = latest(runs, workload)
    shown_runs = list({id(run): run for run, _ in shown.values()}.values())
    rows = [row(key, modes) for key, (_, modes) in sorted(shown.items(), key=lambda kv: kv[0][:sort_width])]
    return ([f"## {title}", "", text, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            + rows + _run_lines(shown_runs))


STEP_COLUMNS = ["PyG eager", "`torch.compile`", "reduce-overhead", "gnn_io", "gnn_io_cg", "x best",
                "compiles after warm-up"]


def hetero_section(runs: list) -> list:
    """The heterogeneous benchmark's section (none without runs)."""
    return _section(
        runs, _hetero_workload, 3, _hetero_row, "Heterogeneous graphs",
        "Training steps (forward, cross-entropy, backward, Adam) of two-layer heterogeneous models "
        "(`benchmarks/hetero.py`), full graph or sampled mini-batches, the modes one after another in one process: "
        "ms per step (median). \"x best\": the faster gnn_io mode against the best other mode. Compiles after the "
        "warm-up and the peak memory above the graph (GB: gnn_io's / the lowest other's) are the faster gnn_io "
        "mode's. The graphs, the other models and earlier runs: hetero.md.",
        ["graph", "model", "steps on", *STEP_COLUMNS, "peak GB"])


def minibatch_section(runs: list) -> list:
    """The mini-batch benchmark's section (none without runs)."""
    return _section(
        runs, _minibatch_workload, 4, _row, "Mini-batch training steps",
        "Training steps (forward, backward, Adam) on subgraphs sampled as PyG's `NeighborLoader` samples "
        "(`benchmarks/minibatch.py`), pre-sampled, each mode in its own process: ms per step, alone (synchronised "
        "each step) / loop (back to back). `reduce-overhead` is `torch.compile(mode=\"reduce-overhead\")`; gnn_io_cg "
        "is `backend=\"gnn_io\", mode=\"reduce-overhead\"`, which pads batches to shape buckets replayed as CUDA "
        "graphs. \"x best\": the best gnn_io loop against the best other loop. Compiles after the warm-up (Dynamo / "
        "AOTAutograd) and the peak memory above the resident graph (MB: gnn_io's / the lowest other's) are the faster "
        "gnn_io mode's. Profiles, the steps with the sampling in the loop and earlier runs: minibatch.md.",
        ["graph", "model", "seeds", "fan-out", *STEP_COLUMNS, "peak MB"])


def _command(args: dict) -> str:
    """The command of a mini-batch run that did not record its own (its arguments)."""
    return (f"python -m benchmarks.minibatch --graph {args['graph']} --model {args['model']} --layers "
            f"{args['layers']} --batch {args['batch']} --fanout {args['fanout']} --steps {args['steps']} --warmup "
            f"{args['warmup']} --modes {args['modes']}")
