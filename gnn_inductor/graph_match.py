"""Shared graph walking for the patterns: canonical gathers and scatters, index identity, the
structure closure, and the cutting of edge functions out of a matched region.

All patterns see the canonical ATen graph (``canonical.py``) through these helpers only, so each
spelling of a gather (``index_select``, ``x[idx]``, ``gather``, ``embedding``) or a scatter
(``scatter_add``, ``scatter_reduce``, ``index_add``, ``index_put(accumulate=True)``,
``index_reduce``) is recognised in exactly one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC

aten = torch.ops.aten

# Ops that only re-shape an index on its way to a gather/scatter.
_INDEX_PASSTHROUGH = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.alias.default,
    aten.view_copy.default, aten.expand_copy.default, aten.unsqueeze_copy.default, aten.clone.default,
    aten.lift_fresh_copy.default, aten.detach.default,
}
# Shape ops allowed inside an edge function; they must keep the edge dimension first.
_EDGE_VIEW_OPS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default,
    aten.expand.default, aten.expand_copy.default, aten.unsqueeze.default, aten.unsqueeze_copy.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.alias.default, aten.clone.default, aten.detach.default,
    aten._to_copy.default,
}
_SIZED_VIEW_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default}
_SIZED_EXPAND_OPS = {aten.expand.default, aten.expand_copy.default}
# Reductions over feature dimensions (never the edge dimension) allowed inside an edge function.
_FEATURE_REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default}
_ZERO_FACTORIES = {aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default}
_FILL_FACTORIES = {aten.full.default: 1, aten.new_full.default: 2, aten.full_like.default: 1}


def val(node) -> object:
    return node.meta.get("val") if isinstance(node, Node) else node


def tensor_val(node) -> torch.Tensor | None:
    """The (fake) tensor a graph node holds, None for a non-node or a node without a tensor value."""
    value = val(node) if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def same_size(a, b) -> bool:
    """True when two (possibly symbolic) sizes are provably equal."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    try:
        return bool(statically_known_true(a == b))
    except Exception:
        return False


# Element-wise ops that ATen does not tag ``pointwise``.
_UNTAGGED_POINTWISE = {
    aten.leaky_relu.default, aten.hardtanh.default, aten._prelu_kernel.default, aten.hardswish.default,
    aten.hardsigmoid.default, aten.mish.default, aten.softplus.default,
}


def is_pointwise(node: Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target in _UNTAGGED_POINTWISE:
        return True
    tags = target.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


def strip_index(node):
    """The 1-D index behind views, expands and casts."""
    while isinstance(node, Node) and node.op == "call_function" and (
            node.target in _INDEX_PASSTHROUGH
            or (node.target == aten._to_copy.default and not val(node).is_floating_point())):
        node = node.args[0]
    return node


def index_key(node) -> tuple:
    """Structural identity of an index: ``edge_index[1]`` taken twice is the same index."""
    node = strip_index(node)
    if isinstance(node, Node) and node.op == "call_function" and node.target in (
            aten.select.int, aten.select_copy.int):
        return ("select", index_key(node.args[0]), node.args[1], node.args[2])
    return ("node", node)


def _dim0(node, dim) -> bool:
    v = val(node)
    return dim == 0 or (v is not None and dim == -v.dim())


@dataclass
class Gather:
    table: Node
    index: Node


def as_gather(node: Node) -> Optional[Gather]:
    """Row gather ``table[index]`` in any of its spellings, else None."""
    if node.op != "call_function":
        return None
    t, a = node.target, node.args
    if t in (aten.index_select.default,) and _dim0(a[0], a[1]):
        return Gather(a[0], a[2])
    if t == aten.index.Tensor and len(a[1]) == 1 and a[1][0] is not None:
        idx = val(a[1][0])
        if idx is not None and idx.dim() == 1 and idx.dtype in (torch.int64, torch.int32):
            return Gather(a[0], a[1][0])
    if t == aten.embedding.default and val(a[1]).dim() == 1:
        return Gather(a[0], a[1])
    if t == aten.gather.default and _dim0(a[0], a[1]) and _broadcast_index(a[2], node) is not None:
        return Gather(a[0], _broadcast_index(a[2], node))
    return None


def _broadcast_index(index: Node, like: Node):
    """For an index expanded from ``idx.view(-1, 1, ...)`` over ``like``'s shape, the 1-D ``idx``."""
    root = strip_index(index)
    rv, lv = val(root), val(like)
    if rv is None or lv is None or rv.dim() != 1:
        return None
    iv = val(index)
    if iv.dim() > 1 and not same_size(iv.shape[0], rv.shape[0]):
        return None
    # Every step between root and index must only add size-1 dims and expand them.
    node = index
    while node is not root:
        if node.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default,
                           aten.unsqueeze.default, aten.unsqueeze_copy.default):
            shape = val(node).shape
            if not all(same_size(s, 1) for s in shape[1:]):
                return None
        node = node.args[0]
    return root


