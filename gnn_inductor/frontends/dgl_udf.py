"""DGL reduce functions written in Python (``update_all(message, reduce_udf)``), traced without DGL's degree
buckets.

DGL runs a reduce UDF once per in-degree: the nodes of degree ``d`` get ``nodes.mailbox[k]`` of shape
``[n, d, ...]`` (their messages, ordered by edge ID) and the UDF's outputs are merged by node; nodes without
in-edges are not passed to it and get 0 in every output field. The buckets are data-dependent, so Dynamo
cannot capture that loop.

Most reduce UDFs only *reduce* their mailbox over the degree dimension and then compute per node:
``{"h": torch.sum(nodes.mailbox["m"], dim=1)}``, ``{"h": nodes.data["h"] + nodes.mailbox["m"].max(1).values}``,
``{"h": F.relu(nodes.mailbox["m"].mean(1) @ W)}``. For those, the per-node result does not depend on the
buckets: each reduction is a scatter of the messages by destination (what the built-in reducers compute), and
the rest is ordinary tensor code on ``[num_dst, ...]`` tensors.

:func:`mailbox_reductions` decides this by tracing the UDF once with ``torch.fx`` proxies standing for the
mailbox and node data (outside Dynamo: :func:`torch._dynamo.assume_constant_result` runs it at trace time and
keeps its answer as a constant). Each mailbox field must be used only by reductions over dimension 1 of one
kind, ``sum``, ``mean``, ``max`` or ``min`` (``torch.sum(m, 1)``, ``m.sum(dim=1)``, ``torch.max(m, 1)[0]``,
``m.max(1).values``, ``torch.amax(m, 1)``, ...) without ``keepdim``; anything else (the mailbox's shape,
indices of a max, an LSTM over the messages, Python control flow on values, node IDs) declines and DGL's own
code runs.

The UDF then runs for real, under Dynamo, on a *stand-in* mailbox: ``[num_dst, 1, ...]`` holding each node's
reduced messages (:func:`stand_in`). A reduction over a dimension of size 1 returns its input, so every
reduction the UDF makes yields exactly the scattered result, and everything else in the UDF (parameters,
closures, node data) is traced as written. Rows of nodes without in-edges are set to 0 afterwards, as DGL
leaves them.
"""
from __future__ import annotations

import builtins
import operator
import os
import sys
import types

import torch
import torch.fx

from gnn_inductor.frontends import declines

KINDS = ("sum", "mean", "max", "min")
_FUNCTIONS = {torch.sum: "sum", torch.mean: "mean", torch.amax: "max", torch.amin: "min", torch.max: "max",
              torch.min: "min"}
_METHODS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min"}
_WITH_INDICES = (torch.max, torch.min, "max", "min")  # return (values, indices) when given a dim


class Nodes:
    """What a traced reduce UDF may read of DGL's ``NodeBatch``: ``mailbox`` and ``data``. Anything else
    (``nodes()``, ``batch_size()``) raises, which declines the UDF."""

    def __init__(self, mailbox: dict, data: dict):
        self.mailbox = mailbox
        self.data = data


def _reduction_kind(node: torch.fx.Node) -> str | None:
    """The kind of ``node`` if it reduces its first argument over dimension 1 (no keepdim, no dtype), else None."""
    if node.op == "call_function" and node.target in _FUNCTIONS:
        kind = _FUNCTIONS[node.target]
    elif node.op == "call_method" and node.target in _METHODS:
        kind = _METHODS[node.target]
    else:
        return None
    args, kwargs = node.args[1:], dict(node.kwargs)
    dim = args[0] if args else kwargs.pop("dim", None)
    if len(args) > 1 or kwargs or dim not in (1, (1,), [1]):
        return None
    if node.target in _WITH_INDICES:  # (values, indices): only the values may be read
        for user in node.users:
            values = (user.target is operator.getitem and user.args[1:] == (0,)) or \
                (user.target is builtins.getattr and user.args[1:] == ("values",))
            if user.op != "call_function" or not values:
                return None
    return kind


def _opaque_proxy(tracer, name: str):
    """A value the analysis does not know (mailbox and data fields, a method's ``self``, a closure's variables):
    tensor code on it traces, attributes and calls give more proxies, Python decisions on it decline."""
    return tracer.create_proxy("placeholder", name, (), {})


_GLOBALS: dict = {}  # source file -> the globals of the module loaded from it


