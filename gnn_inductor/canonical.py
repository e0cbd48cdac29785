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

import torch
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx


def fake_inputs(gm: GraphModule) -> list:
    """Dynamo's fake example value of each placeholder."""
    return [node.meta["example_value"] for node in gm.graph.nodes if node.op == "placeholder"]


def canonicalize(gm: GraphModule) -> GraphModule:
    def run(*args):
        return torch.fx.Interpreter(gm).run(*args)

    with fx_traceback.preserve_node_meta():
        aten_gm = make_fx(torch.func.functionalize(run, remove="mutations"), tracing_mode="symbolic",
                          _allow_non_fake_inputs=False)(*fake_inputs(gm))
    return aten_gm


def fake_mode_of(aten_gm: GraphModule):
    """The fake mode of the canonical graph's values (shares Dynamo's ShapeEnv)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in aten_gm.graph.nodes if n.op == "placeholder"])
