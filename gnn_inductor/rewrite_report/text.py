"""The report in words for people: each entry names the model layer and the line of the user's code first, then
says what happened, in three sections kept apart: rewritten, declined on purpose (with the reason and the setting
that overrides it), not matched (what the pattern expected and what it found), plus a fourth, fell back, where
something failed and the backend ran a safe alternative. Internal identifiers (edge-function keys, argument
roles) stay in the JSON (:func:`gnn_inductor.rewrite_report.records.as_json`). docs/report.md shows the form.
"""
from __future__ import annotations

import os
from typing import Optional

from gnn_inductor import config
from gnn_inductor.frontends import declines as frontend_declines
from gnn_inductor.rewrite_report.records import (
    DECLINED,
    FALLBACK,
    NOT_MATCHED,
    GraphReport,
    NearMiss,
    Rewrite,
    attention_paths,
    reports,
)

SECTIONS = ((DECLINED, "Declined on purpose"), (NOT_MATCHED, "Not matched"), (FALLBACK, "Fell back after an error"))
FAMILIES = {"gat": "GAT", "gatv2": "GATv2", "dot": "dot-product"}
# What a pattern's rewrite or near miss is about, in words
SUBJECTS = {"attention": "fused attention", "edge_softmax": "edge softmax", "spmm": "sparse matrix product (SpMM)",
            "gather_scatter": "gather-scatter aggregation", "gather_linear": "linear map before its gather",
            "attention_bias": "attention bias", "score_projection": "attention score projection",
            "shared_input_linears": "linear maps of one input", "relation_groups": "relations of one input",
            "mini_batch": "mini-batch switch",
            "cuda_graphs": "CUDA graphs", "backend": "the backend's passes", "inductor": "Inductor's compile"}
# The CPU references, as the kernel modules name them
_REFERENCES = {"segment reference": "the CPU reference (segment ops)",
               "segment-sum reference": "the CPU reference (segment sums)"}


def display_path(location: Optional[str]) -> str:
    """A ``file:line`` as a person reads it: inside an installed package from the package's folder
    (``torch_geometric/nn/conv/gat_conv.py:361``), under the working directory relative to it, else whole."""
    if not location:
        return "<unknown>"
    marker = "site-packages" + os.sep
    if marker in location:
        return location.split(marker, 1)[1]
    path, sep, line = location.rpartition(":")
    if not sep or not os.path.isabs(path):
        return location
    relative = os.path.relpath(path)
    return location if relative.startswith("..") else f"{relative}:{line}"


def who(source: dict, root: Optional[str] = None) -> str:
    """The layer an entry belongs to: ``GATConv conv1`` (class and attribute path), the class alone, ``root`` (the
    compiled module's class, for a layer compiled on its own), or ``the whole graph``."""
    if source.get("source") == "<graph>":
        return "the whole graph"
    cls, module = source.get("layer_class"), source.get("module")
    if cls:
        return f"{cls} {module}" if module else cls
    return root or "code"


def entry_head(source: dict, root: Optional[str] = None) -> str:
    """``GATConv conv1 at model.py:52``: the layer and the user's line."""
    if source.get("source") == "<graph>":
        return "the whole graph"
    return f"{who(source, root)} at {display_path(source.get('source'))}"


def short_kernel(kernel: str) -> str:
    """The first clause of a kernel's description (up to a ``:`` or ``;`` outside parentheses), CPU references in
    words."""
    depth, end = 0, len(kernel)
    for i, ch in enumerate(kernel):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch in ":;":
            end = i
            break
    head = kernel[:end].strip()
    return _REFERENCES.get(head, head)