def _globals_of(code) -> dict | None:
    """The globals of the module whose file defines ``code`` (a function's globals cannot cross Dynamo's trace
    as a constant; its code object can)."""
    path = os.path.realpath(code.co_filename)
    found = _GLOBALS.get(path)
    if found is None:
        for module in list(sys.modules.values()):
            try:
                file = getattr(module, "__file__", None)
            except Exception:  # noqa: BLE001 - a lazy module may fail on attribute access
                continue
            if isinstance(file, str) and os.path.realpath(file) == path:
                found = _GLOBALS[path] = vars(module)
                break
    return found


def analyse_code(code, bound: bool, mailbox_keys: tuple, data_keys: tuple) -> tuple | str:
    """``((field, kind), ...)``: how the reduce UDF with code object ``code`` (a method's when ``bound``) uses
    each mailbox field it reads, or a string that says why it cannot be computed without DGL's degree buckets.
    Its closure's variables and a method's ``self`` are opaque proxies (:func:`_opaque_proxy`)."""
    namespace = _globals_of(code)
    if namespace is None:
        return f"the reduce function's module ({code.co_filename}) is not imported"
    graph = torch.fx.Graph()
    tracer = torch.fx.Tracer()
    tracer.graph, tracer.root, tracer.tensor_attrs = graph, torch.nn.Module(), {}
    mailbox = {k: _opaque_proxy(tracer, f"mailbox_{i}") for i, k in enumerate(mailbox_keys)}
    data = {k: _opaque_proxy(tracer, f"data_{i}") for i, k in enumerate(data_keys)}
    closure = tuple(types.CellType(_opaque_proxy(tracer, f"closure_{name}")) for name in code.co_freevars)
    try:
        func = types.FunctionType(code, namespace, code.co_name, None, closure or None)
        result = func(*((_opaque_proxy(tracer, "self"),) if bound else ()), Nodes(mailbox, data))
        if not isinstance(result, dict):
            return f"the reduce function returned {type(result).__name__}, not a dict"
    except Exception as exc:  # noqa: BLE001 - any failure to trace declines the UDF
        return f"the reduce function could not be traced with proxies ({type(exc).__name__}: {exc})"
    uses = []
    for key, proxy in mailbox.items():
        kinds = set()
        for user in proxy.node.users:
            kind = _reduction_kind(user) if user.args and user.args[0] is proxy.node else None
            if kind is None:
                return f"mailbox[{key!r}] is used other than by a sum/mean/max/min over its degree dimension " \
                       f"({user.format_node()})"
            kinds.add(kind)
        if len(kinds) > 1:
            return f"mailbox[{key!r}] is reduced in several ways ({', '.join(sorted(kinds))})"
        if kinds:
            uses.append((key, kinds.pop()))
    return tuple(uses)


def code_of(func) -> tuple | None:
    """``(code object, bound)`` of a plain function or a bound method, what :func:`mailbox_reductions` takes;
    None for any other callable (a partial, a module, a builtin), which is declined."""
    if isinstance(func, types.MethodType) and isinstance(func.__func__, types.FunctionType):
        return func.__func__.__code__, True
    if isinstance(func, types.FunctionType):
        return func.__code__, False
    return None


def analyse(func, mailbox_keys: tuple, data_keys: tuple) -> tuple | str:
    """:func:`analyse_code` of a function or bound method."""
    found = code_of(func)
    return analyse_code(*found, mailbox_keys, data_keys) if found else f"{type(func).__name__} is not a function"


@torch._dynamo.assume_constant_result
def mailbox_reductions(code, bound: bool, mailbox_keys: tuple, data_keys: tuple) -> tuple | str:
    """:func:`analyse_code`, run outside Dynamo's trace (its answer is a constant of the captured graph; code
    objects, unlike functions with closures or bound methods, can be passed as constants). A declined function is
    noted for the report."""
    uses = analyse_code(code, bound, mailbox_keys, data_keys)
    if isinstance(uses, str):
        declines.remember(f"reduce function {code.co_name} at {code.co_filename}:{code.co_firstlineno}", uses)
    return uses


def stand_in(reduced: torch.Tensor) -> torch.Tensor:
    """The mailbox a traced UDF gets: ``[num_dst, 1, ...]``, each node's messages already reduced."""
    return reduced.unsqueeze(1)


def zero_rows_without_messages(value: torch.Tensor, has_messages: torch.Tensor) -> torch.Tensor:
    """``value`` (``[num_dst, ...]``) with the rows of nodes without in-edges set to 0 (DGL does not call the UDF
    for them)."""
    mask = has_messages.view(-1, *([1] * (value.dim() - 1)))
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))