@dataclass
class Scatter:
    node: Node
    index: Node          # 1-D destination index
    src: Node            # per-edge messages [E, *F]
    reduce: str          # sum | mean | max | min
    num_dst: object      # int or SymInt
    result: Node = None  # node whose value the rewrite replaces (the scatter, or the mean's division)


def _zero_base(node: Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in _ZERO_FACTORIES:
        return True
    pos = _FILL_FACTORIES.get(node.target)
    return pos is not None and len(node.args) > pos and node.args[pos] == 0


def as_scatter(node: Node) -> Union[Scatter, str, None]:
    """A scatter by a 1-D index along dim 0 into a zero tensor; a near-miss reason string when it
    is a scatter the ops cannot honour; None when it is not a scatter at all."""
    if node.op != "call_function":
        return None
    t, a, kw = node.target, node.args, node.kwargs
    if t == aten.scatter_add.default:
        base, dim, index, src, reduce, include_self = a[0], a[1], a[2], a[3], "sum", True
    elif t == aten.scatter_reduce.two:
        base, dim, index, src, reduce = a[:5]
        include_self = a[5] if len(a) > 5 else kw.get("include_self", True)
    elif t == aten.index_add.default:
        base, dim, index, src, reduce, include_self = a[0], a[1], a[2], a[3], "sum", True
        if (a[4] if len(a) > 4 else kw.get("alpha", 1)) != 1:
            return "index_add with alpha != 1"
    elif t == aten.index_reduce.default:
        base, dim, index, src, reduce = a[:5]
        include_self = a[5] if len(a) > 5 else kw.get("include_self", True)
    elif t == aten.segment_reduce.default:
        return (f"segment_reduce({a[1]!r}) over offsets: eager gives every tied extreme the full gradient, "
                "scatter semantics share it; left to Inductor")
    elif t == aten.index_put.default:
        accumulate = a[3] if len(a) > 3 else kw.get("accumulate", False)
        if not accumulate or len(a[1]) != 1:
            return None
        base, dim, index, src, reduce, include_self = a[0], 0, a[1][0], a[2], "sum", True
    else:
        return None
    reduce = {"add": "sum", "amax": "max", "amin": "min"}.get(reduce, reduce)
    if reduce == "prod":
        return "reduce='prod' (PyG 'mul') has no gnn_io op; left to Inductor"
    if not _dim0(base, dim):
        return f"scatter along dim {dim}, not the node dimension"
    if not _zero_base(base):
        return "scatter into a tensor that is not freshly zero-filled"
    if include_self and reduce in ("max", "min", "mean"):
        return f"scatter_reduce({reduce!r}, include_self=True) mixes the zero base into the result"
    root = index if t in (aten.index_add.default, aten.index_reduce.default, aten.index_put.default) \
        else _broadcast_index(index, src)
    if root is None or val(root).dim() != 1:
        return "scatter index varies along feature dimensions"
    return Scatter(node, root, src, reduce, val(base).shape[0], node)


def _is_edge_data(node: Node, edge_counts: list) -> bool:
    """A floating point input that needs no gradient and has one row per edge of an integer
    ``[2, E]`` input: edge weights or edge features, part of the graph rather than of the model."""
    v = val(node)
    return (isinstance(v, torch.Tensor) and v.is_floating_point() and node.meta.get("requires_grad") is False
            and v.dim() >= 1 and any(same_size(v.shape[0], e) for e in edge_counts))


def structure_nodes(graph: Graph) -> set:
    """Nodes computed from graph structure alone: integer/bool tensor inputs, edge weights and
    edge features that need no gradient, symbolic sizes and constants. Their values are the same
    for every call on the same graph (the plan cache keys on those inputs)."""
    structure = set()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    edge_counts = [val(n).shape[-1] for n in placeholders if isinstance(val(n), torch.Tensor)
                   and not val(n).is_floating_point() and val(n).dim() == 2 and same_size(val(n).shape[0], 2)]
    for node in graph.nodes:
        if node.op == "placeholder":
            v = val(node)
            if isinstance(v, torch.SymInt) or isinstance(v, int) or (
                    isinstance(v, torch.Tensor) and not v.is_floating_point() and not v.is_complex()) or \
                    _is_edge_data(node, edge_counts):
                structure.add(node)
        elif node.op == "get_attr":
            structure.add(node)
        elif node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload) and (
                    torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable):
                continue
            if all(inp in structure for inp in node.all_input_nodes):
                structure.add(node)
    return structure


