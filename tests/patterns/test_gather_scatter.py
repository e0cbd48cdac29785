"""When gather-scatter calls merge into one ``gnn_io::gather_scatter_multi`` (patterns/gather_scatter.py,
``merge``), and when they stay apart."""
import torch
from torch_geometric.utils import scatter

from gnn_inductor.testing import check_rewrites, random_graph

N = 24


def _graph():
    generator = torch.Generator().manual_seed(0)
    edge_index = random_graph(N, 80, seed=1, hub_degree=30)
    return (torch.randn(N, 6, generator=generator), edge_index,
            torch.randn(edge_index.shape[1], 6, generator=generator))


class Reductions(torch.nn.Module):
    """``message(h_j, h_i, e)`` reduced by destination for each ``(message, reduce)`` pair, concatenated; each
    message is computed once, as PyG's ``propagate`` does."""

    def __init__(self, *pairs):
        super().__init__()
        self.pairs = pairs
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, edge_index, edge_attr):
        h = self.lin(x)
        src, dst = edge_index
        messages = {message: message(h[src], h[dst], edge_attr) for message, _ in self.pairs}
        return torch.cat([scatter(messages[message], dst, 0, dim_size=N, reduce=reduce)
                          for message, reduce in self.pairs], dim=-1)


def x_j(h_j, h_i, e):
    return h_j


def square(h_j, h_i, e):
    return h_j * h_j


def relu_edge(h_j, h_i, e):
    return torch.relu(h_j + e)


def computed_edge(h_j, h_i, e):
    """PNA-like: a linear map of both ends, so the message gathers nothing the op could read itself."""
    return torch.cat([h_i, h_j], dim=-1) @ torch.ones(12, 6) / 12


def scaled_edge(h_j, h_i, e):
    """The edge features alone: no GEMM made them."""
    return e * 2.0


def _gather_scatter_ops(result) -> list:
    return [(w["op"], w["details"]) for g in result.report["graphs"] for w in g["rewrites"]
            if w["pattern"] == "gather_scatter"]


def test_reductions_of_one_message_and_of_its_square_merge():
    result = check_rewrites(Reductions((x_j, "max"), (x_j, "mean"), (square, "mean"), (x_j, "min")), *_graph(),
                            expect={"gather_scatter": 1, "spmm": 0, "near_miss": 0})
    ((op, details),) = _gather_scatter_ops(result)
    assert op == "gnn_io.gather_scatter_multi" and details["merged_calls"] == 4
    assert [m["reduce"] for m in details["members"]] == ["max", "mean", "mean", "min"]
    assert all(m["at"] for m in details["members"])


def test_the_same_reduction_twice_is_one_member():
    result = check_rewrites(Reductions((relu_edge, "max"), (relu_edge, "max"), (relu_edge, "sum")), *_graph(),
                            expect={"gather_scatter": 1})
    ((_, details),) = _gather_scatter_ops(result)
    assert details["merged_calls"] == 3 and [m["reduce"] for m in details["members"]] == ["max", "sum"]
    assert len(details["members"][0]["at"]) == 2


def test_messages_over_other_arguments_stay_apart():
    """``relu(h_j + e)`` also reads ``e``: a different argument list, so it keeps its own call."""
    result = check_rewrites(Reductions((x_j, "max"), (relu_edge, "max"), (x_j, "min")), *_graph(),
                            expect={"gather_scatter": 2})
    ops = sorted(op for op, _ in _gather_scatter_ops(result))
    assert ops == ["gnn_io.gather_scatter", "gnn_io.gather_scatter_multi"]


def test_a_lone_mean_stays_an_spmm():
    check_rewrites(Reductions((x_j, "mean"), (relu_edge, "max")), *_graph(),
                   expect={"spmm": 1, "gather_scatter": 1, "near_miss": 0})


def test_a_computed_edge_message_is_taken_only_with_a_pass_to_share():
    """One reduction of a computed edge tensor stays with Inductor (as before the merge existed), and the report
    says why where a GEMM made that tensor per edge (here a constant weight, which gather_linear does not move);
    two share a pass."""
    lone = check_rewrites(Reductions((computed_edge, "max")), *_graph(), expect={"gather_scatter": 0, "near_miss": 1})
    ((reason,),) = [[m["reason"] for m in g["near_misses"]] for g in lone.report["graphs"] if g["near_misses"]]
    assert "a GEMM made per edge (aten.mm" in reason
    # a reduction of the edge features themselves (GATConv's self-loop attribute mean is one) stays silent
    check_rewrites(Reductions((scaled_edge, "max")), *_graph(), expect={"gather_scatter": 0, "near_miss": 0})
    result = check_rewrites(Reductions((computed_edge, "max"), (computed_edge, "mean")), *_graph(),
                            expect={"gather_scatter": 1, "near_miss": 0})
    ((op, details),) = _gather_scatter_ops(result)
    assert op == "gnn_io.gather_scatter_multi" and details["roles"] == ["edge"]
