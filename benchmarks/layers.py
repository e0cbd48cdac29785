"""The layers the benchmark harness times (:func:`make_layer`): PyG convolutions by name, ``NAME:DEPTH`` stacks of
them, edge features made for the graph they run on, and the dense floor (a layer's GEMMs alone)."""
from __future__ import annotations

import torch

HEADS = 4
EDGE_DIM = 16
ATTENTION_DROPOUT = 0.1  # the "_drop" layers: PyG's dropout on the attention weights, in training mode
# PNAConv's degree histogram (its scalers' average degree): fixed, so the layer does not depend on the graph it
# is timed on; every bucket from degree 1 to 32 holds as many nodes
PNA_DEGREE_HISTOGRAM = torch.tensor([0] + [1] * 32)


# every layer make_layer builds (``--layers all``)
LAYERS = ("gcn", "sage_mean", "sage_max", "gin", "graphconv", "graphconv_max", "sage_multi", "pna", "general_max",
          "edge_conv", "gat", "gat_edge", "gat_edge64", "gatv2", "transformer", "gat_drop", "gatv2_drop",
          "transformer_drop")


def make_layer(name: str, features: int) -> torch.nn.Module:
    """The layer ``name`` with ``features`` inputs and outputs; ``NAME:DEPTH`` (``gcn:3``) is a model of
    ``DEPTH`` such layers with ReLU between them (:class:`Stack`)."""
    from torch_geometric import nn as pyg

    if ":" in name:
        name, depth = name.split(":")
        return Stack([make_layer(name, features) for _ in range(int(depth))])
    f = features
    return {
        "gcn": lambda: pyg.GCNConv(f, f),
        "sage_mean": lambda: pyg.SAGEConv(f, f, aggr="mean"),
        "sage_max": lambda: pyg.SAGEConv(f, f, aggr="max"),
        "gin": lambda: pyg.GINConv(torch.nn.Linear(f, f)),
        "graphconv": lambda: pyg.GraphConv(f, f, aggr="add"),
        "graphconv_max": lambda: pyg.GraphConv(f, f, aggr="max"),
        # several reductions over the same messages: one gnn_io::gather_scatter_multi pass (docs/reductions.md)
        "sage_multi": lambda: pyg.SAGEConv(f, f, aggr=["mean", "max", "min"]),
        "pna": lambda: pyg.PNAConv(f, f, aggregators=["mean", "min", "max", "std"],
                                   scalers=["identity", "amplification", "attenuation"], deg=PNA_DEGREE_HISTOGRAM,
                                   towers=1),
        # a linear layer on gathered rows (gnn_inductor/passes/gather_linear.py moves it before the gather)
        "general_max": lambda: pyg.GeneralConv(f, f, aggr="max"),
        "edge_conv": lambda: pyg.EdgeConv(torch.nn.Linear(2 * f, f), aggr="max"),
        "gat": lambda: pyg.GATConv(f, f // HEADS, heads=HEADS),
        # edge features (EDGE_DIM per edge, seeded, attached for the graph): lin_edge's scores (score_fold.py)
        "gat_edge": lambda: WithEdgeFeatures(pyg.GATConv(f, f // HEADS, heads=HEADS, edge_dim=EDGE_DIM)),
        "gat_edge64": lambda: WithEdgeFeatures(pyg.GATConv(f, f // HEADS, heads=HEADS, edge_dim=64), 64),
        "gatv2": lambda: pyg.GATv2Conv(f, f // HEADS, heads=HEADS),
        "transformer": lambda: pyg.TransformerConv(f, f // HEADS, heads=HEADS),
        # attention dropout (modules are in training mode here): gnn_io draws the mask inside its kernels
        "gat_drop": lambda: pyg.GATConv(f, f // HEADS, heads=HEADS, dropout=ATTENTION_DROPOUT),
        "gatv2_drop": lambda: pyg.GATv2Conv(f, f // HEADS, heads=HEADS, dropout=ATTENTION_DROPOUT),
        "transformer_drop": lambda: pyg.TransformerConv(f, f // HEADS, heads=HEADS, dropout=ATTENTION_DROPOUT),
    }[name]()


class Stack(torch.nn.Module):
    """A full-graph model: the layers one after another on the same graph, ReLU between them."""

    def __init__(self, layers: list):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x, edge_index):
        for i, layer in enumerate(self.layers):
            x = layer(x, edge_index) if i == 0 else layer(torch.relu(x), edge_index)
        return x


def layer_and_depth(name: str) -> tuple:
    """``("gcn", 3)`` for ``gcn:3``, ``("gcn", 1)`` for ``gcn``."""
    base, _, depth = name.partition(":")
    return base, int(depth or 1)


class WithEdgeFeatures(torch.nn.Module):
    """``conv(x, edge_index, edge_attr)`` with seeded random ``edge_attr`` (``[E, dim]``, a buffer in the
    layer's dtype and device) made for the graph by :func:`with_graph`; every mode gets the same features."""

    def __init__(self, conv: torch.nn.Module, dim: int = EDGE_DIM):
        super().__init__()
        self.conv, self.dim = conv, dim
        self.register_buffer("edge_attr", None)

    def attach(self, edge_index: torch.Tensor) -> None:
        weight = next(self.conv.parameters())
        features = torch.randn(edge_index.shape[1], self.dim, generator=torch.Generator().manual_seed(1))
        self.register_buffer("edge_attr", features.to(device=edge_index.device, dtype=weight.dtype))

    def forward(self, x, edge_index):
        if self.edge_attr is None or self.edge_attr.shape[0] != edge_index.shape[1]:
            raise ValueError("WithEdgeFeatures: call layers.with_graph(layer, edge_index) for this graph first")
        return self.conv(x, edge_index, self.edge_attr)


def with_graph(layer: torch.nn.Module, edge_index: torch.Tensor) -> torch.nn.Module:
    """``layer``, given what it needs of the graph ``edge_index`` (edge features for the ``_edge`` layers)."""
    for module in layer.modules():
        if isinstance(module, WithEdgeFeatures):
            module.attach(edge_index)
    return layer


def is_random(layer_name: str) -> bool:
    """Layers whose output depends on a random draw (dropout): each mode draws its own mask, so their outputs
    are not compared."""
    return layer_and_depth(layer_name)[0].endswith("_drop")


class DenseFloor(torch.nn.Module):
    """The layer's dense work alone (mode ``dense_floor``): each of its linear maps applied to the node
    features, summed, with no aggregation. Forward+backward runs the same GEMMs in the same precision as
    the layer (one per map forward, two backward), so no implementation of the layer can beat it; it is
    the measured part of a target that message passing cannot touch. With several maps the sum adds
    ``k - 1`` elementwise adds (SAGEConv's own ``lin_l(.) + lin_r(x)`` is one). A map of ``c x F`` inputs (SAGEConv
    over several aggregations, PNA's maps of ``[x_i, x_j]``) takes ``c`` copies of the features side by side."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        from torch_geometric.nn.dense.linear import Linear

        self.maps = torch.nn.ModuleList(m for m in layer.modules() if isinstance(m, (torch.nn.Linear, Linear)))

    def forward(self, x, edge_index):
        return sum(m(x.repeat(1, self._inputs(m) // x.shape[1])) for m in self.maps)

    @staticmethod
    def _inputs(linear) -> int:
        return linear.in_features if isinstance(linear, torch.nn.Linear) else linear.in_channels
