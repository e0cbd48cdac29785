"""The rewrite report: what matched where in the user's source, which op and kernel, what the
graph plan saw, and what did not match and why.

``gnn_inductor.report(model)`` prints it; ``GNN_IO_REPORT=path.json`` writes the JSON for every
graph compiled in the process (rewritten after each compile and each plan build).
"""
from __future__ import annotations

import json
import os
import re
import weakref
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from gnn_inductor import config
from gnn_inductor.frontends import declines as frontend_declines
from gnn_inductor.plan import state as graph_state

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_LIBRARY_PARTS = (os.sep + "torch" + os.sep, os.sep + "torch_geometric" + os.sep, os.sep + "gnn_inductor" + os.sep,
                  os.sep + "dgl" + os.sep)


def _frames(stack_trace: Optional[str]) -> list:
    if not stack_trace:
        return []
    return [f"{path}:{line} in {func}" for path, line, func in _FRAME.findall(stack_trace)]


def source_of(node) -> dict:
    """``{"source": file:line, "layer": file:line, "frames": [...]}`` from an FX node's stack trace.

    ``source`` is the innermost frame in user code; where the whole stack is library code (a PyG
    layer compiled on its own) it is the innermost frame in the layer's own file.
    """
    frames = _frames(node.meta.get("stack_trace"))
    user = [f for f in frames if not any(part in f for part in _LIBRARY_PARTS)
            and not os.path.basename(f).startswith("torch_geometric.")]  # PyG's generated propagate code
    layer = [f for f in frames if ("torch_geometric" + os.sep + "nn" + os.sep + "conv") in f
             or ("dgl" + os.sep + "nn" + os.sep) in f]
    pick = user[-1] if user else (layer or frames or ["<unknown>"])[0]
    return {"source": pick.split(" in ")[0], "layer": (layer[0].split(" in ")[0] if layer else None),
            "frames": frames}


@dataclass
class Rewrite:
    pattern: str
    op: str
    source: dict
    details: dict = field(default_factory=dict)
    kernel: str = ""
    graph_stats: Optional[dict] = None

    def as_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "source"}
        out.update(source=self.source["source"], layer=self.source["layer"], frames=self.source["frames"])
        return out


@dataclass
class NearMiss:
    pattern: str
    reason: str
    source: dict

    def as_json(self) -> dict:
        return {"pattern": self.pattern, "reason": self.reason, "source": self.source["source"],
                "layer": self.source["layer"]}


@dataclass
class PassRecord:
    """One run of a pass of the backend's pipeline (gnn_inductor/pipeline.py) on a graph: ``status`` ``ran``,
    ``skipped`` (``reason`` says why) or ``failed`` (``reason``: the exception); ``changed``: how many places it
    rewrote, or the report's :class:`Rewrite` entries it made; ``side``: ``forward`` or ``backward`` for the passes
    after AOTAutograd's split, None before it."""
    name: str
    status: str
    changed: object = 0
    reason: str = ""
    side: Optional[str] = None

    @property
    def count(self) -> int:
        return len(self.changed) if isinstance(self.changed, list) else int(self.changed or 0)

    def as_json(self) -> dict:
        out = {"name": self.name, "status": self.status, "changed": self.count, "reason": self.reason,
               "side": self.side}
        if isinstance(self.changed, list):
            out["rewrites"] = [f"{w.pattern} at {w.source['source']}" for w in self.changed]
        return out

    def as_text(self) -> str:
        where = f" ({self.side})" if self.side else ""
        if self.status == "ran":
            return f"{self.name}{where} {self.count}"
        return f"{self.name}{where} {self.status}" + (f" ({self.reason})" if self.reason else "")


