"""The harness's outputs: ``results.json`` (every record), ``results.md`` (the results page: a table per layer
family with ratios against PyG eager, ``torch.compile`` and turbo-gnn and the peak memory of each, then every
column of every case) and two charts, ``speedup.png`` and ``memory.png``. :func:`merge` joins the
``results.json`` of several runs (a suite run in pieces, or runs of different dtypes) into one page, with the runs
of ``benchmarks/minibatch.py`` and ``benchmarks/hetero.py`` among them as sections of their own
(benchmarks/run_pages.py)."""
from __future__ import annotations

import json
import math
import os

from benchmarks.run_pages import hetero_section, kind_of_run, minibatch_section

STEP_RUNS = ("minibatch", "hetero")  # the training-step benchmarks whose runs the page shows

# layer families of the page, in its order: (title, what gnn_io runs for them, the harness's layer names)
FAMILIES = (
    ("Sum and mean aggregation", "cuSPARSE SpMM with a transposed CSR for the backward, or the block-sparse "
     "Tensor-Core SpMM on locally dense graphs", ("gcn", "sage_mean", "gin", "graphconv", "sage_multi", "pna")),
    ("Max and min aggregation", "degree-split Triton reductions with the message fused in",
     ("sage_max", "graphconv_max", "general_max", "edge_conv")),
    ("Attention", "fused CSR attention (online softmax, split backward), or block-sparse Tensor-Core attention on "
     "locally dense graphs", ("gat", "gat_edge", "gat_edge64", "gatv2", "transformer", "gat_drop", "gatv2_drop",
                              "transformer_drop")),
)
LAYER_NAMES = {"gcn": "GCNConv", "sage_mean": "SAGEConv mean", "gin": "GINConv", "graphconv": "GraphConv",
               "sage_multi": "SAGEConv multi-aggr", "pna": "PNAConv", "sage_max": "SAGEConv max",
               "graphconv_max": "GraphConv max", "general_max": "GeneralConv max", "edge_conv": "EdgeConv",
               "gat": "GATConv", "gat_edge": "GATConv edge_dim", "gat_edge64": "GATConv edge_dim 64",
               "gatv2": "GATv2Conv", "transformer": "TransformerConv", "gat_drop": "GATConv dropout",
               "gatv2_drop": "GATv2Conv dropout", "transformer_drop": "TransformerConv dropout"}
BASE_MODES = ("eager", "inductor", "gnn_io")


def write_outputs(records: list, meta: dict, out_dir: str, with_chart: bool = True, step_runs=None) -> str:
    """Writes the JSON and the page (and, with ``with_chart``, the charts); returns the page. ``step_runs``: the
    training-step benchmarks' runs by :data:`STEP_RUNS` name, kept in the JSON under that name and shown in sections
    of their own."""
    step_runs = {kind: list(runs) for kind, runs in (step_runs or {}).items() if runs}
    os.makedirs(out_dir, exist_ok=True)
    clean = [{k: v for k, v in r.items() if k != "out"} for r in records]
    for r in clean:
        r.setdefault("dtype", meta.get("dtype", "float32"))
    runs = meta.get("runs") or [{k: meta[k] for k in meta if k != "runs"}]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": clean, **step_runs}, f, indent=1)
    page = results_page(clean, runs, step_runs)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(page)
    if with_chart:
        try:
            speedup_chart(clean, os.path.join(out_dir, "speedup.png"))
            memory_chart(clean, os.path.join(out_dir, "memory.png"))
        except ImportError as exc:  # matplotlib missing: the tables are the result
            print(f"no charts: {exc}")
    return page