# ---------------------------------------------------------------------------------------------
# Edge functions
# ---------------------------------------------------------------------------------------------

class NotAnEdgeFunction(Exception):
    """The region between gathers and a scatter is not per-edge math the ops can run."""


class NoGather(NotAnEdgeFunction):
    """A scatter of values that involve no gathered row (a degree sum of edge weights): not message
    passing at all, so Inductor keeps it and no near miss is recorded."""


@dataclass
class EdgeRegion:
    """Per-edge math feeding ``root``: ``nodes`` in graph order, ``inputs`` maps each original node
    that becomes an edge-function argument to its (role, tensor passed to the op)."""
    root: Node
    nodes: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)
    special: Optional[Node] = None


@dataclass
class IndexRoles:
    """The destination index of a match and the (single) source index its gathers use."""
    dst_key: tuple
    num_edges: object
    structure: set
    src_key: Optional[tuple] = None
    src_index: Optional[Node] = None


def collect_region(root: Node, roles: IndexRoles, special: frozenset = frozenset(),
                   edge_inputs: bool = False) -> EdgeRegion:
    """Walk back from ``root`` through pointwise ops, edge-preserving views and feature
    reductions to gathers, edge tensors and dense tensors. Nodes in ``special`` (an edge softmax
    output) become the region's special input. With ``edge_inputs``, a per-edge tensor the model
    computed (not structure), such as PNA's messages ``pre_nn([x_i, x_j])``, is an EDGE input the
    region may start from in place of a gather."""
    region = EdgeRegion(root)
    members = set()
    memo = {}

    def visit(node) -> bool:
        """True when ``node`` depends on an edge (is part of the region or an edge input)."""
        if not isinstance(node, Node):
            return False
        if node in memo:
            return memo[node]
        memo[node] = result = _visit(node)
        return result

    def _visit(node: Node) -> bool:
        if node in special:
            if region.special is not None and region.special is not node:
                raise NotAnEdgeFunction("message uses two different edge softmax results")
            region.special = node
            return True
        if node in roles.structure:
            return False  # per-graph constant (e.g. GCN's normalisation): an input from the plan
        gather = as_gather(node)
        if gather is not None and same_size(val(node).shape[0], roles.num_edges):
            key = index_key(gather.index)
            if key == roles.dst_key:
                role = ROLE_DST
            elif strip_index(gather.index) not in roles.structure:
                raise NotAnEdgeFunction("a gather index is computed from features, not graph structure")
            elif roles.src_key in (None, key):
                roles.src_key, roles.src_index, role = key, strip_index(gather.index), ROLE_SRC
            else:
                raise NotAnEdgeFunction("message gathers by more than one source index")
            region.inputs[node] = (role, gather.table)
            return True
        v = val(node)
        if not isinstance(v, torch.Tensor):
            return False
        allowed = node.op == "call_function" and (
            is_pointwise(node) or node.target in _EDGE_VIEW_OPS or node.target in _FEATURE_REDUCTIONS)
        if allowed:
            if node.target in _FEATURE_REDUCTIONS and _reduces_dim0(node):
                allowed = False
        if allowed:
            depends = [visit(inp) for inp in node.all_input_nodes]
            if any(depends):
                if v.dim() == 0 or not same_size(v.shape[0], roles.num_edges):
                    raise NotAnEdgeFunction(f"{node.target} mixes the edge dimension away")
                members.add(node)
                return True
        if edge_inputs and v.is_floating_point() and v.dim() >= 1 and same_size(v.shape[0], roles.num_edges):
            region.inputs[node] = (ROLE_EDGE, node)
            return True
        return False

    visit(root)
    if root not in members and root not in region.inputs:
        raise NoGather("the message does not depend on any gathered row")
    # Inputs that are neither gathers nor region members: edge tensors or dense tensors.
    for node in list(members):
        for inp in node.all_input_nodes:
            if inp in members or inp in region.inputs or inp is region.special:
                continue
            region.inputs[inp] = (_classify_external(inp, node, roles), inp)
    region.nodes = [n for n in root.graph.nodes if n in members]
    return region


