"""GAT's attention-vector projections made in the feature GEMM's kernel (``gnn_io::linear_scores``).

PyG's GATConv (DGL's likewise) projects the node features and then reduces the projection against each attention
vector::

    h = mm(x, t(W)).view(N, H, C)
    alpha_src = (h * att_src).sum(-1)          # [N, H]
    alpha_dst = (h * att_dst).sum(-1)

Each reduction reads all of ``h`` again (0.5 GiB at 2^20 nodes, 128 features, fp32). Its backward reads ``h`` once
more for the attention vector's gradient, and adds ``g * att`` into ``h``'s gradient, a read and a write of it.

The pass replaces the GEMM and its reductions by one ``gnn_io::linear_scores`` call (kernels/attention/head_scores.py):
the features and every projection of them, the scores reduced from the 3xTF32 GEMM's accumulator tiles and their
gradients taken inside the backward GEMMs. It does so wherever that kernel runs at the graph's sizes (float32, TF32
off, CUDA, fixed sizes of a tall product, heads of a power-of-two width: ``_epilogue_takes``) and something besides
the projections reads the features; elsewhere the graph keeps its reductions for Inductor. ``GNN_IO_SCORE_FOLD=0``
turns the pass off.

The epilogue measured 1.02x on GATConv's step (H100, RMAT 2^20 with 15.4M edges, 128 features, 4 heads, fp32,
10.50 -> 10.26 ms and 10.59 -> 10.41, 10 interleaved rounds each, all won). Folding the projections as more
columns of the GEMM instead (``Wa[h] = sum_c a[h, c] W[h C + c, :]``) measured slower on the same setup (0.92x,
its 144-column products 1.06 ms each against 0.60 for 128 columns), and was removed.

Matched: ``sum(mul(view(M, [N, H, C]), A), [-1])`` (either operand order), ``M`` a linear map of graph-input
weights (``linear_fusion.linear_map``) whose weight has ``H C`` rows, ``A`` a graph input of ``H C`` elements shaped
``[1, H, C]`` or ``[H, C]`` of ``M``'s dtype (float32 or float64) and device, the product read by the sum alone.
Every such sum of one ``M`` joins its GEMM.
"""
from __future__ import annotations

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
    """Make the matched projections with their GEMM (module docstring) where the ``score_fold`` setting of
    ``settings`` (``config.snapshot()``) is on, in place. Returns one ``{"source", "weight", "vectors", "columns"}``
    per rewritten GEMM."""
    if not settings["score_fold"]:
        return []
    found = defaultdict(list)
    for node in gm.graph.nodes:
        match = _projection(node)
        if match is not None:
            found[match[0]].append((node, match[2]))
    folded = [_epilogue(gm, matrix, sums) for matrix, sums in found.items()
              if not _read_only_by(matrix, {node.args[0] for node, _ in sums}) and _epilogue_takes(matrix, sums)]
    if folded:
        gm.graph.lint()
        gm.recompile()
    return folded


def _read_only_by(matrix: Node, muls: set) -> bool:
    """Whether every read of ``matrix`` goes through a view read only by the products in ``muls``."""
    return all(view.op == "call_function" and view.target in _VIEWS and set(view.users) <= muls
               for view in matrix.users)


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
            "vectors": [parameter_name(att) for _, att in sums], "columns": heads * channels}
