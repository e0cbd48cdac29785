"""Python functions in ``update_all`` (gnn_inductor/frontends/dgl_udf.py): reduce functions that only reduce
their mailbox over its degree dimension are captured without DGL's degree buckets and rewritten; any other runs
DGL's own code; ``apply_node_func`` is DGL's apply phase. Each model is compared with eager DGL (outputs and
every gradient) on the shared graph (isolated nodes, self loops, duplicate edges, a hub)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.frontends.dgl.conftest import load_dgl

dgl = load_dgl()
from dgl import function as fn

from gnn_inductor import rewrite_report
from gnn_inductor.frontends import dgl_udf
from gnn_inductor.testing import check_rewrites, tolerance
from tests.frontends.dgl.test_dgl_zoo import OUT_CHANNELS, only, reductions
from tests.tiers import tiered, tiered_at

# reduce functions that reduce their mailbox (every spelling of each kind), with what they become
REDUCING = {
    "torch_sum": (lambda nodes: {"out": torch.sum(nodes.mailbox["m"], dim=1)}, "spmm", "sum"),
    "method_sum": (lambda nodes: {"out": nodes.mailbox["m"].sum(1)}, "spmm", "sum"),
    "torch_mean": (lambda nodes: {"out": torch.mean(nodes.mailbox["m"], 1)}, "spmm", "mean"),
    "max_values": (lambda nodes: {"out": nodes.mailbox["m"].max(dim=1).values}, "gather_scatter", "max"),
    "torch_max_0": (lambda nodes: {"out": torch.max(nodes.mailbox["m"], 1)[0]}, "gather_scatter", "max"),
    "amin": (lambda nodes: {"out": torch.amin(nodes.mailbox["m"], dim=1)}, "gather_scatter", "min"),
    "then_node_math": (lambda nodes: {"out": F.relu(nodes.data["h"] + nodes.mailbox["m"].sum(1)) * 2},
                       "spmm", "sum"),
}

# reduce functions that need DGL's buckets: declined, DGL's own code runs
NOT_REDUCING = {
    "degree": lambda nodes: {"out": nodes.mailbox["m"].sum(1) / nodes.mailbox["m"].shape[1]},
    "argmax": lambda nodes: {"out": nodes.data["h"] * torch.max(nodes.mailbox["m"], 1)[1]},
    "first_message": lambda nodes: {"out": nodes.mailbox["m"][:, 0]},
    "keepdim": lambda nodes: {"out": nodes.mailbox["m"].sum(1, keepdim=True).squeeze(1)},
    "two_kinds": lambda nodes: {"out": nodes.mailbox["m"].sum(1) + nodes.mailbox["m"].max(1).values},
    "node_ids": lambda nodes: {"out": nodes.mailbox["m"].sum(1) * nodes.nodes().unsqueeze(-1)},
    "control_flow": lambda nodes: {"out": nodes.mailbox["m"].sum(1) if nodes.mailbox["m"].sum() > 0 else
                                   nodes.mailbox["m"].mean(1)},
}


class ReduceUDF(nn.Module):
    def __init__(self, in_channels: int, reduce):
        super().__init__()
        self.lin = nn.Linear(in_channels, OUT_CHANNELS)
        self.reduce = reduce

    def forward(self, graph, x):
        with graph.local_scope():
            graph.ndata["h"] = self.lin(x)
            graph.update_all(fn.copy_u("h", "m"), self.reduce)
            return graph.ndata["out"] + graph.in_degrees().unsqueeze(-1)


@pytest.mark.parametrize("name", tiered(list(REDUCING), ["method_sum", "torch_max_0", "then_node_math"]))
def test_reducing_udf_is_rewritten(graph, dgl_graph, name):
    reduce, family, kind = REDUCING[name]
    torch.manual_seed(0)
    result = check_rewrites(ReduceUDF(graph.in_channels, reduce), dgl_graph, graph.x, expect=only(**{family: 1}))
    assert reductions(result, family) == [kind]


@pytest.mark.parametrize("name", tiered(list(NOT_REDUCING), ["degree", "argmax", "two_kinds"]))
def test_other_udf_runs_dgl(graph, dgl_graph, name):
    """DGL's own code runs, and the report says where and why."""
    rewrite_report.clear()
    torch.manual_seed(0)
    check_rewrites(ReduceUDF(graph.in_channels, NOT_REDUCING[name]), dgl_graph, graph.x, expect=only())
    text = rewrite_report.format_text()
    assert "DGL message passing run by DGL's own code" in text and "reduce function <lambda> at " in text
    declines = rewrite_report.as_json()["dgl_declines"]
    assert any(d["where"].startswith("reduce function") and d["why"] == dgl_udf.analyse(
        NOT_REDUCING[name], ("m",), ("h",)) for d in declines), declines
    assert any(d["where"] == "DGLGraph.update_all" for d in declines)