def _reduces_dim0(node: Node) -> bool:
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return True
    ndim = val(node.args[0]).dim()
    return any((d % ndim) == 0 for d in dims)


def _classify_external(inp: Node, user: Node, roles: IndexRoles) -> int:
    v, uv = val(inp), val(user)
    if not isinstance(v, torch.Tensor):
        raise NotAnEdgeFunction(f"non-tensor input {inp.name} to the message")
    if v.dim() == 0 or v.dim() < uv.dim() or same_size(v.shape[0], 1):
        return ROLE_DENSE
    if same_size(v.shape[0], roles.num_edges) and v.dim() == uv.dim():
        return ROLE_EDGE
    raise NotAnEdgeFunction(f"{inp.name} of shape {tuple(v.shape)} is neither per-edge nor broadcast")


def pack_args(regions: list) -> tuple:
    """The op's argument list for one or more regions: ``(tensors, roles, arg_of)`` where
    ``arg_of`` maps each region input node to its argument position (shared inputs deduplicated)."""
    tensors, roles, arg_of, seen = [], [], {}, {}
    for region in regions:
        for node, (role, tensor) in region.inputs.items():
            key = (role, tensor)
            if key not in seen:
                seen[key] = len(tensors)
                tensors.append(tensor)
                roles.append(role)
            arg_of[node] = seen[key]
    return tensors, roles, arg_of


def build_edge_fn(region: EdgeRegion, arg_of: dict, num_args: int, special_first: bool) -> GraphModule:
    """An FX function of the per-edge argument values (the special input first when asked)
    that computes ``region.root``."""
    graph = Graph()
    special_ph = graph.placeholder("alpha") if special_first else None
    placeholders = [graph.placeholder(f"a{i}") for i in range(num_args)]
    env = {node: placeholders[i] for node, i in arg_of.items() if node in region.inputs}
    if region.special is not None:
        env[region.special] = special_ph
    for node in region.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
        env[node].meta = {}
        _make_shape_static(env[node], node)
    graph.output(env[region.root])
    return GraphModule(torch.nn.Module(), graph)


@dataclass
class Aggregation:
    scatter: Scatter
    region: EdgeRegion
    roles: IndexRoles
    gathers: bool = True   # False: the message reads model-computed edge tensors only (``edge_messages``)

    @property
    def result(self) -> Node:
        return self.scatter.result

    @property
    def inputs(self) -> frozenset:
        """What the message reads: ``(role, tensor)`` pairs (the op's arguments, in any order)."""
        return frozenset(self.region.inputs.values())


