"""Shape buckets for mini-batches (gnn_inductor/buckets.py): the ladder, the padding and its cut, the analysis that
declines graphs whose ops mix rows, and compiled mini-batch models against eager, forward and gradients."""
import operator

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv, global_mean_pool

import gnn_inductor
from gnn_inductor import backend, buckets
from gnn_inductor.testing import random_graph, tolerance
from tests.buckets_cases import dynamo_graph, why_not_padded
from tests.tiers import INTERPRETED, KERNEL_DEVICE, runs_kernel


def test_the_ladder_is_above_every_size_aligned_and_coarse():
    sizes = list(range(0, 5000, 7)) + [315_577, 331_333, 62_000_000]
    values = [buckets.bucket(n) for n in sizes]
    assert all(v > n and v % buckets.ALIGN == 0 for v, n in zip(values, sizes))
    assert values == sorted(values)
    # a stream of batches within +-5% of each other meets at most two buckets
    assert len({buckets.bucket(n) for n in range(300_000, 331_000, 97)}) <= 2


@pytest.mark.parametrize("nodes,edges", [(1, 0), (10, 1), (300, 5000), (315_577, 470_000), (100, 100_000)])
def test_padded_sizes_leave_room_for_the_padded_edges(nodes, edges):
    padded_nodes, padded_edges = buckets.padded_sizes(nodes, edges)
    assert padded_nodes > nodes and padded_edges >= edges
    assert (padded_edges - edges) <= buckets.PAD_DEGREE * (padded_nodes - nodes)


def _layout():
    kinds = [("rows", "N"), ("edge_index", "E"), ("rows", "E"), ("keep", None)]
    return buckets.Layout(kinds, "n", "e", [[(0, "N")], [(1, "E")], []])


def test_padding_replicates_row_zero_and_points_padded_edges_at_padded_nodes():
    edge_index = random_graph(5, 12)
    edges = edge_index.shape[1]
    x, edge_attr, weight = torch.randn(5, 3), torch.randn(edges, 2), torch.randn(3)
    layout = _layout()
    args = [x, edge_index, edge_attr, weight]
    assert layout.sizes(args) == (5, edges)
    px, pe, pa, pw = layout.pad(args, (5, edges), (9, 40))
    assert px.shape == (9, 3) and pe.shape == (2, 40) and pa.shape == (40, 2) and pw is weight
    assert torch.equal(px[:5], x) and torch.equal(px[5:], x[:1].expand(4, 3))
    assert torch.equal(pa[:edges], edge_attr) and torch.equal(pa[edges:], edge_attr[:1].expand(40 - edges, 2))
    assert torch.equal(pe[:, :edges], edge_index) and bool((pe[:, edges:] >= 5).all())
    assert bool((pe[:, edges:] < 9).all()) and torch.equal(pe[0, edges:], pe[1, edges:])  # padded nodes' self loops
    assert torch.bincount(pe[1, edges:]).max() <= -(-(40 - edges) // 4)
    out = layout.trim((torch.zeros(9, 4), torch.zeros(2, 40), torch.zeros(3)), (5, edges), (9, 40))
    assert [tuple(o.shape) for o in out] == [(5, 4), (2, edges), (3,)]


def test_padding_differentiates_back_to_the_real_rows():
    x = torch.randn(4, 3, requires_grad=True)
    layout = buckets.Layout([("rows", "N"), ("edge_index", "E")], "n", "e", [[(0, "N")]])
    px, _ = layout.pad([x, random_graph(4, 6)], (4, 6), (8, 16))
    (px * torch.arange(8.0)[:, None]).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[0.0] * 3, [1.0] * 3, [2.0] * 3, [3.0] * 3]) + torch.tensor(
        [[4.0 + 5 + 6 + 7] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3]))


class _Layers(torch.nn.Module):
    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, edge_index):
        return self.second(self.first(x, edge_index).relu(), edge_index)