@dataclass
class GraphReport:
    graph_id: int
    rewrites: list
    near_misses: list
    hoisted_nodes: int = 0
    plan_builds: int = 0
    plan_hits: int = 0
    plan_stale: int = 0  # reuses refused: the structure tensors' fingerprint changed (gnn_inductor/plan/cache.py)
    plan_check: str = ""  # what a reuse of the plan checks (plan.cache.reuse_contract); empty without a plan
    passes: list = field(default_factory=list)  # a PassRecord per pass run on the graph, in order
    cuda_graphs: dict = field(default_factory=dict)  # "forward"/"backward" -> CUDA-graph state (GNN_IO_CUDAGRAPHS=1)
    parameter_refs: dict = field(default_factory=dict, repr=False)  # id -> weakref (an id alone can be reused)

    def _ran(self, name: str) -> list:
        return [p for p in self.passes if p.name == name and p.status == "ran"]

    def _by_side(self, name: str) -> dict:
        """``{side: count}`` of the pass ``name``, the latest run per side (a graph compiled again at other sizes
        replaces its counts)."""
        return {p.side: p.count for p in self._ran(name)}

    @property
    def gemm_accumulates(self) -> dict:
        """``forward``/``backward`` -> adds folded into GEMMs (gnn_inductor/passes/gemm_accumulate.py)."""
        return self._by_side("gemm_accumulate")

    @property
    def dense_gemms(self) -> dict:
        """``forward``/``backward`` -> GEMMs made ``gnn_io::mm`` (gnn_inductor/passes/dense_gemm.py)."""
        return self._by_side("dense_gemm")

    @property
    def packed_grads(self) -> int:
        """Attention backwards writing a fused linear map's packed gradient (gnn_inductor/passes/packed_grads.py)."""
        return sum(p.count for p in self._ran("packed_grads"))

    @property
    def projected_grads(self) -> int:
        """... whose linear map's gradients the op makes by blocks of rows (the same file)."""
        return sum(p.count for p in self._ran("projected_grads"))

    def track_parameters(self, inputs) -> None:
        """Remember the graph's parameter inputs (``reports(model)`` finds the graph through them)."""
        self.parameter_refs = {id(t): weakref.ref(t) for t in inputs if isinstance(t, torch.nn.Parameter)}

    def uses(self, params) -> bool:
        """Whether any of ``params`` (live tensors) is one of this graph's parameters, by identity."""
        return any((ref := self.parameter_refs.get(id(p))) is not None and ref() is p for p in params)

    def as_json(self) -> dict:
        return {"graph_id": self.graph_id, "rewrites": [r.as_json() for r in self.rewrites],
                "near_misses": [m.as_json() for m in self.near_misses], "hoisted_structure_nodes": self.hoisted_nodes,
                "plan_builds": self.plan_builds, "plan_hits": self.plan_hits, "plan_stale": self.plan_stale,
                "plan_check": self.plan_check,
                "gemm_accumulates": dict(self.gemm_accumulates), "packed_grads": self.packed_grads,
                "projected_grads": self.projected_grads, "dense_gemms": dict(self.dense_gemms),
                "cuda_graphs": dict(self.cuda_graphs), "passes": [p.as_json() for p in self.passes]}


_REPORTS: list = []


def add(report: GraphReport) -> GraphReport:
    report.graph_id = len(_REPORTS)
    _REPORTS.append(report)
    write_env_report()
    return report


def reports(model=None) -> list:
    """Reports of the graphs compiled in this process, or of those that use ``model``'s parameters."""
    if model is None:
        return list(_REPORTS)
    model = getattr(model, "_orig_mod", model)
    params = list(model.parameters())
    mine = [r for r in _REPORTS if r.uses(params)]
    return mine if params else list(_REPORTS)


def _attention_paths() -> list:
    """The attention path decisions taken at run time (kernels/attention/selector.py), newest last."""
    return graph_state.decisions()


def as_json(model=None) -> dict:
    chosen = reports(model)
    return {
        "graphs": [r.as_json() for r in chosen],
        "rewrites": [dict(graph_id=r.graph_id, **w.as_json()) for r in chosen for w in r.rewrites],
        "near_misses": [dict(graph_id=r.graph_id, **m.as_json()) for r in chosen for m in r.near_misses],
        "attention_paths": _attention_paths(),
        "graph_state": graph_state.summary(),
        "dgl_declines": [{"where": where, "why": why} for where, why in frontend_declines.declines()],
    }