def fold_mean(scatter: Scatter) -> Scatter:
    """PyG's ``scatter(reduce='mean')``: a sum divided by ``clamp(count, min=1)`` where ``count``
    scatters ones by the same index. Folded into ``reduce='mean'`` replacing the division."""
    if scatter.reduce != "sum" or len(scatter.node.users) != 1:
        return scatter
    (div,) = scatter.node.users
    if div.target != aten.div.Tensor or div.args[0] is not scatter.node:
        return scatter
    clamp = strip_index(div.args[1])
    if not (isinstance(clamp, Node) and clamp.target in (aten.clamp.default, aten.clamp_min.default)
            and clamp.args[1] == 1 and (len(clamp.args) < 3 or clamp.args[2] is None)):
        return scatter
    count = as_scatter(clamp.args[0])
    if not isinstance(count, Scatter) or count.reduce != "sum" or index_key(count.index) != index_key(scatter.index):
        return scatter
    ones = count.src
    if not (ones.op == "call_function" and ones.target in (aten.ones.default, aten.new_ones.default, aten.ones_like.default)):
        return scatter
    return Scatter(scatter.node, scatter.index, scatter.src, "mean", scatter.num_dst, div)


def match_aggregation(node: Node, structure: set, special: frozenset = frozenset(), edge_messages: bool = False):
    """An aggregation ``reduce_{dst}(phi(gathered rows, edge tensors, dense tensors))`` anchored
    at a scatter node: an :class:`Aggregation`, a near-miss reason, or None. With ``edge_messages``,
    a message that gathers nothing but reads per-edge tensors the model computed is an aggregation
    too (``gathers`` False)."""
    scatter = as_scatter(node)
    if scatter is None or isinstance(scatter, str):
        return scatter
    if node in structure:
        return None  # structure work (degrees, counts): hoisted into the graph plan instead
    if strip_index(scatter.index) not in structure:
        return "scatter index is computed from features, not graph structure"
    scatter = fold_mean(scatter)
    for edge_inputs in (False, True) if edge_messages else (False,):
        roles = IndexRoles(dst_key=index_key(scatter.index), num_edges=val(scatter.index).shape[0],
                           structure=structure)
        try:
            return Aggregation(scatter, collect_region(scatter.src, roles, special, edge_inputs), roles,
                               gathers=not edge_inputs)
        except NoGather:
            continue
        except NotAnEdgeFunction as exc:
            # the retry over edge tensors is an offer, not a claim: what it cannot take stays silent
            return None if edge_inputs else str(exc)
    return None


def sibling_aggregations(agg: Aggregation, structure: set) -> list:
    """The other aggregations by ``agg``'s destination index whose messages read exactly its inputs
    (the same tensors in the same roles): reductions that one walk over the edges can share."""
    found = []
    for node in agg.scatter.node.graph.nodes:
        if node is agg.scatter.node or node.op != "call_function":
            continue
        scatter = as_scatter(node)
        if not isinstance(scatter, Scatter) or index_key(scatter.index) != agg.roles.dst_key:
            continue
        other = match_aggregation(node, structure, edge_messages=True)
        if isinstance(other, Aggregation) and other.inputs == agg.inputs:
            found.append(other)
    return found


def _make_shape_static(new: Node, old: Node) -> None:
    """Edge functions run at any edge count: sizes become ``-1`` on the edge dim, constants elsewhere."""
    if old.target not in _SIZED_VIEW_OPS and old.target not in _SIZED_EXPAND_OPS:
        return
    shape = val(old).shape
    rest = []
    for s in shape[1:]:
        if not isinstance(s, int):
            raise NotAnEdgeFunction("feature sizes are symbolic")
        rest.append(s)
    new.args = (new.args[0], [-1, *rest]) + tuple(new.args[2:])
