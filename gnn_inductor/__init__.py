"""gnn_inductor: a torch.compile backend that rewrites GNN message passing into IO-aware ops.

Use ``torch.compile(model, backend="gnn_io")``; read what happened with :func:`report`; guard your
own models with :func:`gnn_inductor.testing.check_rewrites`.
"""
from gnn_inductor.backend import gnn_io
from gnn_inductor.logs import set_logs
from gnn_inductor.rewrite_report import report, write_html

__all__ = ["gnn_io", "report", "set_logs", "write_html"]
__version__ = "0.1.0"
