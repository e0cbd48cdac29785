"""The report's records: what each compiled graph's passes rewrote (:class:`Rewrite`), what they left alone and why
(:class:`NearMiss`, of one of three kinds), how each pass ran (:class:`PassRecord`), per graph
(:class:`GraphReport`), kept for the process, and their JSON form (:func:`as_json`, documented in docs/report.md and
docs/report_schema.json).

The words for people are in :mod:`gnn_inductor.rewrite_report.text` and :mod:`gnn_inductor.rewrite_report.html`;
internal identifiers (edge-function keys, argument roles) stay in the JSON.
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

SCHEMA_VERSION = 1  # of :func:`as_json`'s output; raised when a key changes meaning or goes away

# The kinds of a :class:`NearMiss`
DECLINED = "declined"  # the backend chose not to rewrite (cost model, device, dtype, a size rule): a setting overrides
NOT_MATCHED = "not_matched"  # a pattern met code close to what it rewrites but not of its form
FALLBACK = "fallback"  # something failed (a pass, Inductor) and the backend ran a safe alternative
KINDS = (DECLINED, NOT_MATCHED, FALLBACK)

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# PyG's generated code of a layer's propagate (and edge_updater), a module of its own per class
_GENERATED = re.compile(r"_(propagate|edge_updater)_\w+\.py:")
_LIBRARY_PARTS = (os.sep + "torch" + os.sep, os.sep + "torch_geometric" + os.sep, os.sep + "gnn_inductor" + os.sep,
                  os.sep + "dgl" + os.sep)


class Declined(str):
    """The reason of a deliberate decline (the cost model's, :mod:`gnn_inductor.cost`): a string, as every near
    miss's reason is, that also carries the settings overriding it, ``override``: ``((setting name, value), ...)``,
    alternatives. A :class:`NearMiss` made with one is of kind :data:`DECLINED`."""

    override: tuple

    def __new__(cls, text: str, override: tuple = ()):
        made = super().__new__(cls, text)
        made.override = tuple(override)
        return made


def _frames(stack_trace: Optional[str]) -> list:
    if not stack_trace:
        return []
    return [f"{path}:{line} in {func}" for path, line, func in _FRAME.findall(stack_trace)]


def _class_name(cls) -> tuple:
    """``(class name, defining module)`` of an ``nn_module_stack`` entry's type (a class, or its qualified name)."""
    if isinstance(cls, type):
        return cls.__name__, cls.__module__
    text = str(cls).removeprefix("<class '").removesuffix("'>")
    module, _, name = text.rpartition(".")
    return name, module


def _is_layer(cls) -> bool:
    """A message-passing layer: a PyG ``MessagePassing`` (by its class hierarchy, PyG not imported) or a DGL module."""
    name, module = _class_name(cls)
    if module.startswith(("torch_geometric.nn.conv", "dgl.nn")):
        return True
    return isinstance(cls, type) and any(base.__name__ == "MessagePassing" for base in cls.__mro__[1:])


def _module_path(path: str) -> str:
    """``L['self'].conv1`` (Dynamo's name of a submodule) as the attribute path ``conv1``."""
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"^L\['([^']+)'\]", r"\1", path)


def layer_of(node) -> dict:
    """``{"layer_class": "GATConv", "module": "conv1"}`` from an FX node's ``nn_module_stack``: the innermost
    message-passing layer the node ran in (else the innermost module that is not an aggregation helper); both None
    where the stack is empty (a layer compiled on its own: the root module is not in it)."""
    entries = list((node.meta.get("nn_module_stack") or {}).values())
    if not entries:
        return {"layer_class": None, "module": None}
    helpers = [e for e in entries if not _class_name(e[1])[1].startswith("torch_geometric.nn.aggr")]
    layers = [e for e in helpers if _is_layer(e[1])]
    path, cls = (layers or helpers or entries)[-1]
    return {"layer_class": _class_name(cls)[0], "module": _module_path(str(path)) or None}


def source_of(node) -> dict:
    """Where an FX node came from: ``source`` (file:line), ``layer`` (file:line in the layer's own code),
    ``frames`` (the stack), ``layer_class`` and ``module`` (:func:`layer_of`).

    ``source`` is the innermost frame in user code; where the whole stack is library code (a PyG
    layer compiled on its own) it is the innermost frame in the layer's own file.
    """
    frames = _frames(node.meta.get("stack_trace"))
    user = [f for f in frames if not any(part in f for part in _LIBRARY_PARTS)
            and not os.path.basename(f).startswith("torch_geometric.") and not _GENERATED.search(f)]
    layer = [f for f in frames if ("torch_geometric" + os.sep + "nn" + os.sep + "conv") in f
             or ("dgl" + os.sep + "nn" + os.sep) in f]
    pick = user[-1] if user else (layer or frames or ["<unknown>"])[0]
    return {"source": pick.split(" in ")[0], "layer": (layer[0].split(" in ")[0] if layer else None),
            "frames": frames, **layer_of(node)}


