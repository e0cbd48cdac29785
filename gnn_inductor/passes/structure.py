"""Graph passes on the structure of a rewritten graph: index checks, mask indexings made structure, and the
structure work cut out of the graph into the *structure function* of its plan.

After the rewrite, every node computed from graph structure alone (self-loop insertion, degree normalisation, CSR
builds, degree statistics: see ``graph_match.structure_nodes``) is moved by :func:`hoist_structure` into a
structure function; at run time its outputs are cached per graph (``gnn_inductor/plan/cache.py``'s
:class:`~gnn_inductor.plan.cache.PlanCache`) and fed to the compiled remainder as extra inputs, so Inductor never
recomputes (or reuses the memory of) them. Outputs that alias the graph's inputs stay in the main graph (views of
inputs are recomputed there), so a cached plan never keeps a user's tensor alive.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from gnn_inductor.graph_match import as_gather, as_scatter, index_key, strip_index, structure_nodes, val
from gnn_inductor.rewrite_report import source_of


def insert_index_checks(gm: GraphModule, rewrite_ctx) -> int:
    """Before each remaining gather/scatter whose index is graph structure, check the index range
    (``gnn_io.check_index``); the check is structure work, so it runs once per graph. Returns the number of checks
    inserted."""
    done = set()
    structure = structure_nodes(gm.graph)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        gather, scatter = as_gather(node), as_scatter(node)
        if gather is not None:
            index, bounded = strip_index(gather.index), gather.table
        elif scatter is not None and not isinstance(scatter, str):
            index, bounded = scatter.index, scatter.node
        else:
            continue
        if index not in structure or not isinstance(val(index), torch.Tensor):
            continue
        bound = rewrite_ctx.size_arg(bounded, 0)
        key = (index_key(index), str(bound))
        if key in done or (isinstance(bound, Node) and bound not in structure):
            continue
        done.add(key)
        where = f"{node.target} at {source_of(node)['source']}"
        with gm.graph.inserting_after(index if not isinstance(bound, Node) else _later(gm, index, bound)):
            check = gm.graph.call_function(torch.ops.gnn_io.check_index.default, (index, bound, where))
        check.meta["val"] = None
    gm.recompile()
    return len(done)


def select_by_structure_masks(gm: GraphModule) -> int:
    """``x[mask]`` of a tensor that is not structure by a 1-D boolean mask that is (PyG's ``remove_self_loops`` and
    ``add_remaining_self_loops`` on an edge weight or edge features that need a gradient) becomes
    ``x[mask.nonzero()[:, 0]]``. The boolean indexing made a ``nonzero``, and a wait on the host for its count, at
    every call; now the ``nonzero`` is structure, made once per graph in the plan. The plan also gives the selected
    count as a size, so that a graph compiled at its concrete sizes (CUDA graphs, ``gnn_inductor/specialize.py``)
    holds no operator of a data-dependent output shape, which Inductor's tracing refuses there. Returns the number
    of indexings changed."""
    graph, changed = gm.graph, 0
    structure = structure_nodes(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.index.Tensor or node in structure:
            continue
        source, indices = node.args
        mask = indices[0] if len(indices) == 1 else None
        picked_val, mask_val = val(node), val(mask) if isinstance(mask, Node) else None
        if mask not in structure or not isinstance(mask_val, torch.Tensor) or mask_val.dtype != torch.bool \
                or mask_val.dim() != 1 or not isinstance(picked_val, torch.Tensor):
            continue
        if isinstance(mask_val.shape[0], int) and mask_val.shape[0] <= 1:
            # a graph Dynamo compiled for 0 or 1 edge: nothing to gain, and Inductor's CPU code generation failed an
            # assertion (a vectorised atomic add) on the backward of GCNConv's edge weights there; a slice of the
            # selected count in its place made an illegal memory access on the H100. Under CUDA graphs
            # such a graph runs the shape-generic compile (gnn_inductor/specialize.py)
            continue
        with graph.inserting_before(node):
            where = graph.call_function(torch.ops.aten.nonzero.default, (mask,))
            rows = graph.call_function(torch.ops.aten.select.int, (where, 1, 0))
            # integer indexing: its backward is the accumulating index_put the mask's was
            picked = graph.call_function(torch.ops.aten.index.Tensor, (source, [rows]))
        # the selected count is the indexing's own (data-dependent) size symbol, so later nodes' shapes still hold
        where.meta["val"] = mask_val.new_empty((picked_val.shape[0], 1), dtype=torch.long)
        rows.meta["val"] = where.meta["val"].select(1, 0)
        picked.meta.update({k: v for k, v in node.meta.items() if k in ("val", "stack_trace", "nn_module_stack")})
        node.replace_all_uses_with(picked)
        graph.erase_node(node)
        changed += 1
    if changed:
        graph.lint()
        gm.recompile()
    return changed


def _later(gm: GraphModule, a: Node, b: Node) -> Node:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return a if order[a] > order[b] else b


def _is_alias(node: Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None and not returns[0].alias_info.is_write


@dataclass
class Hoisted:
    structure_gm: GraphModule
    input_positions: list   # positions of the main graph's placeholders the structure fn reads
    outputs: list           # structure nodes the main graph now receives as extra inputs
    output_vals: list       # example inputs for them: data-dependent sizes first, then fake tensors
    num_nodes: int


def hoist_structure(gm: GraphModule) -> Optional[Hoisted]:
    """Move the structure-only computation of ``gm`` into its own GraphModule; ``gm`` gets one
    new trailing placeholder per structure output. None when there is nothing worth hoisting."""
    graph = gm.graph
    structure = structure_nodes(graph)
    hoisted = {n for n in structure if n.op == "call_function"}
    keep = _computed_in_both(graph, hoisted)
    work = hoisted - keep
    if not work:
        return None
    outputs = [n for n in graph.nodes if n in work and isinstance(val(n), torch.Tensor)
               and any(u not in hoisted or u in keep for u in n.users)]
    checks = any(n.target is torch.ops.gnn_io.check_index.default for n in work)
    if not outputs and not checks:  # (index checks alone still make a plan: they run once per graph)
        return None

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    needed = [p for p in placeholders if any(u in hoisted for u in p.users)]
    sgraph = Graph()
    env = {p: sgraph.placeholder(p.name) for p in needed}
    owner = torch.nn.Module()
    for n in graph.nodes:
        if n.op == "get_attr" and any(u in hoisted for u in n.users):
            setattr(owner, n.target, getattr(gm, n.target))
            env[n] = sgraph.get_attr(n.target)
    for n in graph.nodes:
        if n in hoisted:
            env[n] = sgraph.node_copy(n, lambda x: env[x])
    # Data-dependent sizes (self loops found by nonzero) must reach Inductor as plain symbols.
    symbol_sources = _unbacked_symbol_sources(graph, hoisted, outputs)
    if symbol_sources is None:
        return None
    size_outputs = [sgraph.call_function(torch.ops.aten.sym_size.int, (env[n], d)) for _, n, d in symbol_sources]
    sgraph.output(tuple(env[o] for o in outputs) + tuple(size_outputs))
    dedupe_structure(sgraph)
    structure_gm = GraphModule(owner, sgraph)

    # the plan's inputs go after the graph's own; a graph may have none (PyG's RGCNConv breaks its graph at an
    # ``.item()``, leaving a graph that starts from constants)
    last = placeholders[-1] if placeholders else None

    def add_placeholder(name: str, value) -> Node:
        nonlocal last
        with graph.inserting_after(last) if last is not None else graph.inserting_before(next(iter(graph.nodes))):
            last = graph.placeholder(name)
        last.meta["val"] = value
        return last

    for i, (_, n, d) in enumerate(symbol_sources):
        add_placeholder(f"plan_size_{i}", val(n).shape[d])
    for i, out in enumerate(outputs):
        out.replace_all_uses_with(add_placeholder(f"plan_{i}", val(out)))
    for n in reversed(list(graph.nodes)):
        if n in work and not n.users:
            graph.erase_node(n)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return Hoisted(structure_gm, [placeholders.index(p) for p in needed], outputs,
                   [val(n).shape[d] for _, n, d in symbol_sources] + [val(o) for o in outputs], len(work))


def _pure(node: Node) -> bool:
    """A call whose result depends only on its arguments and that changes nothing: a functional ATen op (no
    argument written, no random draw), an arithmetic or comparison of sizes, an item of a tuple. Index checks and
    runtime size assertions count too: a repeat of one with the same arguments can only repeat its verdict."""
    target = node.target
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
            return False
        return True
    return target in (operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv, operator.ge,
                      operator.gt, operator.le, operator.lt, operator.eq, operator.ne, torch.sym_sum,
                      torch.sym_max, torch.sym_min)


def _written(node: Node) -> bool:
    """Whether a call that may write into its arguments uses ``node`` (then two equal values must stay two
    tensors), or ``node`` allocates memory it leaves unset (``empty``: a later write gives it its value)."""
    if getattr(node.target, "__name__", "").startswith(("empty", "new_empty")):
        return True
    return any(isinstance(user.target, torch._ops.OpOverload) and user.target._schema.is_mutable
               for user in node.users)


def _frozen(value, canonical: dict):
    """A hashable image of a node's arguments: nodes by identity (after deduplication), lists as tuples."""
    if isinstance(value, Node):
        return ("node", id(canonical.get(value, value)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_frozen(v, canonical) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted((k, _frozen(v, canonical)) for k, v in value.items()))
    return (type(value).__name__, repr(value))


def dedupe_structure(graph: Graph) -> int:
    """Common subexpressions of a structure graph computed once: each layer of a model repeats the structure
    work of its graph (PyG's GCNConv adds self loops and normalises per layer; each attention layer builds its
    CSR), so a two-layer model's plan held every step twice, run again for each new graph (mini-batches). A
    pure call (:func:`_pure`) with the same target and arguments as an earlier one is replaced by it; index
    checks are matched without the text that names their site (the first site's is kept). Returns the number
    of calls removed."""
    seen, canonical, removed = {}, {}, 0
    for node in list(graph.nodes):
        if not _pure(node) or _written(node):
            continue
        args = node.args
        if node.target is torch.ops.gnn_io.check_index.default:
            args = args[:2]
        key = (node.target, _frozen(args, canonical), _frozen(dict(node.kwargs), canonical))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(first)
        canonical[node] = first
        graph.erase_node(node)
        removed += 1
    return removed


_aten = torch.ops.aten
# Tensors of one constant (a scatter's zero base): made in the main graph they cost Inductor one write, fused
# into their consumer; crossing as a plan tensor they cost a graph input and a copy (a functional scatter into
# an input clones it). The point is structural (no extra input, no copy): on the H100 the interleaved A/B of
# declined SAGEConv max and GINConv graphs (10k-578k edges) read the same either way, 0.97-1.01x of
# torch.compile.
_FILLS = {_aten.zeros.default, _aten.new_zeros.default, _aten.full.default, _aten.new_full.default,
          _aten.ones.default, _aten.new_ones.default, _aten.zeros_like.default, _aten.full_like.default,
          _aten.ones_like.default, _aten.scalar_tensor.default}


def _is_fill(node: Node) -> bool:
    v = val(node)
    return node.op == "call_function" and node.target in _FILLS and isinstance(v, torch.Tensor) \
        and not free_unbacked_symbols(v)


def _computed_in_both(graph: Graph, hoisted: set) -> set:
    """Hoisted nodes the main graph must still compute itself: symbolic scalars it uses (they cannot
    cross as tensors; their tensor inputs do), views of graph inputs (a cached output must never
    alias a user's tensor, or it would keep the user's graph alive) and constant fills it uses
    (:data:`_FILLS`: cheaper made than passed in)."""
    keep = {n for n in hoisted if _is_fill(n) and any(u not in hoisted for u in n.users)}
    changed = True
    while changed:
        changed = False
        for n in graph.nodes:
            if n not in hoisted or n in keep or isinstance(val(n), torch.Tensor) or val(n) is None:
                continue
            if any(u not in hoisted or u in keep for u in n.users):
                keep.add(n)
                changed = True
    for n in graph.nodes:
        if n in hoisted and _is_alias(n) and all(i.op in ("placeholder", "get_attr") or (i in keep and _is_alias(i))
                                                 for i in n.all_input_nodes):
            keep.add(n)
    return keep


def _unbacked_symbol_sources(graph: Graph, hoisted: set, outputs: list) -> Optional[list]:
    """For each data-dependent symbol in the outputs' shapes, a hoisted node and dim whose size is
    exactly that symbol: ``[(symbol, node, dim)]``; None when one has no such source."""
    wanted = set()
    for out in outputs:
        wanted |= free_unbacked_symbols(val(out))
    sources = []
    for symbol in sorted(wanted, key=str):
        found = next(((symbol, n, d) for n in graph.nodes if n in hoisted and isinstance(val(n), torch.Tensor)
                      for d, size in enumerate(val(n).shape)
                      if isinstance(size, torch.SymInt) and size.node.expr == symbol), None)
        if found is None:
            return None
        sources.append(found)
    return sources