def rewrite_phrase(w: Rewrite) -> str:
    """What a rewrite made of the code, in words."""
    d = w.details
    if w.pattern == "attention":
        family = FAMILIES.get(d.get("family"), "custom")
        return f"fused attention ({family} scores, softmax and aggregation in one op)"
    if w.pattern == "edge_softmax":
        return "edge softmax in one op"
    if w.pattern == "spmm":
        weighted = ", weighted" if d.get("weighted") else ""
        return f"sparse matrix product over the graph (SpMM, {d.get('reduce', 'sum')}{weighted})"
    if w.pattern == "gather_scatter":
        members = d.get("members")
        if members:
            return f"one fused pass over the edges for {len(members)} reductions (" + \
                ", ".join(m["reduce"] for m in members) + ")"
        return f"fused gather-scatter ({d.get('reduce', 'sum')})"
    if w.pattern == "gather_linear":
        return (f"linear map {d.get('weight')} moved before its gather: {d.get('gathers')} GEMM(s) over node rows "
                "instead of one over the edges")
    if w.pattern == "attention_bias":
        return f"bias {d.get('bias')} added inside the attention op's output"
    if w.pattern == "score_projection":
        return "attention scores made by the feature GEMM's kernel (gnn_io::linear_scores)"
    if w.pattern == "relation_groups":
        if d.get("order") == "maps first":
            maps = "linear maps as one GEMM" if d.get("one_gemm") else "linear maps"
            return f"{d.get('relations')} relations' {maps} first, then their SpMMs as one over a typed CSR"
        return (f"{d.get('relations')} relations' SpMMs of one input as one over a typed CSR"
                + (", their linear maps as one GEMM" if d.get("one_gemm") else ""))
    if w.pattern == "shared_input_linears":
        weights = ", ".join(d.get("weights") or ())
        return f"{len(d.get('widths') or ())} linear maps of one input as one GEMM ({weights})"
    return SUBJECTS.get(w.pattern, w.pattern)


def override_text(override: tuple) -> str:
    """``GNN_IO_CPU_REWRITE=1 (options={"cpu_rewrite": True}) or GNN_IO_FORCE=1 (...)``."""
    parts = []
    for name, value in override:
        shown = int(value) if isinstance(value, bool) else value
        parts.append(f"{config.SETTINGS[name].env}={shown} (options={{{name!r}: {value!r}}})")
    return " or ".join(parts)


def _counted(patterns: list) -> str:
    """``edge softmax and 3x gather-scatter aggregation``."""
    seen: dict = {}
    for p in patterns:
        seen[p] = seen.get(p, 0) + 1
    named = [(f"{n}x " if n > 1 else "") + SUBJECTS.get(p, p) for p, n in seen.items()]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def group_rewrites(rewrites: list) -> list:
    """``[(source, [rewrite, ...])]``: rewrites grouped by layer and line, in order of first appearance."""
    groups: dict = {}
    for w in rewrites:
        key = (w.source.get("layer_class"), w.source.get("module"), w.source.get("source"))
        groups.setdefault(key, (w.source, []))[1].append(w)
    return list(groups.values())


def group_misses(misses: list) -> list:
    """``[(source, reason, [near miss, ...])]``: near misses of one layer, line and reason together."""
    groups: dict = {}
    for m in misses:
        key = (m.source.get("layer_class"), m.source.get("module"), m.source.get("source"), str(m.reason))
        groups.setdefault(key, (m.source, m.reason, []))[2].append(m)
    return list(groups.values())


def graph_stats_line(stats: dict) -> str:
    return (f"{stats['nodes']:,} nodes, {stats['edges']:,} edges, max degree {stats['max_degree']:,}, "
            f"mean degree {stats['mean_degree']}, {stats.get('isolated_nodes', 0):,} isolated node(s) (in-degree: "
            f"edges per destination)")


def _split_line(split: dict) -> str:
    return (f"degree split (CUDA kernels): rows over {split['max_edges']} edges are hubs ({split['hub_rows']} rows, "
            f"{split['hub_edge_share']:.1%} of the edges), {split['work_items']} work items; threshold by "
            f"{split.get('source', 'rule')}")


def _distinct_stats(r: GraphReport) -> list:
    seen = []
    for w in r.rewrites:
        if w.graph_stats:
            core = {k: v for k, v in w.graph_stats.items() if k != "split"}
            if core not in seen:
                seen.append(core)
    return seen