def _where(source: dict) -> dict:
    """The JSON keys of an entry's place in the user's code."""
    return {"source": source["source"], "layer": source.get("layer"), "layer_class": source.get("layer_class"),
            "module": source.get("module"), "frames": list(source.get("frames") or ())}


def override_json(override: tuple) -> list:
    """``[{"setting", "value", "env", "option"}]`` of a :class:`Declined`'s alternatives: the environment variable
    (``GNN_IO_CPU_REWRITE=1``) and the ``torch.compile(..., options=)`` entry that each sets."""
    out = []
    for name, value in override:
        env = config.SETTINGS[name].env
        shown = int(value) if isinstance(value, bool) else value
        out.append({"setting": name, "value": value, "env": f"{env}={shown}", "option": {name: value}})
    return out


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
        out.update(_where(self.source))
        return out


@dataclass
class NearMiss:
    """Code a pass left as it was, and why. ``kind``: :data:`DECLINED`, :data:`NOT_MATCHED` or :data:`FALLBACK`;
    left empty it follows the reason (a :class:`Declined` one is declined, any other not matched). ``override``:
    the settings that would take the rewrite (a :class:`Declined` reason's unless given). ``expected``: for a
    pattern that did not match, the forms it rewrites."""
    pattern: str
    reason: str
    source: dict
    kind: str = ""
    override: tuple = ()
    expected: str = ""

    def __post_init__(self):
        if not self.override:
            self.override = tuple(getattr(self.reason, "override", ()))
        if not self.kind:
            self.kind = DECLINED if isinstance(self.reason, Declined) else NOT_MATCHED
        if self.kind not in KINDS:
            raise ValueError(f"NearMiss kind {self.kind!r}: one of {', '.join(KINDS)}")

    def as_json(self) -> dict:
        return {"pattern": self.pattern, "kind": self.kind, "reason": str(self.reason),
                "override": override_json(self.override), "expected": self.expected, **_where(self.source)}


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
    plan_build_ms: list = field(default_factory=list)  # host time of the latest plan builds (PlanCache.build_ms)
    passes: list = field(default_factory=list)  # a PassRecord per pass run on the graph, in order
    cuda_graphs: dict = field(default_factory=dict)  # "forward"/"backward" -> CUDA-graph state (GNN_IO_CUDAGRAPHS=1)
    parameter_refs: dict = field(default_factory=dict, repr=False)  # id -> weakref (an id alone can be reused)

    def _ran(self, name: str) -> list:
        return [p for p in self.passes if p.name == name and p.status == "ran"]

    def _by_side(self, name: str) -> dict:
        """``{side: count}`` of the pass ``name``, the latest run per side (a graph compiled again at other sizes
        replaces its counts)."""
        return {p.side: p.count for p in self._ran(name)}

    def of_kind(self, kind: str) -> list:
        """The near misses of one kind (:data:`KINDS`), in order."""
        return [m for m in self.near_misses if m.kind == kind]

    @property
    def sides(self) -> list:
        """The sides compiled so far: ``["forward"]``, ``["forward", "backward"]``, or empty (a graph left whole to
        Inductor, whose split the backend does not see)."""
        return [s for s in ("forward", "backward") if any(p.side == s for p in self.passes)]

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
        return {"graph_id": self.graph_id, "sides": self.sides, "rewrites": [r.as_json() for r in self.rewrites],
                "near_misses": [m.as_json() for m in self.near_misses],
                "counts": {"rewritten": len(self.rewrites), **{k: len(self.of_kind(k)) for k in KINDS}},
                "hoisted_structure_nodes": self.hoisted_nodes,
                "plan_builds": self.plan_builds, "plan_hits": self.plan_hits, "plan_stale": self.plan_stale,
                "plan_check": self.plan_check, "plan_build_ms": [round(t, 3) for t in self.plan_build_ms],
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


def attention_paths() -> list:
    """The kernel path decisions taken at run time (kernels/*/selector.py), newest last, as dicts."""
    return graph_state.decisions()


def as_json(model=None) -> dict:
    """The report as JSON-ready data, for ``model`` or everything compiled so far (docs/report.md)."""
    chosen = reports(model)
    return {
        "schema_version": SCHEMA_VERSION,
        "graphs": [r.as_json() for r in chosen],
        "rewrites": [dict(graph_id=r.graph_id, **w.as_json()) for r in chosen for w in r.rewrites],
        "near_misses": [dict(graph_id=r.graph_id, **m.as_json()) for r in chosen for m in r.near_misses],
        "attention_paths": attention_paths(),
        "graph_state": graph_state.summary(),
        "dgl_declines": [{"where": where, "why": why} for where, why in frontend_declines.declines()],
    }


def write_env_report() -> None:
    path = config.get("report")
    if path:
        with open(path, "w") as f:
            json.dump(as_json(), f, indent=2, default=str)


def clear() -> None:
    _REPORTS.clear()
    frontend_declines.clear()