class _MeanCentred(torch.nn.Module):
    """Subtracts the mean over all nodes: a padded row would move every real output."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x, edge_index):
        out = self.conv(x, edge_index)
        return out - out.mean(0)


class _LastNode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)[-1]


class _Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x, edge_index, batch):
        return global_mean_pool(self.conv(x, edge_index), batch, size=3)


SIZES = [(100, 300), (120, 500), (300, 900)]


def _run(model, sizes=SIZES, extra=None, device="cpu"):
    """Eager and compiled (buckets on) over a stream of graphs; the compiled outputs and all gradients checked."""
    torch.manual_seed(0)
    model = model.to(device)
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on"})
    for nodes, edges in sizes:
        edge_index = random_graph(nodes, edges, hub_degree=nodes // 3).to(device)
        x = torch.randn(nodes, 8, device=device, requires_grad=True)
        args = (x, edge_index) + ((extra(nodes),) if extra else ())
        expected = model(*args)
        expected.square().sum().backward()
        grads = [x.grad] + [p.grad for p in model.parameters()]
        model.zero_grad()
        x.grad = None
        actual = compiled(*args)
        actual.square().sum().backward()
        torch.testing.assert_close(actual, expected, **tolerance(torch.float32, "layer"))
        for got, want in zip([x.grad] + [p.grad for p in model.parameters()], grads):
            torch.testing.assert_close(got, want, **tolerance(torch.float32, "layer"))
        model.zero_grad()
    return [r for r in gnn_inductor.rewrite_report.reports()[-4:]]


def _buckets_used(reports) -> list:
    return [rw.details["buckets"] for r in reports for rw in r.rewrites if rw.pattern == "buckets"]


def test_a_sage_model_over_changing_graphs_runs_padded_and_matches_eager():
    reports = _run(_Layers(SAGEConv(8, 16), SAGEConv(16, 4, aggr="max")))
    used = _buckets_used(reports)
    assert used and len(used[-1]) == 2  # the second and third graphs (the first compiles at its own sizes)


def _dynamo_graph(model, extra=None, sizes=SIZES[:2]):
    """``model``'s graph of changing sizes as Dynamo captures it (no compile)."""
    return dynamo_graph(model, [(torch.randn(nodes, 8), random_graph(nodes, edges), *((extra(nodes),) if extra else ()))
                                for nodes, edges in sizes])


def _why_not_padded(model, extra=None):
    """What the analysis says of ``model``'s graph of changing sizes."""
    return why_not_padded(_dynamo_graph(model, extra))


@pytest.mark.parametrize("model,why", [
    (_MeanCentred, "mean.dim reduces over the rows"),
    (_LastNode, "picks rows by position"),
])
def test_ops_that_mix_rows_are_declined_with_the_op(model, why):
    assert why in (_why_not_padded(model()) or "")


def test_a_batch_vector_input_is_declined():
    assert "integer input" in (_why_not_padded(_Pooled(), extra=lambda n: torch.arange(n) * 3 // n) or "")


def test_message_passing_layers_are_padded():
    for model in (_Layers(SAGEConv(8, 16), SAGEConv(16, 4, aggr="max")), _Layers(GCNConv(8, 16), GCNConv(16, 4)),
                  _Layers(GATConv(8, 8, heads=2), GATConv(16, 4))):
        assert _why_not_padded(model) is None


def test_a_declined_graph_says_why_in_the_report():
    reports = _run(_MeanCentred(), sizes=SIZES[:2])
    assert not _buckets_used(reports)
    reasons = [m.reason for r in reports for m in r.near_misses if m.pattern == "buckets"]
    assert reasons and "mean.dim reduces over the rows" in reasons[-1]


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda: _Layers(GCNConv(8, 16), GCNConv(16, 4)),
    lambda: _Layers(GATConv(8, 8, heads=2), GATConv(16, 4)),
], ids=["gcn", "gat"])
def test_more_layers_over_changing_graphs_match_eager(make):
    _run(make())


