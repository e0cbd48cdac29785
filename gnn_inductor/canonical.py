"""Canonical form: the Dynamo graph lowered to a functional, pre-autograd ATen graph.

``make_fx`` retraces the Dynamo graph on its fake example values (same ShapeEnv as Dynamo, so
symbolic and data-dependent sizes carry over) under ``functionalize``: in-place spellings
(``scatter_add_``, ``index_add_``, ``scatter_reduce_``, ``masked_fill_``) become their functional
ATen ops, ``x[idx]`` becomes ``aten.index.Tensor``, ``torch_geometric.utils.scatter`` and
``torch_scatter`` calls become the ATen scatter they are built from. Node metadata (the user's
stack trace) is preserved for the report. Autograd is not traced: the rewritten graph goes to
Inductor, which differentiates it, using the gnn_io ops' own autograd formulas.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.fx import GraphModule, Node
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx


def fake_inputs(gm: GraphModule) -> list:
    """Dynamo's fake example value of each placeholder."""
    return [node.meta["example_value"] for node in gm.graph.nodes if node.op == "placeholder"]


# Composite ops whose C++ decomposition cannot run on symbolic sizes (their Python ones can, under
# the Python dispatcher); everything else keeps the spelling Inductor and the patterns expect.
_DECOMPOSITIONS = torch._decomp.get_decompositions([
    torch.ops.aten.dropout, torch.ops.aten.native_dropout, torch.ops.aten.feature_dropout,
    torch.ops.aten.alpha_dropout,
])


def _dropout(input, p=0.5, training=True, inplace=False):
    """``F.dropout`` spelled with traceable ops: the ATen kernel cannot run on symbolic sizes under
    functionalisation. Same distribution (keep with probability ``1 - p``, scale by ``1/(1-p)``); the spelling
    is what :func:`as_dropout` recognises."""
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return torch.zeros_like(input)
    keep = torch.rand(input.shape, dtype=input.dtype, device=input.device) > p  # shape only: no data dependence
    return input * keep * (1.0 / (1.0 - p))


class Dropout(NamedTuple):
    """One ``F.dropout`` in the canonical graph: ``result = masked * (1 / (1 - p))``, ``masked = input * keep``,
    ``keep = rand(input.shape) > p``."""
    result: Node
    masked: Node
    input: Node
    keep: Node
    rand: Node
    p: float


