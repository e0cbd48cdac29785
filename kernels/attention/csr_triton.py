r"""Fused CSR attention in Triton: scores, online softmax and weighted aggregation in one pass.

For each destination ``i`` and head ``h`` (``e = (j -> i)`` its incoming edges, in CSR order):

.. math::
    s_e = \mathrm{score}(e, h), \qquad
    \mathrm{out}_{i,h} = \frac{\sum_e \exp(s_e - m_i) \, w_e \, v_e}{\sum_e \exp(s_e - m_i) + \varepsilon},
    \qquad \mathrm{lse}_{i,h} = m_i + \log \sum_e \exp(s_e - m_i)

which is ``gnn_io::attention`` (kernels/attention.py) for the three score families below. ``m_i`` is a
running maximum (online softmax), ``w_e`` alpha's attention dropout factor (``keep(e, h) / (1 - p)``, the mask
drawn from the call's seed and the edge's original id by :mod:`kernels.rng` into a bitset of ``E * H / 8`` bytes
once per forward and again, identically, once per backward; no ``[E, H]`` tensor is stored; 1 without dropout)
and ``v_e`` a sum of
``[rows, H, C]`` values (``x_j``, or TransformerConv's ``v_j + e_ij``). No ``[E, H, C]`` tensor is ever built:
each program keeps a ``BLOCK_E x BLOCK_C`` tile of the neighbourhood in registers.

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

Backward recomputes the scores from the saved ``lse`` (``alpha_e = exp(s_e - lse_i)``, ``eps`` dropped, a
relative 1e-16) and ``D_i = <dout_i, out_i>`` (the softmax Jacobian's row term, FlashAttention's delta):
``ds_e = alpha_e (w_e <dout_i, v_e> - D_i)``. The variants, picked by ``GNN_IO_ATTENTION_BACKWARD``
(read at each call, :func:`backward_variant`); unset (``auto``), the GAT family runs ``one_pass_segment`` and the
others ``split``:

- ``split`` (the default but for GAT; FlashAttention-2's split, no atomics outside hub rows): two launches of
  :func:`_split_backward_all_heads_kernel`, one program per
  work item for every head (the item's indices read once, not once per head: measured faster on the H100,
  :data:`SPLIT_BACKWARD_LAUNCH`). The **dst pass** walks the CSR's work items and writes the gradients of
  dst-role arguments (summed in registers over the whole item: one store per item for every head, an atomic
  only for the items of a hub row), of edge-role ones (plain stores: each edge id is one address) and
  GATv2's dense ``att`` (32 slots, as below). ``D [N, H]`` comes from :func:`delta` (``gnn_io::attention_delta``,
  run before the backward op, so that the forward's output is not kept for the kernels). The **src pass** walks
  the transposed CSR (:class:`SourceCSR`: rows are sources, each with its edges' destinations and edge ids, and its own
  degree-split work items), recomputes each edge's score from the destination's terms, ``lse_i``, ``D_i``
  and ``dout_i``, and writes the src-role gradients the same way, once per item. :func:`source_csr` builds
  the transposed CSR once per graph (a stable sort of ``E``) and caches it with the graph's plan entry in
  kernels/attention_paths.py. Row gradients stored by their own pass start uninitialised: only the rows
  without edges and the hub rows (several items add) are zeroed first (:func:`_stored_rows`).
- ``one_pass`` (opt-in; the split backward where the family is not GAT): for the GAT family a dst-role
  gradient is a per-head scalar score term, so the src pass, which already computes every edge's ``ds_e``,
  also adds it to its destination's ``[H]`` gradient row by a float32 atomic (``E * H`` scalar atomics), and
  the dst pass, a second gather of every edge's ``[H, C]`` value row, is skipped (:func:`one_pass_outputs`).
  Measured slower on the H100: its atomics onto a hub's row cost more than the dst pass they replace.
- ``one_pass_segment`` (GAT's default): as ``one_pass``, but the src pass stores each edge's dst-role score-term
  gradient (``[H]`` per edge) at the edge's position in the transposed CSR, contiguously
  (:func:`source_positions` maps the CSR's positions to those; where the transposed CSR leaves edges out, at
  edge ids instead), and :func:`_sum_by_destination` sums them over each destination's CSR row, with ``D`` from
  :func:`_delta_kernel` (the bias subtracted there). No atomics onto hub rows, no second gather of the value rows.
  On the H100, GATConv on RMAT 2^20 (15.4M edges): 11.23 ms against the split backward's 12.20 per
  step (20 interleaved rounds, all won), 1.17x on the uniform graph of 16M edges; the backward's kernels 4.59
  against 5.46 ms (src pass 3.42, sum 0.81 before its launch was fitted, ``D`` 0.36).
- ``atomic``: one pass over the CSR's work items; dst-role gradients are reduced in registers per
  block, src- and edge-role gradients are float32 ``atomic_add`` of a ``BLOCK_E x BLOCK_C`` tile per
  edge block into per-argument buffers, the dense ``att`` gradient goes to 32 slots to keep atomics off
  one address. It also runs where the split one cannot: for the hybrid block/CSR path
  (``attention_paths.run_backward`` passes only the rows left to the CSR kernel, and a src pass over all
  of a source's edges would count those into block rows twice), when :func:`backward` gets no
  :class:`SourceCSR`, and when one pass would write the gradients of more than four distinct arguments.

Degree split: the forward runs one program per work item for every head (default; one per (work item,
head) with ``GNN_IO_ATTENTION_HEADS=per_head``: :func:`heads_variant`, docs/attention.md; that setting
also picks the atomic backward's program shape), the split backward one per work item for every head;
items from :func:`gnn_inductor.plan.work_items.work_items` (at most ``max_edges`` edges each; the plan
builds them once per graph). A light row's single item writes ``out`` and ``lse``; the items of a hub write
their partial ``(m, l, acc)`` to a compact slot buffer (at most ``2 * ceil(E / max_edges)`` slots, a
size-only bound) and :func:`_combine_kernel` merges each hub's slots.

dtypes: float32, float16, bfloat16 inputs, every product and sum in float32; ``out`` in the half
dtype when any input is half precision (as the reference), ``lse`` float32, gradients in each input's
dtype. Runs on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` was set before import.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from gnn_inductor import config as settings  # `config` names a kernel launch's configuration here
from gnn_inductor.plan import state as graph_state
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch, next_power_of_2
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.runtime.cuda_graphs import capturing, kept_outside_graph_pool
from gnn_inductor.kernels.runtime.rng import Dropout, as_float32, keep_bits_by_triton, packed_dropped_triton
from gnn_inductor.plan.work_items import (
    WorkItems, hub_item_count, hub_items, items_memo, listed_fill_rows, rows_to_fill, work_items, work_items_op,
)
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from gnn_inductor.kernels.runtime import edge_functions

INTERPRETED = settings.interpreted()
MAX_EDGES = 256          # the degree split: a program walks at most this many edges of one row
DENSE_GRAD_SLOTS = 32    # the att gradient is summed into this many slots, then reduced
FAMILIES = {"gat": 0, "gatv2": 1, "dot": 2}
_NONE = -1               # role of an unused argument slot
# role of a per-edge output the src pass stores at the edge's position in the transposed CSR (contiguous stores),
# not at its edge id: the segment backward's dst-role score terms, summed per destination afterwards
_BY_SOURCE_POSITION = 4
_MAX_SCORE_TERMS, _MAX_VALUE_TERMS = 3, 2
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

LAUNCH_ENV = settings.SETTINGS["attention_launch"].env  # "legacy": the former launch rule (comparisons, debugging)
HEADS_ENV = settings.SETTINGS["attention_heads"].env  # "all": one forward program per work item for every head
HEADS_VARIANTS = settings.SETTINGS["attention_heads"].choices
BACKWARD_ENV = settings.SETTINGS["attention_backward"].env  # split, atomic, one_pass, one_pass_segment; unset: auto
# one_pass: split, GAT's dst pass folded into the src pass; one_pass_segment: the same, the dst score terms' gradients
# stored per edge and summed over each destination's CSR row (no atomics on hub rows)
# mass: GAT's dst score terms' gradients from the forward's mass (kernels/attention.py's attention_forward_mass: a
# row sum in the D kernel, no per-edge term), where that op runs, else one_pass_segment
# auto (unset): mass, else one_pass_segment, for the GAT family; split for the others
BACKWARD_VARIANTS = settings.SETTINGS["attention_backward"].choices
# the variants that run the split passes over a source CSR (the op's backward builds one for them)
SOURCE_CSR_VARIANTS = ("auto", "split", "one_pass", "one_pass_segment", "mass")
# the variants under which GAT's forward makes the score-term mass where it can (kernels/attention.py)
MASS_VARIANTS = ("auto", "mass")
_MAX_GRAD_OUTPUTS = 4    # arguments one pass of the split backward writes gradients of

# Launch parameters to measure on the H100 (the defaults come from :func:`launch_config`).
AUTOTUNE_CONFIGS = [
    {"max_edges": 256, "block_e": 16, "num_warps": 2},
    {"max_edges": 256, "block_e": 32, "num_warps": 4},
    {"max_edges": 128, "block_e": 8, "num_warps": 1},
    {"max_edges": 512, "block_e": 32, "num_warps": 4},
    {"max_edges": 1024, "block_e": 64, "num_warps": 8},
]
# The all-heads forward at 4 heads x 32 channels (one [BLOCK_E, 128] tile per step).
ALL_HEADS_AUTOTUNE_CONFIGS = [
    {"max_edges": 256, "block_e": 8, "num_warps": 2},
    {"max_edges": 256, "block_e": 16, "num_warps": 4},
    {"max_edges": 256, "block_e": 32, "num_warps": 4},
    {"max_edges": 512, "block_e": 32, "num_warps": 8},
]


# ---------------------------------------------------------------------------------------------
# Recognising the family from the edge functions
# ---------------------------------------------------------------------------------------------

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


class _NotRecognised(Exception):
    pass


_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scaled(node, scale: float = 1.0):
    """Strip ``* c`` and ``/ c`` by constants off ``node``: (inner node, accumulated scale)."""
    while node.op == "call_function" and node.target in (_aten.mul.Tensor, _aten.div.Tensor):
        a, b = node.args
        if node.target == _aten.mul.Tensor and _number(a):
            a, b = b, a
        if not _number(b):
            break
        scale = scale * b if node.target == _aten.mul.Tensor else scale / b
        node = a
    return node, scale


def _arg(node, placeholders) -> int:
    if node not in placeholders:
        raise _NotRecognised(f"{node} is not an argument")
    return placeholders[node]


def _sum_of_args(node, placeholders) -> tuple:
    """``a + b + ...`` of arguments: their indices."""
    if node.op == "call_function" and node.target == _aten.add.Tensor and not node.kwargs:
        return _sum_of_args(node.args[0], placeholders) + _sum_of_args(node.args[1], placeholders)
    return (_arg(node, placeholders),)


def _leaky_relu(node):
    if node.op == "call_function" and node.target == _aten.leaky_relu.default and not node.kwargs:
        return node.args[0], float(node.args[1]) if len(node.args) > 1 else 0.01
    return None


def _last_dim_sum(node):
    if node.op == "call_function" and node.target == _aten.sum.dim_IntList and not node.kwargs and \
            list(node.args[1]) == [-1] and (len(node.args) < 3 or not node.args[2]):
        return node.args[0]
    return None


def _score_form(fn) -> dict:
    placeholders = {n: i for i, n in enumerate(n for n in fn.graph.nodes if n.op == "placeholder")}
    (root,) = [n.args[0] for n in fn.graph.nodes if n.op == "output"]
    root, scale = _scaled(root)
    leaky = _leaky_relu(root)
    if leaky is not None:
        return {"family": "gat", "score_terms": _sum_of_args(leaky[0], placeholders), "query": None,
                    "negative_slope": leaky[1], "score_scale": scale}
    product = _last_dim_sum(root)
    if product is None or product.target != _aten.mul.Tensor or product.kwargs:
        raise _NotRecognised("score is neither leaky_relu(sum of terms) nor a sum over channels of a product")
    for left, right in (product.args, reversed(product.args)):
        leaky = _leaky_relu(left) if isinstance(left, torch.fx.Node) else None
        if leaky is not None and right in placeholders:
            return {"family": "gatv2", "score_terms": _sum_of_args(leaky[0], placeholders), "query": placeholders[right],
                        "negative_slope": leaky[1], "score_scale": scale}
    for left, right in (product.args, reversed(product.args)):
        if left in placeholders and isinstance(right, torch.fx.Node):
            try:
                return {"family": "dot", "score_terms": _sum_of_args(right, placeholders), "query": placeholders[left],
                            "negative_slope": 0.0, "score_scale": scale}
            except _NotRecognised:
                continue
    raise _NotRecognised("score product is not att * leaky_relu(terms) nor query * (sum of keys)")


def _alpha_chain(node, alpha) -> float:
    """Walk from the alpha side of the message back to ``alpha`` through reshapes that add a trailing
    unit channel dim and products with constants; returns the constant factor. (Attention dropout is not
    part of the message: the op applies it to alpha, kernels/rng.py.)"""
    scale = 1.0
    while node is not alpha:
        if node.op != "call_function":
            raise _NotRecognised(f"{node} on the alpha side is not an op")
        if node.target == _aten.unsqueeze.default and node.args[1] in (-1, 2) or node.target in _VIEWS and list(node.args[1])[-1] == 1 and len(node.args[1]) == 3:
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


def _message_form(fn) -> dict:
    nodes = list(fn.graph.nodes)
    alpha = nodes[0]
    placeholders = {n: i for i, n in enumerate(n for n in nodes[1:] if n.op == "placeholder")}
    (root,) = [n.args[0] for n in nodes if n.op == "output"]
    if root.op != "call_function" or root.target != _aten.mul.Tensor or root.kwargs:
        raise _NotRecognised("message is not (alpha-weighted) * values")
    for alpha_side, value_side in (root.args, reversed(root.args)):
        if not isinstance(alpha_side, torch.fx.Node) or not isinstance(value_side, torch.fx.Node):
            continue
        try:
            scale = _alpha_chain(alpha_side, alpha)
            return {"value_terms": _sum_of_args(value_side, placeholders), "message_scale": scale}
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
            if len(form.score_terms) > _MAX_SCORE_TERMS or len(form.value_terms) > _MAX_VALUE_TERMS:
                raise _NotRecognised("more terms than the kernel has slots for")
            per_edge = (ROLE_SRC, ROLE_DST, ROLE_EDGE)
            if any(roles[i] not in per_edge for i in form.score_terms + form.value_terms):
                raise _NotRecognised("a score term or value is dense")
            if form.family == "gatv2" and roles[form.query] != ROLE_DENSE:
                raise _NotRecognised("gatv2 attention vector is not dense")
            if form.family == "dot" and roles[form.query] not in per_edge:
                raise _NotRecognised("dot-product query is dense")
            _FORMS[key] = form
        except _NotRecognised as exc:
            _FORMS[key] = str(exc)
    return _FORMS[key]


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------

@triton.jit
def _rows(ROLE: tl.constexpr, src, dst, eid):
    if ROLE == 0:
        rows = src
    elif ROLE == 1:
        rows = dst
    else:
        rows = eid
    return rows.to(tl.int64)


@triton.jit
def _scalar(ptr, ROLE: tl.constexpr, src, dst, eid, h, stride_r, stride_h, mask):
    rows = _rows(ROLE, src, dst, eid)
    return tl.load(ptr + rows * stride_r + h * stride_h, mask=mask, other=0).to(tl.float32)


@triton.jit
def _vector(ptr, ROLE: tl.constexpr, src, dst, eid, h, stride_r, stride_h, stride_c, chans, mask):
    rows = _rows(ROLE, src, dst, eid)
    offsets = rows[:, None] * stride_r + h * stride_h + chans[None, :] * stride_c
    return tl.load(ptr + offsets, mask=mask, other=0).to(tl.float32)


@triton.jit
def _terms_scalar(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0: tl.constexpr, S1: tl.constexpr,
                  S2: tl.constexpr, src, dst, eid, h, mask):
    total = _scalar(s0, S0, src, dst, eid, h, s0r, s0h, mask)
    if S1 >= 0:
        total += _scalar(s1, S1, src, dst, eid, h, s1r, s1h, mask)
    if S2 >= 0:
        total += _scalar(s2, S2, src, dst, eid, h, s2r, s2h, mask)
    return total


@triton.jit
def _terms_vector(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0: tl.constexpr, S1: tl.constexpr,
                  S2: tl.constexpr, src, dst, eid, h, chans, mask):
    total = _vector(s0, S0, src, dst, eid, h, s0r, s0h, s0c, chans, mask)
    if S1 >= 0:
        total += _vector(s1, S1, src, dst, eid, h, s1r, s1h, s1c, chans, mask)
    if S2 >= 0:
        total += _vector(s2, S2, src, dst, eid, h, s2r, s2h, s2c, chans, mask)
    return total


@triton.jit
def _edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID: tl.constexpr, BLOCK_E: tl.constexpr):
    edges = block_start + tl.arange(0, BLOCK_E)
    emask = edges < end
    src = tl.load(col_ptr + edges, mask=emask, other=0)
    if NEED_EID:
        eid = tl.load(perm_ptr + edges, mask=emask, other=0)
    else:
        eid = edges
    dst = tl.zeros_like(src) + row
    return emask, src, dst, eid


@triton.jit
def _score(KIND: tl.constexpr, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c,
           S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, q, qr, qh, qc, Q: tl.constexpr, att,
           src, dst, eid, h, chans, emask, tile_mask, slope, scale):
    """(score [BLOCK_E], pre-activation terms, query tile): what backward needs to differentiate."""
    if KIND == 0:
        terms = _terms_scalar(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0, S1, S2, src, dst, eid, h, emask)
        score = tl.where(terms > 0, terms, terms * slope) * scale
        query = terms  # unused
    else:
        terms = _terms_vector(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                              src, dst, eid, h, chans, tile_mask)
        if KIND == 1:
            query = terms  # unused
            score = tl.sum(tl.where(terms > 0, terms, terms * slope) * att[None, :], axis=1) * scale
        else:
            query = _vector(q, Q, src, dst, eid, h, qr, qh, qc, chans, tile_mask)
            score = tl.sum(query * terms, axis=1) * scale
    return score, terms, query


@fast_launch
@triton.jit
def _forward_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, slot_of_item_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale,
        out_ptr, lse_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
        num_heads, head_dim, slope, score_scale, message_scale, eps,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    item = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    shared = tl.load(item_shared_ptr + item)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    if KIND == 1:
        att = tl.load(q + h * qh + chans * qc, mask=cmask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_C], dtype=tl.float32)

    m = tl.max(tl.full([BLOCK_E], float("-inf"), tl.float32), axis=0)
    l_vec = tl.zeros([BLOCK_E], dtype=tl.float32)
    acc = tl.zeros([BLOCK_E, BLOCK_C], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = _edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        tile_mask = emask[:, None] & cmask[None, :]
        score, _terms, _query = _score(KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                                       q, qr, qh, qc, Q, att, src, dst, eid, h, chans, emask, tile_mask,
                                       slope, score_scale)
        score = tl.where(emask, score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=0))
        correction = tl.exp(m - m_new)
        p = tl.exp(score - m_new)
        l_vec = l_vec * correction + p
        weight = p * message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, h, num_heads, dropout_scale)
        value = _vector(v0, V0, src, dst, eid, h, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += _vector(v1, V1, src, dst, eid, h, v1r, v1h, v1c, chans, tile_mask)
        acc = acc * correction + weight[:, None] * value
        m = m_new

    total = tl.sum(l_vec, axis=0)
    acc_row = tl.sum(acc, axis=0)
    if shared == 0:
        out_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
        tl.store(out_ptr + out_offsets, acc_row / (total + eps), mask=cmask)
        tl.store(lse_ptr + row.to(tl.int64) * num_heads + h, m + tl.log(total))
    elif shared == 1:
        slot = tl.load(slot_of_item_ptr + item).to(tl.int64)
        tl.store(part_m_ptr + slot * num_heads + h, m)
        tl.store(part_l_ptr + slot * num_heads + h, total)
        tl.store(part_acc_ptr + (slot * num_heads + h) * head_dim + chans, acc_row, mask=cmask)


@fast_launch
@triton.jit
def _combine_kernel(slot_row_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, lse_ptr, bias_ptr, num_slots,
                    num_heads, head_dim, eps, mass_ptr, part_mass_acc_ptr, part_mass_l_ptr, BIAS: tl.constexpr,
                    MASS: tl.constexpr, BLOCK_C: tl.constexpr):
    """Merge the partial (max, sum, acc) of a hub's items; the program of a hub's first slot does it. ``BIAS``: the
    ``[H, C]`` bias at ``bias_ptr`` is added to the stored row. ``MASS``: the partial sums of the score-term mass
    are merged alike and the row's mass stored (:func:`forward`)."""
    slot = tl.program_id(0)
    h = tl.program_id(1)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    row = tl.load(slot_row_ptr + slot)
    previous = tl.load(slot_row_ptr + tl.maximum(slot - 1, 0))
    if (row >= 0) & ((slot == 0) | (previous != row)):
        m = tl.load(part_m_ptr + slot * num_heads + h)
        total = tl.load(part_l_ptr + slot * num_heads + h)
        acc = tl.load(part_acc_ptr + (slot.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
        if MASS:
            mass_l = tl.load(part_mass_l_ptr + slot * num_heads + h)
            mass_acc = tl.load(part_mass_acc_ptr + (slot.to(tl.int64) * num_heads + h) * head_dim + chans,
                               mask=cmask, other=0)
        k = slot + 1
        same = tl.load(slot_row_ptr + k, mask=k < num_slots, other=-1) == row
        while same:
            m_k = tl.load(part_m_ptr + k * num_heads + h)
            l_k = tl.load(part_l_ptr + k * num_heads + h)
            acc_k = tl.load(part_acc_ptr + (k.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
            m_new = tl.maximum(m, m_k)
            scale_old, scale_k = tl.exp(m - m_new), tl.exp(m_k - m_new)
            total = total * scale_old + l_k * scale_k
            acc = acc * scale_old + acc_k * scale_k
            if MASS:
                mass_l = mass_l * scale_old + tl.load(part_mass_l_ptr + k * num_heads + h) * scale_k
                mass_acc = mass_acc * scale_old + scale_k * tl.load(
                    part_mass_acc_ptr + (k.to(tl.int64) * num_heads + h) * head_dim + chans, mask=cmask, other=0)
            m = m_new
            k += 1
            same = tl.load(slot_row_ptr + k, mask=k < num_slots, other=-1) == row
        out_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
        result = acc / (total + eps)
        if MASS:
            tl.store(mass_ptr + out_offsets, (mass_acc - mass_l * result) / total, mask=cmask)
        if BIAS:
            result += tl.load(bias_ptr + h * head_dim + chans, mask=cmask, other=0).to(tl.float32)
        tl.store(out_ptr + out_offsets, result, mask=cmask)
        tl.store(lse_ptr + row.to(tl.int64) * num_heads + h, m + tl.log(total))


@triton.jit
def _add_scalar_grad(ptr, ROLE: tl.constexpr, src, dst, eid, h, num_heads, grad, mask):
    if ROLE == 1:  # one destination for the whole block: reduce first, one atomic
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + row * num_heads + h, tl.sum(grad, axis=0))
    else:
        rows = _rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + rows * num_heads + h, grad, mask=mask)


@triton.jit
def _add_vector_grad(ptr, ROLE: tl.constexpr, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad, mask):
    if ROLE == 1:
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + (row * num_heads + h) * head_dim + chans, tl.sum(grad, axis=0), mask=cmask)
    else:
        rows = _rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + (rows[:, None] * num_heads + h) * head_dim + chans[None, :], grad, mask=mask)


