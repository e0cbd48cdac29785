"""Pattern families of the gnn_io backend, one file each, applied in this order: the edge
softmax first (attention is built on it), then the most specific aggregation (attention, SpMM),
then the general gather-scatter that takes every remaining aggregation it can honour."""
from gnn_inductor.patterns import attention, edge_softmax, gather_scatter, spmm

ORDER = (edge_softmax.PATTERN, attention.PATTERN, spmm.PATTERN, gather_scatter.PATTERN)