class ParametrisedReduce(nn.Module):
    """A reduce function with a parameter and a Python message function: ``relu(max_j relu(h_j + e_ij) W)``."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.lin = nn.Linear(in_channels, in_channels)
        self.weight = nn.Parameter(torch.randn(in_channels, OUT_CHANNELS) / in_channels ** 0.5)

    def reduce(self, nodes):
        return {"out": F.relu(nodes.mailbox["m"].max(1).values @ self.weight)}

    def forward(self, graph, x, edge_attr):
        with graph.local_scope():
            graph.ndata["h"] = self.lin(x)
            graph.edata["e"] = edge_attr
            graph.update_all(lambda edges: {"m": F.relu(edges.src["h"] + edges.data["e"])}, self.reduce)
            return graph.ndata["out"]


def test_udf_message_and_reduce_with_a_parameter(graph, dgl_graph):
    torch.manual_seed(0)
    result = check_rewrites(ParametrisedReduce(graph.in_channels), dgl_graph, graph.x, graph.edge_attr_x,
                            expect=only(gather_scatter=1))
    assert reductions(result, "gather_scatter") == ["max"]


class ClosureReduce(nn.Module):
    """A reduce lambda written inside ``forward``, closing over a parameter and a local tensor."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.lin = nn.Linear(in_channels, OUT_CHANNELS)
        self.scale = nn.Parameter(torch.rand(OUT_CHANNELS) + 0.5)

    def forward(self, graph, x):
        with graph.local_scope():
            graph.ndata["h"] = self.lin(x)
            scale, shift = self.scale, x[0, :OUT_CHANNELS].tanh()  # per feature: broadcasts over DGL's buckets
            graph.update_all(fn.copy_u("h", "m"),
                             lambda nodes: {"out": torch.mean(nodes.mailbox["m"], dim=1) * scale + shift})
            return graph.ndata["out"]


def test_reduce_lambda_with_a_closure(graph, dgl_graph):
    torch.manual_seed(0)
    result = check_rewrites(ClosureReduce(graph.in_channels), dgl_graph, graph.x, expect=only(spmm=1))
    assert reductions(result, "spmm") == ["mean"]


class ApplyNodes(ReduceUDF):
    """``update_all(message, reduce, apply_node_func)``: DGL writes back only what the apply function returns."""

    def forward(self, graph, x):
        with graph.local_scope():
            graph.ndata["h"] = self.lin(x)
            graph.update_all(fn.copy_u("h", "m"), self.reduce,
                             lambda nodes: {"a": nodes.data["r"] + 1, "b": F.elu(nodes.data["r"]) * nodes.data["h"]})
            assert "r" not in graph.ndata
            return graph.ndata["a"], graph.ndata["b"]


@pytest.mark.parametrize("reduce, family", tiered_at([
    (fn.sum("m", "r"), "spmm"),
    # DGL's max leaves -inf in rows without messages for the apply function (there "b" = elu(-inf) h = -h, not
    # 0) and zeroes only the first output's infinities ("a" = -inf + 1 becomes 0)
    (fn.max("m", "r"), "gather_scatter"),
    (lambda nodes: {"r": nodes.mailbox["m"].mean(1)}, "spmm"),
], [1]), ids=["builtin_sum", "builtin_max", "udf_mean"])
def test_apply_node_func(graph, dgl_graph, reduce, family):
    torch.manual_seed(0)
    check_rewrites(ApplyNodes(graph.in_channels, reduce), dgl_graph, graph.x, expect=only(**{family: 1}))


def test_analyse_names_each_field_and_says_why_not():
    """The analysis alone: the kind of each mailbox field, fields the function does not read left out, and a
    reason for every declined function."""
    def reduce(nodes):
        return {"a": nodes.mailbox["m"].sum(1) + torch.sum(nodes.mailbox["m"], 1), "b": nodes.data["h"]}

    assert dgl_udf.analyse(reduce, ("m", "unused"), ("h",)) == (("m", "sum"),)
    for name, func in NOT_REDUCING.items():
        reason = dgl_udf.analyse(func, ("m",), ("h",))
        assert isinstance(reason, str) and reason, name
    assert "not a dict" in dgl_udf.analyse(lambda nodes: nodes.mailbox["m"].sum(1), ("m",), ())


def test_another_reduce_function_recompiles(graph, dgl_graph):
    """The analysis is a constant of the captured graph: a model given another reduce function (a reducing one of
    another kind, then one that reads the degree) gets a new graph and the right result each time."""
    model = ReduceUDF(graph.in_channels, REDUCING["method_sum"][0])
    compiled = torch.compile(model, backend="gnn_io")
    for reduce in (REDUCING["method_sum"][0], REDUCING["max_values"][0], NOT_REDUCING["degree"]):
        model.reduce = reduce
        torch.testing.assert_close(compiled(dgl_graph, graph.x), model(dgl_graph, graph.x), **tolerance(torch.float32))
