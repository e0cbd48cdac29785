"""The backend's passes, declared in the order they run, as Inductor declares its own (``torch/_inductor/fx_passes``).

Two lists. :data:`GRAPH_PASSES` run on the graph Dynamo captured, before AOTAutograd splits it into a forward and a
backward: the canonical ATen graph is made, message passing rewritten into ``gnn_io`` ops, the cost model consulted,
the dense maps around the ops folded, and the structure work cut out into the graph's plan. :data:`SPLIT_PASSES` run
on each of the forward and backward graphs AOTAutograd hands Inductor. Each entry names the setting that switches it
(or None), and after the split the side it runs on; a pass takes the compile's settings (one
:func:`gnn_inductor.config.snapshot`), never reads them live.

Every pass reports through one :class:`~gnn_inductor.rewrite_report.PassRecord` in the graph's report: ran (and what
it changed: a count, or the report's rewrite entries it made), skipped (why) or failed (the exception). A pass that
raises is recorded as failed and the exception goes on to the backend, which falls back (gnn_inductor/backend.py):
before the split the graph goes to Inductor unchanged, after it that side compiles without the later passes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule

from gnn_inductor import config, cost, kernels
from gnn_inductor.buckets_layout import copy_module
from gnn_inductor.canonical import canonicalize, fake_mode_of
from gnn_inductor.passes import (
    dense_gemm,
    direct_ops,
    gather_linear,
    gemm_accumulate,
    linear_fusion,
    packed_grads,
    relation_groups,
    relation_segments,
    score_fold,
    structure,
)
from gnn_inductor.passes.patterns import RewriteContext, run_patterns
from gnn_inductor.patterns import attention as attention_pattern
from gnn_inductor.rewrite_report import GraphReport, NearMiss, PassRecord, Rewrite

GRAPH_SOURCE = {"source": "<graph>", "layer": None, "frames": []}  # a report entry about the whole graph


def _on(value) -> bool:
    """Whether a switch setting's value turns its pass on (``0`` / False off, any other choice on)."""
    return value not in (False, "0", None)


@dataclass(frozen=True)
class GraphPass:
    """One pass of a pipeline. ``run(state)`` before the split, ``run(gm, report, settings)`` after it, returns what
    changed (a count, or the report's rewrite entries it made). ``setting``: the setting that switches it (None:
    always on), read through ``on`` (default: any value but ``0``); ``requires``: other switch settings that must be
    on too. ``side``: ``forward``, ``backward`` or ``both`` (after the split). ``rewritten_only``: only in graphs the
    backend rewrote (a graph without rewrites is what ``torch.compile``'s default runs)."""

    name: str
    setting: Optional[str]
    run: Callable
    side: str = "both"
    rewritten_only: bool = False
    on: Callable = _on
    requires: tuple = ()

    def switched_off(self, settings) -> str:
        """The setting that switches the pass off under ``settings`` (``GNN_IO_FUSE_LINEARS=0``); empty when on."""
        for name in (self.setting, *self.requires) if self.setting else self.requires:
            value = settings[name]
            if not (self.on(value) if name == self.setting else _on(value)):
                shown = int(value) if isinstance(value, bool) else value
                return f"{config.SETTINGS[name].env}={shown}"
        return ""

    def skip_reason(self, settings, report: Optional[GraphReport]) -> str:
        """Why the pass does not run under ``settings`` on the graph of ``report``; empty when it runs."""
        if self.rewritten_only and (report is None or not report.rewrites):
            return "no rewrites in this graph"
        return self.switched_off(settings)


