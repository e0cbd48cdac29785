"""Graph plans at run time: the structure function of a rewritten graph run once per graph, its outputs cached.

The structure function is cut out of the graph by ``gnn_inductor/passes/structure.py`` (``hoist_structure``); the
compiled remainder gets its outputs as extra inputs. :class:`PlanCache` runs it and keeps its outputs per graph.

The cache is keyed by the identity and version counter of the structure input tensors and the
values of symbolic sizes. It holds only weak references to those inputs (an entry dies with its
graph) and never outputs that alias them (views of inputs are recomputed in the main graph), and
an in-place change to ``edge_index`` bumps its version, which misses the cache. Writes that bypass
the version counter (through ``.data``, ``.numpy()``, DLPack) are caught by a fingerprint of the
structure tensors (``gnn_inductor/plan/fingerprint.py``), taken at the build and compared at each reuse: by
default for CPU graphs only (``GNN_IO_PLAN_CHECK``, docs/usage.md "Editing a graph in place": on
CUDA the comparison's device sync cost 83 us of host time per call and 3-5% of a 16M-edge step on
the H200). A new graph each call (mini-batches) simply builds a new plan each call.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from gnn_inductor.plan.csr import degree_stats
from gnn_inductor.plan.fingerprint import fingerprints
from gnn_inductor.plan.state import version_of

MAX_PLANS_PER_GRAPH = 8
BUILD_TIMES_KEPT = 16  # plan build times the report keeps per graph (the latest)


def fingerprint_checked(check: str, on_cuda: bool) -> bool:
    """Whether reuses of a plan compare its structure tensors' fingerprint under the ``plan_check`` setting
    ``check`` (``auto``: CPU graphs only)."""
    return check == "fingerprint" or (check == "auto" and not on_cuda)


def reuse_contract(check: str, on_cuda: bool) -> str:
    """What a reuse of a plan checks, in words for the report (docs/usage.md, "Editing a graph in place")."""
    if fingerprint_checked(check, on_cuda):
        return ("each reuse compares the structure tensors' fingerprint: any write to them, through .data or "
                ".numpy() too, rebuilds the plan")
    return ("reuses trust the structure tensors' version counters: writes PyTorch records rebuild the plan, writes "
            "through .data or DLPack are not followed (GNN_IO_PLAN_CHECK=fingerprint follows them, at one device "
            "sync per call)")


@dataclass(eq=False)
class _Entry:
    refs: list
    versions: list
    scalars: list
    outputs: tuple
    fingerprints: Optional[torch.Tensor] = None


@dataclass
class PlanCache:
    """Runs a structure function once per graph and returns the cached outputs after that.

    ``check``: which reuses also compare the structure tensors' fingerprints with the build's (one pass over them
    and, on CUDA, one device sync per call): ``"fingerprint"`` every one, ``"auto"`` those of CPU graphs,
    ``"version"`` none (identity and version counters only). ``stale`` counts the reuses a changed fingerprint
    turned into rebuilds. ``build_ms``: the host time of the latest builds, ms (on CUDA the structure function's
    launches and the syncs inside it, not its whole device time)."""
    structure_fn: Callable
    on_build: Callable = lambda outputs: None
    check: str = "auto"
    entries: list = field(default_factory=list)
    builds: int = 0
    hits: int = 0
    stale: int = 0
    build_ms: list = field(default_factory=list)

    def __call__(self, inputs: list) -> tuple:
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        scalars = [int(s) for s in inputs if not isinstance(s, torch.Tensor)]
        versions = [version_of(t) for t in tensors]  # None: an inference tensor, never cached
        for entry in self.entries:
            if entry.scalars == scalars and entry.versions == versions and \
                    all(r() is t for r, t in zip(entry.refs, tensors)):
                if entry.fingerprints is not None and not torch.equal(entry.fingerprints, fingerprints(tensors)):
                    self.entries.remove(entry)  # written behind the version counter's back: build anew
                    self.stale += 1
                    break
                self.hits += 1
                return entry.outputs
        start = time.perf_counter()
        outputs = tuple(self.structure_fn(*inputs))
        self.build_ms.append((time.perf_counter() - start) * 1e3)
        del self.build_ms[:-BUILD_TIMES_KEPT]
        self.builds += 1
        self.on_build(outputs)
        if None not in versions:
            self._remember(tensors, versions, scalars, outputs)
        return outputs

    def _remember(self, tensors, versions, scalars, outputs) -> None:
        checked = fingerprint_checked(self.check, any(t.is_cuda for t in tensors))
        entry = _Entry([], versions, scalars, outputs, fingerprints(tensors) if checked else None)
        this = weakref.ref(self)

        def forget(_ref, entry=entry):
            cache = this()
            if cache is not None and entry in cache.entries:
                cache.entries.remove(entry)

        entry.refs = [weakref.ref(t, forget) for t in tensors]
        self.entries.insert(0, entry)
        del self.entries[MAX_PLANS_PER_GRAPH:]


# Plans whose graph statistics the report records: the first few graphs a compiled graph meets. Reading them
# costs device syncs, which a stream of new graphs (mini-batch training) would pay at every step.
STATS_BUILDS = 2


def plan_stats_hook(rewrites: list, outputs_index: dict, more_stats: dict | None = None) -> Callable:
    """Fills each rewrite's ``graph_stats`` from its CSR ``rowptr`` when one of the first
    :data:`STATS_BUILDS` plans is built (the report then shows the latest of those graphs). ``more_stats``:
    ``{pattern: (key, function of the rowptr)}``, more statistics for the rewrites of a pattern (the degree split
    of the fused gather-scatter kernels, which the caller passes: the kernels sit above the plan)."""
    builds = [0]
    more_stats = more_stats or {}

    def on_build(outputs):
        builds[0] += 1
        if builds[0] > STATS_BUILDS:
            return
        for rewrite in rewrites:
            pos = outputs_index.get(getattr(rewrite, "plan_node", None))
            if pos is not None:
                rewrite.graph_stats = degree_stats(outputs[pos])
                extra = more_stats.get(rewrite.pattern)
                if extra is not None:
                    rewrite.graph_stats[extra[0]] = extra[1](outputs[pos])
    return on_build
