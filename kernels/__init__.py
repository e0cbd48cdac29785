"""Kernel families of the gnn_io backend.

One file per family. Each file holds the CPU reference (exact, CSR/segment based), the
``torch.ops.gnn_io.*`` custom op with its fake implementation and autograd formula, and is the
place where the GPU issues add their Triton or vendor-library kernels behind the same op.
Importing this package registers every op.
"""
from gnn_inductor.kernels import csr, spmm, gather_scatter, edge_softmax, attention  # noqa: F401