def _rewritten_lines(r: GraphReport, root: Optional[str]) -> list:
    lines = [f"  Rewritten ({len(r.rewrites)})" + ("" if r.rewrites else ": none")]
    sides = "+".join(r.sides) or "forward"
    per_entry_stats = len(_distinct_stats(r)) > 1
    for source, group in group_rewrites(r.rewrites):
        phrases = [rewrite_phrase(w) for w in group]
        more = "".join(f"; {p}" for p in phrases[1:])
        lines.append(f"    {entry_head(source, root)} -> {phrases[0]}, {sides}{more}")
        for w in group:
            if w.op.startswith("gnn_io."):
                lines.append(f"        runs {w.op}: {short_kernel(w.kernel)}")
            for member in w.details.get("members", ()):  # a merged rewrite: the reductions sharing its pass
                lines.append(f"      member {member['reduce']} (written at "
                             f"{', '.join(display_path(a) for a in member['at'])})")
            if w.graph_stats and per_entry_stats:
                lines.append(f"        graph: {graph_stats_line(w.graph_stats)}")
            if w.graph_stats and "split" in w.graph_stats:
                lines.append(f"        {_split_line(w.graph_stats['split'])}")
    return lines


def _miss_lines(r: GraphReport, kind: str, title: str, root: Optional[str]) -> list:
    misses = r.of_kind(kind)
    if kind == FALLBACK and not misses:
        return []
    lines = [f"  {title} ({len(misses)})" + ("" if misses else ": none")]
    for source, reason, group in group_misses(misses):
        subject = _counted([m.pattern for m in group])
        if kind == DECLINED:
            lines.append(f"    {entry_head(source, root)}: {subject} not rewritten")
            lines.append(f"        why: {reason}")
            if group[0].override:
                lines.append(f"        override: {override_text(group[0].override)}")
        elif kind == NOT_MATCHED:
            lines.append(f"    {entry_head(source, root)}: {subject} not matched")
            lines.append(f"        found: {reason}")
            if group[0].expected:
                lines.append(f"        expected: {group[0].expected}")
        else:
            lines.append(f"    {entry_head(source, root)}: {subject} fell back")
            lines.append(f"        why: {reason}")
    return lines


def _plan_lines(r: GraphReport) -> list:
    lines = []
    stats = _distinct_stats(r)
    if len(stats) == 1:
        lines.append(f"  graph: {graph_stats_line(stats[0])}")
    if r.hoisted_nodes:
        built = ", ".join(f"{t:.1f}" for t in r.plan_build_ms[-4:])
        lines.append(f"  graph plan: {r.hoisted_nodes} ops of structure work (CSR, self loops, normalisation) run "
                     f"once per graph; plan built {r.plan_builds}x" + (f" ({built} ms)" if built else "")
                     + f", reused {r.plan_hits}x")
    if r.plan_check:
        lines.append(f"  plan reuse: {r.plan_check}")
    if r.plan_stale:
        lines.append(f"  plan rebuilt {r.plan_stale}x for a graph whose structure tensors were written without "
                     "their version counter changing (through .data or .numpy()): found by their fingerprint")
    return lines


