"""The mini-batch switch: a graph whose plan is rebuilt at almost every call runs as ``torch.compile``'s default.

Mini-batch training meets a new graph at every step: the plan (CSR builds, index checks, self loops and
normalisation run eagerly, op by op) is rebuilt every call and never reused. On small graphs that costs more than
the fused kernels save: on the H100, RMAT 2^17 subgraphs of about 18k edges (two layers, a new subgraph per step,
``benchmarks/minibatch.py``), GCNConv took 2.2 ms against torch.compile's 1.3 (docs/usage.md).
"""
from __future__ import annotations

import torch

from gnn_inductor import config
from gnn_inductor.pipeline import GRAPH_SOURCE, edge_count
from gnn_inductor.rewrite_report import DECLINED, FALLBACK, NearMiss

# The mini-batch switch (:class:`Churn`): calls seen first, the share of them that built a plan, and the largest
# graph (edges) it applies to. The edge bound is not calibrated: at 1.1M edges a fixed graph's fused kernels
# run at 1.0-1.4x of torch.compile's step on the H100, less than a plan rebuilt per step costs there.
CHURN_CALLS = 8
CHURN_SHARE = 0.75
CHURN_EDGES = config.default("churn_edges")


class Churn:
    """A graph Dynamo compiled with dynamic shapes (its input sizes changed: the mini-batch case) and a plan is
    also compiled as ``torch.compile``'s default would compile it (``plain``, structure work inside, no gnn_io
    ops; ``plain_compile(gm, example_inputs, settings)`` returns ``(compiled, None)`` or ``(None, why)``). Once at least
    :data:`CHURN_CALLS` calls ran, at least :data:`CHURN_SHARE` of them built a new plan, and the current graph has
    at most ``GNN_IO_CHURN_EDGES`` (default :data:`CHURN_EDGES`) edges, every later call runs ``plain``, and the
    report says so. ``GNN_IO_CHURN``: ``auto`` (the default) or ``on``, on CUDA and CPU graphs alike (the CPU's
    default leaves the aggregations to Inductor, but the hoisted structure work still ran op by op per graph:
    GCNConv's CPU step took 1.8x torch.compile's), ``off``. ``settings``: the compile's (``config.snapshot()``).
    ``enabled`` False: no switch (and no compile of ``plain``), for a graph whose calls run padded to buckets."""

    def __init__(self, gm, example_inputs, cache, positions, graph_report, settings, plain_compile, enabled=True):
        self.cache, self.positions, self.graph_report = cache, positions, graph_report
        self.calls, self.plain, self.plain_now = 0, None, False
        self.limit = settings["churn_edges"]
        if not enabled or settings["churn"] == "off" or not any(isinstance(e, torch.SymInt) for e in example_inputs):
            return
        plain, failure = plain_compile(gm, example_inputs, settings)
        if plain is None:
            self._note(f"not compiled as torch.compile's default ({failure}): a new graph every step keeps the "
                       f"rewrites", FALLBACK)
        self.plain = plain

    def _note(self, reason: str, kind: str, override: tuple = ()) -> None:
        self.graph_report.near_misses.append(NearMiss("mini_batch", reason, GRAPH_SOURCE, kind, override))

    def observe(self, args) -> None:
        if self.plain is None:
            return
        self.calls += 1
        builds = self.cache.builds
        if self.calls < CHURN_CALLS or builds < CHURN_SHARE * self.calls:
            return
        edges = structure_edges([args[i] for i in self.positions])
        if edges is None or edges > self.limit:
            return
        self.plain_now = True
        self._note(f"a new graph on {builds} of {self.calls} calls ({edges} edges, at most {self.limit}): its plan "
                   f"was rebuilt every step, so later calls run as torch.compile's default compiles the graph "
                   f"(GNN_IO_CHURN=off keeps the rewrites)", DECLINED, (("churn", "off"),))


def structure_edges(tensors) -> int | None:
    """Edges of the graph among a plan's inputs: :func:`~gnn_inductor.pipeline.edge_count` (a ``[2, E]`` index),
    else the length of the longest one-dimensional integer tensor (DGL's separate source and destination
    tensors)."""
    edges = edge_count(tensors)
    if edges is not None:
        return edges
    lengths = [t.numel() for t in tensors if isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point()]
    return max(lengths) if lengths else None