class _EdgePrefix(torch.nn.Module):
    """A running count over the edges: padded edges appended after real ones would change no prefix here, but a
    prefix over edges is declined (after a concatenation padded edges sit between real ones)."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index) + torch.cumsum(edge_index[0], 0).sum() * 0


def test_an_integer_prefix_over_edges_is_declined():
    assert "cumsum" in (_why_not_padded(_EdgePrefix()) or "")


# a minute of interpreted GEMMs on the CPU: the GPU tier and --slow (the kernels' own tests stay in the default tier)
@pytest.mark.slow
@runs_kernel
def test_the_buckets_float32_gemms_run_on_the_3xtf32_kernels(monkeypatch):
    """A bucket's fixed sizes let its float32 GEMMs (forward and both gradients) take the 3xTF32 kernels
    (gnn_inductor/passes/dense_gemm.py; thresholds lowered to the test's sizes), and the padded model still matches
    eager; the buckets' report entry counts them."""
    from gnn_inductor.kernels.dense import gemm as dense_triton

    if INTERPRETED:
        monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 32)
    ran = []
    real = dense_triton._launch_stationary

    def recording(*args, **kwargs):
        ran.append(tuple(args[0].shape))
        return real(*args, **kwargs)
    monkeypatch.setattr(dense_triton, "_launch_stationary", recording)
    torch._dynamo.reset()
    reports = _run(_Layers(SAGEConv(8, 16), SAGEConv(16, 4)), device=KERNEL_DEVICE)
    entries = [rw for r in reports for rw in r.rewrites if rw.pattern == "buckets"]
    assert entries and entries[-1].details["gemms_3xtf32"] > 0, entries
    # the first graph compiles at its own sizes (100 rows); the later ones at their buckets' padded rows
    assert {rows for rows, _ in ran} - {100} and all(rows % buckets.ALIGN == 0 for rows, _ in ran if rows != 100)



def _filter_masks(gm) -> list:
    """The getitem nodes of ``gm`` that index by a boolean mask (``t[mask]``, ``t[:, mask]``)."""
    def is_mask(index):
        return isinstance(index, torch.fx.Node) and getattr(index.meta.get("example_value"), "dtype", None) \
            is torch.bool
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.getitem
            and (is_mask(n.args[1]) or isinstance(n.args[1], tuple) and any(map(is_mask, n.args[1])))]


@pytest.mark.parametrize("make,filters", [
    (lambda: _Layers(GCNConv(8, 16), GCNConv(16, 4)), 2),
    (lambda: _Layers(GATConv(8, 8, heads=2), GATConv(16, 4)), 2),
    (lambda: _Layers(SAGEConv(8, 16), SAGEConv(16, 4)), 0),
], ids=["gcn", "gat", "sage"])
def test_self_loop_filters_keep_every_edge_slot(make, filters):
    """PyG's ``remove_self_loops`` (``edge_index[:, mask]``, a data-dependent edge count) becomes a ``where`` onto
    the padded nodes: the graph keeps fixed sizes and takes the padded nodes' ids as a last input."""
    gm = _dynamo_graph(make())
    layout, why = buckets.layout_of(gm)
    assert why is None
    before = len([n for n in gm.graph.nodes if n.op == "placeholder"])
    assert len(_filter_masks(gm)) == filters
    assert buckets.redirect_filters(gm, layout) == (filters, None)
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == before + (filters > 0)
    assert not _filter_masks(gm)
    wheres = [n for n in gm.graph.nodes if n.target is torch.where]
    assert len(wheres) == filters


class _CountScaled(SAGEConv):
    """Divides by the number of edges left after dropping self loops: the count is a value, so the filter stays."""

    def forward(self, x, edge_index):
        kept = edge_index[:, edge_index[0] != edge_index[1]]
        return super().forward(x, kept) / kept.size(1)


