"""PyG frontend: the PyG code Dynamo cannot trace, given a traceable path while compiling.

PyG's message passing is plain torch code and needs nothing. One piece around it does: ``HeteroLinear`` (the
per-relation key and value maps of ``HGTConv``), where pyg-lib's ``segment_matmul`` is not installed, multiplies
segment by segment in ``forward_naive``, slicing ``x`` by the values of ``type_ptr``. Dynamo reads those values with
``Tensor.item()``, a graph break: the layer compiles in pieces, its attention never meets its edge softmax in one
graph, and a later call recompiles with symbolic sizes. While Dynamo traces (``torch.compiler.is_compiling()``)
and this frontend is on, ``forward_naive`` is one op, ``gnn_io::segment_matmul`` (kernels/dense/segment.py): the
same products, opaque to the compiler. Outside compilation it is PyG's own.

``RGCNConv`` asks, where the user left ``torch_geometric.backend.use_segment_matmul`` unset, a heuristic whether
pyg-lib's ``segment_matmul`` would pay, from ``int(segment_count.max())``: a read of a device value on the host, a
sync and a graph break per layer and step. Its answer is never used while compiling (that path requires
``not is_compiling()``), so while Dynamo traces the layer the frontend sets the switch to False around PyG's own
``forward`` and back to None after it: no sync, and the layer in its model's graph. ogbn-mag-shaped mini-batches,
H200: docs/benchmarks/hetero.md.

:func:`install_when_imported` patches PyG's class once PyG is imported (now, or right after its import); the
backend calls it at import. ``with plain_pyg():`` turns the traceable path off (what ``torch.compile`` without
gnn_inductor sees, for the benchmarks' baselines); Dynamo guards on the switch, so a model compiled under it
recompiles outside it.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import sys

import torch

from gnn_inductor.frontends.dgl_import import call_after_import
from gnn_inductor.kernels.dense import segment  # noqa: F401  (registers torch.ops.gnn_io.segment_matmul)

_STATE = {"on": True, "installed": False}


def _traceable(original):
    @functools.wraps(original)
    def forward_naive(self, x, type_ptr):
        if torch.compiler.is_compiling() and _STATE["on"]:
            return torch.ops.gnn_io.segment_matmul(x, type_ptr, self.weight)
        return original(self, x, type_ptr)

    forward_naive._gnn_io_original = original
    return forward_naive


def _without_heuristic(original):
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        backend = sys.modules["torch_geometric.backend"]
        if torch.compiler.is_compiling() and _STATE["on"] and backend.use_segment_matmul is None:
            # no try/finally: Dynamo traces a graph break inside one as a break at the call, and replays the two
            # stores of the switch as one (None) after the graph
            backend.use_segment_matmul = False
            out = original(self, *args, **kwargs)
            backend.use_segment_matmul = None
            return out
        return original(self, *args, **kwargs)

    forward._gnn_io_original = original
    return forward


def install() -> bool:
    """Give ``HeteroLinear.forward_naive`` and ``RGCNConv.forward`` their traceable paths, once, if PyG is imported.
    True when they are in place."""
    if _STATE["installed"]:
        return True
    if "torch_geometric" not in sys.modules:
        return False
    linear = importlib.import_module("torch_geometric.nn.dense.linear")
    linear.HeteroLinear.forward_naive = _traceable(linear.HeteroLinear.forward_naive)
    rgcn = importlib.import_module("torch_geometric.nn.conv.rgcn_conv").RGCNConv
    rgcn.forward = _without_heuristic(rgcn.forward)
    _STATE["installed"] = True
    return True


@contextlib.contextmanager
def plain_pyg():
    """PyG's own code while compiling too, inside the block."""
    before = _STATE["on"]
    _STATE["on"] = False
    try:
        yield
    finally:
        _STATE["on"] = before


def install_when_imported() -> None:
    """:func:`install` now if PyG is imported, else right after ``import torch_geometric`` finishes."""
    call_after_import("torch_geometric", install)
