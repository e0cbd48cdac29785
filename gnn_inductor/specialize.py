"""Graphs whose plan has data-dependent sizes, compiled at the concrete sizes of each graph met, for CUDA graphs.

A graph with symbolic sizes stays off Inductor's CUDA graph trees (it skips such graphs); compiled at fixed sizes
it replays. Past :data:`MAX_SPECIALIZED` size signatures (a stream of different graphs, as in mini-batch training)
the shape-generic graph, compiled once, runs everything else without CUDA graphs.
"""
from __future__ import annotations

import copy

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException

from gnn_inductor.pipeline import GRAPH_SOURCE, first_line
from gnn_inductor.rewrite_report import FALLBACK, NearMiss

# Concrete-size compiles kept per data-dependent-size graph under CUDA graphs before the dynamic fallback.
MAX_SPECIALIZED = 4


def size_specialized(aten_gm, num_args, num_sizes, static_inputs, graph_report, plan_of, compile_at, dynamic):
    """The step of a graph whose plan has data-dependent sizes, compiled under CUDA graphs at the sizes of each
    graph it meets (one compile per distinct size signature, the plan sizes and the arguments' shapes and
    integers; ``compile_at(gm, example_inputs, graph_report, static_inputs)`` compiles one), ``dynamic()`` the
    shape-generic compile past :data:`MAX_SPECIALIZED` signatures."""
    compiled, refused = {}, set()
    fallback = []
    shifted_static = [i if i < num_args else i - num_sizes for i in static_inputs]

    def run(*args):
        plan = plan_of(args)
        sizes, tensors = tuple(int(s) for s in plan[:num_sizes]), plan[num_sizes:]
        key = (sizes,) + tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        fn = compiled.get(key)
        if fn is None and key not in refused and len(compiled) < MAX_SPECIALIZED:
            gm = with_constant_sizes(aten_gm, num_args, sizes)
            try:
                fn = compiled[key] = compile_at(gm, list(args) + list(tensors), graph_report, shifted_static)
            except DynamicOutputShapeException as exc:
                # an operator whose output size depends on values is left even at fixed sizes: PyG's boolean
                # indexing of edge inputs that need a gradient, on a graph Dynamo compiled for 0 or 1 edge, which
                # passes/structure.select_by_structure_masks leaves as it is; the shape-generic graph runs it
                refused.add(key)
                graph_report.near_misses.append(NearMiss(
                    "cuda_graphs", f"a graph of sizes {sizes} keeps an operator of a data-dependent output shape "
                    f"({first_line(exc)[:80]}); it runs the shape-generic graph, without CUDA graphs", GRAPH_SOURCE,
                    FALLBACK))
        if fn is not None:
            return fn(*args, *tensors)
        if not fallback:
            fallback.append(dynamic())
        return fallback[0](*args, *sizes, *tensors)

    return run


def with_constant_sizes(aten_gm, num_args: int, sizes: tuple):
    """A copy of ``aten_gm`` whose plan-size placeholders (right after the ``num_args`` arguments) are the
    integers ``sizes``."""
    graph = copy.deepcopy(aten_gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, size in zip(placeholders[num_args:num_args + len(sizes)], sizes):
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n, node=node, size=size: size if n is node else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, node=node, size=size: size if n is node else n)
        graph.erase_node(node)
    graph.lint()
    return torch.fx.GraphModule(aten_gm, graph)
