"""Each source spelling of a gather and a scatter meets the matcher in one canonical form."""
import pytest
import torch
from torch_geometric.utils import scatter as pyg_scatter
from torch_geometric.utils import softmax as pyg_softmax

from gnn_inductor.testing import check_rewrites, random_graph

N = 24


def gather_index_select(x, idx):
    return x.index_select(0, idx)


def gather_subscript(x, idx):
    return x[idx]


def gather_gather(x, idx):
    return x.gather(0, idx.view(-1, 1).expand(-1, x.shape[1]))


def scatter_add_(msg, idx):
    return msg.new_zeros(N, msg.shape[1]).scatter_add_(0, idx.view(-1, 1).expand_as(msg), msg)


def index_add_(msg, idx):
    return msg.new_zeros(N, msg.shape[1]).index_add_(0, idx, msg)


def index_put_(msg, idx):
    return msg.new_zeros(N, msg.shape[1]).index_put_((idx,), msg, accumulate=True)


def scatter_reduce_max(msg, idx):
    return msg.new_zeros(N, msg.shape[1]).scatter_reduce_(0, idx.view(-1, 1).expand_as(msg), msg, "amax",
                                                          include_self=False)


def pyg_mean(msg, idx):
    return pyg_scatter(msg, idx, 0, dim_size=N, reduce="mean")


def pyg_min(msg, idx):
    return pyg_scatter(msg, idx, 0, dim_size=N, reduce="min")


class Aggregate(torch.nn.Module):
    def __init__(self, gather, scatter, message):
        super().__init__()
        self.gather, self.scatter, self.message = gather, scatter, message
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, edge_index):
        h = self.lin(x)
        return self.scatter(self.message(self.gather(h, edge_index[0])), edge_index[1])


@pytest.mark.parametrize("gather", [gather_index_select, gather_subscript, gather_gather])
@pytest.mark.parametrize("scatter, expect", [
    (scatter_add_, {"spmm": 1}), (index_add_, {"spmm": 1}), (index_put_, {"spmm": 1}),
    (pyg_mean, {"spmm": 1}), (scatter_reduce_max, {"gather_scatter": 1}), (pyg_min, {"gather_scatter": 1}),
])
def test_copy_message_spellings(gather, scatter, expect):
    torch.manual_seed(0)
    model = Aggregate(gather, scatter, lambda m: m)
    check_rewrites(model, torch.randn(N, 6), random_graph(N, 80, hub_degree=30), expect={**expect, "near_miss": 0})


@pytest.mark.parametrize("scatter", [scatter_add_, pyg_mean, scatter_reduce_max, pyg_min])
def test_pointwise_message_becomes_gather_scatter(scatter):
    torch.manual_seed(0)
    model = Aggregate(gather_subscript, scatter, lambda m: torch.sigmoid(m) * 2 - m.abs())
    check_rewrites(model, torch.randn(N, 6), random_graph(N, 80, hub_degree=30),
                   expect={"gather_scatter": 1, "spmm": 0, "near_miss": 0})


class HandWrittenAttention(torch.nn.Module):
    """Attention written by hand with PyG's softmax utility (TransformerConv-like, 2 heads)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(6, 8) for _ in range(3))

    def forward(self, x, edge_index):
        src, dst = edge_index
        q, k, v = (lin(x).view(-1, 2, 4) for lin in (self.q, self.k, self.v))
        score = (q[dst] * k[src]).sum(-1) / 2.0
        alpha = pyg_softmax(score, dst, num_nodes=N)
        return pyg_scatter(alpha.unsqueeze(-1) * v[src], dst, 0, dim_size=N, reduce="sum")


class SoftmaxOnly(torch.nn.Module):
    def forward(self, score, edge_index):
        return pyg_softmax(score * 3.0, edge_index[1], num_nodes=N)


def test_hand_written_attention():
    torch.manual_seed(0)
    check_rewrites(HandWrittenAttention(), torch.randn(N, 6), random_graph(N, 80, hub_degree=30),
                   expect={"attention": 1, "edge_softmax": 0, "near_miss": 0})


def test_edge_softmax_alone():
    edge_index = random_graph(N, 80, hub_degree=30)
    check_rewrites(SoftmaxOnly(), torch.randn(edge_index.shape[1], 3), edge_index,
                   expect={"edge_softmax": 1, "near_miss": 0})


class SegmentAggregate(torch.nn.Module):
    """PyG's ``segment`` over CSR offsets (sorted edges, as with ``ptr``)."""

    def __init__(self, reduce):
        super().__init__()
        self.reduce = reduce
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, ptr, col):
        from torch_geometric.utils import segment

        return segment(self.lin(x)[col], ptr, reduce=self.reduce)


@pytest.mark.parametrize("reduce, expect", [("sum", {"spmm": 1, "near_miss": 0}), ("mean", {"spmm": 1, "near_miss": 0}),
                                            ("max", {"gather_scatter": 0, "near_miss": 1})])
def test_segment_spelling(reduce, expect):
    torch.manual_seed(0)
    dst, src = random_graph(N, 80, hub_degree=30).sort(dim=1).values[1], random_graph(N, 80, hub_degree=30)[0]
    order = torch.argsort(dst, stable=True)
    dst, col = dst[order], src[order]
    ptr = torch.zeros(N + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=N), 0)
    check_rewrites(SegmentAggregate(reduce), torch.randn(N, 6), ptr, col, expect=expect)