def _dense_lines(r: GraphReport) -> list:
    lines = []
    if any(r.gemm_accumulates.values()):
        folded = ", ".join(f"{n} in the {g}" for g, n in r.gemm_accumulates.items() if n)
        lines.append("  GEMMs adding into a fresh buffer in place (gnn_io::addmm_into, no copy; "
                     f"gnn_inductor/passes/gemm_accumulate.py): {folded}")
    if r.packed_grads:
        lines.append(f"  attention gradients written into the fused linear map's packed gradient, no concatenation "
                     f"(gnn_io::attention_backward_packed, gnn_inductor/passes/packed_grads.py): {r.packed_grads}")
    if r.projected_grads:
        lines.append("  the fused linear map's input, weight and bias gradients made from that packed gradient by "
                     "blocks of rows, never whole (gnn_io::attention_backward_projected, "
                     f"gnn_inductor/passes/packed_grads.py): {r.projected_grads}")
    if any(r.dense_gemms.values()):
        made = ", ".join(f"{n} in the {g}" for g, n in r.dense_gemms.items() if n)
        lines.append("  float32 GEMMs on Tensor Cores by the 3xTF32 split, float32 accuracy (gnn_io::mm, "
                     "gnn_inductor/passes/dense_gemm.py; tall products of an inner size up to 128 on the "
                     "weight-stationary kernel; GNN_IO_FP32_GEMM=cublas turns it off): "
                     f"{made}")
    if r.cuda_graphs:
        lines.append("  CUDA graphs (GNN_IO_CUDAGRAPHS=1): "
                     + "; ".join(f"{phase} {state}" for phase, state in r.cuda_graphs.items()))
    return lines


def format_text_for(chosen: list, root: Optional[str] = None) -> list:
    """The lines of the report of the graphs ``chosen``; ``root``: the compiled module's class name, for entries
    whose layer the graph does not name (a layer compiled on its own)."""
    if not chosen:
        return ["gnn_io: no graphs compiled yet (call the compiled model once first)"]
    lines = []
    for r in chosen:
        counts = (f"{len(r.rewrites)} rewritten, {len(r.of_kind(DECLINED))} declined on purpose, "
                  f"{len(r.of_kind(NOT_MATCHED))} not matched"
                  + (f", {len(r.of_kind(FALLBACK))} fell back" if r.of_kind(FALLBACK) else ""))
        lines.append(f"graph {r.graph_id} ({'+'.join(r.sides) or 'left whole to Inductor'}): {counts}")
        lines.extend(_rewritten_lines(r, root))
        for kind, title in SECTIONS:
            lines.extend(_miss_lines(r, kind, title, root))
        lines.extend(_plan_lines(r))
        lines.extend(_dense_lines(r))
        if r.passes:
            lines.append("  passes: " + ", ".join(p.as_text() for p in r.passes))
    return lines


def kernel_path_lines() -> list:
    """The kernel path decisions taken at run time, newest last."""
    lines = []
    for d in attention_paths():
        stats = d["stats"]
        lines.append(f"attention path ({d['family']}, {d['precision']}): {d['path']}, order {d['order']} - "
                     f"{d['reason']}")
        if stats:
            lines.append(f"      {stats.get('block_windows', 0)} of {stats.get('windows')} row windows on Tensor "
                         "Cores, "
                         f"{stats.get('tiles')} tiles, fill {stats.get('mean_tile_fill')}, "
                         f"format {stats.get('format_bytes', 0) / 2**20:.1f} MiB; predicted ms {d['predicted_ms']}"
                         + (f" ({stats['calibration']} calibration)" if stats.get("calibration") else "")
                         + (f"; order build ms {d['order_build_ms']}" if d["order_build_ms"] else "")
                         + (f"; measured ms {d['measured_forward_ms']}" if d["measured_forward_ms"] else ""))
    return lines


def root_class(model) -> Optional[str]:
    """The class name of the module a model compiled (through ``torch.compile``'s wrapper)."""
    if model is None:
        return None
    return type(getattr(model, "_orig_mod", model)).__name__


def format_text(model=None) -> str:
    """The text report for ``model``, or for everything compiled so far."""
    lines = format_text_for(reports(model), root_class(model))
    declines = frontend_declines.declines()
    if declines:
        lines.append("DGL message passing run by DGL's own code (a graph break), in this process:")
        lines.extend(f"  {where}: {why}" for where, why in declines)
    lines.extend(kernel_path_lines())
    return "\n".join(lines)


def near_miss_line(m: NearMiss, root: Optional[str] = None) -> str:
    """One near miss on one line (assertion messages, logs)."""
    return f"{m.kind}: {entry_head(m.source, root)}: {SUBJECTS.get(m.pattern, m.pattern)}: {m.reason}"