def merge(paths: list, out_dir: str) -> int:
    """One page from several runs: ``--merge A/results.json B/results.json --out DIR``. A case measured in more
    than one run (same graph, layer, mode and dtype) keeps the later run's record. A file written by
    ``benchmarks/minibatch.py --out`` or ``benchmarks/hetero.py --out`` joins that benchmark's section."""
    runs, by_key, step_runs = [], {}, {kind: [] for kind in STEP_RUNS}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        if kind_of_run(run) is not None:
            step_runs[kind_of_run(run)].append(run)
            continue
        for kind in STEP_RUNS:
            step_runs[kind].extend(run.get(kind, []))
        metas = run["meta"].get("runs") or [run["meta"]]
        runs.extend(metas)
        for r in run["results"]:
            r.setdefault("dtype", metas[0].get("dtype", "float32"))
            by_key[(r["graph"], r["layer"], r["mode"], r["dtype"])] = r
    if not runs:
        raise SystemExit("--merge: no harness results.json among the files (a page needs at least one)")
    meta = {"runs": runs, "device": runs[0]["device"]}
    print(write_outputs(list(by_key.values()), meta, out_dir, step_runs=step_runs))
    return 0


def _fmt(value, digits=2):
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def _cases(records: list) -> dict:
    """(graph, layer, dtype) -> {mode: record}, in the records' order."""
    cases = {}
    for r in records:
        cases.setdefault((r["graph"], r["layer"], r.get("dtype", "float32")), {})[r["mode"]] = r
    return cases


def _time(record: dict, key: str = "fwdbwd_ms") -> str:
    if not record:
        return "-"
    if "error" in record:
        return "fails: " + record["error"].replace("|", "/")[:48]
    return _fmt(record.get(key))


def _speedup(base: dict, new: dict):
    if base.get("fwdbwd_ms") and new.get("fwdbwd_ms"):
        return base["fwdbwd_ms"] / new["fwdbwd_ms"]
    return None


def _ratio(base: dict, new: dict) -> str:
    value = _speedup(base, new)
    return "-" if value is None else f"{value:.2f}x"


def _header(runs: list) -> list:
    first = runs[0]
    lines = [f"# Benchmarks: {first['device']}", "",
             f"torch {first['torch']}, Triton {first['triton']}, torch_geometric {first['torch_geometric']}, "
             f"Python {first.get('python', '-')}, "
             + ", or ".join(f"{f} features per node" for f in sorted({r.get("features", first["features"])
                                                                       for r in runs}, reverse=True))
             + " (each run's command has its own).", "",
             "Each figure is the median of a layer's forward+backward step (ms), timed with CUDA events after "
             "warm-up; peak memory is `torch.cuda.max_memory_allocated` over one step (GB). Ratios are speedups of "
             "gnn_io: above 1, gnn_io is faster. `rel err` is gnn_io's output against PyG eager's. turbo-gnn (the "
             "paper's kernels, built from its sdist on the same machine) has an SpMM for sum and mean aggregation "
             "only.", "", "Runs (commands from the repository root):", ""]
    for run in runs:
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(f"- {run['date']}, {run['dtype']}: `{run['command']}`{note}")
    return lines + [""]


def _under_cuda_graphs(modes: dict) -> bool:
    """Whether a case's gnn_io figure is the CUDA-graph mode's alone (the training of a small graph, where every mode
    that pays runs under CUDA graphs): such a case is a row of :func:`_cuda_graph_section`, not of its family's."""
    return "gnn_io_cg" in modes and "gnn_io" not in modes