@dataclass
class CompileState:
    """What the passes before the split share: the graph they rewrite and what they found. ``on_declined(state,
    near_misses)``: the backend's answer when the cost model declines every rewrite, a compiled callable that
    finishes the compile (then ``result``), or None to go on with the rewrites."""

    dynamo_gm: GraphModule
    example_inputs: list
    settings: Any
    on_declined: Callable
    gm: Optional[GraphModule] = None  # the canonical ATen graph the passes rewrite
    device: str = "cpu"
    ctx: Optional[RewriteContext] = None
    moved: list = field(default_factory=list)  # gather_linear's rewrites
    kept: list = field(default_factory=list)  # ... and its near misses
    report: GraphReport = field(default_factory=lambda: GraphReport(0, [], []))
    hoisted: Optional[structure.Hoisted] = None
    result: Any = None
    current: str = "canonicalize"  # the pass running now, named in the report when one fails
    # the calls run padded to shape buckets (gnn_inductor/buckets.py), this graph of changing sizes only past them
    padded: bool = False


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message; empty for one raised without a message (``AssertionError()``),
    where ``str(exc).splitlines()`` is an empty list."""
    return next(iter(str(exc).splitlines()), "")


def edge_count(example_inputs: list):
    """Edges of the example graph: the longest ``[2, E]`` integer input (None when there is none)."""
    counts = [t.shape[1] for t in example_inputs if isinstance(t, torch.Tensor) and t.dim() == 2
              and t.shape[0] == 2 and not t.is_floating_point()]
    return max(counts) if counts else None


def _run_one(entry: GraphPass, records: Optional[list], side: Optional[str], call: Callable) -> None:
    try:
        changed = call()
    except Exception as exc:
        if records is not None:
            records.append(PassRecord(entry.name, "failed", 0, f"{type(exc).__name__}: {first_line(exc)[:160]}", side))
        raise
    if records is not None:
        records.append(PassRecord(entry.name, "ran", changed if isinstance(changed, list) else int(changed or 0),
                                  "", side))


def run_graph_passes(state: CompileState, passes: tuple = None) -> None:
    """:data:`GRAPH_PASSES` (or ``passes``) on ``state`` in order, until one finishes the compile
    (``state.result``)."""
    for entry in GRAPH_PASSES if passes is None else passes:
        state.current = entry.name
        reason = entry.skip_reason(state.settings, state.report)
        if reason:
            state.report.passes.append(PassRecord(entry.name, "skipped", 0, reason))
            continue
        _run_one(entry, state.report.passes, None, lambda: entry.run(state))
        if state.result is not None:
            return


class Progress:
    """The pass running now after the split (:func:`run_split_passes`), named in the report when one fails."""

    def __init__(self, current: str = ""):
        self.current = current


def run_split_passes(gm: GraphModule, report: Optional[GraphReport], side: str, settings, progress: Progress,
                     passes: tuple = None) -> None:
    """:data:`SPLIT_PASSES` (or ``passes``) for ``side`` (``forward``/``backward``) on ``gm``, in order. ``report``
    None (a graph compiled outside the backend's compile): no records, and no pass that needs rewrites runs."""
    records = report.passes if report is not None else None
    for entry in SPLIT_PASSES if passes is None else passes:
        if entry.side not in ("both", side):
            continue
        reason = entry.skip_reason(settings, report)
        if reason:
            if records is not None:
                records.append(PassRecord(entry.name, "skipped", 0, reason, side))
            continue
        progress.current = entry.name
        _run_one(entry, records, side, lambda: entry.run(gm, report, settings))


# -- before the split ------------------------------------------------------------------------------------------------

def _canonicalize(state: CompileState) -> int:
    state.gm = canonicalize(state.dynamo_gm)
    return 0


def _gather_linear(state: CompileState) -> list:
    """GEMMs of gathered rows moved before their gathers (gnn_inductor/passes/gather_linear.py), as report rewrites,
    and near misses for those the graph's sizes kept per edge."""
    kept: list = []
    state.moved = [Rewrite(
        "gather_linear", "aten::mm of node rows, then index_select", moved["source"],
        {"weight": moved["weight"], "gathers": moved["gathers"], "edge_pieces": moved["edge_pieces"]},
        kernel=f"{moved['gathers']} GEMM(s) over the gathered tensors' rows instead of one over the edges")
        for moved in gather_linear.move_linears_before_gathers(state.gm, kept)]
    state.kept = [NearMiss(
        "gather_linear", f"the linear map {k['weight']} of gathered rows stays one GEMM over the edges: the graph "
        f"compiled here has {k['edges']} edges, no more than the {k['rows']} rows of a gathered tensor, so moving it "
        "before the gather would not pay",
        k["source"], kind="declined")
        for k in kept]
    return state.moved


def _patterns(state: CompileState) -> list:
    """The registered message-passing patterns (gnn_inductor/passes/patterns.py, patterns/)."""
    state.ctx = run_patterns(state.gm, RewriteContext(state.gm, fake_mode_of(state.gm),
                                                      num_edges_hint=edge_count(state.example_inputs)))
    state.ctx.near_misses[:0] = state.kept
    state.report.near_misses = state.ctx.near_misses
    return list(state.ctx.rewrites)


def attention_declined(ctx: RewriteContext, device: str) -> list:
    """Near misses for a graph whose rewrites are all fused attention the cost model declines (float32, or
    bfloat16 TransformerConv, on a small graph, ``cost.attention_declined``); empty when any rewrite stays.
    Decided per graph: the edge softmax was rewritten before the family was known, so the graph goes to Inductor
    as Dynamo captured it."""
    if not ctx.rewrites or any(r.pattern != "attention" for r in ctx.rewrites):
        return []
    tf32 = torch.get_float32_matmul_precision() != "highest"
    reasons = [cost.attention_declined(device, ctx.num_edges_hint, r.details.get("family"), r.details.get("dtype"),
                                       tf32, r.details.get("rows")) for r in ctx.rewrites]
    if not all(reasons):
        return []
    return [NearMiss(r.pattern, reason, r.source) for r, reason in zip(ctx.rewrites, reasons)]


def _cost_model(state: CompileState) -> int:
    """The graph-wide decision of the cost model (fused attention declined on every rewrite: the backend's
    ``on_declined`` decides what runs), then the report's rewrites with the kernel each runs."""
    state.device = next((t.device.type for t in state.example_inputs if isinstance(t, torch.Tensor)), "cpu")
    declined = attention_declined(state.ctx, state.device)
    if declined:
        state.result = state.on_declined(state, declined)
        if state.result is not None:
            return len(declined)
    for rewrite in state.ctx.rewrites:
        rewrite.kernel = kernels.kernel_for(rewrite.op, state.device, rewrite.details)
    state.report.rewrites = state.ctx.rewrites + state.moved
    state.report.track_parameters(state.example_inputs)
    return len(declined)


def _relation_groups(state: CompileState) -> list:
    """The SpMMs of one input over several relations as one over a typed CSR, their maps as one GEMM
    (gnn_inductor/passes/relation_groups.py)."""
    grouped = [Rewrite(
        "relation_groups", f"{g['relations']} gnn_io.spmm of one input", g["source"],
        {"relations": g["relations"], "one_gemm": g["gemm"], "order": g["order"]},
        kernel=("the relations' linear maps as one GEMM, then one SpMM over a typed CSR (a column per node and "
                "relation, built once per graph)" if g["order"] == "maps first" and g["gemm"] else
                "each relation's linear map first, then one SpMM of the mapped rows over a typed CSR (a row per node "
                "and relation, built once per graph)" if g["order"] == "maps first" else
                "one SpMM over a typed CSR (a row per node and relation, built once per graph)"
                + (", the relations' linear maps as one GEMM" if g["gemm"] else "")))
        for g in relation_groups.group_relations(state.gm, state.ctx)]
    state.report.rewrites.extend(grouped)
    return grouped


def _index_checks(state: CompileState) -> int:
    return structure.insert_index_checks(state.gm, state.ctx)


def _attention_bias(state: CompileState) -> list:
    """The bias added to an attention output, made inside the op (patterns/attention.py ``fold_bias``)."""
    folded = [Rewrite(
        "attention_bias", "aten::add of the attention output and a bias", f["source"], {"bias": f["bias"]},
        kernel="added in the attention op's output memory; the backward's D reads out - bias")
        for f in attention_pattern.fold_bias(state.gm)]
    state.report.rewrites.extend(folded)
    return folded


def _score_projection(state: CompileState) -> list:
    """GAT's attention-vector projections made by its feature GEMM's kernel (gnn_inductor/passes/score_fold.py)."""
    folded = [Rewrite(
        "score_projection", "aten::sum of (features * attention vector) over channels", f["source"],
        {k: f[k] for k in ("weight", "vectors", "columns")},
        kernel="gnn_io::linear_scores: the scores made from the feature GEMM's tiles (3xTF32 kernel), their "
               "gradients inside the backward GEMMs: no pass over the features for either")
        for f in score_fold.fold_score_projections(state.gm, state.settings)]
    state.report.rewrites.extend(folded)
    return folded


def _shared_input_linears(state: CompileState) -> list:
    """One GEMM for the linear maps of a shared input (gnn_inductor/passes/linear_fusion.py)."""
    fused = [Rewrite(
        "shared_input_linears", "aten::addmm / aten::mm (weights concatenated)", group["source"],
        {"weights": group["weights"], "widths": group["widths"]},
        kernel=f"one GEMM of {len(group['widths'])} maps ({' + '.join(str(w) for w in group['widths'])} output "
               f"columns), Inductor/cuBLAS")
        for group in linear_fusion.fuse_shared_input_linears(state.gm, state.settings)]
    state.report.rewrites.extend(fused)
    return fused


def _structure_masks(state: CompileState) -> int:
    return structure.select_by_structure_masks(state.gm)


def _hoist_structure(state: CompileState) -> int:
    state.hoisted = structure.hoist_structure(state.gm)
    return state.hoisted.num_nodes if state.hoisted is not None else 0


GRAPH_PASSES = (
    GraphPass("canonicalize", None, _canonicalize),
    GraphPass("gather_linear", "gather_linear", _gather_linear),
    GraphPass("patterns", None, _patterns),
    GraphPass("cost_model", None, _cost_model),
    GraphPass("relation_groups", "group_relations", _relation_groups, rewritten_only=True),
    GraphPass("index_checks", None, _index_checks),
    GraphPass("attention_bias", "attention_bias", _attention_bias),
    GraphPass("score_projection", "score_fold", _score_projection, rewritten_only=True),
    GraphPass("shared_input_linears", "fuse_linears", _shared_input_linears, rewritten_only=True),
    GraphPass("structure_masks", None, _structure_masks),
    GraphPass("hoist_structure", None, _hoist_structure),
)


# -- after the split -------------------------------------------------------------------------------------------------

def _direct_ops(gm: GraphModule, report, settings) -> int:
    """The gnn_io ops without custom_op's per-call Python (gnn_inductor/passes/direct_ops.py)."""
    return direct_ops.retarget(gm)


def _packed_grads(gm: GraphModule, report, settings) -> int:
    """Attention gradients into the fused linear map's packed gradient (gnn_inductor/passes/packed_grads.py)."""
    return packed_grads.pack(gm)


def _projected_grads(gm: GraphModule, report, settings) -> int:
    """... and its GEMMs run on it one block of rows at a time (the same file)."""
    return packed_grads.project_all(gm)


def _gemm_accumulate(gm: GraphModule, report, settings) -> int:
    """GEMM + fresh tensor summed in the fresh tensor's memory (gnn_inductor/passes/gemm_accumulate.py)."""
    return gemm_accumulate.fold(gm)


def _dense_gemm(gm: GraphModule, report, settings) -> int:
    """Large float32 GEMMs by the 3xTF32 split on Tensor Cores (gnn_inductor/passes/dense_gemm.py)."""
    return dense_gemm.rewrite(gm)


SPLIT_PASSES = (
    GraphPass("direct_ops", "direct_ops", _direct_ops),
    GraphPass("packed_grads", "packed_grads", _packed_grads, side="backward", rewritten_only=True),
    GraphPass("projected_grads", "projected_grads", _projected_grads, side="backward", rewritten_only=True,
              requires=("packed_grads",)),
    GraphPass("gemm_accumulate", "gemm_accumulate", _gemm_accumulate, rewritten_only=True),
    GraphPass("dense_gemm", "fp32_gemm", _dense_gemm, rewritten_only=True, on=lambda value: value == "x3"),
)


# -- a padded bucket's graph (gnn_inductor/buckets.py), before the split ---------------------------------------------

def _bucket_canonicalize(state: CompileState) -> int:
    """The bucket's graph in ATen, from a copy: the graph Dynamo gave stays as it was for the compile without
    rewrites."""
    copy = copy_module(state.dynamo_gm)
    for node, value in zip([n for n in copy.graph.nodes if n.op == "placeholder"], state.example_inputs):
        node.meta = {**node.meta, "example_value": value}  # the copy shares the metadata dicts: a new one
    state.gm = canonicalize(copy)
    return 0


def _relation_segments(state: CompileState) -> list:
    """The relations of a layer as one product per edge (gnn_inductor/passes/relation_segments.py)."""
    done = relation_segments.segment_relations(state.gm, RewriteContext(state.gm, fake_mode_of(state.gm)))
    state.report.rewrites = [Rewrite("relation_segments", "gnn_io.device_segment_matmul", g["source"],
                                     {"relations": g["relations"], "reduce": g["reduce"]},
                                     kernel="the edges sorted by relation, one Triton segment GEMM")
                             for g in done]
    return state.report.rewrites


# The passes before the split of a padded bucket's fixed-size compile: where one rewrites the graph, the bucket
# compiles the canonical ATen graph (:func:`bucket_graph`), else the graph Dynamo gave, as ``torch.compile`` would.
BUCKET_GRAPH_PASSES = (
    GraphPass("canonicalize", None, _bucket_canonicalize),
    GraphPass("relation_segments", "relation_segments", _relation_segments),
)


def bucket_graph(dynamo_gm: GraphModule, example_inputs: list, settings) -> tuple:
    """``(graph, report)``: :data:`BUCKET_GRAPH_PASSES` on a bucket's graph (``example_inputs`` its fixed-size
    fakes); ``graph`` the rewritten ATen graph, or None where no pass rewrote it; the report holds the passes'
    records and rewrites. A pass that raises propagates (the caller compiles the graph Dynamo gave)."""
    state = CompileState(dynamo_gm, example_inputs, settings, on_declined=None)
    run_graph_passes(state, BUCKET_GRAPH_PASSES)
    return (state.gm if state.report.rewrites else None), state.report


# The split passes of a padded bucket's fixed-size compile (gnn_inductor/buckets.py), a graph left to Inductor with
# no rewrite: its float32 GEMMs have fixed sizes there, and under CUDA graphs, with the launches gone, the step is
# the GPU's work, mostly those GEMMs. The other split passes work on the ops of rewrites and find none.
BUCKET_SPLIT_PASSES = tuple(dataclasses.replace(p, rewritten_only=False) for p in SPLIT_PASSES if p.name == "dense_gemm")


def switched_on(name: str, settings) -> bool:
    """Whether the pass ``name`` (of either list) is switched on under ``settings``, its graph aside."""
    return not next(p for p in GRAPH_PASSES + SPLIT_PASSES + BUCKET_GRAPH_PASSES
                    if p.name == name).switched_off(settings)