def write_env_report() -> None:
    path = config.get("report")
    if path:
        with open(path, "w") as f:
            json.dump(as_json(), f, indent=2)


def format_text(model=None) -> str:
    lines = format_text_for(reports(model))
    declines = frontend_declines.declines()
    if declines:
        lines.append("DGL message passing run by DGL's own code (a graph break), in this process:")
        lines.extend(f"  {where}: {why}" for where, why in declines)
    for d in _attention_paths():
        stats = d["stats"]
        lines.append(f"attention path ({d['family']}, {d['precision']}): {d['path']}, order {d['order']} - {d['reason']}")
        if stats:
            lines.append(f"      {stats.get('block_windows', 0)} of {stats.get('windows')} row windows on Tensor Cores, "
                         f"{stats.get('tiles')} tiles, fill {stats.get('mean_tile_fill')}, "
                         f"format {stats.get('format_bytes', 0) / 2**20:.1f} MiB; predicted ms {d['predicted_ms']}"
                         + (f" ({stats['calibration']} calibration)" if stats.get("calibration") else "")
                         + (f"; order build ms {d['order_build_ms']}" if d["order_build_ms"] else "")
                         + (f"; measured ms {d['measured_forward_ms']}" if d["measured_forward_ms"] else ""))
    return "\n".join(lines)


def format_text_for(chosen: list) -> list:
    if not chosen:
        return ["gnn_io: no graphs compiled yet (call the compiled model once first)"]
    lines = []
    for r in chosen:
        lines.append(f"graph {r.graph_id}: {len(r.rewrites)} rewrite(s), {len(r.near_misses)} near miss(es), "
                     f"{r.hoisted_nodes} structure node(s) in the graph plan, "
                     f"plan built {r.plan_builds}x, reused {r.plan_hits}x")
        if r.plan_check:
            lines.append(f"  plan reuse: {r.plan_check}")
        if r.plan_stale:
            lines.append(f"  plan rebuilt {r.plan_stale}x for a graph whose structure tensors were written without "
                         "their version counter changing (through .data or .numpy()): found by their fingerprint")
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
        if r.passes:
            lines.append("  passes: " + ", ".join(p.as_text() for p in r.passes))
        if r.cuda_graphs:
            lines.append("  CUDA graphs (GNN_IO_CUDAGRAPHS=1): "
                         + "; ".join(f"{phase} {state}" for phase, state in r.cuda_graphs.items()))
        for w in r.rewrites:
            extra = ", ".join(f"{k}={v}" for k, v in w.details.items() if k not in ("edge_functions", "members"))
            lines.append(f"  [{w.pattern}] -> {w.op} ({w.kernel}) {extra}")
            lines.append(f"      at {w.source['source']}" + (f" (layer {w.source['layer']})"
                                                             if w.source["layer"] and w.source["layer"] !=
                                                             w.source["source"] else ""))
            for member in w.details.get("members", ()):  # a merged rewrite: the reductions sharing its pass
                lines.append(f"      member {member['reduce']} of {member['message']} (from {', '.join(member['at'])})")
            if w.graph_stats:
                s = w.graph_stats
                lines.append(f"      graph: {s['nodes']} nodes, {s['edges']} edges, max degree {s['max_degree']}, "
                             f"mean degree {s['mean_degree']}")
                if "split" in s:
                    split = s["split"]
                    lines.append(f"      degree split (CUDA kernels): rows over {split['max_edges']} edges are hubs ({split['hub_rows']}"
                                 f" rows, {split['hub_edge_share']:.1%} of the edges), {split['work_items']} work items;"
                                 f" threshold by {split.get('source', 'rule')}")
        for m in r.near_misses:
            lines.append(f"  near miss [{m.pattern}] at {m.source['source']}: {m.reason}")
    return lines


def report(model=None) -> str:
    """Print (and return) the rewrite report, for ``model`` or for everything compiled so far."""
    text = format_text(model)
    print(text)
    return text


def clear() -> None:
    _REPORTS.clear()
    frontend_declines.clear()

