r"""Which fused attention an op's edge functions are: the family, its score and value terms, and its scales.

For each destination ``i`` and head ``h`` (``e = (j -> i)`` its incoming edges, in CSR order) the fused kernels
compute

.. math::
    s_e = \mathrm{score}(e, h), \qquad
    \mathrm{out}_{i,h} = \frac{\sum_e \exp(s_e - m_i) \, w_e \, v_e}{\sum_e \exp(s_e - m_i) + \varepsilon},
    \qquad \mathrm{lse}_{i,h} = m_i + \log \sum_e \exp(s_e - m_i)

which is ``gnn_io::attention`` (kernels/attention/op.py) for the three score families below. ``m_i`` is a
running maximum (online softmax), ``w_e`` alpha's attention dropout factor (``keep(e, h) / (1 - p)``, the mask
drawn from the call's seed and the edge's original id by :mod:`kernels.runtime.rng`; 1 without dropout) and ``v_e``
a sum of ``[rows, H, C]`` values (``x_j``, or TransformerConv's ``v_j + e_ij``).

Families (recognised from the edge functions' FX graphs by :func:`recognise`; anything else runs the
reference, so an unrecognised function is slower, never wrong):

========== =================================================================== ===============================
family     score                                                               PyG layer
========== =================================================================== ===============================
``gat``    ``leaky_relu(sum_t a_t[e, h]) * scale``, per-head scalar terms      GATConv (``a_l x_j + a_r x_i``
                                                                               + edge term)
``gatv2``  ``scale * sum_c att[h, c] * leaky_relu(sum_t a_t[e, h, c])``        GATv2Conv
``dot``    ``scale * sum_c q[e, h, c] * sum_t k_t[e, h, c]``                   TransformerConv
========== =================================================================== ===============================

Each term reaches the edge through its role (src, dst or edge; ``att`` is dense).

The dot family may also carry a per-edge score factor ``f`` (an argument of a per-edge role, ``[rows, H]``, or
``[rows, 1]`` for every head): ``s_e = scale * f[e, h] * sum_c q[e, h, c] * sum_t k_t[e, h, c]``, the score of PyG's
HGTConv (``(q_i * k_j).sum(-1) * p_rel / sqrt(D)``, ``p_rel`` the relation prior gathered per edge). The kernels
multiply the score by ``f`` and give its gradient ``df[e, h] = ds[e, h] * scale * sum_c q k``; ``q`` and the keys
get theirs scaled by ``f``.

The message is ``alpha`` (times constants) times a sum of values, ``[E, H, C]``, or that product flattened to
``[E, H * C]`` (HGTConv's ``out.view(-1, out_channels)``); the op's output then has the message's shape, heads
major.

Float casts inside the chains are transparent: ``x.float()``, ``x.to(torch.bfloat16)`` and a sum with
``dtype=torch.float32`` (what CUDA autocast makes of ``sum``, on its float32 list) change only where eager rounds an
intermediate, and the kernels load every argument in its own dtype and compute in float32. The output dtype is not
part of the form: the op's is half precision when any argument is (``kernels/attention/layout.py``), and the rewrite
casts it to eager's where they differ (``patterns/attention.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC

FAMILIES = {"gat": 0, "gatv2": 1, "dot": 2}
MAX_SCORE_TERMS, MAX_VALUE_TERMS = 3, 2   # the kernels' argument slots


@dataclass(frozen=True)
class AttentionForm:
    """What the fused kernels compute, as argument indices into the op's ``args``."""
    family: str
    score_terms: tuple       # summed inside the score (scalars for gat, [*, H, C] vectors otherwise)
    query: int | None     # gatv2: the dense ``att``; dot: the other factor of the dot product
    negative_slope: float    # leaky_relu slope (gat, gatv2)
    score_scale: float
    value_terms: tuple       # summed into the message's [*, H, C] value
    message_scale: float
    score_factor: int | None = None   # dot: the per-edge [*, H] factor of the score (HGTConv's relation prior)
    message_width: int | None = None  # the message flattened to [*, message_width] (= H * C), None for [*, H, C]


class _NotRecognised(Exception):
    pass


