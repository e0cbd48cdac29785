"""GAT's attention-vector projections folded into the feature GEMM.

PyG's GATConv (DGL's likewise) projects the node features and then reduces the projection against each attention
vector::

    h = mm(x, t(W)).view(N, H, C)
    alpha_src = (h * att_src).sum(-1)          # [N, H]
    alpha_dst = (h * att_dst).sum(-1)

Each reduction reads all of ``h`` again (0.5 GiB at 2^20 nodes, 128 features, fp32). Its backward reads ``h`` once
more for the attention vector's gradient, and adds ``g * att`` into ``h``'s gradient, a read and a write of it.
Since ``(x W^T)_h . a_h = x . (W_h^T a_h)``, a projection is ``H`` more output columns of the same GEMM, with rows
``Wa[h] = sum_c a[h, c] W[h C + c, :]`` (and ``b . a`` per head for a bias)::

    out = mm(x, t(cat([W, Wa_src, Wa_dst, 0])))   # [N, H C + 2 H (+ zero columns)]
    h = out[:, :H C].view(N, H, C); alpha_src = out[:, H C:H C + H]; alpha_dst = out[:, H C + H:H C + 2 H]

The attention op reads the three as strided views (its kernels take row strides). In the backward, AOTAutograd
concatenates their gradients into the GEMM's output gradient, which ``gnn_inductor/passes/packed_grads.py`` turns into the
attention backward writing them in place; ``dx`` and ``dW`` are then the GEMM's own, and the attention vectors'
gradients come from ``dWa`` (an ``[H, F]`` product), not from a pass over ``h``.

The folded sum is reassociated (``x . (W^T a)`` for ``(x W^T) . a``): in float32 it differs from eager by rounding
(relative ~1e-7 of the score).

Where nothing else reads the features (GATConv's edge features, ``lin_edge(edge_attr)``, which only make
``alpha_edge``; a bipartite layer's destination features), the GEMM keeps the score columns alone: an ``[E, H]``
output instead of an ``[E, H C]`` one.

``GNN_IO_SCORE_FOLD``: ``epilogue`` (default) makes the features and every projection of them with one
``gnn_io::linear_scores`` call (kernels/attention/head_scores.py), the scores reduced from the 3xTF32 GEMM's accumulator
tiles and their gradients taken inside the backward GEMMs, wherever that kernel runs at the graph's sizes (float32,
TF32 off, CUDA, fixed sizes of a tall product, heads of a power-of-two width: ``_epilogue_takes``); elsewhere the
graph keeps its reductions for Inductor. ``0`` folds nothing; ``auto`` folds only projections whose features nothing
else reads; ``1`` folds the others too, padding the GEMM's width to a multiple of :data:`COLUMN_MULTIPLE` with zero
columns so the attention kernels read rows whose stride Triton can specialise on (16 elements; a 136-float row is
not); ``tight`` folds them without padding.

The epilogue measured 1.02x on GATConv's step (H100, RMAT 2^20 with 15.4M edges, 128 features, 4 heads, fp32,
10.50 -> 10.26 ms and 10.59 -> 10.41, 10 interleaved rounds each, all won). On the same setup, with the GEMMs in
the 3xTF32 kernel, the column fold measured 10.82 against 11.73 ms unfolded-to-folded (0.92x), its
144-column products 1.06 ms each against 0.60.

The column forms are off because none measured faster (H100, RMAT 2^20 with 15.4M edges, 128 features, 4 heads, fp32):
- GATConv: 11.81 ms padded against 11.22 unfolded (16 interleaved rounds, none won), 14.05 tight (the kernels'
  loads of 136-float rows). The profile shows why: cuBLAS's kernels for 144 output columns took 3.54 ms of GEMM
  per step against 2.50 for 128, more than the 0.74 ms of reductions and pointwise passes the fold removes.
- GATConv with 16 and with 64 edge features (``auto``): 15.64 against 15.68 ms and 19.55 against 19.41, the
  same 2.33 GB step memory both ways. Inductor's own graph never kept the ``[E, H C]`` edge projection either.

Only float32 and float64 are folded. In bf16 the attention vectors' gradient, formed as ``W_h^T (g^T x)`` from a
rounded ``[H, F]`` product, was 0.54 (relative, in norm) from a float32 run where eager's own bf16 error is 0.13.

Matched: ``sum(mul(view(M, [N, H, C]), A), [-1])`` (either operand order), ``M`` a linear map of graph-input
weights (``linear_fusion.linear_map``) whose weight has ``H C`` rows, ``A`` a graph input of ``H C`` elements shaped
``[1, H, C]`` or ``[H, C]`` of ``M``'s dtype and device, the product read by the sum alone. Every such sum of one
``M`` joins its GEMM.
"""
from __future__ import annotations