@triton.jit
def _weight_and_value(keep_bits_ptr, dropout_scale, DROPOUT: tl.constexpr, v0, v0r, v0h, v0c,
                      V0: tl.constexpr, v1, v1r, v1h, v1c, V1: tl.constexpr, src, dst, eid, h, num_heads, chans,
                      tile_mask, message_scale, BLOCK_E: tl.constexpr):
    """Backward's per-edge factor of alpha (``message_scale`` times the dropout factor) and value tile."""
    weight = tl.zeros([BLOCK_E], dtype=tl.float32) + message_scale
    if DROPOUT:
        weight = packed_dropped_triton(weight, keep_bits_ptr, eid, h, num_heads, dropout_scale)
    value = _vector(v0, V0, src, dst, eid, h, v0r, v0h, v0c, chans, tile_mask)
    if V1 >= 0:
        value += _vector(v1, V1, src, dst, eid, h, v1r, v1h, v1c, chans, tile_mask)
    return weight, value


@fast_launch
@triton.jit
def _backward_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale,
        delta_ptr, lse_ptr, grad_out_ptr,
        gs0, gs1, gs2, gq, gv0, gv1,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        GS0: tl.constexpr, GS1: tl.constexpr, GS2: tl.constexpr, GQ: tl.constexpr, GV0: tl.constexpr,
        GV1: tl.constexpr, DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    item = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    node_offsets = (row.to(tl.int64) * num_heads + h) * head_dim + chans
    grad_row = tl.load(grad_out_ptr + node_offsets, mask=cmask, other=0).to(tl.float32)
    delta = tl.load(delta_ptr + row.to(tl.int64) * num_heads + h)
    lse = tl.load(lse_ptr + row.to(tl.int64) * num_heads + h)
    if KIND == 1:
        att = tl.load(q + h * qh + chans * qc, mask=cmask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = _edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        tile_mask = emask[:, None] & cmask[None, :]
        score, terms, query = _score(KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                                     q, qr, qh, qc, Q, att, src, dst, eid, h, chans, emask, tile_mask,
                                     slope, score_scale)
        alpha = tl.where(emask, tl.exp(score - lse), 0.0)
        weight, value = _weight_and_value(keep_bits_ptr, dropout_scale, DROPOUT, v0, v0r, v0h, v0c, V0,
                                          v1, v1r, v1h, v1c, V1, src, dst, eid, h, num_heads, chans, tile_mask,
                                          message_scale, BLOCK_E)

        grad_value = (alpha * weight)[:, None] * grad_row[None, :]
        if GV0:
            _add_vector_grad(gv0, V0, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_value, tile_mask)
        if GV1:
            _add_vector_grad(gv1, V1, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_value, tile_mask)

        grad_alpha = weight * tl.sum(value * grad_row[None, :], axis=1)
        grad_score = alpha * (grad_alpha - delta) * score_scale
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
            if GS0:
                _add_scalar_grad(gs0, S0, src, dst, eid, h, num_heads, grad_terms, emask)
            if GS1:
                _add_scalar_grad(gs1, S1, src, dst, eid, h, num_heads, grad_terms, emask)
            if GS2:
                _add_scalar_grad(gs2, S2, src, dst, eid, h, num_heads, grad_terms, emask)
        else:
            if KIND == 1:
                grad_terms = grad_score[:, None] * att[None, :] * tl.where(terms > 0, 1.0, slope)
                grad_att += tl.sum(grad_score[:, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
            else:
                grad_terms = grad_score[:, None] * query
                if GQ:
                    _add_vector_grad(gq, Q, src, dst, eid, h, num_heads, head_dim, chans, cmask,
                                     grad_score[:, None] * terms, tile_mask)
            if GS0:
                _add_vector_grad(gs0, S0, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
            if GS1:
                _add_vector_grad(gs1, S1, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
            if GS2:
                _add_vector_grad(gs2, S2, src, dst, eid, h, num_heads, head_dim, chans, cmask, grad_terms, tile_mask)
    if GQ and KIND == 1:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gq + (dense_slot * num_heads + h) * head_dim + chans, grad_att, mask=cmask)


# ---------------------------------------------------------------------------------------------
# The split backward (default, GNN_IO_ATTENTION_BACKWARD=split)
# ---------------------------------------------------------------------------------------------
# One kernel, two passes: MAJOR = ROLE_DST walks the CSR's work items (rows are destinations), MAJOR = ROLE_SRC
# the work items of the transposed CSR (:class:`SourceCSR`, rows are sources). One program takes a work item
# for every head, on [BLOCK_E, BLOCK_H(, BLOCK_C)] tiles (the shaped indices of the all-heads section below).
# Either pass recomputes each edge's score, alpha and ds exactly as :func:`_backward_kernel`, and writes the
# gradients of up to four arguments (G0..G3: a buffer, its role, and how often the argument is a score term (T),
# a value term (V) and the dot query (Q): an argument in two places, such as GATv2's x_l or TransformerConv's
# edge embedding, gets the sum once). Arguments of the pass's row role (dst, resp. src) are summed in registers
# over the whole item and written once for every head (an atomic only for an item of a hub row:
# ``shared == 1``); edge-role arguments (dst pass only) are plain stores, every edge id being its own address.

@triton.jit
def _combine_grads(T: tl.constexpr, V: tl.constexpr, Q: tl.constexpr, grad_terms, grad_value, grad_query):
    """``T * grad_terms + V * grad_value + Q * grad_query`` without the zero terms."""
    if T > 0:
        total = grad_terms * T
        if V > 0:
            total += grad_value * V
        if Q > 0:
            total += grad_query * Q
    elif V > 0:
        total = grad_value * V
        if Q > 0:
            total += grad_query * Q
    else:
        total = grad_query * Q
    return total


@triton.jit
def _store_edge_grad_heads(ptr, R: tl.constexpr, T: tl.constexpr, V: tl.constexpr, Q: tl.constexpr,
                           KIND: tl.constexpr, eid, pos, heads, num_heads, head_dim, chans, score_mask, tile_mask,
                           grad_terms, grad_value, grad_query):
    """An edge-role gradient of one block of edges, every head: plain stores (each edge id is written by one
    program); ``eid`` is ``[BLOCK_E, 1]``, the gradients ``[BLOCK_E, BLOCK_H(, BLOCK_C)]``. Role
    ``_BY_SOURCE_POSITION`` (4): stored at ``pos``, the edges' positions in the CSR this pass walks."""
    if R == 2 or R == 4:
        if R == 2:
            rows = eid.to(tl.int64) * num_heads + heads[None, :]
        else:
            rows = pos.to(tl.int64) * num_heads + heads[None, :]
        total = _combine_grads(T, V, Q, grad_terms, grad_value, grad_query)
        if KIND == 0 and T > 0:
            tl.store(ptr + rows, total, mask=score_mask)
        else:
            tl.store(ptr + rows[:, :, None] * head_dim + chans[None, None, :], total, mask=tile_mask)


@triton.jit
def _write_row_grad_heads(ptr, row_stride, row0, R: tl.constexpr, T: tl.constexpr, V: tl.constexpr,
                          Q: tl.constexpr, KIND: tl.constexpr, MAJOR: tl.constexpr, row, shared, heads, hmask,
                          num_heads, head_dim, chans, node_mask, sum_terms, sum_value, sum_query):
    """A row-role gradient, summed over the whole item (``[BLOCK_H(, BLOCK_C)]``): stored by a row's only item,
    added by a hub's items, one atomic for every head; padding items (``shared == 2``) write nothing. Rows are
    ``row_stride`` elements apart (the heads' values of a row contiguous): a buffer of its own, or a column slice
    of a packed gradient (:func:`backward`'s ``pack``). Row ``row`` is stored at ``row - row0``: a buffer of the
    rows from ``row0`` on (:func:`backward_chunked`), 0 for a buffer of every row."""
    if R == MAJOR:
        total = _combine_grads(T, V, Q, sum_terms, sum_value, sum_query)
        row_base = (row - row0).to(tl.int64) * row_stride
        if KIND == 0 and T > 0:
            if shared == 0:
                tl.store(ptr + row_base + heads, total, mask=hmask)
            elif shared == 1:
                tl.atomic_add(ptr + row_base + heads, total, mask=hmask)
        else:
            offsets = row_base + heads[:, None] * head_dim + chans[None, :]
            if shared == 0:
                tl.store(ptr + offsets, total, mask=node_mask)
            elif shared == 1:
                tl.atomic_add(ptr + offsets, total, mask=node_mask)


@triton.jit
def _scatter_dst_grad_heads(ptr, R: tl.constexpr, T: tl.constexpr, MAJOR: tl.constexpr, dst, heads, num_heads,
                            score_mask, grad_terms):
    """A dst-role gradient written from the src pass (the one-pass GAT backward): GAT's per-head scalar score
    term, one float32 atomic per edge and head into its destination's ``[H]`` row (``dst`` is ``[BLOCK_E, 1]``,
    ``grad_terms`` ``[BLOCK_E, BLOCK_H]``). Only such outputs are given to the src pass (:func:`backward`)."""
    if MAJOR == 0:
        if R == 1:
            tl.atomic_add(ptr + dst.to(tl.int64) * num_heads + heads[None, :], grad_terms * T, mask=score_mask)


@fast_launch
@triton.jit
def _split_backward_all_heads_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, other_ptr, eid_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale,
        lse_ptr, delta_ptr, grad_out_ptr, g0, g1, g2, g3, gatt, g0s, g1s, g2s, g3s, row0,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr, MAJOR: tl.constexpr,
        G0R: tl.constexpr, G0T: tl.constexpr, G0V: tl.constexpr, G0Q: tl.constexpr,
        G1R: tl.constexpr, G1T: tl.constexpr, G1V: tl.constexpr, G1Q: tl.constexpr,
        G2R: tl.constexpr, G2T: tl.constexpr, G2V: tl.constexpr, G2Q: tl.constexpr,
        G3R: tl.constexpr, G3T: tl.constexpr, G3V: tl.constexpr, G3Q: tl.constexpr,
        ROW_T: tl.constexpr, ROW_V: tl.constexpr, ROW_Q: tl.constexpr, EDGE_Q: tl.constexpr, GATT: tl.constexpr,
        DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """One work item of one pass of the split backward (see above), every head at once: the item's CSR indices,
    and in the dst pass its row's ``dout``, ``D`` and ``lse``, are read once for all heads, and a row gradient is
    one store (or one hub atomic) for all heads. That beat one program per (item, head) on the H100 by 1.2-1.5x
    (:data:`SPLIT_BACKWARD_LAUNCH`). ``other_ptr`` holds the edges' other endpoint (sources in the dst pass,
    destinations in the src pass) and ``eid_ptr`` their edge ids; ``ROW_*`` say which gradient kinds a row-role
    output needs summed, ``EDGE_Q`` whether the dot query's is needed at all, ``GATT`` whether GATv2's ``att``
    gradient is (dst pass only). Padded heads load zeros, get ``alpha = 0`` and are masked out at every store.
    ``delta_ptr`` holds ``D = <dout, out>`` per (row, head), computed before the backward (``attention_delta``)."""
    item = tl.program_id(0)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    shared = tl.load(item_shared_ptr + item)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    head_row = heads[None, :]
    head_tile = heads[None, :, None]
    node_mask = hmask[:, None] & cmask[None, :]
    if MAJOR == 1:  # one destination per item: its dout, D and lse once, for every head
        node_heads = row.to(tl.int64) * num_heads + heads
        grad_node = tl.load(grad_out_ptr + node_heads[:, None] * head_dim + chans[None, :], mask=node_mask,
                            other=0).to(tl.float32)
        grad_row = grad_node[None, :, :]
        delta_row = tl.load(delta_ptr + node_heads, mask=hmask, other=0)[None, :]
        lse_row = tl.load(lse_ptr + node_heads, mask=hmask, other=0)[None, :]
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    if KIND == 0:
        acc_terms = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    else:
        acc_terms = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    acc_value = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    acc_query = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        if MAJOR == 1:
            emask, src, dst, eid = _edge_tile(block_start, end, other_ptr, eid_ptr, row, NEED_EID, BLOCK_E)
        else:
            emask, dst, src, eid = _edge_tile(block_start, end, other_ptr, eid_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        pos = (block_start + tl.arange(0, BLOCK_E))[:, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        if MAJOR == 1:
            grad_rows = grad_row
            delta = delta_row
            lse = lse_row
        else:  # every edge its own destination
            dst_heads = dst.to(tl.int64) * num_heads + head_row
            grad_rows = tl.load(grad_out_ptr + dst_heads[:, :, None] * head_dim + chans[None, None, :],
                                mask=tile_mask, other=0).to(tl.float32)
            delta = tl.load(delta_ptr + dst_heads, mask=score_mask, other=0)
            lse = tl.load(lse_ptr + dst_heads, mask=score_mask, other=0)
        score, terms, query = _head_scores(KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                                           q, qr, qh, qc, Q, att, src, dst, eid, head_row, head_tile, chans,
                                           score_mask, tile_mask, slope, score_scale)
        alpha = tl.where(score_mask, tl.exp(score - lse), 0.0)
        weight = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32) + message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = _vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += _vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)

        grad_value = (alpha * weight)[:, :, None] * grad_rows
        grad_score = alpha * (weight * tl.sum(value * grad_rows, axis=2) - delta) * score_scale
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
        elif KIND == 1:
            grad_terms = grad_score[:, :, None] * att[None, :, :] * tl.where(terms > 0, 1.0, slope)
            if GATT:
                grad_att += tl.sum(grad_score[:, :, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
        else:
            grad_terms = grad_score[:, :, None] * query
        if EDGE_Q:
            grad_query = grad_score[:, :, None] * terms
        else:
            grad_query = grad_value  # no output reads it

        if ROW_T:
            acc_terms += grad_terms
        if ROW_V:
            acc_value += grad_value
        if ROW_Q:
            acc_query += grad_query
        _store_edge_grad_heads(g0, G0R, G0T, G0V, G0Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g1, G1R, G1T, G1V, G1Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g2, G2R, G2T, G2V, G2Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        _store_edge_grad_heads(g3, G3R, G3T, G3V, G3Q, KIND, eid, pos, heads, num_heads, head_dim, chans, score_mask,
                               tile_mask, grad_terms, grad_value, grad_query)
        if KIND == 0:  # GAT: dst-role score terms summed by atomics in the src pass (one-pass backward)
            _scatter_dst_grad_heads(g0, G0R, G0T, MAJOR, dst, heads, num_heads, score_mask, grad_terms)
            _scatter_dst_grad_heads(g1, G1R, G1T, MAJOR, dst, heads, num_heads, score_mask, grad_terms)
            _scatter_dst_grad_heads(g2, G2R, G2T, MAJOR, dst, heads, num_heads, score_mask, grad_terms)
            _scatter_dst_grad_heads(g3, G3R, G3T, MAJOR, dst, heads, num_heads, score_mask, grad_terms)

    sum_terms = tl.sum(acc_terms, axis=0)
    sum_value = tl.sum(acc_value, axis=0)
    sum_query = tl.sum(acc_query, axis=0)
    _write_row_grad_heads(g0, g0s, row0, G0R, G0T, G0V, G0Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g1, g1s, row0, G1R, G1T, G1V, G1Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g2, g2s, row0, G2R, G2T, G2V, G2Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    _write_row_grad_heads(g3, g3s, row0, G3R, G3T, G3V, G3Q, KIND, MAJOR, row, shared, heads, hmask, num_heads,
                          head_dim, chans, node_mask, sum_terms, sum_value, sum_query)
    if GATT:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gatt + (dense_slot * num_heads + heads[:, None]) * head_dim + chans[None, :], grad_att,
                      mask=node_mask)


@fast_launch
@triton.jit
def _delta_kernel(grad_out_ptr, out_ptr, bias_ptr, delta_ptr, mass_ptr, mass_grad_ptr, mass_scale, part_ptr, num_rows,
                  num_heads, head_dim, BIAS: tl.constexpr, MASS: tl.constexpr, BIAS_GRAD: tl.constexpr,
                  HEADS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """``delta[r] = sum_c grad_out[r, c] * out[r, c]`` over the (node, head) rows ``r`` of ``[N * H, C]``; with
    ``BIAS``, ``out`` is the biased output and the ``[H, C]`` bias at ``bias_ptr`` is subtracted first (no
    ``out - bias`` tensor: 0.45 ms per ``[2^20, 128]`` float32 step on the H100)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    chans = tl.arange(0, BLOCK_C)
    rmask = rows < num_rows
    mask = rmask[:, None] & (chans < head_dim)[None, :]
    offsets = rows.to(tl.int64)[:, None] * head_dim + chans[None, :]
    grad = tl.load(grad_out_ptr + offsets, mask=mask, other=0).to(tl.float32)
    out = tl.load(out_ptr + offsets, mask=mask, other=0).to(tl.float32)
    if BIAS:
        heads = rows % num_heads
        out -= tl.load(bias_ptr + heads[:, None] * head_dim + chans[None, :], mask=mask, other=0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(grad * out, axis=1), mask=rmask)
    if MASS:  # a dst-role GAT score term's gradient from the forward's mass (forward's ``mass``)
        mass = tl.load(mass_ptr + offsets, mask=mask, other=0)
        tl.store(mass_grad_ptr + rows, tl.sum(grad * mass, axis=1) * mass_scale, mask=rmask)
    if BIAS_GRAD:  # this block's column sums of dout per head (BLOCK_R is a multiple of HEADS: row r is head r % H)
        part = tl.sum(tl.reshape(grad, (BLOCK_R // HEADS, HEADS, BLOCK_C)), axis=0)
        heads = tl.arange(0, HEADS)
        tl.store(part_ptr + (tl.program_id(0) * HEADS + heads[:, None]).to(tl.int64) * head_dim + chans[None, :], part,
                 mask=(chans < head_dim)[None, :])


# ---------------------------------------------------------------------------------------------
# All heads in one program (the default forward, GNN_IO_ATTENTION_HEADS; the split backward above uses it too)
# ---------------------------------------------------------------------------------------------
# One program per work item walks the row's edges once for every head: the CSR indices are read once,
# each neighbour's H x C features come in as one [BLOCK_E, BLOCK_H, BLOCK_C] tile (contiguous for a
# contiguous [rows, H, C] input), per-head scores are sums over the channel axis, and the online softmax
# keeps one running max per head. The helpers above are reused with shaped indices: edge rows as
# [BLOCK_E, 1] and heads as [1, BLOCK_H] (per-head scalars) or [1, BLOCK_H, 1] (per-channel vectors)
# broadcast to [BLOCK_E, BLOCK_H] and [BLOCK_E, BLOCK_H, BLOCK_C] tiles.

@triton.jit
def _head_scores(KIND: tl.constexpr, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c,
                 S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, q, qr, qh, qc, Q: tl.constexpr, att,
                 src, dst, eid, head_row, head_tile, chans, score_mask, tile_mask, slope, scale):
    """(scores ``[BLOCK_E, BLOCK_H]`` of every head, pre-activation terms, query tile), as :func:`_score`;
    ``src``/``dst``/``eid`` are ``[BLOCK_E, 1]``."""
    if KIND == 0:
        terms = _terms_scalar(s0, s0r, s0h, s1, s1r, s1h, s2, s2r, s2h, S0, S1, S2, src, dst, eid, head_row,
                              score_mask)
        score = tl.where(terms > 0, terms, terms * slope) * scale
        query = terms  # unused
    else:
        terms = _terms_vector(s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                              src, dst, eid, head_tile, chans, tile_mask)
        if KIND == 1:
            query = terms  # unused
            score = tl.sum(tl.where(terms > 0, terms, terms * slope) * att[None, :, :], axis=2) * scale
        else:
            query = _vector(q, Q, src, dst, eid, head_tile, qr, qh, qc, chans, tile_mask)
            score = tl.sum(query * terms, axis=2) * scale
    return score, terms, query


@fast_launch
@triton.jit
def _forward_all_heads_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, item_shared_ptr, slot_of_item_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale,
        out_ptr, lse_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
        num_heads, head_dim, slope, score_scale, message_scale, eps, bias_ptr,
        mass_ptr, part_mass_acc_ptr, part_mass_l_ptr,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr, BIAS: tl.constexpr,
        MASS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """The all-heads forward of one work item (section comment above); ``BIAS``: the ``[H, C]`` bias at
    ``bias_ptr`` is added to a row this item stores (hub rows: by :func:`_combine_kernel`). ``MASS`` (GAT only):
    the row's score-term mass (:func:`forward`'s ``mass``) is stored at ``mass_ptr`` too, hub items keeping its
    two partial sums next to their (max, sum, acc)."""
    item = tl.program_id(0)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    shared = tl.load(item_shared_ptr + item)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    head_row = heads[None, :]
    head_tile = heads[None, :, None]
    node_mask = hmask[:, None] & cmask[None, :]
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)

    # padded heads (h >= num_heads) load zeros and get finite scores: no inf - inf, stores mask them out
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_tile = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    if MASS:
        mass_l = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
        mass_acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_C], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = _edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        score, terms, _query = _head_scores(KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, S0, S1, S2,
                                             q, qr, qh, qc, Q, att, src, dst, eid, head_row, head_tile, chans,
                                             score_mask, tile_mask, slope, score_scale)
        score = tl.where(emask[:, None], score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=0))
        correction = tl.exp(m - m_new)
        p = tl.exp(score - m_new[None, :])
        l_tile = l_tile * correction[None, :] + p
        weight = p * message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = _vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += _vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)
        acc = acc * correction[None, :, None] + weight[:, :, None] * value
        if MASS:  # the same sums, each edge's term scaled by LeakyReLU's slope where its pre-activation is negative
            factor = tl.where(terms > 0, 1.0, slope)
            mass_l = mass_l * correction[None, :] + p * factor
            mass_acc = mass_acc * correction[None, :, None] + (weight * factor)[:, :, None] * value
        m = m_new

    total = tl.sum(l_tile, axis=0)
    acc_rows = tl.sum(acc, axis=0)
    node_heads = row.to(tl.int64) * num_heads + heads
    if MASS:
        mass_l_rows = tl.sum(mass_l, axis=0)
        mass_acc_rows = tl.sum(mass_acc, axis=0)
    if shared == 0:
        result = acc_rows / (total[:, None] + eps)
        if MASS:
            mass = (mass_acc_rows - mass_l_rows[:, None] * result) / total[:, None]
            tl.store(mass_ptr + node_heads[:, None] * head_dim + chans[None, :], mass, mask=node_mask)
        if BIAS:
            result += tl.load(bias_ptr + heads[:, None] * head_dim + chans[None, :], mask=node_mask,
                              other=0).to(tl.float32)
        tl.store(out_ptr + node_heads[:, None] * head_dim + chans[None, :], result, mask=node_mask)
        tl.store(lse_ptr + node_heads, m + tl.log(total), mask=hmask)
    elif shared == 1:
        slot_heads = tl.load(slot_of_item_ptr + item).to(tl.int64) * num_heads + heads
        tl.store(part_m_ptr + slot_heads, m, mask=hmask)
        tl.store(part_l_ptr + slot_heads, total, mask=hmask)
        tl.store(part_acc_ptr + slot_heads[:, None] * head_dim + chans[None, :], acc_rows, mask=node_mask)
        if MASS:
            tl.store(part_mass_l_ptr + slot_heads, mass_l_rows, mask=hmask)
            tl.store(part_mass_acc_ptr + slot_heads[:, None] * head_dim + chans[None, :], mass_acc_rows,
                     mask=node_mask)


@triton.jit
def _add_head_grad(ptr, ROLE: tl.constexpr, src, dst, eid, inner, row_width, grad, mask, row_mask):
    """Add a ``[BLOCK_E, BLOCK_H(, BLOCK_C)]`` gradient tile into a ``[rows, row_width]`` buffer at
    ``row * row_width + inner``; the edge rows have the tile's rank (``[BLOCK_E, 1(, 1)]``)."""
    if ROLE == 1:  # one destination for the whole block: reduce first, one atomic per element
        row = tl.max(dst, axis=0).to(tl.int64)
        tl.atomic_add(ptr + row * row_width + inner, tl.sum(grad, axis=0, keep_dims=True), mask=row_mask)
    else:
        rows = _rows(ROLE, src, dst, eid)
        tl.atomic_add(ptr + rows * row_width + inner, grad, mask=mask)


@fast_launch
@triton.jit
def _backward_all_heads_kernel(
        item_row_ptr, item_start_ptr, item_end_ptr, col_ptr, perm_ptr,
        s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c, q, qr, qh, qc,
        v0, v0r, v0h, v0c, v1, v1r, v1h, v1c, keep_bits_ptr, dropout_scale,
        delta_ptr, lse_ptr, grad_out_ptr,
        gs0, gs1, gs2, gq, gv0, gv1,
        num_heads, head_dim, slope, score_scale, message_scale,
        KIND: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, Q: tl.constexpr,
        V0: tl.constexpr, V1: tl.constexpr, DROPOUT: tl.constexpr, NEED_EID: tl.constexpr,
        GS0: tl.constexpr, GS1: tl.constexpr, GS2: tl.constexpr, GQ: tl.constexpr, GV0: tl.constexpr,
        GV1: tl.constexpr, DENSE_SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_C: tl.constexpr):
    """:func:`_backward_kernel` for every head of a work item at once (same formulas, per-head ``[H]`` rows)."""
    item = tl.program_id(0)
    row = tl.load(item_row_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    chans = tl.arange(0, BLOCK_C)
    cmask = chans < head_dim
    head_row = heads[None, :]
    head_tile = heads[None, :, None]
    head_chan = head_tile * head_dim + chans[None, None, :]   # offset of (h, c) inside a [H, C] row
    node_mask = hmask[:, None] & cmask[None, :]
    row_width = num_heads * head_dim
    node_offsets = row.to(tl.int64) * row_width + heads[:, None] * head_dim + chans[None, :]
    grad_rows = tl.load(grad_out_ptr + node_offsets, mask=node_mask, other=0).to(tl.float32)
    delta = tl.load(delta_ptr + row.to(tl.int64) * num_heads + heads, mask=hmask, other=0)
    lse = tl.load(lse_ptr + row.to(tl.int64) * num_heads + heads, mask=hmask, other=0)
    if KIND == 1:
        att = tl.load(q + heads[:, None] * qh + chans[None, :] * qc, mask=node_mask, other=0).to(tl.float32)
    else:
        att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    grad_att = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)

    for block_start in range(start, end, BLOCK_E):
        emask, src, dst, eid = _edge_tile(block_start, end, col_ptr, perm_ptr, row, NEED_EID, BLOCK_E)
        src, dst, eid = src[:, None], dst[:, None], eid[:, None]
        src_t, dst_t, eid_t = src[:, :, None], dst[:, :, None], eid[:, :, None]
        score_mask = emask[:, None] & hmask[None, :]
        tile_mask = score_mask[:, :, None] & cmask[None, None, :]
        score, terms, query = _head_scores(KIND, s0, s0r, s0h, s0c, s1, s1r, s1h, s1c, s2, s2r, s2h, s2c,
                                           S0, S1, S2, q, qr, qh, qc, Q, att, src, dst, eid, head_row, head_tile,
                                           chans, score_mask, tile_mask, slope, score_scale)
        alpha = tl.where(score_mask, tl.exp(score - lse[None, :]), 0.0)
        weight = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32) + message_scale
        if DROPOUT:
            weight = packed_dropped_triton(weight, keep_bits_ptr, eid, head_row, num_heads, dropout_scale)
        value = _vector(v0, V0, src, dst, eid, head_tile, v0r, v0h, v0c, chans, tile_mask)
        if V1 >= 0:
            value += _vector(v1, V1, src, dst, eid, head_tile, v1r, v1h, v1c, chans, tile_mask)

        grad_value = (alpha * weight)[:, :, None] * grad_rows[None, :, :]
        if GV0:
            _add_head_grad(gv0, V0, src_t, dst, eid_t, head_chan, row_width, grad_value, tile_mask,
                           node_mask[None, :, :])
        if GV1:
            _add_head_grad(gv1, V1, src_t, dst, eid_t, head_chan, row_width, grad_value, tile_mask,
                           node_mask[None, :, :])

        grad_alpha = weight * tl.sum(value * grad_rows[None, :, :], axis=2)
        grad_score = alpha * (grad_alpha - delta[None, :]) * score_scale
        if KIND == 0:
            grad_terms = grad_score * tl.where(terms > 0, 1.0, slope)
            if GS0:
                _add_head_grad(gs0, S0, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
            if GS1:
                _add_head_grad(gs1, S1, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
            if GS2:
                _add_head_grad(gs2, S2, src, dst, eid, head_row, num_heads, grad_terms, score_mask, hmask[None, :])
        else:
            if KIND == 1:
                grad_terms = grad_score[:, :, None] * att[None, :, :] * tl.where(terms > 0, 1.0, slope)
                grad_att += tl.sum(grad_score[:, :, None] * tl.where(terms > 0, terms, terms * slope), axis=0)
            else:
                grad_terms = grad_score[:, :, None] * query
                if GQ:
                    _add_head_grad(gq, Q, src_t, dst, eid_t, head_chan, row_width, grad_score[:, :, None] * terms,
                                   tile_mask, node_mask[None, :, :])
            if GS0:
                _add_head_grad(gs0, S0, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
            if GS1:
                _add_head_grad(gs1, S1, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
            if GS2:
                _add_head_grad(gs2, S2, src_t, dst, eid_t, head_chan, row_width, grad_terms, tile_mask,
                               node_mask[None, :, :])
    if GQ and KIND == 1:
        dense_slot = (item % DENSE_SLOTS).to(tl.int64)
        tl.atomic_add(gq + dense_slot * row_width + heads[:, None] * head_dim + chans[None, :], grad_att,
                      mask=node_mask)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

# Per-head forward launch: (tile elements, warps) by family, measured on the H100 (fp32, 4 heads x 32
# channels, RMAT 2^20 / 15.4M edges and 2^17 / 1.1M edges): most rows of a power-law
# graph have a handful of edges, so small edge blocks on one warp keep the lanes busy and many programs in
# flight. The former rule (about 1024 elements, 32 x 32 on 4 warps) took 1.4-2.0x longer on both graphs.
PER_HEAD_LAUNCH = {"gat": (256, 1), "gatv2": (256, 1), "dot": (128, 1)}


def launch_config(family: str, head_dim: int, phase: str = "forward") -> dict:
    """Block sizes of the per-head kernels by family, phase and head dim: the whole head in one tile row
    (``BLOCK_C``, a power of two of at least 16) and ``BLOCK_E`` edges. ``phase``: ``"forward"``
    (``BLOCK_E * BLOCK_C`` near the measured tile of :data:`PER_HEAD_LAUNCH`, ``BLOCK_E`` between 2 and 32) or
    ``"atomic"`` (the atomic backward: the earlier rule, about 1024 elements, not re-measured)."""
    block_c = max(16, next_power_of_2(head_dim))
    if phase == "atomic" or settings.get("attention_launch") == "legacy":
        block_e = max(8, min(32, 1024 // block_c))
        return {"block_e": block_e, "block_c": block_c, "num_warps": 2 if block_e * block_c <= 512 else 4}
    tile, warps = PER_HEAD_LAUNCH[family]
    return {"block_e": max(2, min(32, tile // block_c)), "block_c": block_c, "num_warps": warps}


# All-heads forward: (tile elements, warps) by family, measured on the H100 as PER_HEAD_LAUNCH (4 x 32: the
# forward took 3.1 / 3.5 / 4.0 ms for GAT / GATv2 / TransformerConv on RMAT 2^20 against 4.4 / 5.1 / 5.4 ms
# per head, and 0.47 / 0.52-0.59 / 0.53 ms against 0.68 / 0.69 / 0.73 ms on RMAT 2^17).
ALL_HEADS_FORWARD_LAUNCH = {"gat": (256, 1), "gatv2": (256, 2), "dot": (256, 2)}


# The split backward (all heads per program): (tile elements, warps) by family, measured on the H100
# (fp32, 4 heads x 32 channels, RMAT 2^20 / 15.4M edges; the backward alone, benchmarks/probe.py attn_launch). At
# these launches (2 edges per block at 4 x 32) it took 5.25 / 8.77 / 8.94 ms for GAT / GATv2 / TransformerConv
# (GAT on 2 warps: 5.53 ms) against 7.69 / 12.07 / 10.67 ms for the former per-head split backward at its
# default launch; whole layers, forward and backward, 13.78 / 20.41 / 25.90 ms against 16.24 / 24.30 / 27.61 ms.
SPLIT_BACKWARD_LAUNCH_SESSION9 = {"gat": (256, 1), "gatv2": (256, 2), "dot": (256, 2)}
# Each pass's own launch, (dst pass, src pass), measured on the H200 (fp32, 4 x 32, RMAT 2^20, the whole backward
# timed with one pass's launch swept and the other's at the shared launch above; benchmarks/probe.py --parts
# split_sweep): GAT's dst pass at 4 edges per block took the backward from 4.59 to
# 4.36 ms; GATv2's passes at 1 edge per block each 7.70 -> 7.21 (src) and 7.29 ms (dst); TransformerConv's dst
# pass at 1 edge 6.97 -> 6.59 ms (its src pass kept 2 edges on 2 warps: 1 edge took 7.05). The src pass gathers
# every edge's destination ``dout`` row, ``D`` and ``lse``; the dst pass reads them once per row.
# ``GNN_IO_SPLIT_LAUNCH=session9`` runs :data:`SPLIT_BACKWARD_LAUNCH_SESSION9` in both passes (the A/B).
SPLIT_BACKWARD_LAUNCH = {"gat": ((512, 1), (256, 1)), "gatv2": ((128, 1), (128, 1)), "dot": ((128, 1), (256, 2))}
SPLIT_LAUNCH_ENV = settings.SETTINGS["split_launch"].env


def split_launch(family: str) -> tuple:
    """((tile, warps) of the dst pass, of the src pass) for ``family``'s split backward."""
    if settings.get("split_launch") == "session9":
        return (SPLIT_BACKWARD_LAUNCH_SESSION9[family],) * 2
    return SPLIT_BACKWARD_LAUNCH[family]


def all_heads_launch_config(heads: int, head_dim: int, measured: tuple | None = None, min_block_c: int = 1,
                            min_block_e: int = 2) -> dict:
    """Block sizes of the all-heads kernels: every head in one tile row (``BLOCK_H x BLOCK_C``, each rounded up
    to a power of two, ``BLOCK_C`` at least ``min_block_c``). With ``measured = (tile elements, warps)`` (the
    forward's :data:`ALL_HEADS_FORWARD_LAUNCH`, the split backward's :data:`SPLIT_BACKWARD_LAUNCH`):
    ``BLOCK_E`` edges with ``BLOCK_E * BLOCK_H * BLOCK_C`` near that tile (between ``min_block_e`` and 32), the
    warps scaled with the tile. Without (the all-heads atomic backward, not re-measured) or with
    ``GNN_IO_ATTENTION_LAUNCH=legacy``: about 2048 elements."""
    block_h, block_c = next_power_of_2(heads), max(min_block_c, next_power_of_2(head_dim))
    width = block_h * block_c
    if measured is not None and settings.get("attention_launch") != "legacy":
        tile, warps = measured
        block_e = max(min_block_e, min(32, tile // width))
        warps = min(8, warps * max(1, block_e * width // tile))
        return {"block_e": block_e, "block_h": block_h, "block_c": block_c, "num_warps": warps}
    block_e = max(8, min(32, 2048 // width))
    tile = block_e * width
    return {"block_e": block_e, "block_h": block_h, "block_c": block_c,
            "num_warps": 2 if tile <= 512 else 4 if tile <= 2048 else 8}


# a register cap (ptxas maxnreg) for the split backward's src pass, opt-in (0 or unset: none). H100, GATConv,
# 4 x 32, fp32 (probe part mass_launch): on RMAT 2^20 the src pass took 2.67 ms at 56 registers (55
# used, no spill) against 3.00 uncapped (61 used), 2.81 at 64, 3.06-3.29 at 48 and 40, and the step 9.80 against
# 9.91 ms (12 interleaved rounds, 92% won); but on the uniform graph of 16M edges the step took 12.15 against 12.09
# (8 rounds, 25% won) and on the grid 5.50 against 5.50. So there is no default cap.
SRC_MAXNREG_ENV = settings.SETTINGS["src_maxnreg"].env


def heads_variant(default: str = "all") -> str:
    """Which kernel runs: ``"all"`` (grid ``(items,)``, one program walks an item's edges once for every head)
    or ``"per_head"`` (grid ``(items, H)``), from the ``GNN_IO_ATTENTION_HEADS`` environment variable, read
    at each call; unset, ``default``: the forward runs all heads per program (measured faster on the H100),
    the atomic backward per head (its all-heads form is not measured)."""
    return settings.get("attention_heads") or default


class _Layout:
    """The op's arguments as strided ``[rows, H]`` / ``[rows, H, C]`` views for the kernels' slots, and the
    call's attention dropout (:class:`rng.Dropout` or None), or the reason they do not fit (then the reference
    runs)."""

    def __init__(self, form: AttentionForm, args, roles, num_edges: int, dropout: Dropout | None = None):
        self.form, self.args, self.roles, self.dropout = form, list(args), list(roles), dropout
        self.reason = None
        self._keep_bits = None
        value = args[form.value_terms[0]]
        if value.dim() != 3:
            self.reason = f"message values have shape {tuple(value.shape)}, expected [rows, heads, channels]"
            return
        self.heads, self.channels = value.shape[1], value.shape[2]
        self.num_edges = num_edges
        vector = form.family != "gat"
        self.views = {}
        for i in form.score_terms:
            self._view(i, vector)
        for i in form.value_terms:
            self._view(i, True)
        if form.query is not None:
            self._view(form.query, True)
        if self.reason is None and any(a.dtype not in _FLOATS for i, a in enumerate(args) if i in self.views):
            self.reason = "an input is not float32, float16 or bfloat16"
        # the kernels draw one mask entry per (edge, head): alpha must have one score per head, not one broadcast
        # over the heads (whose dropout the reference draws once per edge)
        per_edge_scores = form.score_terms + ((form.query,) if form.family == "dot" else ())
        if self.reason is None and dropout is not None and any(
                args[i].shape[1] != self.heads for i in per_edge_scores if roles[i] != ROLE_DENSE):
            self.reason = "attention dropout on scores broadcast over the heads"

    def _view(self, i: int, vector: bool):
        if self.reason is not None:
            return
        if i in self.views:
            if self.views[i].dim() != (3 if vector else 2):
                self.reason = f"argument {i} is used both per head and per channel"
            return
        arg, role = self.args[i], self.roles[i]
        shape = (self.heads, self.channels) if vector else (self.heads,)
        if role == ROLE_DENSE:
            arg = arg.reshape(arg.shape[-len(shape) - 1:]) if arg.dim() > len(shape) else arg.unsqueeze(0)
            if arg.shape[0] != 1:
                self.reason = f"dense argument {i} has shape {tuple(self.args[i].shape)}"
                return
        if not vector and arg.dim() == 3 and arg.shape[2] == 1:
            arg = arg[..., 0]
        if arg.dim() != len(shape) + 1:
            self.reason = f"argument {i} has shape {tuple(self.args[i].shape)}, expected [rows, {shape}]"
            return
        # traced, an edge argument's rows and the edge count may be two unbacked sizes (each edge tensor masked by
        # its own nonzero, as PyG's remove_self_loops does): undecidable there, taken as equal; the op checks the
        # real sizes at run time (a ValueError or the reference, never a wrong read)
        if role == ROLE_EDGE and guard_or_false(arg.shape[0] != self.num_edges):
            self.reason = f"edge argument {i} has {arg.shape[0]} rows for {self.num_edges} edges"
            return
        try:
            view = arg.expand(arg.shape[0], *shape)
        except RuntimeError:
            self.reason = f"argument {i} of shape {tuple(self.args[i].shape)} does not broadcast to {shape}"
            return
        self.views[i] = view

    def slot(self, i: int | None, vector: bool) -> list:
        """Pointer and strides (row, head[, channel]) of argument ``i``, a dummy for an empty slot."""
        if i is None:
            any_view = next(iter(self.views.values()))
            return [any_view, 0, 0, 0] if vector else [any_view, 0, 0]
        view = self.views[i]
        strides = [view.stride(0), view.stride(1)] + ([view.stride(2)] if vector else [])
        if self.roles[i] == ROLE_DENSE:
            strides[0] = 0
        return [view, *strides]

    def role(self, i: int | None) -> int:
        return _NONE if i is None else self.roles[i]

    def keep_bits_slot(self) -> list:
        """The CSR kernels' ``keep_bits_ptr, dropout_scale`` arguments: the call's dropout mask as a bitset by
        counter ``e * H + h`` (:func:`rng.keep_bits_by_triton`), drawn at the first launch of this layout and
        shared by its launches (a forward; a backward's dst and src passes draw it again, identically). The
        kernels' edge loop steps over one or two edges, so a Philox-10 chain in it costs as much as a full
        tile's; drawn apart, every lane of the draw is used. ``E * H / 8`` bytes while the call runs."""
        if self.dropout is None:
            return [self.slot(None, False)[0], 1.0]
        if self._keep_bits is None:
            self._keep_bits = keep_bits_by_triton(self.dropout, self.num_edges * self.heads)
        return [self._keep_bits, self.dropout.scale]


def _padded(seq, n):
    return list(seq) + [None] * (n - len(seq))


def _common_slots(layout: _Layout) -> tuple:
    form = layout.form
    vector = form.family != "gat"
    s = _padded(form.score_terms, _MAX_SCORE_TERMS)
    v = _padded(form.value_terms, _MAX_VALUE_TERMS)
    pointers = [*layout.slot(s[0], True), *layout.slot(s[1], True), *layout.slot(s[2], True)] if vector else \
        [x for i in s for x in (*layout.slot(i, False), 0)]
    pointers += layout.slot(form.query, True) + layout.slot(v[0], True) + layout.slot(v[1], True)
    pointers += layout.keep_bits_slot()
    constexprs = {"KIND": FAMILIES[form.family], "S0": layout.role(s[0]), "S1": layout.role(s[1]), "S2": layout.role(s[2]),
                      "Q": layout.role(form.query), "V0": layout.role(v[0]), "V1": layout.role(v[1]),
                      "DROPOUT": layout.dropout is not None}
    # the dropout counter is the original edge id: read through perm like an edge-role argument
    constexprs["NEED_EID"] = layout.dropout is not None or \
        ROLE_EDGE in [constexprs[k] for k in ("S0", "S1", "S2", "Q", "V0", "V1")]
    return pointers, constexprs


def dropout_slot(dropout: Dropout | None, dummy: Tensor) -> list:
    """The block-sparse kernels' ``seed_ptr, dropout_p, dropout_scale`` arguments (``dummy`` and no-ops without
    dropout): they draw the mask per tile cell, where the draw fills whole 16 x 16 tiles."""
    if dropout is None:
        return [dummy, 0.0, 1.0]
    return [dropout.seed, as_float32(dropout.p), dropout.scale]


def _items(rowptr: Tensor, col: Tensor, items, max_edges: int):
    """The plan's work items, or this call's own (one device sync) when the caller has none."""
    if items:
        return list(items), max_edges
    return list(work_items_op(rowptr, col, MAX_EDGES)), MAX_EDGES


def _out_dtype(args) -> torch.dtype:
    return next((a.dtype for a in args if a.dtype in (torch.float16, torch.bfloat16)), torch.float32)


def prepare(args, roles, perm: Tensor, score_key: str, message_key: str,
            dropout: Dropout | None = None) -> _Layout | str:
    """The kernels' :class:`_Layout` of an attention op's arguments, or the reason the reference runs."""
    form = recognise(score_key, message_key, roles)
    if isinstance(form, str):
        return form
    layout = _Layout(form, args, roles, perm.shape[0], dropout)
    return layout.reason if layout.reason is not None else layout


def _hub_slots(item_row: Tensor, item_shared: Tensor, num_slots: int) -> tuple:
    """``(slot_of_item, slot_row)``: each item's hub slot (-1 for an item that has its row alone) and each slot's
    row (-1 past the hub items), int32; structure of the items alone, kept with a plan's items (items_memo)."""
    is_shared = item_shared == 1
    rank = torch.cumsum(is_shared.to(torch.int32), 0) - 1
    slot_of_item = torch.where(is_shared, rank, -1).to(torch.int32)
    slot_row = torch.full((num_slots + 1,), -1, dtype=torch.int32, device=item_row.device)
    slot_row.scatter_(0, torch.where(is_shared, rank, num_slots).long(), item_row.to(torch.int32))
    return slot_of_item, slot_row[:num_slots]


def forward(layout: _Layout, rowptr: Tensor, col: Tensor, perm: Tensor, eps: float, items=(), max_edges: int = 0,
            config: dict | None = None, variant: str | None = None, bias: Tensor | None = None,
            mass: bool = False) -> tuple:
    """``(out [N, H, C], lse [N, H] float32)`` of the fused forward (module docstring); ``variant`` picks
    the per-head or all-heads kernel (default: :func:`heads_variant`). With ``bias`` (``[H, C]``, the output's
    dtype) ``out`` is the attention output plus ``bias``: added by the all-heads kernel and the hub combine as they
    store a row, written into the rows without edges, or (per-head kernel, items without a known hub count) added
    to the whole output afterwards.

    ``mass`` (the GAT family, all-heads kernel): also return GAT's score-term mass, float32 ``[N, H, C]``,
    ``M_i = sum_j alpha_ij s'_ij (w_ij v_j - out_i)`` (``s'`` LeakyReLU's slope at the edge's pre-activation,
    ``w`` the message scale and dropout, ``out`` without bias). A dst-role score term's gradient is then
    ``score_scale * <dout_i, M_i>`` per head (:func:`delta`'s ``mass``), a row sum, where the backward would
    otherwise sum a term per edge over each destination's edges (``backward``'s segment form)."""
    form, heads, channels = layout.form, layout.heads, layout.channels
    all_heads = (variant or heads_variant()) == "all"
    if mass and (form.family != "gat" or not all_heads):
        raise ValueError(f"attention forward: the score-term mass is made by the all-heads GAT kernel, not for "
                         f"family {form.family!r} with the {'all-heads' if all_heads else 'per-head'} kernel")
    defaults = all_heads_launch_config(heads, channels, ALL_HEADS_FORWARD_LAUNCH[form.family]) if all_heads else \
        launch_config(form.family, channels)
    config = {**defaults, **(config or {})}
    (item_row, item_start, item_end, item_shared), max_edges = _items(rowptr, col, items, max_edges)
    num_dst, device = rowptr.shape[0] - 1, rowptr.device
    # with a plan's own items (every row with edges has one: the item op remembered them, hub_item_count) each
    # such row is stored (light rows by their item, hub rows by the combine kernel) and only the rows without edges
    # are zeroed, no memset of the whole output; other items may cover some rows only (the hybrid path's CSR
    # part), whose other rows must stay 0
    hubs = hub_item_count((item_row, item_start, item_end, item_shared))
    allocate = torch.zeros if hubs is None else torch.empty
    out = allocate((num_dst, heads, channels), dtype=_out_dtype(layout.args), device=device)
    lse = allocate((num_dst, heads), dtype=torch.float32, device=device)
    masses = allocate((num_dst, heads, channels), dtype=torch.float32, device=device) if mass else lse
    epilogue = bias is not None and all_heads and hubs is not None
    if epilogue:
        bias = bias.contiguous()
    if hubs is not None:
        empty = listed_fill_rows((item_row, item_start, item_end, item_shared))
        zero_rows_without_entries(out, rowptr, fill=bias if epilogue else None, rows=empty)
        zero_rows_without_entries(lse, rowptr, rows=empty)
        if mass:
            zero_rows_without_entries(masses, rowptr, rows=empty)

    # hub items keep partial results in compact slots, one per hub item: as many as the plan's items hold where
    # that is known (hub_item_count), else a size-only bound (no sync): rows with d > max_edges have
    # ceil(d / max_edges) < 2 d / max_edges items, so 2 * ceil(E / max_edges) slots always suffice. The combine
    # kernel is launched over the slots: over the bound, at 2^20 rows and 15M edges ~120k programs per head
    # that mostly end at once (a launch floor of a few tenths of a ms on the H100)
    num_slots = max(hubs, 1) if hubs is not None else 2 * cdiv(col.shape[0], max_edges) + 1
    slot_of_item, slot_row = items_memo((item_row, item_start, item_end, item_shared), ("hub_slots", num_slots),
                                        lambda: _hub_slots(item_row, item_shared, num_slots))
    part_m = torch.empty((num_slots, heads), dtype=torch.float32, device=device)
    part_l = torch.empty((num_slots, heads), dtype=torch.float32, device=device)
    part_acc = torch.empty((num_slots, heads, channels), dtype=torch.float32, device=device)
    part_mass_acc = torch.empty_like(part_acc) if mass else part_acc
    part_mass_l = torch.empty_like(part_l) if mass else part_l

    pointers, constexprs = _common_slots(layout)
    if item_row.shape[0]:
        kernel_args = (item_row, item_start, item_end, item_shared, slot_of_item, col, perm, *pointers,
                       out, lse, part_m, part_l, part_acc, heads, channels, form.negative_slope, form.score_scale,
                       form.message_scale, eps)
        if all_heads:
            _forward_all_heads_kernel[(item_row.shape[0],)](
                *kernel_args, bias if epilogue else lse, masses, part_mass_acc, part_mass_l, **constexprs,
                BIAS=epilogue, MASS=mass, BLOCK_E=config["block_e"], BLOCK_H=config["block_h"], BLOCK_C=config["block_c"],
                num_warps=config["num_warps"], **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {}))
        else:
            _forward_kernel[(item_row.shape[0], heads)](
                *kernel_args, **constexprs, BLOCK_E=config["block_e"], BLOCK_C=config["block_c"],
                num_warps=config["num_warps"])
        _combine_kernel[(num_slots, heads)](slot_row, part_m, part_l, part_acc, out, lse, bias if epilogue else lse,
                                            num_slots, heads, channels, eps, masses, part_mass_acc, part_mass_l,
                                            BIAS=epilogue, MASS=mass, BLOCK_C=config["block_c"], num_warps=1)
    if bias is not None and not epilogue:
        out.add_(bias)
    return (out, lse, masses) if mass else (out, lse)


def _undo(view_grad: Tensor, arg: Tensor, role: int) -> Tensor:
    """A gradient in a slot's ``[rows, H(, C)]`` layout back in ``arg``'s shape (broadcasts summed)."""
    if role == ROLE_DENSE:
        view_grad = view_grad.sum(0, keepdim=True)
        return view_grad.sum_to_size(arg.shape) if arg.dim() == view_grad.dim() else \
            view_grad.reshape(view_grad.shape[1:]).sum_to_size(arg.shape)
    if arg.dim() == view_grad.dim() + 1:
        view_grad = view_grad.unsqueeze(-1)
    return view_grad.sum_to_size(arg.shape)


def backward_variant() -> str:
    """Which backward the op runs: ``"auto"`` (default: ``"mass"`` where it runs, else ``"one_pass_segment"``,
    for the GAT family; ``"split"`` for the others), ``"split"``, ``"atomic"``, ``"one_pass"``,
    ``"one_pass_segment"`` (the split backward with the one-pass GAT forms of :func:`backward`) or ``"mass"``
    (kernels/attention.py's ``attention_forward_mass``), from the ``GNN_IO_ATTENTION_BACKWARD`` environment variable, read
    at each call (module docstring). ``"split_all"`` is a deprecated synonym of ``"split"``: it named the
    all-heads split backward while it was opt-in, and old commands still set it."""
    return settings.get("attention_backward")


class SourceCSR(NamedTuple):
    """The CSR transposed for the split backward's src pass: rows are source nodes, each row's edges
    in CSR order (a stable sort by source)."""
    rowptr: Tensor   # [num_src + 1] int64
    dst: Tensor      # [E] the destination of each edge (col's dtype)
    eid: Tensor      # [E] its edge id, perm[position in the CSR] (what edge-role arguments are indexed by)
    items: WorkItems  # work items of these rows, at most ``max_edges`` edges each
    max_edges: int = 0  # their split: rows of more entries have several (shared) items; 0 when unknown
    fill_rows: Tensor | None = None  # the rows without entries or of more than ``max_edges`` (rows_to_fill)


def build_source_csr(rowptr: Tensor, col: Tensor, perm: Tensor, num_src: int, max_edges: int) -> SourceCSR:
    """:class:`SourceCSR` of the CSR ``(rowptr, col, perm)``: a stable sort of the ``E`` sources and a
    histogram, on ``rowptr``'s device; edges whose source is ``>= num_src`` are left out (no row)."""
    num_dst, num_edges = rowptr.numel() - 1, col.numel()
    degree = (rowptr[1:] - rowptr[:-1]).long()
    dst_of_position = torch.repeat_interleave(torch.arange(num_dst, device=rowptr.device, dtype=col.dtype), degree,
                                              output_size=num_edges)
    position = torch.sort(col, stable=True).indices
    counts = torch.bincount(col.long(), minlength=num_src)[:num_src]
    t_rowptr = torch.zeros(num_src + 1, dtype=torch.long, device=rowptr.device)
    torch.cumsum(counts, 0, out=t_rowptr[1:])
    return SourceCSR(t_rowptr, dst_of_position.index_select(0, position), perm.index_select(0, position),
                     work_items(t_rowptr, max_edges), max_edges, rows_to_fill(t_rowptr, max_edges))


def source_csr(layout: _Layout, rowptr: Tensor, col: Tensor, perm: Tensor, max_edges: int = 0) -> SourceCSR | None:
    """The graph's :class:`SourceCSR` for ``layout``'s source rows, built at the first call and cached with
    the graph's plan entry (kernels/attention_paths.py: it lives, and is invalidated, with the plan). None when it
    is not built yet and a CUDA graph is being captured: its work items count their hubs on the host (a
    synchronisation a capture refuses), so that backward runs the atomic variant, which needs no source CSR."""

    num_src = max((view.shape[0] for i, view in layout.views.items() if layout.roles[i] == ROLE_SRC), default=0)
    key = (num_src, max_edges or MAX_EDGES)
    cache = graph_state.state_of(rowptr, col, perm).slot("csr_by_src")
    if key not in cache and capturing(rowptr.device):
        return None
    return kept_outside_graph_pool(cache, key, lambda: build_source_csr(rowptr, col, perm, *key), rowptr.device)


def source_positions(rowptr: Tensor, col: Tensor, perm: Tensor, by_src: SourceCSR) -> Tensor | None:
    """``[E]`` (col's dtype): for each position of the CSR ``(rowptr, col)``, the position of the same edge in
    ``by_src`` (the inverse of :func:`build_source_csr`'s stable sort), built at the first call and cached with
    the graph's plan entry. The segment backward's src pass stores each edge's dst-role term there, contiguously,
    and the sum per destination reads it back through this map. None where ``by_src`` leaves edges out (sources
    past its rows: their positions are never walked), and while a CUDA graph is captured before it was built (the
    check reads a count on the host)."""

    cache = graph_state.state_of(rowptr, col, perm).slot("csr_by_src")
    key = ("source_positions", by_src.rowptr.numel() - 1)
    if key not in cache and capturing(rowptr.device):
        return None

    def build():
        num_edges = col.numel()
        if int(by_src.rowptr[-1]) != num_edges:  # once per graph
            return None
        order = torch.sort(col, stable=True).indices  # build_source_csr's order
        positions = torch.empty(num_edges, dtype=col.dtype, device=col.device)
        positions[order] = torch.arange(num_edges, dtype=col.dtype, device=col.device)
        return positions
    return kept_outside_graph_pool(cache, key, build, rowptr.device)


def _grad_outputs(form: AttentionForm, roles, needs_grad, pass_roles) -> list:
    """``(argument, role, T, V, Q)`` for each argument of a role in ``pass_roles`` that needs a gradient:
    how often it is a score term, a value term, and whether it is the dot query."""
    query = (form.query,) if form.family == "dot" else ()
    outputs = []
    for i in dict.fromkeys(form.score_terms + query + form.value_terms):
        if needs_grad[i] and roles[i] in pass_roles:
            outputs.append((i, roles[i], form.score_terms.count(i), form.value_terms.count(i), int(i in query)))
    return outputs


def one_pass_outputs(form: AttentionForm, dst_outputs: list, src_outputs: list) -> bool:
    """Whether the src pass can write the dst pass's gradients too, so that the dst pass is skipped: the GAT
    family, where a dst-role gradient is only a per-head scalar score term (one atomic per edge and head) and
    edge-role ones are plain stores by edge id (each edge is walked once in either pass)."""
    return (form.family == "gat" and bool(dst_outputs)
            and len(dst_outputs) + len(src_outputs) <= _MAX_GRAD_OUTPUTS
            and all(role == ROLE_EDGE or (role == ROLE_DST and t > 0 and v == 0 and q == 0)
                    for _, role, t, v, q in dst_outputs))


def backward(layout: _Layout, grad_out: Tensor, delta: Tensor, lse: Tensor, rowptr: Tensor, col: Tensor,
             perm: Tensor, needs_grad, items=(), max_edges: int = 0, config: dict | None = None,
             variant: str | None = None, by_src: SourceCSR | None = None, one_pass: bool | None = None,
             pack: dict | None = None):
    """Gradients of every argument flagged in ``needs_grad`` (None elsewhere), the dropout mask (if any)
    regenerated from ``layout.dropout``. ``delta`` is ``D = <dout, out>`` per (row, head), float32 and shaped as
    ``lse`` (:func:`delta`, run before the backward so that the forward's output need not be kept for it).

    With ``by_src`` (:func:`source_csr` of the whole graph) the split backward runs, for all heads at once;
    without it the atomic one, per head or for all heads at once (``variant``, default per head:
    :func:`heads_variant`). The split backward needs every row's items: a caller passing a subset of rows (the
    hybrid path's ``csr_items``) must pass no ``by_src``, or a source's edges into the other rows would be
    counted too. ``one_pass`` (default: on unless ``GNN_IO_ATTENTION_BACKWARD`` is ``split``): for the GAT
    family the src pass also writes the dst-role scalar gradients (:func:`one_pass_outputs`): per edge, summed
    per destination after it (``one_pass_segment``, and the default ``auto``), or by atomics (``one_pass``); the
    dst pass, a second gather of every edge's ``[H, C]`` value row, is not run. ``config`` (launch keys
    ``block_e``, ``num_warps``...) overrides both split passes' launch; its ``"src"`` and ``"dst"`` entries (dicts
    of the same keys) override one pass's.

    ``pack`` (argument -> a tensor of the argument's shape and dtype whose rows are not contiguous with each
    other: a column slice of one ``[N, F]`` gradient, kernels/attention.py's ``attention_backward_packed``): the
    gradient of such an argument is written by the kernels into that tensor, which is then its entry of the
    result, where the split passes store it row by row (a row-role output of its own pass, float32, the
    argument's own shape); elsewhere the entry is computed as usual and the caller copies it.
    """
    form, channels = layout.form, layout.channels
    query = (form.query,) if form.query is not None else ()
    wanted = [i for i in dict.fromkeys(form.score_terms + query + form.value_terms) if needs_grad[i]]
    if not wanted:
        return [None] * len(layout.args)
    dst_outputs = _grad_outputs(form, layout.roles, needs_grad, (ROLE_DST, ROLE_EDGE))
    src_outputs = _grad_outputs(form, layout.roles, needs_grad, (ROLE_SRC,))
    split = by_src is not None and max(len(dst_outputs), len(src_outputs)) <= _MAX_GRAD_OUTPUTS
    by_edge = []  # dst-role outputs the src pass stores per edge, summed over the CSR rows after it
    positions = None  # where it stores them: at source_positions (transposed-CSR positions), or at edge ids
    if split:
        setting = backward_variant()
        if one_pass is None:
            one_pass = setting in ("one_pass", "one_pass_segment", "auto", "mass")
        if one_pass and form.family != "gatv2" and one_pass_outputs(form, dst_outputs, src_outputs):
            if setting in ("one_pass_segment", "auto", "mass"):
                by_edge = [o for o in dst_outputs
                           if o[1] == ROLE_DST and layout.views[o[0]].shape[0] == rowptr.numel() - 1]
                # stored at each edge's position in the transposed CSR (contiguous) where every edge has one, else
                # at its edge id (scattered)
                positions = source_positions(rowptr, col, perm, by_src) if by_edge else None
                store_role = ROLE_EDGE if positions is None else _BY_SOURCE_POSITION
                dst_outputs = [(o[0], store_role, *o[2:]) if o in by_edge else o for o in dst_outputs]
            src_outputs, dst_outputs = src_outputs + dst_outputs, []
    by_edge_ids = [o[0] for o in by_edge]
    targets = {}
    if split and pack:
        row_outputs = {o[0] for o in dst_outputs if o[1] == ROLE_DST} | {o[0] for o in src_outputs if o[1] == ROLE_SRC}
        targets = {i: t for i, t in pack.items()
                   if i in row_outputs and i not in by_edge_ids and t.dtype == torch.float32
                   and tuple(t.shape) == tuple(layout.views[i].shape) == tuple(layout.args[i].shape)
                   and t.dim() >= 2 and t[0].is_contiguous()}
    buffers = _grad_buffers(layout, [i for i in wanted if i not in by_edge_ids],
                            _stored_rows(layout, items, rowptr, by_src, dst_outputs, src_outputs) if split else {},
                            rowptr.device, targets)
    for i in by_edge_ids:
        if positions is not None:  # [E, H] by transposed-CSR position: every position is walked, each once
            buffers[i] = torch.empty((col.numel(), layout.heads), dtype=torch.float32, device=rowptr.device)
        else:  # [E, H] by edge id; zeros: an edge without a source row is walked by no program
            buffers[i] = torch.zeros((col.numel(), layout.heads), dtype=torch.float32, device=rowptr.device)
    (item_row, item_start, item_end, item_shared), max_edges = _items(rowptr, col, items, max_edges)
    delta = delta.contiguous()
    if not split:
        _atomic_backward(layout, buffers, grad_out, delta, lse, col, perm, (item_row, item_start, item_end),
                         config, variant)
    else:
        given = config or {}
        overrides = {k: v for k, v in given.items() if k not in ("dst", "src")}

        def pass_config(measured: tuple, name: str) -> dict:
            """A pass's launch: its measured tile and warps, then ``config``'s keys, then its own entry's."""
            return {**all_heads_launch_config(layout.heads, channels, measured, min_block_c=16, min_block_e=1),
                    **overrides, **(given.get(name) or {})}
        dst_launch, src_launch = split_launch(form.family)
        config, src_config = pass_config(dst_launch, "dst"), pass_config(src_launch, "src")
        cap = settings.get("src_maxnreg")
        if cap and "maxnreg" not in src_config:
            src_config["maxnreg"] = cap
        grad_out = grad_out.contiguous()
        att_grad = buffers.get(form.query) if form.family == "gatv2" else None
        if dst_outputs or att_grad is not None:
            _split_pass(layout, ROLE_DST, dst_outputs, buffers, att_grad, (item_row, item_start, item_end, item_shared),
                        col, perm, grad_out, lse, delta, config)
        if src_outputs:
            _split_pass(layout, ROLE_SRC, src_outputs, buffers, None, by_src.items, by_src.dst, by_src.eid, grad_out,
                        lse, delta, src_config)
        for i in by_edge_ids:
            buffers[i] = _sum_by_destination(buffers[i], rowptr, perm if positions is None else positions,
                                             (item_row, item_start, item_end, item_shared))
    result = [None] * len(layout.args)
    for i, grad in buffers.items():
        result[i] = grad if i in targets else _undo(grad, layout.args[i], layout.roles[i]).to(layout.args[i].dtype)
    return result


def chunk_bounds(num_rows: int, row_bytes: int, chunk_bytes: int) -> list:
    """Row boundaries ``[0, ..., num_rows]`` cutting ``num_rows`` rows of ``row_bytes`` each into chunks of at most
    ``chunk_bytes`` (even by rows; one chunk when all of them fit)."""
    count = max(1, cdiv(num_rows * row_bytes, max(1, chunk_bytes)))
    count = min(count, max(1, num_rows))
    return [num_rows * c // count for c in range(count + 1)]


def _item_bounds(items, bounds: list, cache: dict, key) -> list | None:
    """For each row boundary in ``bounds``, the index of the first work item of a row at or past it: the items of
    rows ``[bounds[c], bounds[c + 1])`` are then ``[result[c], result[c + 1])``. Items come in row order with any
    padding items last (:func:`gnn_inductor.plan.work_items.work_items`); one device sync, kept in ``cache``
    (the graph plan's) under ``key``. None where the items are not in that order, or while a CUDA graph is captured
    before they were counted (the count reads the device)."""
    item_row, shared = items[0], items[3]
    device = item_row.device
    if key not in cache and capturing(device):
        return None

    def build():
        from gnn_inductor.plan.work_items import PADDING

        real = shared != PADDING
        count = real.sum()
        rows = torch.where(real, item_row.long(), torch.iinfo(torch.int64).max)  # padding sorts last
        ordered = (rows[1:] >= rows[:-1]).all() if rows.numel() > 1 else torch.ones((), dtype=torch.bool,
                                                                                   device=device)
        found = torch.searchsorted(rows, torch.tensor(bounds, dtype=torch.int64, device=device))
        found[-1] = count
        values = torch.cat([ordered.reshape(1).long(), found]).tolist()  # the one sync
        return values[1:] if values[0] else None
    return kept_outside_graph_pool(cache, key, build, device)


CHUNK_STREAMS_ENV = settings.SETTINGS["grad_chunk_streams"].env  # 0: backward_chunked's two passes one after the other
_SIDE_STREAMS: dict = {}


def _side_stream(device) -> "torch.cuda.Stream | None":
    """A second stream on CUDA ``device`` (one per device, kept), None on other devices or with
    ``GNN_IO_GRAD_CHUNK_STREAMS=0``."""
    if getattr(device, "type", device) != "cuda":
        return None
    if not settings.get("grad_chunk_streams"):
        return None
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def backward_chunked(layout: _Layout, grad_out: Tensor, delta: Tensor, lse: Tensor, rowptr: Tensor, col: Tensor,
                     perm: Tensor, needs_grad, items, max_edges: int, by_src: SourceCSR, pack_offsets: list,
                     pack_width: int, gaps: list, dtype: torch.dtype, bounds: list, consume,
                     cache: dict) -> list | None:
    """The split backward one block of node rows at a time, for gradients packed into one ``[N, pack_width]``
    tensor (kernels/attention.py's ``attention_backward_projected``): for each chunk ``[r0, r1)`` of ``bounds``,
    the packed gradient's rows ``r0 .. r1`` (``dtype``; argument ``i``'s gradient in columns
    ``pack_offsets[i] ..``, zeros in the column ranges ``gaps``) are computed by the dst pass over the items of
    destinations ``r0 .. r1`` and the src pass over the items of sources ``r0 .. r1``, then handed to
    ``consume(r0, r1, chunk)`` and dropped. Each packed gradient row is a row-role output of its own pass (a
    destination's sum over its CSR row, a source's over its transposed row), so it is complete once its chunk's
    two passes ran, and the whole ``[N, pack_width]`` tensor never exists. Unpacked gradients (edge-role, the
    dense ``att``) are accumulated over the chunks in their own buffers and returned as :func:`backward` does; the
    packed entries are None.

    None, with nothing computed, where the chunks cannot be cut so: a row-role gradient that is not packed (it
    would be stored at the chunk's row offset), a packed argument that is not such a row output, the GAT family
    (its one-pass backward writes destination gradients from the src pass), more than four outputs in a pass, or
    item boundaries unknown (:func:`_item_bounds`)."""
    form = layout.form
    dst_outputs = _grad_outputs(form, layout.roles, needs_grad, (ROLE_DST, ROLE_EDGE))
    src_outputs = _grad_outputs(form, layout.roles, needs_grad, (ROLE_SRC,))
    num_rows = bounds[-1]
    row_outputs = {o[0] for o in dst_outputs if o[1] == ROLE_DST} | {o[0] for o in src_outputs if o[1] == ROLE_SRC}
    packed = {i for i, offset in enumerate(pack_offsets) if offset >= 0}
    rows_of = {ROLE_DST: rowptr.numel() - 1, ROLE_SRC: by_src.rowptr.numel() - 1}
    if form.family == "gat" or max(len(dst_outputs), len(src_outputs)) > _MAX_GRAD_OUTPUTS or \
            row_outputs != packed or any(layout.views[i].shape[0] != num_rows or rows_of[layout.roles[i]] != num_rows
                                         or layout.views[i][0].numel() != layout.args[i][0].numel() for i in packed):
        return None
    dst_items, _ = _items(rowptr, col, items, max_edges)
    dst_at = _item_bounds(dst_items, bounds, cache, ("chunk_items", "dst", max_edges, tuple(bounds)))
    src_at = _item_bounds(by_src.items, bounds, cache, ("chunk_items", "src", by_src.rowptr.numel(), tuple(bounds)))
    if dst_at is None or src_at is None:
        return None
    device = rowptr.device
    wanted = [i for i in dict.fromkeys(form.score_terms + ((form.query,) if form.query is not None else ())
                                       + form.value_terms) if needs_grad[i]]
    buffers = _grad_buffers(layout, [i for i in wanted if i not in packed], {}, device)
    hubs = hub_items(dst_items)
    splits = {i: (rowptr, hubs[1] if hubs else None) if layout.roles[i] == ROLE_DST else
              (by_src.rowptr, by_src.max_edges or None) for i in packed}
    dst_launch, src_launch = split_launch(form.family)
    dst_config = all_heads_launch_config(layout.heads, layout.channels, dst_launch, min_block_c=16, min_block_e=1)
    src_config = all_heads_launch_config(layout.heads, layout.channels, src_launch, min_block_c=16, min_block_e=1)
    grad_out, delta = grad_out.contiguous(), delta.contiguous()
    att_grad = buffers.get(form.query) if form.family == "gatv2" else None
    direct = dtype == torch.float32  # the kernels store float32 rows into the block itself, else into their own
    stream = _side_stream(device)
    for c in range(len(bounds) - 1):
        r0, r1 = bounds[c], bounds[c + 1]
        chunk = torch.empty((r1 - r0, pack_width), dtype=dtype, device=device)
        for start, end in gaps:
            chunk[:, start:end].zero_()
        views, own = {}, {}
        for i in packed:
            view = chunk[:, pack_offsets[i]:pack_offsets[i] + layout.args[i][0].numel()]
            views[i] = view.view(r1 - r0, *layout.views[i].shape[1:])
            own[i] = views[i] if direct else \
                torch.empty((r1 - r0, *layout.views[i].shape[1:]), dtype=torch.float32, device=device)
            part, above = splits[i]
            if above is None:
                own[i].zero_()
            else:
                zero_rows_without_entries(own[i], part[r0:r1 + 1], above)
        this = {**buffers, **own}  # this block's buffers (the unpacked ones span every block)
        run_dst = dst_at[c + 1] > dst_at[c] and bool(dst_outputs or att_grad is not None)
        run_src = bool(src_outputs) and src_at[c + 1] > src_at[c]
        # the two passes write disjoint memory (the dst pass the dst-role, edge-role and att gradients, the src pass
        # the src-role ones): with a side stream they run side by side, each filling the other's ramp and tail
        side = stream if run_dst and run_src else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        if run_src:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                _split_pass(layout, ROLE_SRC, src_outputs, this, None,
                            [t[src_at[c]:src_at[c + 1]] for t in by_src.items], by_src.dst, by_src.eid, grad_out,
                            lse, delta, src_config, row0=r0)
        if run_dst:
            _split_pass(layout, ROLE_DST, dst_outputs, this, att_grad,
                        [t[dst_at[c]:dst_at[c + 1]] for t in dst_items], col, perm, grad_out, lse, delta,
                        dst_config, row0=r0)
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
        for i in packed:
            if own[i] is not views[i]:
                views[i].copy_(own[i])
        consume(r0, r1, chunk)
        # dropped before the next block is allocated (a rebinding would keep this one alive until then)
        del chunk, views, own, view, this
    result = [None] * len(layout.args)
    for i, grad in buffers.items():
        if i not in packed:
            result[i] = _undo(grad, layout.args[i], layout.roles[i]).to(layout.args[i].dtype)
    return result


def _sum_by_destination(by_edge: Tensor, rowptr: Tensor, index: Tensor, items) -> Tensor:
    """``[N, H]``: row ``i`` sums ``by_edge[index[q]]`` over the CSR positions ``q`` of row ``i`` (``by_edge`` is
    ``[E, H]`` by edge id with ``index = perm``, or by transposed-CSR position with ``index`` from
    :func:`source_positions`): the Triton SpMM over the CSR with ``index`` as its columns and unit values, on the
    CSR's degree-split work items (a hub row's items add; the one-pass backward's per-edge atomics into one ``[H]``
    row serialise on a hub instead). The unit values are kept with the plan's items (:func:`items_memo`). The launch
    fits these narrow rows (:data:`SEGMENT_SUM_LAUNCH`)."""
    from gnn_inductor.kernels.spmm.csr_triton import triton_spmm

    ones = items_memo(items, ("unit_values", index.numel()),
                      lambda: torch.ones(index.numel(), dtype=torch.float32, device=index.device))
    block_e, num_warps = SEGMENT_SUM_LAUNCH
    return triton_spmm(by_edge, ones, rowptr, index, items, "sum", block_e=block_e,
                       block_f=max(4, next_power_of_2(by_edge.shape[1])), num_warps=num_warps)


# (edges per block, warps) of the per-destination sum of the segment backward, with a feature block of the heads
# (at least 4): the H100, RMAT 2^20 / 15.4M edges and 2^17 / 1.1M, 4 heads (probe part segment_sum):
# 0.733 and 0.128 ms against 0.945 and 0.155 at the SpMM's default launch (8 edges, 16 features, 1 warp)
SEGMENT_SUM_LAUNCH = (16, 1)


def _stored_rows(layout: _Layout, items, rowptr: Tensor, by_src: SourceCSR, dst_outputs: list,
                 src_outputs: list) -> dict:
    """``argument -> (CSR rowptr, split, those rows listed or None)`` for the gradients the split backward stores
    row by row: a row-role output of its own pass (dst-role in the dst pass, src-role in the src pass), whose rows
    with one item are stored by it, so its buffer needs zeros only in the rows without entries and the hub rows
    (several items add; :func:`zero_rows_without_entries`). Only where the items are known to cover every row with
    entries and their split is known: the plan's own items for the dst pass (:func:`hub_items`), :class:`SourceCSR`'s
    for the src pass."""
    stored = {}
    hubs = hub_items(items) if items else None
    if hubs is not None:
        for i, role, *_ in dst_outputs:
            if role == ROLE_DST and layout.views[i].shape[0] == rowptr.numel() - 1:
                stored[i] = (rowptr, hubs[1], listed_fill_rows(items, hubs[1]))
    if by_src.max_edges:
        for i, role, *_ in src_outputs:
            if role == ROLE_SRC and layout.views[i].shape[0] == by_src.rowptr.numel() - 1:
                stored[i] = (by_src.rowptr, by_src.max_edges, by_src.fill_rows)
    return stored


def _zero_unstored_rows(buffer: Tensor, stored: tuple) -> None:
    rowptr, above, rows = stored  # (_stored_rows)
    zero_rows_without_entries(buffer, rowptr, above, rows=rows)


def _grad_buffers(layout: _Layout, wanted: list, stored: dict, device, targets: dict | None = None) -> dict:
    """float32 gradient buffers of the ``wanted`` arguments: zeros, but for the ``stored`` ones
    (:func:`_stored_rows`), uninitialised but for the rows no item stores (512 MiB of memset saved per
    ``[2^20, 128]`` float32 gradient). ``targets`` (argument -> float32 tensor of the buffer's shape, e.g. a
    column slice of a packed gradient) are used as the buffers of those arguments instead of new memory."""
    buffers = {}
    for i in wanted:
        view = layout.views[i]
        rows = DENSE_GRAD_SLOTS if layout.roles[i] == ROLE_DENSE else view.shape[0]
        if targets and i in targets:
            buffers[i] = targets[i]
            if i in stored:
                _zero_unstored_rows(buffers[i], stored[i])
            else:
                buffers[i].zero_()
        elif i in stored:
            buffers[i] = torch.empty((rows, *view.shape[1:]), dtype=torch.float32, device=device)
            _zero_unstored_rows(buffers[i], stored[i])
        else:
            buffers[i] = torch.zeros((rows, *view.shape[1:]), dtype=torch.float32, device=device)
    return buffers


def _split_pass(layout: _Layout, major: int, outputs: list, buffers: dict, att_grad, items, other: Tensor,
                eid: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor, config: dict, row0: int = 0) -> None:
    """One launch of :func:`_split_backward_all_heads_kernel`: the dst pass (``major == ROLE_DST``) or the src
    pass; its row-role outputs hold the rows from ``row0`` on."""
    form = layout.form
    pointers, constexprs = _common_slots(layout)
    # an edge-role output is stored by edge id (the segment variant's per-edge dst score terms too)
    constexprs["NEED_EID"] = constexprs["NEED_EID"] or any(o[1] == ROLE_EDGE for o in outputs)
    slots = _padded(outputs, _MAX_GRAD_OUTPUTS)
    grads, strides, specs = [], [], {}
    for k, output in enumerate(slots):
        i, role, t, v, q = output if output is not None else (None, _NONE, 0, 0, 0)
        grads.append(lse if i is None else buffers[i])
        strides.append(0 if i is None else buffers[i].stride(0))
        specs.update({f"G{k}R": role, f"G{k}T": t, f"G{k}V": v, f"G{k}Q": q})
    row_outputs = [o for o in outputs if o[1] == major]
    flags = {"ROW_T": any(o[2] for o in row_outputs), "ROW_V": any(o[3] for o in row_outputs),
             "ROW_Q": any(o[4] for o in row_outputs), "EDGE_Q": any(o[4] for o in outputs),
             "GATT": att_grad is not None}
    if not items[0].shape[0]:
        return
    args = (*items, other, eid, *pointers, lse, delta, grad_out, *grads,
            lse if att_grad is None else att_grad, *strides, row0,
            layout.heads, layout.channels, form.negative_slope, form.score_scale, form.message_scale)
    _split_backward_all_heads_kernel[(items[0].shape[0],)](
        *args, **constexprs, MAJOR=major, **specs, **flags,
        DENSE_SLOTS=DENSE_GRAD_SLOTS,
        BLOCK_E=config["block_e"], BLOCK_H=config["block_h"], BLOCK_C=config["block_c"], num_warps=config["num_warps"],
        **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {}))


def delta(grad_out: Tensor, out: Tensor, bias: Tensor | None = None, mass: Tensor | None = None,
          score_scale: float = 1.0):
    """``D`` (and with ``mass``, ``(D, dst-term gradient)``): :func:`delta_parts`' without the bias gradient."""
    delta, mass_grad, _ = delta_parts(grad_out, out, bias, mass, score_scale)
    return delta if mass is None else (delta, mass_grad)


def delta_parts(grad_out: Tensor, out: Tensor, bias: Tensor | None = None, mass: Tensor | None = None,
                score_scale: float = 1.0, bias_grad: bool = False) -> tuple:
    """``D = <dout, out>`` over channels, float32 ``[N, H]``, from ``[N, H, C]`` tensors (one kernel, each read
    once); with ``bias`` (``[H, C]`` or its flat view), ``D = <dout, out - bias>``, the bias subtracted in the
    kernel (no ``out - bias`` tensor). With ``mass`` (:func:`forward`'s, float32 ``[N, H, C]``) returns
    ``score_scale * <dout, mass>`` too: GAT's dst-role score-term gradient, from the same read of ``dout``. With
    ``bias_grad``, also ``dout``'s column sum, float32 ``[H, C]`` (the bias gradient): each program stores its
    rows' sums, then those are summed (one read of ``dout`` less than a separate reduction: 512 MiB at
    ``[2^20, 128]`` float32), where a program's rows start at a head boundary (its row count a multiple of ``H``);
    else None. Returns ``(D, dst-term gradient or None, bias gradient or None)``."""
    grad_out, out = grad_out.contiguous(), out.contiguous()
    num_dst, heads, channels = out.shape
    block_c = max(16, next_power_of_2(channels))
    delta = torch.empty((num_dst, heads), dtype=torch.float32, device=out.device)
    mass_grad = None if mass is None else torch.empty_like(delta)
    if mass is not None and (tuple(mass.shape) != tuple(out.shape) or mass.dtype != torch.float32):
        raise ValueError(f"attention delta: a mass of shape {tuple(mass.shape)} ({mass.dtype}) for an output of "
                         f"shape {tuple(out.shape)} (float32 expected)")
    block_r = max(1, 2048 // block_c)
    programs = cdiv(delta.numel(), block_r)
    summed = bias_grad and delta.numel() > 0 and block_r % heads == 0 and heads == next_power_of_2(heads)
    parts = torch.empty((programs, heads, channels), dtype=torch.float32, device=out.device) if summed else delta
    if delta.numel():
        _delta_kernel[(programs,)](
            grad_out, out, out if bias is None else bias.contiguous(), delta,
            delta if mass is None else mass.contiguous(), delta if mass_grad is None else mass_grad,
            float(score_scale), parts, delta.numel(), heads, channels, BIAS=bias is not None, MASS=mass is not None,
            BIAS_GRAD=summed, HEADS=heads if summed else 1, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return delta, mass_grad, (parts.sum(0) if summed else None)


def _atomic_backward(layout: _Layout, buffers: dict, grad_out: Tensor, delta: Tensor, lse: Tensor, col: Tensor,
                     perm: Tensor, items, config: dict | None, variant: str | None) -> None:
    """The one-pass backward: src- and edge-role gradients are float32 atomics of every edge block."""
    form, heads, channels = layout.form, layout.heads, layout.channels
    all_heads = (variant or heads_variant(default="per_head")) == "all"
    defaults = all_heads_launch_config(heads, channels) if all_heads else launch_config(form.family, channels, "atomic")
    config = {**defaults, **(config or {})}
    item_row, item_start, item_end = items
    s = _padded(form.score_terms, _MAX_SCORE_TERMS)
    v = _padded(form.value_terms, _MAX_VALUE_TERMS)
    grads = [buffers.get(i) for i in (s[0], s[1], s[2], form.query, v[0], v[1])]
    flags = {"GS0": grads[0] is not None, "GS1": grads[1] is not None, "GS2": grads[2] is not None,
             "GQ": grads[3] is not None, "GV0": grads[4] is not None, "GV1": grads[5] is not None}
    pointers, constexprs = _common_slots(layout)
    if item_row.shape[0]:
        kernel_args = (item_row, item_start, item_end, col, perm, *pointers, delta, lse, grad_out.contiguous(),
                       *[lse if g is None else g for g in grads], heads, channels, form.negative_slope,
                       form.score_scale, form.message_scale)
        if all_heads:
            _backward_all_heads_kernel[(item_row.shape[0],)](
                *kernel_args, **constexprs, **flags, DENSE_SLOTS=DENSE_GRAD_SLOTS, BLOCK_E=config["block_e"],
                BLOCK_H=config["block_h"], BLOCK_C=config["block_c"], num_warps=config["num_warps"])
        else:
            _backward_kernel[(item_row.shape[0], heads)](
                *kernel_args, **constexprs, **flags, DENSE_SLOTS=DENSE_GRAD_SLOTS, BLOCK_E=config["block_e"],
                BLOCK_C=config["block_c"], num_warps=config["num_warps"])


def kernel_name(family: str) -> str:
    heads = ", all heads per program (forward)" if heads_variant() == "all" else ""
    variant = backward_variant()
    if variant == "atomic":
        backward = "atomic backward"
    elif family == "gat" and variant == "one_pass":
        backward = ("one-pass split backward (src pass over the transposed CSR, all heads per program, the dst "
                    "score terms' gradients by atomics)")
    elif family == "gat" and variant in MASS_VARIANTS:
        backward = ("one-pass split backward (src pass over the transposed CSR, all heads per program); the dst "
                    "score terms' gradients from the forward's score-term mass, summed in the D kernel (float32 "
                    "with TF32 off; else stored per edge and summed per destination by the SpMM)")
    elif family == "gat" and variant == "one_pass_segment":
        backward = ("one-pass split backward (src pass over the transposed CSR, all heads per program, the dst "
                    "score terms' gradients stored per edge and summed per destination by the SpMM)")
    else:
        backward = "split backward (dst pass, src pass over the transposed CSR, all heads per program)"
    return (f"fused CSR attention (Triton, {family} family{heads}): online softmax, saved LSE, degree-split work "
            f"items, {backward}")
