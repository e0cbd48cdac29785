r"""A small expression compiler: pointwise edge functions into Triton source lines.

An edge function (``gnn_inductor.kernels.runtime.edge_functions``) maps per-edge argument values to a message
``[E, *M]``. The fused kernels compute it on a 2-D *tile* ``[BLOCK_E edges, BLOCK_F features]``,
``f`` indexing the flattened message features ``F = prod(M)``. Each value of the function is read
in that frame: its element at tile position ``(e, f)`` is the element that torch broadcasting puts
at message position ``(e, unflatten(f))``. That holds for

- pointwise ops (the table :data:`_EMIT` below) whose per-edge operands have the result's rank
  (the edge dimension first) and whose dense operands broadcast into the feature dims;
- views, ``unsqueeze``/``squeeze``, ``expand`` and ``reshape`` that keep every element at its
  broadcast position (checked numerically on a probe, so a view that reorders features is refused);
- scalar constants and ``*_like`` factories.

Every argument then has a *layout*: the feature shape it broadcasts from, aligned to ``M`` (each
dim 1 or ``M_d``): ``full`` (one value per feature), ``scalar`` (one value per edge or node, as an
edge weight ``[E]`` or ``[E, 1]``) or ``partial`` (broadcast over some dims only, as a per-head
weight ``[E, H, 1]`` against ``[E, H, C]``).

With views made identities, the function is elementwise over tiles, so its vector-Jacobian
product is too: :func:`lower` traces ``torch.autograd.grad`` of the elementwise form with
``make_fx`` (ATen's own derivative formulas: ``threshold_backward``, ``leaky_relu_backward``, ...)
and lowers it with the same table. The gradient of an argument element is the sum of its tile
contributions over the edges and the features it is broadcast over (the kernels do that sum).

Anything else (reductions over features, integer math, data-dependent shapes, non-finite
constants, ops not in the table) raises :class:`Unsupported`, and the op runs its exact
reference instead. All arithmetic is float32; booleans stay boolean.

:func:`load_kernels` writes generated kernel source into a cache directory keyed by its hash and
imports it, so ``triton.jit`` can read the source.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx

from gnn_inductor import config
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE
from gnn_inductor.kernels.runtime.reference import autograd_dispatch

aten = torch.ops.aten


class Unsupported(Exception):
    """The edge function cannot be generated into a kernel; the op runs its reference instead."""


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArgLayout:
    role: int
    aligned: tuple   # feature shape aligned to the message shape M: each dim 1 or M_d
    is_bool: bool

    @property
    def numel(self) -> int:
        return math.prod(self.aligned)

    def kind(self, message_shape: tuple) -> str:
        if self.aligned == tuple(message_shape) or self.numel == math.prod(message_shape):
            return "full"
        return "scalar" if self.numel == 1 else "partial"


@dataclass(frozen=True)
class Lowered:
    """An edge function lowered for the tile frame.

    ``forward`` / ``vjp`` are source lines; the forward reads the arguments ``a0, a1, ...`` and
    defines ``forward_result``; the VJP reads the arguments and the cotangent ``g`` and defines
    ``vjp_results[i]`` (None where argument ``i`` gets no gradient: a boolean mask; "0.0" where the function
    does not read it).
    """
    message_shape: tuple
    message_dtype: torch.dtype  # of the message for float32 arguments
    layouts: tuple
    forward: tuple
    forward_result: str
    vjp: tuple
    vjp_results: tuple


def _aligned(shape, message_shape, what: str) -> tuple:
    shape = list(shape)
    while len(shape) > len(message_shape) and shape[0] == 1:
        shape.pop(0)
    if len(shape) > len(message_shape):
        raise Unsupported(f"{what} of shape {tuple(shape)} has more dims than the message {tuple(message_shape)}")
    shape = [1] * (len(message_shape) - len(shape)) + shape
    for s, m in zip(shape, message_shape):
        if s not in (1, m):
            raise Unsupported(f"{what} of feature shape {tuple(shape)} does not broadcast to the message "
                              f"{tuple(message_shape)}")
    return tuple(shape)


_VIEWS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default,
    aten.expand.default, aten.expand_copy.default, aten.unsqueeze.default, aten.unsqueeze_copy.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.alias.default, aten.clone.default,
    aten.detach.default, aten.permute.default, aten.transpose.int, aten.contiguous.default,
}
_LIKE_FACTORIES = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default}


def _probe_edges(specs) -> int:
    sizes = {s for spec in specs for s in spec[1]}
    return next(p for p in (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67) if p not in sizes)


def _analyse(fn, specs: list) -> tuple:
    """Trace ``fn`` to ATen on a probe, check every node against the tile frame; returns
    (message shape M, argument layouts)."""
    num_edges = _probe_edges(specs)
    generator = torch.Generator().manual_seed(0)
    probes, arg_edge = [], []
    for role, shape, dtype in specs:
        full = tuple(shape) if role == ROLE_DENSE else (num_edges, *shape)
        if dtype == torch.bool:
            probes.append(torch.rand(full, generator=generator) > 0.5)
        elif dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            probes.append(torch.randn(full, generator=generator))
        else:
            raise Unsupported(f"argument of dtype {dtype} (only floating point and bool arguments are generated)")
        arg_edge.append(role != ROLE_DENSE)
    try:
        fn = make_fx(fn)(*probes)  # one ATen spelling per op, whatever the function was written in
    except Exception as exc:
        raise Unsupported(f"tracing the edge function failed: {type(exc).__name__}: {exc}") from None
    env, edge = {}, {}
    placeholders = [n for n in fn.graph.nodes if n.op == "placeholder"]
    for node, probe, is_edge in zip(placeholders, probes, arg_edge):
        env[node], edge[node] = probe, is_edge
    output = next(n for n in fn.graph.nodes if n.op == "output")
    result = output.args[0]
    if not isinstance(result, Node):
        raise Unsupported("edge function does not return one tensor")
    for node in fn.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            raise Unsupported(f"{node.op} {node.target} (tensor constants and modules are not generated)")
        env[node] = node.target(*torch.fx.node.map_arg(node.args, env.__getitem__),
                                **torch.fx.node.map_arg(node.kwargs, env.__getitem__))
        if not isinstance(env[node], torch.Tensor):
            raise Unsupported(f"{node.target} does not return one tensor")
        edge[node] = any(edge.get(i, False) for i in node.all_input_nodes)
        if node.target not in _VIEWS and node.target not in _EMIT and node.target not in _LIKE_FACTORIES:
            raise Unsupported(f"{node.target} is not a pointwise op the kernel generator knows")
    out = env[result]
    if not edge[result] or out.dim() < 1 or out.shape[0] != num_edges or not out.is_floating_point():
        raise Unsupported("the message is not a floating point per-edge tensor")
    message_shape = tuple(out.shape[1:])
    message_dtype = out.dtype
    if message_dtype == torch.float64:
        raise Unsupported("the message is float64 (the kernels compute in float32)")

    def frame(node):
        value = env[node]
        if edge[node]:
            if value.dim() < 1 or value.shape[0] != num_edges:
                raise Unsupported(f"{node} mixes the edge dimension into the features")
            return value.reshape(num_edges, *_aligned(value.shape[1:], message_shape, str(node)))
        return value.reshape(1, *_aligned(value.shape, message_shape, str(node)))

    for node in fn.graph.nodes:
        if node.op != "call_function":
            continue
        tile = frame(node).expand(num_edges, *message_shape)
        if node.target in _VIEWS:
            if not torch.equal(frame(node.args[0]).expand(num_edges, *message_shape), tile):
                raise Unsupported(f"{node.target} moves features (only broadcasting views are generated)")
        elif node.target in _EMIT and edge[node]:
            rank = env[node].dim()
            for operand in node.all_input_nodes:
                shape = env[operand].shape
                if edge[operand] and len(shape) != rank:
                    raise Unsupported(f"{node.target} broadcasts per-edge values of different ranks")
                if not edge[operand] and (len(shape) > rank or (len(shape) == rank and shape[0] != 1)):
                    raise Unsupported(f"{node.target} broadcasts a dense value over the edge dimension")
    layouts = tuple(ArgLayout(role, _aligned(shape, message_shape, f"argument {i}"), dtype == torch.bool)
                    for i, (role, shape, dtype) in enumerate(specs))
    return message_shape, message_dtype, layouts, fn


def _elementwise(fn: GraphModule):
    """``fn`` with views as identities: every value is a tile, flattened to 1-D."""
    def run(*args):
        env = {}
        it = iter(args)
        for node in fn.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(it)
            elif node.op == "output":
                return env[node.args[0]]
            elif node.target in _VIEWS:
                env[node] = env[node.args[0]]
            else:
                env[node] = node.target(*torch.fx.node.map_arg(node.args, env.__getitem__),
                                        **torch.fx.node.map_arg(node.kwargs, env.__getitem__))
    return run


# ---------------------------------------------------------------------------------------------
# Emission
# ---------------------------------------------------------------------------------------------

def _literal(value) -> str:
    if isinstance(value, bool):
        return "1.0" if value else "0.0"
    if isinstance(value, (int, float)):
        value = float(value)
        if not math.isfinite(value):
            raise Unsupported(f"non-finite constant {value}")
        return repr(value)
    raise Unsupported(f"constant {value!r}")


def _float(x: str, is_bool: bool) -> str:
    return f"{x}.to(tl.float32)" if is_bool else x


def _binary(op):
    return lambda a, b: f"({a} {op} {b})"


def _pow(x, n):
    if not isinstance(n, str) or not n[0].isdigit() and n[0] != "-":
        raise Unsupported("pow with a tensor exponent")
    n = float(n)
    if n == 0.5:
        return f"tl.sqrt({x})"
    if n == -0.5:
        return f"tl.rsqrt({x})"
    if n.is_integer() and abs(n) <= 4:
        n = int(n)
        if n == 0:
            return "1.0"
        product = " * ".join([x] * abs(n))
        return f"({product})" if n > 0 else f"(1.0 / ({product}))"
    raise Unsupported(f"pow with exponent {n} (integers up to 4 and +-0.5 are generated)")


def _clamp(x, lo=None, hi=None):
    if lo is not None:
        x = f"tl.maximum({x}, {lo})"
    if hi is not None:
        x = f"tl.minimum({x}, {hi})"
    return x


_SQRT1_2 = repr(math.sqrt(0.5))
_INV_SQRT_2PI = repr(1.0 / math.sqrt(2.0 * math.pi))


def _gelu(x, approximate="none"):
    if approximate != "none":
        raise Unsupported("gelu(approximate='tanh')")
    return f"(0.5 * {x} * (1.0 + tl.erf({x} * {_SQRT1_2})))"


def _gelu_backward(g, x, approximate="none"):
    if approximate != "none":
        raise Unsupported("gelu(approximate='tanh')")
    return (f"({g} * (0.5 * (1.0 + tl.erf({x} * {_SQRT1_2})) + {x} * {_INV_SQRT_2PI} * "
            f"tl.exp(-0.5 * {x} * {x})))")


def _add(a, b, alpha="1.0"):
    return f"({a} + {b})" if alpha == "1.0" else f"({a} + {b} * {alpha})"


def _sub(a, b, alpha="1.0"):
    return f"({a} - {b})" if alpha == "1.0" else f"({a} - {b} * {alpha})"


def _div(a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise Unsupported(f"div(rounding_mode={rounding_mode!r})")
    return f"({a} / {b})"


def _tanh(x):
    return f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"


def _softplus(x, beta="1.0", threshold="20.0"):
    """``log1p(exp(beta x)) / beta``, or ``x`` where ``beta x > threshold`` (ATen's form). ``log1p(e)`` of the
    small ``e = exp(-|beta x|)`` is ``log(u) e / (u - 1)`` with ``u = 1 + e`` (exact to rounding; ``e`` where
    ``u`` rounds to 1), since Triton's ``log1p`` is not in every backend."""
    bx = f"({beta} * {x})"
    e = f"tl.exp(-tl.abs({bx}))"
    log1p = f"tl.where((1.0 + {e}) == 1.0, {e}, tl.log(1.0 + {e}) * {e} / ((1.0 + {e}) - 1.0))"
    return f"tl.where({bx} > {threshold}, {x}, (tl.maximum({bx}, 0.0) + {log1p}) / {beta})"


def _softplus_backward(g, x, beta="1.0", threshold="20.0"):
    bx = f"({beta} * {x})"
    return f"tl.where({bx} > {threshold}, {g}, {g} * tl.sigmoid({bx}))"


def _sign(x):
    return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))"


