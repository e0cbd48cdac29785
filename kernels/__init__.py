"""Kernel families of the gnn_io backend: ``runtime/`` (what every family shares) and one folder per family
(``attention/``, ``gather_scatter/``, ``spmm/``, ``dense/``), each with its ``torch.ops.gnn_io.*`` operators,
their CPU references, fake implementations and autograd formulas, and the GPU kernels behind them.
Importing this package registers every op.
"""
from __future__ import annotations

from gnn_inductor.kernels.attention import edge_softmax, head_scores  # noqa: F401  (registration)
from gnn_inductor.kernels.attention import op as attention_op
from gnn_inductor.kernels.dense import ops as dense_ops  # noqa: F401  (registration)
from gnn_inductor.kernels.dense import segment  # noqa: F401  (registration)
from gnn_inductor.kernels.gather_scatter import op as gather_scatter_op
from gnn_inductor.kernels.spmm import op as spmm_op
from gnn_inductor.plan import csr  # noqa: F401  (registration)


def kernel_for(op: str, device_type: str, details: dict | None = None) -> str:
    """Which kernel an op runs on a device type (for the rewrite report)."""
    module = {"gnn_io.spmm": spmm_op, "gnn_io.gather_scatter": gather_scatter_op,
              "gnn_io.gather_scatter_multi": gather_scatter_op, "gnn_io.edge_softmax": edge_softmax,
              "gnn_io.attention": attention_op}[op]
    if hasattr(module, "kernel_name"):
        return module.kernel_name(device_type, details or {})
    return module.KERNEL.get(device_type, module.KERNEL["cpu"])
