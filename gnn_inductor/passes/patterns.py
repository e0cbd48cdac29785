"""The rewrite pass: runs the pattern families over a canonical ATen graph, in priority order,
and records what fired and what nearly did.

A pattern (one file each under ``patterns/``) is an object with ``name``, ``covers`` (the source
forms it matches), ``match(node, ctx)`` returning a match object, a near-miss reason string, or
None, ``replace(match, ctx)`` that inserts the ``torch.ops.gnn_io`` call and returns the
replacement node, and optionally ``after(ctx)``, a step over the family's replacements once its
scan is done (the gather-scatter family merges calls that can share one pass over the edges).
Graph walking lives in ``graph_match.py``; this module owns the order, the shared CSR plan nodes
and the bookkeeping.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch.fx import GraphModule, Node

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.graph_match import Aggregation, index_key, structure_nodes, val
from gnn_inductor.kernels.runtime.roles import ROLE_NAMES, ROLE_SRC
from gnn_inductor.rewrite_report import FALLBACK, NearMiss, Rewrite, source_of


class PlanNodes(NamedTuple):
    """Graph nodes of one CSR plan; ``walk`` is what the forward kernels take."""
    rowptr: Node
    col: Node
    row: Node
    perm: Node
    t_rowptr: Node
    t_col: Node
    t_perm: Node

    @property
    def walk(self) -> tuple:
        return self.rowptr, self.col, self.row, self.perm


@dataclass(frozen=True)
class Pattern:
    """A pattern family: what it matches (``covers``, the source forms), how it decides
    (``match``) and what it becomes (``replace``)."""
    name: str
    covers: tuple
    match: Callable
    replace: Callable
    after: Optional[Callable] = None


@dataclass
class RewriteContext:
    gm: GraphModule
    fake_mode: Any
    structure: set = field(default_factory=set)
    rewrites: list = field(default_factory=list)
    near_misses: list = field(default_factory=list)
    num_edges_hint: Optional[int] = None   # edges of the example graph, for the cost model
    declined: set = field(default_factory=set)  # nodes the cost model leaves to Inductor
    _plans: dict = field(default_factory=dict)
    _symbols: dict = field(default_factory=dict)

    def __post_init__(self):
        self.refresh_structure()
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" and isinstance(val(node), torch.SymInt):
                self._symbols[val(node).node.expr] = node

    def refresh_structure(self) -> None:
        self.structure = structure_nodes(self.gm.graph)

    # -- node creation ----------------------------------------------------------------------
    def call(self, target, args: tuple, before: Node, **kwargs) -> Node:
        """Insert ``target(*args, **kwargs)`` before ``before`` with its fake value in ``meta['val']``."""
        with self.gm.graph.inserting_before(before):
            node = self.gm.graph.call_function(target, args, kwargs)
        self._set_val(node)
        node.meta["stack_trace"] = before.meta.get("stack_trace")
        return node

    def call_parts(self, target, args: tuple, before: Node, count: int) -> list:
        """Insert a call returning ``count`` tensors and one ``getitem`` node per part."""
        node = self.call(target, args, before)
        parts = []
        for i in range(count):
            part = self.call(operator.getitem, (node, i), before)
            parts.append(part)
        return parts

    def _set_val(self, node: Node) -> None:
        args = torch.fx.node.map_arg(node.args, lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = node.target(*args, **node.kwargs)

    def size_arg(self, tensor_node: Node, dim: int):
        """A size of ``tensor_node`` as an op argument: an int, or the graph's own SymInt input, so
        that plan nodes stay pure structure (hoistable)."""
        size = val(tensor_node).shape[dim]
        if isinstance(size, int):
            return size
        expr = size.node.expr
        if expr.is_number:
            return int(expr)
        built = self._from_symbols(expr)
        if built is not None:
            return built
        with self.gm.graph.inserting_after(tensor_node):
            node = self.gm.graph.call_function(torch.ops.aten.sym_size.int, (tensor_node, dim))
        node.meta["val"] = size
        return node

    def _from_symbols(self, expr, before: Optional[Node] = None) -> Optional[Node]:
        """A size that is a sum of products of the graph's SymInt inputs and integers (the rows of a ``cat`` of
        several node types: ``s0 + s1``), computed from those inputs ahead of every other node, or None. Taking
        such a size from the tensor that has it instead would place the plan after that tensor, which an
        aggregation's own scatter is (its replacement would then read a plan built from its own output)."""
        if expr.is_Integer:
            return int(expr)
        if expr in self._symbols:
            return self._symbols[expr]
        if not (expr.is_Add or expr.is_Mul) or not expr.free_symbols <= set(self._symbols):
            return None
        if before is None:
            before = next(n for n in self.gm.graph.nodes if n.op != "placeholder")
        terms = [self._from_symbols(term, before) for term in expr.args]
        if any(term is None for term in terms):
            return None
        combine = operator.add if expr.is_Add else operator.mul
        result = terms[0]
        for term in terms[1:]:
            with self.gm.graph.inserting_before(before):
                result = self.gm.graph.call_function(combine, (result, term))
            result.meta["val"] = combine(*(t.meta["val"] if isinstance(t, Node) else t for t in result.args))
            self.structure.add(result)
        return result

    def csr(self, dst_index: Node, src_index: Node, num_dst, num_src) -> "PlanNodes":
        """The CSR plan nodes for edges ``src -> dst`` (see ``gnn_inductor/plan/csr.py``); one per distinct
        (destination, source, sizes) in the graph, placed right after its last input."""
        key = (index_key(dst_index), index_key(src_index), str(num_dst), str(num_src))
        inputs = [n for n in (dst_index, src_index, num_dst, num_src) if isinstance(n, Node)]
        order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        last = max(inputs, key=order.__getitem__)
        if key in self._plans and all(p._erased for p in self._plans[key]):
            del self._plans[key]  # nothing of it left in the graph: build it again
        if key in self._plans:
            parts = self._plans[key] = self._revive(self._plans[key])
            plan = parts.rowptr.args[0]
            if order[plan] > order[last]:
                # first built for a later aggregation (another pattern family came first): the same
                # structure by content, so take this requester's earlier index nodes and move up
                plan.args = (dst_index, src_index, num_dst, num_src)
                last.append(plan)
                anchor = plan
                for part in parts:
                    anchor.append(part)
                    anchor = part
            return parts
        with self.gm.graph.inserting_after(last):
            plan = self.gm.graph.call_function(torch.ops.gnn_io.csr_plan.default,
                                               (dst_index, src_index, num_dst, num_src))
        self._set_val(plan)
        parts = []
        with self.gm.graph.inserting_after(plan):
            for i in reversed(range(len(PlanNodes._fields))):
                part = self.gm.graph.call_function(operator.getitem, (plan, i))
                part.meta["val"] = plan.meta["val"][i]
                parts.append(part)
        parts = PlanNodes(*reversed(parts))
        self._plans[key] = parts
        self.structure.update((plan, *parts))
        return parts

    def _revive(self, parts: "PlanNodes") -> "PlanNodes":
        """Plan parts with the ones dead-code elimination removed since (an earlier family used only
        some of them) made again, right after the plan node."""
        plan = next(p for p in parts if not p._erased).args[0]
        fresh = []
        for i, part in enumerate(parts):
            if part._erased:
                with self.gm.graph.inserting_after(plan):
                    part = self.gm.graph.call_function(operator.getitem, (plan, i))
                part.meta["val"] = plan.meta["val"][i]
                self.structure.add(part)
            fresh.append(part)
        return PlanNodes(*fresh)

    def plan_for(self, agg: Aggregation, src_table: Optional[Node] = None) -> PlanNodes:
        """CSR plan nodes of an aggregation: by its destination index, with the source index
        its message gathers by (or the destination index when it gathers by none); the source
        count is the rows of ``src_table`` (default: the first table gathered by source)."""
        src_tables = [src_table] if src_table is not None else \
            [t for _, (role, t) in agg.region.inputs.items() if role == ROLE_SRC]
        src_index = agg.roles.src_index if agg.roles.src_index is not None else agg.scatter.index
        num_dst = self.size_arg(agg.scatter.node, 0)
        num_src = self.size_arg(src_tables[0], 0) if src_tables else num_dst
        return self.csr(agg.scatter.index, src_index, num_dst, num_src)

    def register_fn(self, fn: GraphModule) -> str:
        return edge_functions.register(fn)

    # -- bookkeeping ------------------------------------------------------------------------
    def record(self, pattern: str, op: str, node: Node, details: dict, plan_node: Optional[Node]) -> Rewrite:
        if "roles" in details:
            details["roles"] = [ROLE_NAMES[r] for r in details["roles"]]
        rewrite = Rewrite(pattern=pattern, op=op, source=source_of(node), details=details)
        rewrite.plan_node = plan_node
        self.rewrites.append(rewrite)
        return rewrite

    def near_miss(self, pattern: str, reason: str, node: Node, kind: str = "") -> None:
        """A pattern's near miss at ``node``: declined on purpose where ``reason`` is the cost model's
        (``rewrite_report.Declined``), else not matched, with the forms the pattern rewrites (``kind`` given: that)."""
        covers = next((p.covers for p in registered_patterns() if p.name == pattern), ())
        self.near_misses.append(NearMiss(pattern=pattern, reason=reason, source=source_of(node), kind=kind,
                                         expected=" or ".join(covers)))


