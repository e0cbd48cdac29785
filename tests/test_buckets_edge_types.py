"""Mini-batches with an integer input per edge (RGCNConv's ``edge_type``) padded to buckets: the padded entries take
row 0's type, the per-type filters keep every edge slot at fixed sizes, and every output and gradient matches eager;
uses of the integers that padding could change (node ids, counts per type, orders) are declined with the op named."""
import copy

import pytest
import torch
from torch_geometric.nn import GCNConv, RGCNConv, SAGEConv

import gnn_inductor
from gnn_inductor.testing import assert_close_to_reference, random_graph
from tests.buckets_cases import dynamo_graph, why_not_padded

RELATIONS = 4
# node and edge counts of a stream of mini-batches; the first compiles at its own sizes, the others run padded
SIZES = [(100, 300), (120, 500), (300, 900), (140, 520)]


class _Relational(torch.nn.Module):
    def __init__(self, bases=None, aggr="mean"):
        super().__init__()
        self.first = RGCNConv(8, 16, RELATIONS, num_bases=bases, aggr=aggr)
        self.second = RGCNConv(16, 4, RELATIONS, num_bases=bases, aggr=aggr)

    def forward(self, x, edge_index, edge_type):
        return self.second(self.first(x, edge_index, edge_type).relu(), edge_index, edge_type)


def _types(edges: int, seed: int) -> torch.Tensor:
    """Edge types with the last type never drawn (a relation without edges in the batch)."""
    return torch.randint(0, RELATIONS - 1, (edges,), generator=torch.Generator().manual_seed(seed))


# int64 indices only: on the CPU, PyG's eager mean aggregation does not scatter by int32 indices
@pytest.mark.parametrize("bases,aggr,device,cuda_graphs", [
    (None, "mean", "cpu", False),
    pytest.param(None, "add", "cpu", False, marks=pytest.mark.slow),
    pytest.param(2, "mean", "cpu", False, marks=pytest.mark.slow),
    pytest.param(None, "mean", "cuda", False, marks=pytest.mark.cuda),
    pytest.param(None, "add", "cuda", True, marks=pytest.mark.cuda),
    pytest.param(2, "mean", "cuda", True, marks=pytest.mark.cuda),
], ids=["plain", "sum", "bases", "cuda", "cuda-graphs-sum", "cuda-graphs-bases"])
def test_relational_layers_over_changing_graphs_run_padded_and_match_eager(bases, aggr, device, cuda_graphs):
    """Hubs, self loops, duplicates, isolated nodes and an empty relation; outputs and all gradients, against eager in
    float64 (the basis gradients sum over relations and nodes, where eager float32 rounds as far as the compile).
    Each layer's relations run as one product per edge in the padded buckets (``relation_segments``)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Relational(bases, aggr).to(device)
    exact = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on", "cuda_graphs": cuda_graphs})
    for step, (nodes, edges) in enumerate(SIZES):
        edge_index = random_graph(nodes, edges, hub_degree=nodes // 3, seed=step).to(device)
        edge_type = _types(edge_index.shape[1], step).to(device)
        x = torch.randn(nodes, 8, device=device)
        runs = {}
        for name, module, run in (("exact", exact, exact), ("eager", model, model), ("compiled", model, compiled)):
            inputs = x.to(torch.float64 if module is exact else torch.float32).requires_grad_()
            if run is compiled and cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            out = run(inputs, edge_index, edge_type)
            out.square().sum().backward()
            runs[name] = [out.detach().clone(), inputs.grad] + [p.grad for p in module.parameters()]
            module.zero_grad(set_to_none=True)
        for i, (actual, expected, baseline) in enumerate(zip(runs["compiled"], runs["exact"], runs["eager"])):
            assert_close_to_reference(f"step {step}, {'output' if i == 0 else f'gradient {i}'}", actual, expected,
                                      baseline)
    entries = [rw for r in gnn_inductor.rewrite_report.reports(compiled) for rw in r.rewrites
               if rw.pattern == "buckets"]
    assert entries and entries[-1].details["buckets"]
    # one graph (the PyG frontend answers RGCNConv's heuristic without a break), one filter per relation and layer
    # kept at fixed sizes, each layer's relations one group
    (entry,) = entries
    assert entry.details["edge_filters_at_fixed_size"] == 2 * RELATIONS
    assert entry.details["relation_segments"] == [RELATIONS, RELATIONS]


class _CountsPerType(SAGEConv):
    """Scales by the number of edges of each edge's type: padded edges would add to a real type's count."""

    def forward(self, x, edge_index, edge_type):
        counts = torch.zeros(RELATIONS).scatter_add(0, edge_type, torch.ones(edge_type.shape[0]))
        return super().forward(x, edge_index) * counts[edge_type].sum()


class _TypesAsNodeIds(SAGEConv):
    """Reads node rows by the integers: they are node ids, which a padded entry's value would make a real node."""

    def forward(self, x, edge_index, edge_type):
        return super().forward(x, edge_index) + x[edge_type].sum(0, keepdim=True)[:, :1]


class _SortedTypes(SAGEConv):
    """Sorts the integers: the padded entries change where the real ones sort."""

    def forward(self, x, edge_index, edge_type):
        order = torch.sort(edge_type, stable=True).indices
        return super().forward(x, edge_index[:, order])


def _why_not_padded(model) -> str:
    calls = []
    for nodes, edges in SIZES[:2]:
        edge_index = random_graph(nodes, edges)
        calls.append((torch.randn(nodes, 8), edge_index, _types(edge_index.shape[1], 0)))
    return why_not_padded(dynamo_graph(model, calls)) or ""


@pytest.mark.parametrize("model,why", [
    (_CountsPerType(8, 4), "writes or counts by the values of the integer edge input"),
    (_TypesAsNodeIds(8, 4), "node ids, not edge types"),
    (_SortedTypes(8, 4), "counts or orders the values"),
], ids=["count-per-type", "node-ids", "sort"])
def test_uses_of_edge_integers_that_padding_could_change_are_declined(model, why):
    assert why in _why_not_padded(model)


def test_edge_types_read_as_relation_weights_are_padded():
    class _Weighted(SAGEConv):
        def __init__(self):
            super().__init__(8, 4)
            self.scale = torch.nn.Parameter(torch.rand(RELATIONS))

        def forward(self, x, edge_index, edge_type):
            return super().forward(x, edge_index) * self.scale[edge_type].mean()

    # a mean over the edges mixes the padded edges' weights in: declined by the row analysis, not the type check
    assert "reduces over the rows" in _why_not_padded(_Weighted())


def test_float16_graphs_with_edge_filters_are_not_padded():
    """The edges a filter drops meet at the padded nodes, where a float16 sum could overflow into NaN gradients."""
    torch._dynamo.reset()
    model = GCNConv(8, 4).half()  # its self loops' filter; PyG's RGCNConv does not run in float16
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on"})
    for step, (nodes, edges) in enumerate(SIZES[:3]):
        compiled(torch.randn(nodes, 8, dtype=torch.float16), random_graph(nodes, edges, seed=step))
    reports = gnn_inductor.rewrite_report.reports(compiled)
    assert not [rw for r in reports for rw in r.rewrites if rw.pattern == "buckets"]
    assert any("float16" in m.reason for r in reports for m in r.near_misses if m.pattern == "buckets")
