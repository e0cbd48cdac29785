"""Direct calls of the gnn_io custom ops in compiled graphs: the same implementation without the per-call Python
of ``torch.library.custom_op``.

A ``custom_op`` call goes through its Python autograd kernel (which, under no grad, redispatches below
autograd), its Python backend wrapper (an aliasing check of the outputs, a Dynamo-disable wrapper) and then the
implementation. In the graphs Inductor compiles, after AOTAutograd has split forward from backward, none of that
is needed: autograd is already in the graph's structure, the implementation is opaque to Dynamo, and the
outputs are fresh tensors by construction. Measured on the H100 (one op call on a tiny graph, timed both ways):
``gnn_io::gather_scatter_forward`` took 179.5 us per call through ``torch.ops`` against 82.3 us for its
implementation called directly, for every op call of every step.

So for each ``gnn_io`` op built with ``custom_op`` the backend defines a twin ``gnn_io::<name>_direct`` with the
same schema, the same fake (shape) function and the implementation registered as its kernel, and an autograd
fallthrough (the twin never records autograd: it exists only inside compiled forward and backward graphs).
:func:`retarget` points a partitioned graph's calls at the twins before Inductor lowers it
(``GNN_IO_DIRECT_OPS=0`` keeps the ``custom_op`` calls, to compare).
"""
from __future__ import annotations

import torch
from torch._library.custom_ops import OPDEFS
from torch.fx import GraphModule


NAMESPACE = "gnn_io"
SUFFIX = "_direct"
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_TWINS: dict = {}  # original OpOverload -> twin OpOverload (None: the op keeps its own calls)


def twin(op) -> torch._ops.OpOverload | None:
    """The direct twin of a ``gnn_io`` op built with ``torch.library.custom_op`` (defined at the first request),
    or None for any other op, for one whose kernels differ by device (its implementation is not one function)
    and for one called for its side effect (``gnn_io::check_index``: graph passes keep it by its identity)."""
    if op in _TWINS:
        return _TWINS[op]
    result = None
    if isinstance(op, torch._ops.OpOverload) and op.namespace == NAMESPACE and op._overloadname == "default" \
            and op not in torch.fx.node._side_effectful_functions:
        definition = OPDEFS.get(f"{NAMESPACE}::{op._opname}")
        if definition is not None and set(definition._backend_fns) <= {None} and \
                definition._abstract_fn is not None:
            result = _define(op, definition)
    _TWINS[op] = result
    return result


def _define(op, definition) -> torch._ops.OpOverload:
    name = op._opname + SUFFIX
    if not hasattr(getattr(torch.ops, NAMESPACE), name):
        schema = str(op._schema).split("(", 1)[1]
        _LIB.define(f"{name}({schema}")
        _LIB.impl(name, definition._init_fn, "CompositeExplicitAutograd")
        _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", definition._abstract_fn, lib=_LIB)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def define_all() -> int:
    """Every twin, defined now: a graph loaded from AOTAutograd's cache calls the twins its first compile made, and
    nothing retargets it in this process. Returns how many exist."""
    prefix = f"{NAMESPACE}::"
    ops = [getattr(getattr(torch.ops, NAMESPACE), name[len(prefix):]).default
           for name in list(OPDEFS) if name.startswith(prefix)]
    return sum(twin(op) is not None for op in ops)


def is_direct(node) -> bool:
    """Whether an FX node calls a direct twin."""
    return getattr(node.target, "_opname", "").endswith(SUFFIX)


def retarget(gm: GraphModule) -> int:
    """Point ``gm``'s calls of gnn_io custom ops at their direct twins; returns how many calls moved. The pipeline
    runs it unless ``GNN_IO_DIRECT_OPS=0`` (gnn_inductor/pipeline.py)."""
    moved = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = twin(node.target)
        if target is not None:
            node.target = target
            moved += 1
    if moved:
        gm.recompile()
    return moved