import contextlib
import operator
from collections import defaultdict

import torch
from torch.fx import GraphModule, Node

from gnn_inductor import config
from gnn_inductor.graph_match import tensor_val
from gnn_inductor.kernels.attention import head_scores
from gnn_inductor.passes.linear_fusion import call_node, linear_map, parameter_name
from gnn_inductor.rewrite_report import source_of

aten = torch.ops.aten
ENV = config.SETTINGS["score_fold"].env
COLUMN_MULTIPLE = 16
MODES = config.SETTINGS["score_fold"].choices
DEFAULT = config.default("score_fold")
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _projection(node: Node):
    """``(M, view, A)`` when ``node`` is ``sum(mul(view(M, [N, H, C]), A), [-1])`` as the module docstring says."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList or node.kwargs:
        return None
    if len(node.args) > 2 and node.args[2]:
        return None  # keepdim
    mul, dims = node.args[0], list(node.args[1])
    if not isinstance(mul, Node) or mul.target is not aten.mul.Tensor or mul.kwargs or len(mul.users) != 1 \
            or len(mul.args) != 2 or not all(isinstance(a, Node) for a in mul.args):
        return None
    for view, att in (mul.args, mul.args[::-1]):
        if view.op != "call_function" or view.target not in _VIEWS or not isinstance(view.args[0], Node):
            continue
        matrix, h3, a, m = view.args[0], tensor_val(view), tensor_val(att), tensor_val(view.args[0])
        found = linear_map(matrix)
        if found is None or h3 is None or a is None or m is None or h3.dim() != 3 or dims not in ([-1], [2]):
            continue
        heads, channels = h3.shape[1], h3.shape[2]
        weight = tensor_val(found[1])
        if weight.shape[0] != heads * channels or m.dim() != 2 or m.shape[1] != heads * channels:
            continue
        if att.op != "placeholder" or tuple(a.shape) not in ((1, heads, channels), (heads, channels)) \
                or a.dtype != h3.dtype or a.device != h3.device or h3.dtype not in (torch.float32, torch.float64):
            continue
        return matrix, view, att
    return None


def fold_score_projections(gm: GraphModule, settings) -> list:
    """Fold the matched projections the ``score_fold`` setting of ``settings`` (``config.snapshot()``) allows
    (module docstring) into their GEMMs, in place. Returns one ``{"source", "weight", "vectors", "columns",
    "scores_only"}`` per rewritten GEMM."""
    mode = settings["score_fold"]
    if mode == "0":
        return []
    found = defaultdict(list)
    for node in gm.graph.nodes:
        match = _projection(node)
        if match is not None:
            found[match[0]].append((node, match[2]))
    folded = []
    for matrix, sums in found.items():
        scores_only = _read_only_by(matrix, {node.args[0] for node, _ in sums})
        if mode == "epilogue":
            if not scores_only and _epilogue_takes(matrix, sums):
                folded.append(_epilogue(gm, matrix, sums))
            continue
        if not scores_only and mode == "auto":
            continue
        folded.append(_fold(gm, matrix, sums, scores_only, pad=mode == "1"))
    if folded:
        gm.graph.lint()
        gm.recompile()
    return folded


def _read_only_by(matrix: Node, muls: set) -> bool:
    """Whether every read of ``matrix`` goes through a view read only by the products in ``muls``."""
    return all(view.op == "call_function" and view.target in _VIEWS and set(view.users) <= muls
               for view in matrix.users)


def _fold(gm: GraphModule, matrix: Node, sums: list, scores_only: bool, pad: bool) -> dict:
    """``matrix``'s GEMM with the projections of ``sums`` as more columns (only those, when ``scores_only``)."""
    x, weight, bias = linear_map(matrix)
    rows, features = tensor_val(weight).shape
    heads = tensor_val(sums[0][0]).shape[1]
    channels = rows // heads
    kept = 0 if scores_only else rows
    width = kept + heads * len(sums)
    padding = (-width) % COLUMN_MULTIPLE if pad and not scores_only else 0
    like = tensor_val(weight)
    with gm.graph.inserting_before(matrix):
        per_head = call_node(gm, aten.view.default, (weight, [heads, channels, features]))
        pieces, bias_pieces = ([] if scores_only else [weight]), ([] if scores_only else [bias])
        for _, att in sums:
            column = call_node(gm, aten.view.default, (att, [heads, channels, 1]))
            pieces.append(call_node(gm, aten.sum.dim_IntList, (call_node(gm, aten.mul.Tensor, (per_head, column)), [1])))
            if bias is not None:
                flat = call_node(gm, aten.view.default, (att, [heads, channels]))
                by_head = call_node(gm, aten.view.default, (bias, [heads, channels]))
                bias_pieces.append(call_node(gm, aten.sum.dim_IntList, (call_node(gm, aten.mul.Tensor, (by_head, flat)), [1])))
        if padding:
            pieces.append(_zeros(gm, [padding, features], like))
            bias_pieces.append(_zeros(gm, [padding], like))
        stacked = pieces[0] if len(pieces) == 1 else call_node(gm, aten.cat.default, (pieces, 0))
        stacked_t = call_node(gm, aten.t.default, (stacked,))
        if bias is None:
            out = call_node(gm, aten.mm.default, (x, stacked_t))
        else:
            bias_all = bias_pieces[0] if len(bias_pieces) == 1 else call_node(gm, aten.cat.default, (bias_pieces, 0))
            out = call_node(gm, aten.addmm.default, (bias_all, x, stacked_t))
        out.meta["stack_trace"] = matrix.meta.get("stack_trace")
        if not scores_only:
            features_view = call_node(gm, aten.slice.Tensor, (out, 1, 0, rows))
            features_view.meta.update({k: v for k, v in matrix.meta.items() if k != "val"})
            matrix.replace_all_uses_with(features_view)
    start = kept
    for node, _ in sums:
        with gm.graph.inserting_after(out):
            scores = out if width == heads else call_node(gm, aten.slice.Tensor, (out, 1, start, start + heads))
        if scores is not out:
            scores.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        mul = node.args[0]
        node.replace_all_uses_with(scores)
        gm.graph.erase_node(node)
        gm.graph.erase_node(mul)
        start += heads
    for view in list(matrix.users):  # scores only: the views the products read, now read by nothing
        gm.graph.erase_node(view)
    gm.graph.erase_node(matrix)
    return {"source": source_of(sums[0][0]), "weight": parameter_name(weight),
            "vectors": [parameter_name(att) for _, att in sums], "columns": width + padding,
            "scores_only": scores_only}