class _TypedFilter(torch.nn.Module):
    """Filters an integer edge tensor that is not edge_index (edge types): its dropped entries have no padded value."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x, edge_index):
        mask = edge_index[0] != edge_index[1]
        types = (edge_index[0] % 3)[mask]
        return self.conv(x, edge_index[:, mask]) + types.sum() * 0


@pytest.mark.parametrize("model,why", [(_CountScaled(8, 4), "used as a value"), (_TypedFilter(), "not edge_index")])
def test_a_filter_that_cannot_keep_its_slots_is_left_as_it_is(model, why):
    gm = _dynamo_graph(model)
    layout, _ = buckets.layout_of(gm)
    code = gm.code
    count, reason = buckets.redirect_filters(gm, layout)
    assert count == 0 and why in reason and gm.code == code


def _with_self_loops(nodes, edges):
    edge_index = random_graph(nodes, edges, hub_degree=nodes // 3)
    loops = torch.arange(0, nodes, 7).expand(2, -1)
    return torch.cat([edge_index, loops, loops[:, :3]], dim=1)  # self loops, three of them twice


@pytest.mark.parametrize("make,index_dtype", [
    (lambda: GCNConv(8, 4), torch.int64),
    pytest.param(lambda: GCNConv(8, 4), torch.int32, marks=pytest.mark.slow),
    pytest.param(lambda: GATConv(8, 4, heads=2), torch.int64, marks=pytest.mark.slow),
], ids=["gcn", "gcn-int32", "gat"])
def test_self_loop_filters_run_padded_at_fixed_sizes_and_match_eager(make, index_dtype):
    """Graphs with self loops (some twice), duplicates, a hub and isolated nodes: outputs and all gradients."""
    torch._dynamo.reset()  # the first graph compiles at its own sizes, the other two in buckets
    torch.manual_seed(0)
    model = make()
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on"})
    for nodes, edges in SIZES:
        edge_index = _with_self_loops(nodes, edges).to(index_dtype)
        x = torch.randn(nodes, 8, requires_grad=True)
        expected = model(x, edge_index)
        expected.square().sum().backward()
        grads = [x.grad] + [p.grad for p in model.parameters()]
        model.zero_grad()
        x.grad = None
        actual = compiled(x, edge_index)
        actual.square().sum().backward()
        torch.testing.assert_close(actual, expected, **tolerance(torch.float32, "layer"))
        for got, want in zip([x.grad] + [p.grad for p in model.parameters()], grads):
            torch.testing.assert_close(got, want, **tolerance(torch.float32, "layer"))
        model.zero_grad()
    reports = gnn_inductor.rewrite_report.reports()[-4:]
    entries = [rw for r in reports for rw in r.rewrites if rw.pattern == "buckets"]
    assert entries and len(entries[-1].details["buckets"]) == 2
    assert entries[-1].details["edge_filters_at_fixed_size"] == 1
    assert not [m for r in reports for m in r.near_misses if "fixed-size compile failed" in m.reason]


def test_a_call_runs_in_a_compiled_bucket_up_to_two_steps_larger():
    """A call whose own bucket was never compiled takes the smallest compiled one that holds it within
    ``REUSE`` in both sizes and has padded nodes for its padded edges; else it compiles its own."""
    b = buckets.Bucketed.__new__(buckets.Bucketed)
    b.compiled = {(1024, 4480, 8): "f", (1152, 4480, 8): "g", (2048, 8192, 8): "h", (1024, 4480, 16): "other",
                  (960, 4480, 8): None}  # a failed compile is never reused
    own = buckets.padded_sizes(900, 3800) + (8,)
    assert own == (960, 4096, 8) and b.covering(own, 900, 3800) == (1024, 4480, 8)
    assert b.covering((960, 4096, 16), 900, 3800) == (1024, 4480, 16)  # the same other sizes only
    assert b.covering((960, 4096, 32), 900, 3800) is None
    assert b.covering(buckets.padded_sizes(500, 2000) + (8,), 500, 2000) is None  # more than REUSE larger
    # padded nodes too few for the padded edges: 1024 - 1014 nodes for 3456 - 3042 edges, PAD_DEGREE each at most
    b.compiled = {(1024, 3456, 8): "f"}
    own = buckets.padded_sizes(1014, 3042) + (8,)
    assert own == (1024, 3200, 8) and b.covering(own, 1014, 3042) is None
    assert b.covering(own, 1000, 3042) == (1024, 3456, 8)  # 24 padded nodes: enough


def test_a_size_not_met_recently_runs_in_a_bucket_up_to_twice_larger():
    """An epoch's short last batch: more than REUSE smaller than the compiled bucket, it runs there (padded to up to
    FAR_REUSE times its own bucket), outputs and gradients checked; that it compiles its own when it comes back
    within RECENT_CALLS calls is tests/benchmarks/test_bucket_reuse.py's (the same ``Bucketed.choose``)."""
    sizes = [(300, 900), (200, 600)]
    own = [buckets.padded_sizes(n, random_graph(n, e, hub_degree=n // 3).shape[1]) for n, e in sizes]
    assert all(own[1][i] * buckets.REUSE < own[0][i] <= own[1][i] * buckets.FAR_REUSE for i in (0, 1))
    torch._dynamo.reset()
    reports = _run(_Layers(SAGEConv(8, 16), SAGEConv(16, 4)), sizes=[(100, 300)] + sizes)
    assert _buckets_used(reports)[-1] == [list(own[0])]


def test_calls_that_fit_a_compiled_bucket_do_not_compile_another():
    sizes = [(300, 900), (280, 860), (270, 840)]
    own = [buckets.padded_sizes(n, random_graph(n, e, hub_degree=n // 3).shape[1]) for n, e in sizes]
    assert own[0] == own[1] != own[2]  # the third call's own bucket is smaller, within REUSE of the first's
    torch._dynamo.reset()  # the first call compiles at its own sizes (no frame remembered as dynamic)
    reports = _run(_Layers(SAGEConv(8, 16), SAGEConv(16, 4)), sizes=[(100, 300)] + sizes)
    assert _buckets_used(reports)[-1] == [list(own[0])]


def test_a_rare_size_after_the_buckets_settle_runs_without_a_compile(monkeypatch):
    """The settling call compiles the bucket one step above the largest. After it, a rare size larger than every
    compiled bucket runs the captured graph as it is, a small one runs padded in a compiled bucket (outputs and
    gradients checked against eager by ``_run``), neither compiles; one that comes back RECUR times compiles."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(buckets, "SETTLE_CALLS", 2)
    settled, outlier, tiny = [(100, 300), (300, 900), (280, 860), (290, 880)], (700, 2600), (40, 100)
    torch._dynamo.reset()
    model = _Layers(SAGEConv(8, 16), SAGEConv(16, 4))
    reports = _run(model, sizes=settled)
    entry = [rw for r in reports for rw in r.rewrites if rw.pattern == "buckets"][-1]
    own = list(buckets.padded_sizes(300, random_graph(300, 900, hub_degree=100).shape[1]))
    assert entry.details["buckets"] == [own, [buckets.bucket(size) for size in own]]
    compiles = counters["aot_autograd"]["total"]
    _run(model, sizes=[outlier, tiny])
    assert counters["aot_autograd"]["total"] == compiles
    assert entry.details["unpadded_calls"] == 1 and len(entry.details["buckets"]) == 2
    _run(model, sizes=[outlier] * (buckets.RECUR - 1))
    assert len(entry.details["buckets"]) == 3 and entry.details["unpadded_calls"] == buckets.RECUR - 1


def test_a_padded_graph_compiles_no_mini_batch_switch(monkeypatch):
    """The graph of changing sizes under the buckets runs only past them: it gets no mini-batch switch (whose
    torch.compile default would be one more compile at the warm-up); a graph the buckets do not pad keeps it."""
    made = []
    real = backend.Churn

    def spy(gm, example_inputs, *args, enabled=True, **kwargs):
        if any(isinstance(e, torch.SymInt) for e in example_inputs):  # a graph of changing sizes
            made.append(enabled)
        return real(gm, example_inputs, *args, enabled=enabled, **kwargs)
    monkeypatch.setattr(backend, "Churn", spy)
    torch._dynamo.reset()
    _run(_Layers(SAGEConv(8, 16), SAGEConv(16, 4)))
    assert made and not any(made), made
    made.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Layers(SAGEConv(8, 16), SAGEConv(16, 4))
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "off"})
    for nodes, edges in SIZES:
        compiled(torch.randn(nodes, 8), random_graph(nodes, edges))
    assert made and all(made), made
