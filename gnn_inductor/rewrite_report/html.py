"""The report as one self-contained HTML page (:func:`write_html`): the model's layers with each rewrite, decline
and pattern that did not match, the lines of the user's code, the graph statistics with a degree histogram, the
graph plan's build times and the kernel path decisions with their predicted and measured times.

Nothing is fetched: the style is inline, the charts are inline SVG, there is no script. Every text from the
report (paths, reasons, the user's source lines) is escaped.
"""
from __future__ import annotations

import json
import linecache
from html import escape
from typing import Optional

from gnn_inductor.frontends import declines as frontend_declines
from gnn_inductor.rewrite_report.records import (
    DECLINED,
    FALLBACK,
    NOT_MATCHED,
    GraphReport,
    as_json,
    attention_paths,
    reports,
)
from gnn_inductor.rewrite_report.text import (
    SECTIONS,
    SUBJECTS,
    display_path,
    graph_stats_line,
    group_misses,
    group_rewrites,
    override_text,
    rewrite_phrase,
    root_class,
    short_kernel,
    who,
)

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#1d1d1f;
padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{margin:1.4em 0 .4em}table{border-collapse:collapse;width:100%;margin:.4em 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f5f5f7}
code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}pre{background:#f5f5f7;padding:.6em;overflow:auto}
.entry{border-left:4px solid #999;padding:.3em .8em;margin:.5em 0;background:#fafafa}
.rewritten .entry,.tag.rewritten{border-color:#2e7d32}.declined .entry,.tag.declined{border-color:#b26a00}
.not-matched .entry,.tag.not-matched{border-color:#c62828}.fallback .entry,.tag.fallback{border-color:#6a1b9a}
.tag{display:inline-block;border-left:4px solid;padding:0 .4em;margin:1px 0;background:#f5f5f7}
.muted{color:#666}.line{color:#444;background:#f5f5f7;padding:0 .3em}
svg text{font:11px system-ui,sans-serif;fill:#333}.bar0{fill:#4e79a7}.bar1{fill:#f28e2b}.bar2{fill:#59a14f}
"""
_KIND_CLASS = {DECLINED: "declined", NOT_MATCHED: "not-matched", FALLBACK: "fallback"}


def _source_line(location: Optional[str]) -> str:
    """The text of the user's line at ``file:line``, escaped (empty where the file cannot be read)."""
    path, _, line = (location or "").rpartition(":")
    if not path or not line.isdigit():
        return ""
    text = linecache.getline(path, int(line)).strip()
    return f' <code class="line">{escape(text)}</code>' if text else ""


def _place(source: dict, root: Optional[str]) -> str:
    if source.get("source") == "<graph>":
        return "<b>the whole graph</b>"
    return (f"<b>{escape(who(source, root))}</b> at <code>{escape(display_path(source.get('source')))}</code>"
            + _source_line(source.get("source")))


def bar_chart(labels: list, series: list, title: str, unit: str = "", width: int = 640, height: int = 180) -> str:
    """An inline SVG bar chart: ``series`` is ``[(name, values)]``, one bar per series at each label, heights
    scaled to the largest value, each bar labelled with its value."""
    values = [v for _, vs in series for v in vs if v is not None]
    top = max(values) if values and max(values) > 0 else 1
    left, bottom, plot_h = 40, 34, height - 58
    slot = (width - left - 10) / max(1, len(labels))
    bar = max(2.0, slot * 0.8 / max(1, len(series)))
    parts = [f'<svg role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#999"/>']
    for i, label in enumerate(labels):
        x0 = left + i * slot + slot * 0.1
        for j, (name, vs) in enumerate(series):
            v = vs[i]
            if v is None:
                continue
            h = plot_h * v / top
            x, y = x0 + j * bar, height - bottom - h
            shown = f"{v:,}" if isinstance(v, int) else f"{v:.3g}"
            parts.append(f'<rect class="bar{j % 3}" x="{x:.1f}" y="{y:.1f}" width="{bar - 1:.1f}" height="{h:.1f}">'
                         f'<title>{escape(f"{name} {label}: {shown}{unit}")}</title></rect>')
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{escape(shown)}</text>')
        parts.append(f'<text x="{x0 + bar * len(series) / 2:.1f}" y="{height - bottom + 14}" '
                     f'text-anchor="middle">{escape(str(label))}</text>')
    for j, (name, _) in enumerate(series):
        if len(series) > 1:
            parts.append(f'<rect class="bar{j % 3}" x="{left + j * 120}" y="{height - 12}" width="10" height="10"/>'
                         f'<text x="{left + j * 120 + 14}" y="{height - 3}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def degree_labels(count: int) -> list:
    """The labels of a degree histogram's buckets (``degree_histogram`` of the graph statistics): 0, 1, 2-3, 4-7..."""
    return ["0", "1"] + [f"{2 ** (k - 1)}-{2 ** k - 1}" for k in range(2, count)][:max(0, count - 2)]


def _stats_section(r: GraphReport) -> str:
    seen, parts = [], []
    for w in r.rewrites:
        stats = w.graph_stats
        if not stats or {k: v for k, v in stats.items() if k != "split"} in seen:
            continue
        seen.append({k: v for k, v in stats.items() if k != "split"})
        parts.append(f"<p>{escape(graph_stats_line(stats))}</p>")
        histogram = stats.get("degree_histogram")
        if histogram:
            parts.append(bar_chart(degree_labels(len(histogram)), [("nodes", list(histogram))],
                                   "nodes per in-degree bucket", " nodes"))
            parts.append('<p class="muted">Nodes per in-degree bucket (powers of two).</p>')
    if not parts:
        return ""
    return '<section class="stats"><h3>Graph statistics</h3>' + "".join(parts) + "</section>"


def _plan_section(r: GraphReport) -> str:
    if not r.hoisted_nodes and not r.plan_builds:
        return ""
    rows = [("structure work in the plan", f"{r.hoisted_nodes} ops, run once per graph"),
            ("plans built", str(r.plan_builds)), ("plans reused", str(r.plan_hits)),
            ("rebuilt after a write behind the version counter", str(r.plan_stale)), ("reuse check", r.plan_check)]
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    chart = ""
    if r.plan_build_ms:
        chart = bar_chart([str(i + 1) for i in range(len(r.plan_build_ms))],
                          [("build", [round(t, 3) for t in r.plan_build_ms])], "plan build times", " ms")
        chart += '<p class="muted">Host time of each recent plan build, ms.</p>'
    return f'<section class="plan"><h3>Graph plan</h3><table>{body}</table>{chart}</section>'


def _tags(items: list, cls: str) -> str:
    return "".join(f'<span class="tag {cls}">{escape(x)}</span><br>' for x in items)


def _layers_table(r: GraphReport, root: Optional[str]) -> str:
    rows: dict = {}

    def row(source):
        key = (source.get("layer_class"), source.get("module"), source.get("source"))
        return rows.setdefault(key, {"source": source, "rewritten": [], DECLINED: [], NOT_MATCHED: [], FALLBACK: []})

    for w in r.rewrites:
        row(w.source)["rewritten"].append(rewrite_phrase(w))
    for m in r.near_misses:
        subject = SUBJECTS.get(m.pattern, m.pattern)
        if subject not in row(m.source)[m.kind]:
            row(m.source)[m.kind].append(subject)
    head = "<tr><th>layer and line</th><th>rewritten</th><th>declined on purpose</th><th>not matched</th></tr>"
    body = "".join(f"<tr><td>{_place(entry['source'], root)}</td><td>{_tags(entry['rewritten'], 'rewritten')}</td>"
                   f"<td>{_tags(entry[DECLINED], 'declined')}</td><td>{_tags(entry[NOT_MATCHED], 'not-matched')}</td>"
                   "</tr>" for entry in rows.values())
    return f'<section class="layers"><h3>Layers</h3><table>{head}{body}</table></section>'


def _rewritten_section(r: GraphReport, root: Optional[str]) -> str:
    items = []
    for source, group in group_rewrites(r.rewrites):
        kernels = "".join(f"<li>runs <code>{escape(w.op)}</code>: {escape(short_kernel(w.kernel))}"
                          f'<details><summary class="muted">kernel</summary>{escape(w.kernel)}</details></li>'
                          for w in group if w.op.startswith("gnn_io."))
        phrases = "".join(f"<li>{escape(rewrite_phrase(w))}</li>" for w in group)
        items.append(f'<div class="entry">{_place(source, root)}<ul>{phrases}{kernels}</ul></div>')
    body = "".join(items) or '<p class="muted">none</p>'
    return f'<section class="rewritten"><h3>Rewritten ({len(r.rewrites)})</h3>{body}</section>'


def _miss_section(r: GraphReport, kind: str, title: str, root: Optional[str]) -> str:
    misses = r.of_kind(kind)
    if kind == FALLBACK and not misses:
        return ""
    items = []
    for source, reason, group in group_misses(misses):
        subjects = ", ".join(dict.fromkeys(SUBJECTS.get(m.pattern, m.pattern) for m in group))
        lines = [f"<li><b>{'found' if kind == NOT_MATCHED else 'why'}:</b> {escape(str(reason))}</li>"]
        if group[0].expected:
            lines.append(f"<li><b>expected:</b> {escape(group[0].expected)}</li>")
        if group[0].override:
            lines.append(f"<li><b>override:</b> <code>{escape(override_text(group[0].override))}</code></li>")
        items.append(f'<div class="entry">{_place(source, root)}: {escape(subjects)}'
                     f'{f" ({len(group)}x)" if len(group) > 1 else ""}<ul>{"".join(lines)}</ul></div>')
    body = "".join(items) or '<p class="muted">none</p>'
    return f'<section class="{_KIND_CLASS[kind]}"><h3>{escape(title)} ({len(misses)})</h3>{body}</section>'


def _passes_section(r: GraphReport) -> str:
    if not r.passes:
        return ""
    body = "".join(f"<tr><td>{escape(p.name)}</td><td>{escape(p.side or 'whole graph')}</td><td>{escape(p.status)}"
                   f"</td><td>{p.count}</td><td>{escape(p.reason)}</td></tr>" for p in r.passes)
    return ('<section class="passes"><h3>Passes</h3><details><summary>each pass of the pipeline, in order</summary>'
            "<table><tr><th>pass</th><th>side</th><th>status</th><th>changed</th><th>reason</th></tr>"
            f"{body}</table></details></section>")


def _kernel_paths_section() -> str:
    decisions = attention_paths()
    if not decisions:
        return ""
    rows, charts = [], []
    for i, d in enumerate(decisions):
        rows.append(f"<tr><td>{i}</td><td>{escape(str(d['family']))}</td><td>{escape(str(d['precision']))}</td>"
                    f"<td><b>{escape(str(d['path']))}</b></td><td>{escape(str(d['order']))}</td>"
                    f"<td>{escape(str(d['reason']))}</td><td>{escape(json.dumps(d['predicted_ms']))}</td>"
                    f"<td>{escape(json.dumps(d['measured_forward_ms']))}</td>"
                    f"<td>{escape(json.dumps(d['order_build_ms']))}</td></tr>")
        paths = list(dict.fromkeys([*d["predicted_ms"], *d["measured_forward_ms"]]))
        if paths:
            charts.append(f"<p>decision {i}: {escape(str(d['family']))}, {escape(str(d['precision']))}</p>" + bar_chart(
                paths, [("predicted", [d["predicted_ms"].get(p) for p in paths]),
                        ("measured first call", [d["measured_forward_ms"].get(p) for p in paths])],
                f"decision {i}: predicted and measured ms per path", " ms", width=420))
    head = ("<tr><th>#</th><th>family</th><th>precision</th><th>path</th><th>order</th><th>why</th>"
            "<th>predicted ms</th><th>measured ms (first call)</th><th>order build ms</th></tr>")
    return (f'<section class="kernel-paths"><h2>Kernel path decisions</h2><table>{head}{"".join(rows)}</table>'
            f'{"".join(charts)}</section>')


def render_html(model=None) -> str:
    """The report of ``model`` (or of everything compiled so far) as one HTML page."""
    chosen, root = reports(model), root_class(model)
    total = {k: sum(len(r.of_kind(k)) for r in chosen) for k in (DECLINED, NOT_MATCHED, FALLBACK)}
    summary = (f"{len(chosen)} graph(s): {sum(len(r.rewrites) for r in chosen)} rewritten, {total[DECLINED]} "
               f"declined on purpose, {total[NOT_MATCHED]} not matched"
               + (f", {total[FALLBACK]} fell back" if total[FALLBACK] else ""))
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>gnn_io report</title>",
             f"<style>{_STYLE}</style></head><body><h1>gnn_io rewrite report</h1>",
             f"<p>{escape(summary)}</p>"]
    if not chosen:
        parts.append('<p class="muted">No graphs compiled yet (call the compiled model once first).</p>')
    for r in chosen:
        sides = "+".join(r.sides) or "left whole to Inductor"
        parts.append(f'<section class="graph" id="graph-{r.graph_id}"><h2>Graph {r.graph_id} '
                     f'<span class="muted">({escape(sides)})</span></h2>')
        parts.append(_layers_table(r, root))
        parts.append(_rewritten_section(r, root))
        parts.extend(_miss_section(r, kind, title, root) for kind, title in SECTIONS)
        parts.append(_stats_section(r))
        parts.append(_plan_section(r))
        parts.append(_passes_section(r))
        parts.append("</section>")
    parts.append(_kernel_paths_section())
    declines = frontend_declines.declines()
    if declines:
        parts.append('<section class="frontends"><h2>DGL message passing left to DGL</h2><ul>'
                     + "".join(f"<li><code>{escape(w)}</code>: {escape(y)}</li>" for w, y in declines)
                     + "</ul></section>")
    data = json.dumps(as_json(model), indent=1, default=str)
    parts.append(f"<details><summary>The JSON report</summary><pre>{escape(data)}</pre></details></body></html>")
    return "".join(parts)


def write_html(path, model=None) -> str:
    """Write the report of ``model`` (or of everything compiled so far) to ``path`` as one self-contained HTML
    page; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(model))
    return str(path)