def _zeros(gm: GraphModule, shape: list, like) -> Node:
    """A ``zeros`` node of ``like``'s dtype and device, its fake value made under ``like``'s fake mode."""
    node = gm.graph.call_function(aten.zeros.default, (shape,), {"dtype": like.dtype, "device": like.device})
    with getattr(like, "fake_mode", None) or contextlib.nullcontext():
        node.meta["val"] = torch.zeros(shape, dtype=like.dtype, device=like.device)
    return node


def _epilogue_takes(matrix: Node, sums: list) -> bool:
    """Whether ``gnn_io::linear_scores`` runs ``matrix`` and its projections ``sums`` in the 3xTF32 kernel with the
    score epilogue at the graph's sizes (fixed sizes, ``head_scores.runs_fused``). Elsewhere Inductor's own
    reduction is as good."""
    x, weight, _ = linear_map(matrix)
    xv, wv = tensor_val(x), tensor_val(weight)
    sizes = (*xv.shape, *wv.shape)
    if not all(isinstance(size, int) for size in sizes):
        return False
    heads = tensor_val(sums[0][0]).shape[1]
    return head_scores.runs_fused(xv.shape[0], xv.shape[1], wv.shape[0], len(sums), heads, xv.dtype,
                                  xv.device.type)


def _epilogue(gm: GraphModule, matrix: Node, sums: list) -> dict:
    """``matrix``'s GEMM and the projections of ``sums`` as one ``gnn_io::linear_scores`` call."""
    x, weight, bias = linear_map(matrix)
    heads = tensor_val(sums[0][0]).shape[1]
    channels = tensor_val(weight).shape[0] // heads
    with gm.graph.inserting_before(matrix):
        vectors = [call_node(gm, aten.view.default, (att, [1, heads, channels])) for _, att in sums]
        stacked = vectors[0] if len(vectors) == 1 else call_node(gm, aten.cat.default, (vectors, 0))
        fused = call_node(gm, head_scores.linear_scores._opoverload, (x, weight, bias, stacked))
        fused.meta["stack_trace"] = matrix.meta.get("stack_trace")
        features = call_node(gm, operator.getitem, (fused, 0))
        scores = call_node(gm, operator.getitem, (fused, 1))
        features.meta.update({k: v for k, v in matrix.meta.items() if k != "val"})
    matrix.replace_all_uses_with(features)
    gm.graph.erase_node(matrix)
    for r, (node, _) in enumerate(sums):
        with gm.graph.inserting_after(scores):
            score = call_node(gm, aten.select.int, (scores, 1, r))
        score.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        mul = node.args[0]
        node.replace_all_uses_with(score)
        gm.graph.erase_node(node)
        gm.graph.erase_node(mul)
    return {"source": source_of(sums[0][0]), "weight": parameter_name(weight),
            "vectors": [parameter_name(att) for _, att in sums], "columns": heads * channels,
            "scores_only": False, "epilogue": True}
