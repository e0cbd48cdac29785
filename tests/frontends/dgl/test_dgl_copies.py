"""Graphs copied by DGL (``to``, ``cpu``, ``clone``, ``int``/``long``, unpickling) get a new graph index
without ``_init``: the frontend caches their structure too, so a model compiled on the copy is rewritten
(gnn_inductor/frontends/dgl.py, ``_COPIERS``)."""
import pickle

import pytest
import torch

from tests.frontends.dgl.conftest import load_dgl

dgl = load_dgl()
from dgl.nn.pytorch import GATConv, GraphConv  # noqa: E402

from gnn_inductor.frontends.dgl import _STRUCTURE  # noqa: E402
from gnn_inductor.testing import check_rewrites  # noqa: E402
from tests.frontends.dgl.test_dgl_zoo import OUT_CHANNELS, only  # noqa: E402
from tests.tiers import tiered

COPIES = {
    "to_str": lambda g: g.to("cpu"),  # DGL copies: its torch.device is not equal to the string
    "to_device": lambda g: g.to(torch.device("cpu")),
    "cpu": lambda g: g.cpu(),
    "clone": lambda g: g.clone(),
    "int": lambda g: g.int(),
    "long": lambda g: g.int().long(),
    "pickle": lambda g: pickle.loads(pickle.dumps(g)),
}


@pytest.mark.parametrize("copy", COPIES)
def test_copy_has_the_structure(graph, dgl_graph, copy):
    copied = COPIES[copy](dgl_graph)
    s = getattr(copied._graph, _STRUCTURE, None)
    assert s is not None
    src, dst = graph.edge_index
    assert torch.equal(s.src, src) and torch.equal(s.dst, dst)
    assert s.src.dtype == torch.int64 and s.device == copied.device
    assert (s.num_src, s.num_dst) == (graph.num_nodes, graph.num_nodes)


@pytest.mark.parametrize("copy", tiered(["to_str", "to_device", "cpu", "clone", "int"], ["int"]))
def test_graph_conv_on_a_copy(graph, dgl_graph, copy):
    torch.manual_seed(0)
    model = GraphConv(graph.in_channels, OUT_CHANNELS, allow_zero_in_degree=True)
    check_rewrites(model, COPIES[copy](dgl_graph), graph.x, expect=only(spmm=1))


@pytest.mark.parametrize("copy", tiered(["to_str", "to_device", "cpu"], ["to_str"]))
def test_gat_conv_on_a_copy(graph, dgl_graph, copy):
    torch.manual_seed(0)
    model = GATConv(graph.in_channels, 4, 2, allow_zero_in_degree=True).train()
    check_rewrites(model, COPIES[copy](dgl_graph), graph.x, expect=only(attention=1))