_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _uncast(node):
    """``node`` without the float casts (``_to_copy`` to float32, float16 or bfloat16, nothing else changed) around
    it."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == _aten._to_copy.default \
            and len(node.args) == 1 and set(node.kwargs) == {"dtype"} and node.kwargs["dtype"] in _FLOAT_DTYPES:
        node = node.args[0]
    return node


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scaled(node, scale: float = 1.0):
    """Strip ``* c`` and ``/ c`` by constants and float casts off ``node``: (inner node, accumulated scale)."""
    node = _uncast(node)
    while node.op == "call_function" and node.target in (_aten.mul.Tensor, _aten.div.Tensor):
        a, b = node.args
        if node.target == _aten.mul.Tensor and _number(a):
            a, b = b, a
        if not _number(b):
            break
        scale = scale * b if node.target == _aten.mul.Tensor else scale / b
        node = _uncast(a)
    return node, scale


def _arg(node, placeholders) -> int:
    node = _uncast(node)
    if node not in placeholders:
        raise _NotRecognised(f"{node} is not an argument")
    return placeholders[node]


def _sum_of_args(node, placeholders) -> tuple:
    """``a + b + ...`` of arguments: their indices."""
    node = _uncast(node)
    if node.op == "call_function" and node.target == _aten.add.Tensor and not node.kwargs:
        return _sum_of_args(node.args[0], placeholders) + _sum_of_args(node.args[1], placeholders)
    return (_arg(node, placeholders),)


def _leaky_relu(node):
    node = _uncast(node)
    if node.op == "call_function" and node.target == _aten.leaky_relu.default and not node.kwargs:
        return node.args[0], float(node.args[1]) if len(node.args) > 1 else 0.01
    return None


def _last_dim_sum(node):
    """The summand of a sum over the last dim (in its own dtype or a float one: float32 under CUDA autocast)."""
    if node.op == "call_function" and node.target == _aten.sum.dim_IntList and \
            set(node.kwargs) <= {"dtype"} and node.kwargs.get("dtype") in (None, *_FLOAT_DTYPES) and \
            list(node.args[1]) == [-1] and (len(node.args) < 3 or not node.args[2]):
        return _uncast(node.args[0])
    return None


def _factored(node, placeholders):
    """``(factor argument, other side)`` where ``node`` is the product of an argument and a non-argument, else
    None."""
    if node.op != "call_function" or node.target != _aten.mul.Tensor or node.kwargs:
        return None
    a, b = (_uncast(x) for x in node.args)
    if not isinstance(a, torch.fx.Node) or not isinstance(b, torch.fx.Node):
        return None
    for factor, other in ((a, b), (b, a)):
        if factor in placeholders and other not in placeholders:
            return placeholders[factor], other
    return None


def _score_form(fn) -> dict:
    placeholders = {n: i for i, n in enumerate(n for n in fn.graph.nodes if n.op == "placeholder")}
    (root,) = [n.args[0] for n in fn.graph.nodes if n.op == "output"]
    root, scale = _scaled(root)
    factored = _factored(root, placeholders)
    if factored is None:
        return _unfactored_score_form(root, scale, placeholders)
    factor, other = factored
    root, scale = _scaled(other, scale)
    form = _unfactored_score_form(root, scale, placeholders)
    if form["family"] != "dot":
        raise _NotRecognised(f"a score factor on the {form['family']} family (only the dot-product family has one)")
    return {**form, "score_factor": factor}


def _unfactored_score_form(root, scale: float, placeholders: dict) -> dict:
    leaky = _leaky_relu(root)
    if leaky is not None:
        return {"family": "gat", "score_terms": _sum_of_args(leaky[0], placeholders), "query": None,
                    "negative_slope": leaky[1], "score_scale": scale}
    product = _last_dim_sum(root)
    if product is None or product.target != _aten.mul.Tensor or product.kwargs:
        raise _NotRecognised("score is neither leaky_relu(sum of terms) nor a sum over channels of a product")
    factors = [_uncast(a) for a in product.args]
    for left, right in (factors, reversed(factors)):
        leaky = _leaky_relu(left) if isinstance(left, torch.fx.Node) else None
        if leaky is not None and right in placeholders:
            return {"family": "gatv2", "score_terms": _sum_of_args(leaky[0], placeholders), "query": placeholders[right],
                        "negative_slope": leaky[1], "score_scale": scale}
    for left, right in (factors, reversed(factors)):
        if left in placeholders and isinstance(right, torch.fx.Node):
            try:
                return {"family": "dot", "score_terms": _sum_of_args(right, placeholders), "query": placeholders[left],
                            "negative_slope": 0.0, "score_scale": scale}
            except _NotRecognised:
                continue
    raise _NotRecognised("score product is not att * leaky_relu(terms) nor query * (sum of keys)")


def _alpha_chain(node, alpha) -> float:
    """Walk from the alpha side of the message back to ``alpha`` through reshapes that add a trailing
    unit channel dim, float casts and products with constants; returns the constant factor. (Attention dropout is not
    part of the message: the op applies it to alpha, kernels/runtime/rng.py.)"""
    scale = 1.0
    while node is not alpha:
        if node.op != "call_function":
            raise _NotRecognised(f"{node} on the alpha side is not an op")
        inner = _uncast(node)
        if inner is not node:
            node = inner
        elif node.target == _aten.unsqueeze.default and node.args[1] in (-1, 2) or node.target in _VIEWS and list(node.args[1])[-1] == 1 and len(node.args[1]) == 3:
            node = node.args[0]
        elif node.target in (_aten.mul.Tensor, _aten.div.Tensor):
            a, b = node.args
            if node.target == _aten.div.Tensor:
                if not _number(b):
                    raise _NotRecognised("alpha divided by a tensor")
                scale, node = scale / b, a
                continue
            if _number(a):
                a, b = b, a
            if _number(b):
                scale, node = scale * b, a
                continue
            raise _NotRecognised("alpha multiplied by a tensor")
        else:
            raise _NotRecognised(f"{node.target} on the alpha side of the message")
    return scale


def _flattened(node) -> tuple:
    """``(node, width)`` of a message flattened to ``[rows, width]`` by a view or reshape (``width`` an int), else
    ``(node, None)``."""
    if node.op == "call_function" and node.target in _VIEWS and not node.kwargs and len(node.args[1]) == 2 and \
            isinstance(node.args[1][1], int) and not isinstance(node.args[1][1], bool) and node.args[1][1] > 0:
        return _uncast(node.args[0]), node.args[1][1]
    return node, None


def _message_form(fn) -> dict:
    nodes = list(fn.graph.nodes)
    alpha = nodes[0]
    placeholders = {n: i for i, n in enumerate(n for n in nodes[1:] if n.op == "placeholder")}
    (root,) = [n.args[0] for n in nodes if n.op == "output"]
    root, width = _flattened(_uncast(root))
    if root.op != "call_function" or root.target != _aten.mul.Tensor or root.kwargs:
        raise _NotRecognised("message is not (alpha-weighted) * values")
    for alpha_side, value_side in (root.args, reversed(root.args)):
        if not isinstance(alpha_side, torch.fx.Node) or not isinstance(value_side, torch.fx.Node):
            continue
        try:
            scale = _alpha_chain(alpha_side, alpha)
            return {"value_terms": _sum_of_args(value_side, placeholders), "message_scale": scale,
                    "message_width": width}
        except _NotRecognised:
            continue
    raise _NotRecognised("message is not alpha (times constants) times a sum of values")


_FORMS: dict = {}


def recognise(score_key: str, message_key: str, roles) -> AttentionForm | str:
    """The :class:`AttentionForm` of an attention op, or the reason it runs the reference."""
    key = (score_key, message_key, tuple(roles))
    if key not in _FORMS:
        try:
            form = AttentionForm(**_score_form(edge_functions.lookup(score_key)),
                                 **_message_form(edge_functions.lookup(message_key)))
            if len(form.score_terms) > MAX_SCORE_TERMS or len(form.value_terms) > MAX_VALUE_TERMS:
                raise _NotRecognised("more terms than the kernel has slots for")
            per_edge = (ROLE_SRC, ROLE_DST, ROLE_EDGE)
            if any(roles[i] not in per_edge for i in form.score_terms + form.value_terms):
                raise _NotRecognised("a score term or value is dense")
            if form.family == "gatv2" and roles[form.query] != ROLE_DENSE:
                raise _NotRecognised("gatv2 attention vector is not dense")
            if form.family == "dot" and roles[form.query] not in per_edge:
                raise _NotRecognised("dot-product query is dense")
            if form.score_factor is not None and roles[form.score_factor] not in per_edge:
                raise _NotRecognised("score factor is dense")
            _FORMS[key] = form
        except _NotRecognised as exc:
            _FORMS[key] = str(exc)
    return _FORMS[key]