def as_dropout(node: Node) -> Optional[Dropout]:
    """``node`` as the result of a dropout spelled by :func:`_dropout` (in ATen ops), else None."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target != aten.mul.Tensor or len(node.args) != 2 or node.kwargs:
        return None
    masked, scale = node.args
    if not isinstance(masked, Node) or masked.target != aten.mul.Tensor or len(masked.args) != 2 or masked.kwargs:
        return None
    input, keep = masked.args
    if not isinstance(keep, Node) or keep.target != aten.gt.Scalar:
        return None
    rand, p = keep.args
    if not isinstance(rand, Node) or rand.target != aten.rand.default or not isinstance(p, float) \
            or not 0.0 < p < 1.0 or scale != 1.0 / (1.0 - p):
        return None
    return Dropout(node, masked, input, keep, rand, p)


def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """``torch.segment_reduce`` over CSR offsets (PyG's ``segment``) spelled as the scatter it is,
    so segment and scatter aggregations meet the matcher in one form. Sum and mean only: for max
    and min, eager ``segment_reduce`` gives each of several equal maxima in one segment the full
    gradient where scatter semantics share it, so those stay as they are (a near miss)."""
    supported = offsets is not None and lengths is None and indices is None and axis == 0 and offsets.dim() == 1 \
        and reduce in ("sum", "mean") and initial in (None, 0)
    if not supported:
        return torch.segment_reduce(data, reduce, lengths=lengths, indices=indices, offsets=offsets, axis=axis,
                                    unsafe=unsafe, initial=initial)
    row = torch.repeat_interleave(offsets[1:] - offsets[:-1], output_size=data.shape[0])
    index = row.view(-1, *([1] * (data.dim() - 1))).expand_as(data)
    out = data.new_zeros((offsets.shape[0] - 1, *data.shape[1:]))
    if reduce == "sum":
        return out.scatter_add(0, index, data)
    return out.scatter_reduce(0, index, data, "mean", include_self=False)


_SOURCE_REWRITES = {torch.nn.functional.dropout: _dropout, torch.dropout: _dropout,
                    torch.segment_reduce: _segment_reduce}


def _rewrite_source_ops(gm: GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SOURCE_REWRITES:
            node.target = _SOURCE_REWRITES[node.target]
    gm.recompile()


_NEW_FACTORIES = {
    torch.ops.aten.new_zeros.default: torch.ops.aten.zeros.default,
    torch.ops.aten.new_ones.default: torch.ops.aten.ones.default,
    torch.ops.aten.new_empty.default: torch.ops.aten.empty.memory_format,
    torch.ops.aten.new_full.default: torch.ops.aten.full.default,
}


def _detach_factories(aten_gm: GraphModule) -> None:
    """``t.new_zeros(size)`` borrows only dtype and device from ``t``: spell it ``zeros(size, dtype,
    device)`` so that PyG's ``src.new_ones(E)`` degree counts are seen as pure graph structure."""
    for node in aten_gm.graph.nodes:
        target = _NEW_FACTORIES.get(node.target)
        if target is None:
            continue
        like = node.args[0].meta["val"]
        kwargs = {"dtype": like.dtype, "device": like.device, **node.kwargs}
        node.target, node.args, node.kwargs = target, tuple(node.args[1:]), kwargs
    aten_gm.graph.eliminate_dead_code()
    aten_gm.recompile()


def _specialize_float_inputs(aten_gm: GraphModule) -> None:
    """``.item()`` of a float input Dynamo made of a Python float (``dynamic=True``) becomes the float's value,
    guarded: the scalar patterns (GATConv's LeakyReLU slope) need a constant, and a new value recompiles, as
    Dynamo's default specialisation of floats would. Only backed symbols (the input's value known at tracing)
    are specialised; others stay symbolic."""
    from torch.fx.experimental.symbolic_shapes import guard_scalar

    changed = False
    for node in list(aten_gm.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten._local_scalar_dense.default:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.SymFloat) or not value.node.has_hint():
            continue
        constant = guard_scalar(value)
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n: constant if n is node else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: constant if n is node else n)
        aten_gm.graph.erase_node(node)
        changed = True
    if changed:
        aten_gm.graph.eliminate_dead_code()
        aten_gm.recompile()


def canonicalize(gm: GraphModule) -> GraphModule:
    _rewrite_source_ops(gm)

    def run(*args):
        return torch.fx.Interpreter(gm).run(*args)

    # With dynamic=True Dynamo passes a Python float attribute (GATConv's negative_slope, a dropout p) as a float64
    # scalar input read by .item(); its fake input carries the value's symbol (item_memo, in the ShapeEnv the
    # backend shares). make_fx fakes the inputs again in the backend's fake mode, without it: .item() would then be
    # data-dependent (DataDependentOutputException, the graph left to Inductor). Hand the symbols over, as AOT
    # autograd does (it fakes with sources).
    memos = [getattr(value, "item_memo", None) for value in fake_inputs(gm)]
    functional = torch.func.functionalize(run, remove="mutations")

    def traced(*args):
        for arg, memo in zip(args, memos):
            if memo is not None and isinstance(arg, torch.Tensor) and getattr(arg, "item_memo", None) is None:
                arg.item_memo = memo
        return functional(*args)

    with fx_traceback.preserve_node_meta(), enable_python_dispatcher():
        aten_gm = make_fx(traced, tracing_mode="symbolic", decomposition_table=_DECOMPOSITIONS,
                          _allow_non_fake_inputs=False)(*fake_inputs(gm))
    _specialize_float_inputs(aten_gm)
    _detach_factories(aten_gm)
    # make_fx leaves its ShapeEnv on the module; nothing reads it there (the values' fake mode holds the same one)
    aten_gm.__dict__.pop("shape_env", None)
    # make_fx traces below autograd: carry each input's requires_grad over for the structure analysis
    dynamo_inputs = fake_inputs(gm)
    dynamo_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for node, example, name in zip([n for n in aten_gm.graph.nodes if n.op == "placeholder"], dynamo_inputs,
                                   dynamo_names):
        node.meta["requires_grad"] = bool(getattr(example, "requires_grad", False))
        node.meta["dynamo_name"] = name  # e.g. L_self_modules_lin_key_parameters_weight_, for the report
    return aten_gm


def fake_mode_of(aten_gm: GraphModule):
    """The fake mode of the canonical graph's values (shares Dynamo's ShapeEnv)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in aten_gm.graph.nodes if n.op == "placeholder"])
