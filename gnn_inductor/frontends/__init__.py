"""Frontends: libraries whose message passing the ``gnn_io`` backend learns to see through.

PyG needs none (its message passing is plain torch code). :mod:`gnn_inductor.frontends.dgl` gives
Dynamo a traceable view of DGL's; see docs/dgl.md.
"""