def _cuda_graph_section(cases: dict) -> list:
    """The cases measured with gnn_io under CUDA graphs and without it: each mode's step, gnn_io_cg's speedup over the
    best of the other three, and each mode's peak (for the CUDA-graph modes over the timed steps from the first,
    recording included)."""
    rows = [(key, modes) for key, modes in cases.items() if _under_cuda_graphs(modes)]
    if not rows:
        return []
    lines = ["## Under CUDA graphs (`mode=\"reduce-overhead\"`)", "",
             "Small graphs, where a step is bound by the host's calls: gnn_io_cg is `torch.compile(backend=\"gnn_io\", "
             "mode=\"reduce-overhead\")`, reduce-overhead `torch.compile(mode=\"reduce-overhead\")`. x best: "
             "gnn_io_cg against the best of the other three.", "",
             "| graph | nodes | edges | layer | dtype | PyG eager | torch.compile | reduce-overhead | gnn_io_cg "
             "| x best | peak GB eager / compile / reduce-overhead / gnn_io_cg |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for (graph, layer, dtype), modes in rows:
        e, i, c, g = (modes.get(m, {}) for m in ("eager", "inductor", "inductor_cg", "gnn_io_cg"))
        times = [r["fwdbwd_ms"] for r in (e, i, c) if r.get("fwdbwd_ms")]
        best = f"{min(times) / g['fwdbwd_ms']:.2f}x" if times and g.get("fwdbwd_ms") else "-"
        peaks = " / ".join(_fmt(r.get("peak_gb"), 3) for r in (e, i, c, g))
        lines.append(f"| {graph} | {g.get('nodes')} | {g.get('edges')} | {LAYER_NAMES.get(layer, layer)} | {dtype} | "
                     f"{_time(e)} | {_time(i)} | {_time(c)} | {_time(g)} | {best} | {peaks} |")
    return lines + [""]


def _family_section(title: str, kernels: str, layers: tuple, cases: dict) -> list:
    rows = [(key, modes) for key, modes in cases.items() if key[1] in layers and not _under_cuda_graphs(modes)]
    if not rows:
        return []
    versus_compile = [v for _, m in rows if (v := _speedup(m.get("inductor", {}), m.get("gnn_io", {}))) is not None]
    lines = [f"## {title}", "", f"gnn_io runs {kernels}."]
    if versus_compile:
        lines.append(f"Against `torch.compile` in the same run: {min(versus_compile):.2f}x to "
                     f"{max(versus_compile):.2f}x (geometric mean {_geomean(versus_compile):.2f}x over "
                     f"{len(versus_compile)} cases).")
    lines += ["", "| graph | nodes | edges | layer | dtype | PyG eager | torch.compile | gnn_io | turbo-gnn | "
              "vs eager | vs torch.compile | vs turbo-gnn | peak GB eager / compile / gnn_io | rel err |",
              "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for (graph, layer, dtype), modes in rows:
        e, i, g, t = (modes.get(m, {}) for m in ("eager", "inductor", "gnn_io", "turbo_gnn"))
        any_r = e or i or g
        peaks = " / ".join(_fmt(r.get("peak_gb")) for r in (e, i, g))
        lines.append(f"| {graph} | {any_r.get('nodes')} | {any_r.get('edges')} | {LAYER_NAMES.get(layer, layer)} | "
                     f"{dtype} | {_time(e)} | {_time(i)} | {_time(g)} | "
                     f"{_time(t) if t.get('fwdbwd_ms') else '-'} | {_ratio(e, g)} | {_ratio(i, g)} | "
                     f"{_ratio(t, g)} | {peaks} | {_fmt(g.get('rel_err'), 7)} |")
    return lines + [""]


def _geomean(values: list) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def results_page(records: list, runs: list, step_runs=None) -> str:
    cases = _cases(records)
    lines = _header(runs) + ["![gnn_io speedup per case](speedup.png)", "", "![peak memory per case](memory.png)",
                             ""]
    grouped = set()
    for title, kernels, layers in FAMILIES:
        lines += _family_section(title, kernels, layers, cases)
        grouped.update(layers)
    rest = tuple(sorted({layer for _, layer, _ in cases} - grouped))
    lines += _family_section("Other layers", "the rewrites named in the last table's path column", rest, cases)
    lines += _cuda_graph_section(cases)
    step_runs = step_runs or {}
    lines += minibatch_section(step_runs.get("minibatch", [])) + hetero_section(step_runs.get("hetero", []))
    return "\n".join(lines + _detail_table(records)) + "\n"


def _detail_table(records: list) -> list:
    """Every column of every case: forward times, the step's own memory, plan build time, the roofline, the
    half-precision error against a float32 eager reference, the kernel paths taken, the extra modes."""
    extra = list(dict.fromkeys(r["mode"] for r in records if r["mode"] not in BASE_MODES))
    lines = ["## Every column", "",
             "fwd: forward alone (ms). step GB: the step's peak less what was allocated before it. plan build: "
             "gnn_io's structure work at the first call (ms). CSR build: the backend's CSR build of the graph alone, "
             "both directions, timed to the end of its device work (ms), and the GiB it allocates at its peak, its "
             "outputs included. roofline: the least bytes the layer must move over the copy bandwidth measured in "
             "the run (ms). err vs fp32: half-precision runs, against eager in float32 from the same inputs.", "",
             "| graph | layer | dtype | fwd eager | fwd compile | fwd gnn_io | step GB (eager / compile / gnn_io) | "
             "plan build | CSR build (ms / peak GB) | roofline | err vs fp32 (eager / gnn_io) | gnn_io path |"
             + "".join(f" {m} |" for m in extra),
             "|---|---|---|---:|---:|---:|---|---:|---|---:|---|---|" + "---:|" * len(extra)]
    for (graph, layer, dtype), modes in _cases(records).items():
        e, i, g = (modes.get(m, {}) for m in BASE_MODES)
        lines.append(f"| {graph} | {layer} | {dtype} | {_time(e, 'fwd_ms')} | {_time(i, 'fwd_ms')} | "
                     f"{_time(g, 'fwd_ms')} | {' / '.join(_fmt(r.get('step_gb')) for r in (e, i, g))} | "
                     f"{_fmt(g.get('plan_build_ms'))} | {_csr_build(g)} | {_fmt(g.get('roofline_ms'), 3)} | "
                     f"{_fmt(e.get('err_vs_fp32'), 5)} / {_fmt(g.get('err_vs_fp32'), 5)} | {g.get('paths', '-')} |"
                     + "".join(f" {_time(modes.get(m, {}))} |" for m in extra))
    return lines


def _csr_build(record: dict) -> str:
    if "csr_build_error" in record:
        return "fails: " + record["csr_build_error"][:40]
    if record.get("csr_build_ms") is None:
        return "-"
    return f"{_fmt(record['csr_build_ms'])} / {_fmt(record.get('csr_build_gb'))}"


def _bars(ax, labels: list, series: list, ylabel: str, log: bool) -> None:
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series):
        xs = [x + (k - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    ax.set_xticks(list(range(len(labels))))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)


def _figure(labels: list):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(max(7, len(labels) * 0.55), 4.5))


def _labels(keys: list) -> list:
    return [f"{LAYER_NAMES.get(layer, layer)} {graph}" + ("" if dtype == "float32" else f" {dtype}")
            for graph, layer, dtype in keys]


def speedup_chart(records: list, path: str) -> None:
    """gnn_io's speedup over each other mode, one group of bars per case (log scale: 1 is parity)."""
    cases = {k: m for k, m in _cases(records).items() if m.get("gnn_io", {}).get("fwdbwd_ms")}
    if not cases:
        return
    labels = _labels(list(cases))
    fig, ax = _figure(labels)
    series = [(f"vs {name}", [_speedup(m.get(mode, {}), m["gnn_io"]) for m in cases.values()])
              for mode, name in (("eager", "PyG eager"), ("inductor", "torch.compile"), ("turbo_gnn", "turbo-gnn"))
              if any(m.get(mode, {}).get("fwdbwd_ms") for m in cases.values())]
    _bars(ax, labels, series, "gnn_io speedup (fwd+bwd, log)", log=True)
    ax.axhline(1.0, color="black", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def memory_chart(records: list, path: str) -> None:
    """Peak memory of one forward+backward step per case and mode (GB, log scale)."""
    cases = {k: m for k, m in _cases(records).items() if any(m.get(x, {}).get("peak_gb") for x in BASE_MODES)}
    if not cases:
        return
    labels = _labels(list(cases))
    fig, ax = _figure(labels)
    series = [(name, [m.get(mode, {}).get("peak_gb") for m in cases.values()])
              for mode, name in (("eager", "PyG eager"), ("inductor", "torch.compile"), ("gnn_io", "gnn_io"))]
    _bars(ax, labels, series, "peak memory of a step, GB (log)", log=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