def _to_copy(x, dtype=None, **_):
    cast = {None: "{x}", torch.float32: "{x}", torch.float64: "{x}",
            torch.bfloat16: "{x}.to(tl.bfloat16).to(tl.float32)", torch.float16: "{x}.to(tl.float16).to(tl.float32)"}
    if dtype not in cast:
        raise Unsupported(f"cast to {dtype}")
    return cast[dtype].format(x=x)


# target -> (emitter taking the operand strings, result is bool, operands kept bool)
_FLOAT, _BOOL, _LOGICAL = "float", "bool", "logical"
_EMIT = {
    aten.add.Tensor: (_add, _FLOAT), aten.add.Scalar: (_add, _FLOAT),
    aten.sub.Tensor: (_sub, _FLOAT), aten.sub.Scalar: (_sub, _FLOAT),
    aten.rsub.Scalar: (lambda a, b, alpha="1.0": _sub(b, a, alpha), _FLOAT),
    aten.rsub.Tensor: (lambda a, b, alpha="1.0": _sub(b, a, alpha), _FLOAT),
    aten.mul.Tensor: (_binary("*"), _FLOAT), aten.mul.Scalar: (_binary("*"), _FLOAT),
    aten.div.Tensor: (_div, _FLOAT), aten.div.Scalar: (_div, _FLOAT), aten.div.Tensor_mode: (_div, _FLOAT),
    aten.neg.default: (lambda x: f"(-{x})", _FLOAT),
    aten.reciprocal.default: (lambda x: f"(1.0 / {x})", _FLOAT),
    aten.relu.default: (lambda x: f"tl.maximum({x}, 0.0)", _FLOAT),
    aten.leaky_relu.default: (lambda x, slope="0.01": f"tl.where({x} > 0, {x}, {x} * {slope})", _FLOAT),
    aten.sigmoid.default: (lambda x: f"tl.sigmoid({x})", _FLOAT),
    aten.tanh.default: (_tanh, _FLOAT),
    aten.exp.default: (lambda x: f"tl.exp({x})", _FLOAT),
    aten.log.default: (lambda x: f"tl.log({x})", _FLOAT),
    aten.sqrt.default: (lambda x: f"tl.sqrt({x})", _FLOAT),
    aten.rsqrt.default: (lambda x: f"tl.rsqrt({x})", _FLOAT),
    aten.abs.default: (lambda x: f"tl.abs({x})", _FLOAT),
    aten.sin.default: (lambda x: f"tl.sin({x})", _FLOAT),
    aten.cos.default: (lambda x: f"tl.cos({x})", _FLOAT),
    aten.erf.default: (lambda x: f"tl.erf({x})", _FLOAT),
    aten.sgn.default: (_sign, _FLOAT), aten.sign.default: (_sign, _FLOAT),
    aten.gelu.default: (_gelu, _FLOAT),
    aten.softplus.default: (_softplus, _FLOAT),
    aten.maximum.default: (lambda a, b: f"tl.maximum({a}, {b})", _FLOAT),
    aten.minimum.default: (lambda a, b: f"tl.minimum({a}, {b})", _FLOAT),
    aten.clamp.default: (_clamp, _FLOAT), aten.clamp.Tensor: (_clamp, _FLOAT),
    aten.clamp_min.default: (lambda x, lo: _clamp(x, lo), _FLOAT),
    aten.clamp_max.default: (lambda x, hi: _clamp(x, None, hi), _FLOAT),
    aten.pow.Tensor_Scalar: (_pow, _FLOAT),
    aten.where.self: (lambda c, a, b: f"tl.where({c}, {a}, {b})", _FLOAT),
    aten.masked_fill.Scalar: (lambda x, m, v: f"tl.where({m}, {v}, {x})", _FLOAT),
    aten.masked_fill.Tensor: (lambda x, m, v: f"tl.where({m}, {v}, {x})", _FLOAT),
    aten._to_copy.default: (_to_copy, _FLOAT),
    aten.scalar_tensor.default: (lambda v, **_: v, _FLOAT),
    # derivative formulas (what make_fx records for torch.autograd.grad)
    aten.threshold_backward.default: (lambda g, x, t: f"tl.where({x} <= {t}, 0.0, {g})", _FLOAT),
    aten.leaky_relu_backward.default: (lambda g, x, slope, _r: f"tl.where({x} > 0, {g}, {g} * {slope})",
                                       _FLOAT),
    aten.sigmoid_backward.default: (lambda g, y: f"({g} * (1.0 - {y}) * {y})", _FLOAT),
    aten.tanh_backward.default: (lambda g, y: f"({g} * (1.0 - {y} * {y}))", _FLOAT),
    aten.gelu_backward.default: (_gelu_backward, _FLOAT),
    aten.softplus_backward.default: (_softplus_backward, _FLOAT),
    # comparisons and logic: boolean tiles
    aten.gt.Tensor: (_binary(">"), _BOOL), aten.gt.Scalar: (_binary(">"), _BOOL),
    aten.ge.Tensor: (_binary(">="), _BOOL), aten.ge.Scalar: (_binary(">="), _BOOL),
    aten.lt.Tensor: (_binary("<"), _BOOL), aten.lt.Scalar: (_binary("<"), _BOOL),
    aten.le.Tensor: (_binary("<="), _BOOL), aten.le.Scalar: (_binary("<="), _BOOL),
    aten.eq.Tensor: (_binary("=="), _BOOL), aten.eq.Scalar: (_binary("=="), _BOOL),
    aten.ne.Tensor: (_binary("!="), _BOOL), aten.ne.Scalar: (_binary("!="), _BOOL),
    aten.logical_and.default: (_binary("&"), _LOGICAL), aten.logical_and_.default: (_binary("&"), _LOGICAL),
    aten.logical_or.default: (_binary("|"), _LOGICAL), aten.logical_or_.default: (_binary("|"), _LOGICAL),
    aten.logical_not.default: (lambda x: f"({x} == 0)", _LOGICAL),
}
_IDENTITIES = {aten.detach.default, aten.alias.default, aten.clone.default, aten.view.default,
               aten._unsafe_view.default, aten.expand.default}