# The pattern pass's families with their priorities, filled by :func:`register_pattern` (each family's module
# registers itself when ``gnn_inductor.patterns`` is imported, as Inductor's passes are filled by
# ``register_replacement``): the pass never imports its patterns.
_REGISTERED: list = []


def register_pattern(pattern: Pattern, priority: int) -> Pattern:
    """Add a pattern family to the pattern pass; families run in ascending ``priority``. Registering a family of
    the same name again replaces it (a module reloaded)."""
    _REGISTERED[:] = [(p, q) for p, q in _REGISTERED if q.name != pattern.name]
    _REGISTERED.append((priority, pattern))
    _REGISTERED.sort(key=lambda entry: entry[0])
    return pattern


def registered_patterns() -> tuple:
    """The registered pattern families in the order the pass applies them."""
    return tuple(pattern for _, pattern in _REGISTERED)


def run_patterns(gm: GraphModule, ctx: RewriteContext) -> RewriteContext:
    """Apply every registered pattern family in priority order. Each family scans the graph once; a node
    replaced by one family is never seen by the next."""
    for pattern in registered_patterns():
        for node in list(gm.graph.nodes):
            if node.graph is None or node.op != "call_function" or node in ctx.declined:
                continue
            try:
                found = pattern.match(node, ctx)
            except Exception as exc:  # a matcher bug must never break compilation
                ctx.near_miss(pattern.name, f"matcher error: {type(exc).__name__}: {exc}", node, FALLBACK)
                continue
            if found is None:
                continue
            if isinstance(found, str):
                ctx.near_miss(pattern.name, found, node)
                continue
            replacement = pattern.replace(found, ctx)
            ctx.rewrites[-1].op_node = replacement
            found.result.replace_all_uses_with(replacement)
        if pattern.after is not None:
            pattern.after(ctx)
        gm.graph.eliminate_dead_code()
        live = set(gm.graph.nodes)
        ctx.rewrites = [r for r in ctx.rewrites if r.op_node in live]  # e.g. an edge softmax absorbed by attention
        ctx.refresh_structure()
    gm.graph.lint()
    gm.recompile()
    return ctx
