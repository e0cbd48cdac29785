"""Pattern families of the gnn_io backend, one file each. Importing this package registers them into the pattern
pass (``gnn_inductor.passes.patterns.register_pattern``) with their priorities: the edge softmax first (attention is built
on it), then the most specific aggregations (attention, SpMM), then the general gather-scatter that takes every
remaining aggregation it can honour."""
from gnn_inductor.patterns import attention, edge_softmax, gather_scatter, spmm  # noqa: F401  (registration)