def emit(gm: GraphModule, inputs: list, prefix: str) -> tuple:
    """Source lines computing ``gm`` (an elementwise graph) over tile names ``inputs`` (one per
    placeholder: a name, or None for an argument that is not there); returns (lines, outputs)
    with one name or literal per output (None for a None output)."""
    names, is_bool, lines = {}, {}, []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, inputs):
        names[node] = name
        value = node.meta.get("val")
        is_bool[node] = isinstance(value, torch.Tensor) and value.dtype == torch.bool

    def operand(a, want_float: bool):
        if isinstance(a, Node):
            if names.get(a) is None:
                raise Unsupported(f"{a} has no value")
            return _float(names[a], is_bool[a]) if want_float else names[a]
        if a is None or isinstance(a, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return a
        return _literal(a)

    for i, node in enumerate(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _IDENTITIES:
            names[node], is_bool[node] = names[node.args[0]], is_bool[node.args[0]]
            continue
        if node.target in _LIKE_FACTORIES:
            fill = {aten.zeros_like.default: 0.0, aten.ones_like.default: 1.0}.get(node.target)
            names[node] = operand(node.args[1], True) if fill is None else _literal(fill)
            is_bool[node] = False
            continue
        if node.target not in _EMIT:
            raise Unsupported(f"{node.target} is not a pointwise op the kernel generator knows")
        emitter, kind = _EMIT[node.target]
        keep_bool = kind == _LOGICAL or node.target in (aten.where.self, aten.masked_fill.Scalar,
                                                        aten.masked_fill.Tensor)
        args = [operand(a, not keep_bool) for a in node.args]
        if node.target in (aten.where.self,):
            args = [operand(node.args[0], False)] + [operand(a, True) for a in node.args[1:]]
        if node.target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
            args = [operand(node.args[0], True), operand(node.args[1], False), operand(node.args[2], True)]
        kwargs = {k: (v if isinstance(v, (str, torch.dtype, torch.device, torch.layout)) or v is None else
                      operand(v, True)) for k, v in node.kwargs.items() if k not in ("layout", "device", "pin_memory")}
        try:
            expr = emitter(*args, **kwargs)
        except TypeError as exc:
            raise Unsupported(f"{node.target} with arguments {node.args} {node.kwargs}: {exc}") from None
        name = f"{prefix}{i}"
        lines.append(f"{name} = {expr}")
        names[node] = name
        is_bool[node] = kind in (_BOOL, _LOGICAL)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    outs = []
    for r in results:
        if r is None:
            outs.append(None)
        elif isinstance(r, Node):
            outs.append(_float(names[r], is_bool[r]))
        else:
            outs.append(_literal(r))
    return lines, outs


FORWARD_PREFIX = "msg_"  # of the forward's temporaries (emit numbers them: msg_3, msg_7, ...)


def renamed_forward(lowered: Lowered, prefix: str) -> tuple:
    """``(lines, result)`` of ``lowered``'s forward with its temporaries named ``{prefix}N``, so that several
    edge functions over the same argument tiles can be generated into one kernel body."""
    temporary = re.compile(rf"\b{FORWARD_PREFIX}(\d+)\b")

    def rename(text: str) -> str:
        return temporary.sub(lambda m: f"{prefix}{m.group(1)}", text)
    return tuple(rename(line) for line in lowered.forward), rename(lowered.forward_result)


def lower(fn: GraphModule, specs: list) -> Lowered:
    """Lower ``fn`` for arguments ``specs = [(role, feature shape (full shape for DENSE), dtype)]``.

    Raises :class:`Unsupported` with the reason when it cannot. Runs on real CPU probes, also when
    called while a fake mode is active (the rewrite pass asks at compile time)."""
    with unset_fake_temporarily():
        return _lower(fn, specs)


def _lower(fn: GraphModule, specs: list) -> Lowered:
    message_shape, message_dtype, layouts, fn = _analyse(fn, specs)
    elementwise = _elementwise(fn)
    length = 5
    probes = [torch.rand(length) > 0.5 if layout.is_bool else torch.randn(length) for layout in layouts]
    differentiable = [not layout.is_bool for layout in layouts]

    def vjp(*args_and_cotangent):
        *args, cotangent = args_and_cotangent
        leaves = [a.detach().requires_grad_(True) if d else a for a, d in zip(args, differentiable)]
        wanted = [leaf for leaf, d in zip(leaves, differentiable) if d]
        with torch.enable_grad(), autograd_dispatch():  # lowering may run inside a custom op
            out = elementwise(*leaves)
            grads = iter(torch.autograd.grad(out, wanted, cotangent, allow_unused=True))
        return tuple(next(grads) if d else None for d in differentiable)

    try:
        forward_gm = make_fx(elementwise)(*probes)
        vjp_gm = make_fx(vjp)(*probes, torch.randn(length))
    except Unsupported:
        raise
    except Exception as exc:
        raise Unsupported(f"tracing the elementwise form failed: {type(exc).__name__}: {exc}") from None
    arg_names = [f"a{i}" for i in range(len(layouts))]
    forward, (forward_result,) = emit(forward_gm, arg_names, FORWARD_PREFIX)
    vjp_lines, vjp_results = emit(vjp_gm, arg_names + ["g"], "vjp_")
    # an argument the function does not read gets a zero gradient (the members of a merged op share arguments)
    vjp_results = [r if r is not None or layout.is_bool else "0.0" for r, layout in zip(vjp_results, layouts)]
    return Lowered(message_shape, message_dtype, layouts, tuple(forward), forward_result, tuple(vjp_lines),
                   tuple(vjp_results))


# ---------------------------------------------------------------------------------------------
# Loading generated source
# ---------------------------------------------------------------------------------------------

_MODULES: dict = {}


def cache_dir() -> str:
    """Where generated kernels are written: ``GNN_IO_KERNEL_CACHE``, else a per-user temp folder."""
    default = os.path.join(tempfile.gettempdir(), f"gnn_io_kernels_{os.getuid() if hasattr(os, 'getuid') else 0}")
    return config.get("kernel_cache") or default


def load_kernels(source: str):
    """Import generated ``source`` (a module of ``triton.jit`` kernels) from the cache, once per process."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    if digest in _MODULES:
        return _MODULES[digest]
    folder = cache_dir()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"gnn_io_gen_{digest}.py")
    if not os.path.exists(path):
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            handle.write(source)
        os.replace(partial, path)  # atomic: concurrent processes never import half a file
    name = f"gnn_io_gen_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[digest] = module
    return module


def layout_offsets(layout: ArgLayout, message_shape: tuple, feature: str) -> str | None:
    """Source of the element offset of a ``partial`` argument at flattened message feature
    ``feature`` (None for full and scalar layouts, whose offsets are ``feature`` and 0)."""
    if layout.kind(message_shape) != "partial":
        return None
    terms, inner, stride = [], 1, 1
    inner_sizes = []
    for m in reversed(message_shape):
        inner_sizes.append(inner)
        inner *= m
    inner_sizes.reverse()
    strides = []
    for a in reversed(layout.aligned):
        strides.append(stride)
        stride *= a
    strides.reverse()
    for a, m, inner_d, stride_d in zip(layout.aligned, message_shape, inner_sizes, strides):
        if a != 1:
            terms.append(f"(({feature} // {inner_d}) % {m}) * {stride_d}")
    return " + ".join(terms) if terms else "0"
