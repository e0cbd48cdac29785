"""The relations of one layer as one SpMM over a typed CSR and one GEMM (gnn_inductor/passes/relation_groups.py):
RGCNConv (plain and with bases) against eager in float64, forward and every gradient, on a graph with isolated nodes,
duplicates, self loops, a hub, a relation without edges and int32 indices, each in both orders (the maps first where
they narrow the features or keep their width, the aggregation first where they widen them); a relation loop whose
results are not summed through maps (one SpMM, no GEMM); HeteroConv and ``to_hetero`` of SAGEConv, whose relations
into one node type read different node types, in both orders; and the setting that turns the pass off."""
import copy

import pytest
import torch
from torch_geometric.nn import HeteroConv, RGCNConv, SAGEConv, to_hetero
from torch_geometric.utils import scatter

import gnn_inductor
from gnn_inductor.plan import csr
from gnn_inductor.testing import random_graph, random_hetero_graph, tolerance
from tests.tiers import covering

NODES, RELATIONS = 40, 4
FLOAT64 = tolerance(torch.float64)


def _graph(index_dtype=torch.int64):
    edge_index = random_graph(NODES, 300, seed=3, hub_degree=25)
    edge_index = torch.cat([edge_index, edge_index[:, :20], torch.tensor([[5, 6], [5, 6]])], dim=1)  # duplicates, loops
    edge_type = torch.randint(0, RELATIONS - 1, (edge_index.shape[1],), generator=torch.Generator().manual_seed(1))
    return edge_index.to(index_dtype), edge_type  # relation RELATIONS - 1 has no edges


def _groups(model) -> list:
    return [w for r in gnn_inductor.rewrite_report.reports(model) for w in r.rewrites if w.pattern == "relation_groups"]


def _check(model, inputs, tol=FLOAT64, options=None):
    """Forward, the input's gradient and every parameter's gradient of the compiled model against eager (float64
    unless ``tol`` says otherwise); the compiled model's report groups."""
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    options = {"cpu_rewrite": True, "strict": True, **(options or {})}
    compiled = torch.compile(model, backend="gnn_io", options=options)
    x = inputs[0].detach().requires_grad_()
    x_ref = inputs[0].detach().requires_grad_()
    # eager with int64 indices: PyG's RGCNConv gives a different input gradient with int32 ones in eager mode
    # (torch 2.11, PyG 2.8; the forward agrees), and the compiled model's gradient with int32 indices is the
    # int64 one
    out, want = compiled(x, *inputs[1:]), eager(x_ref, inputs[1].long(), *inputs[2:])
    torch.testing.assert_close(out, want, **tol)
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
    return _groups(model)


@pytest.mark.parametrize(("bases", "index_dtype", "width"), covering([None, 2], [torch.int64, torch.int32], [5, 8]))
def test_rgcn_relations_run_as_one_spmm_and_one_gemm(bases, index_dtype, width):
    """A layer that narrows its input (6 -> 5) maps first, then aggregates the mapped rows; one that widens it
    (6 -> 8) aggregates first."""
    torch.manual_seed(0)
    model = RGCNConv(6, width, RELATIONS, num_bases=bases).double()
    edge_index, edge_type = _graph(index_dtype)
    groups = _check(model, [torch.randn(NODES, 6, dtype=torch.float64), edge_index, edge_type])
    order = "maps first" if width <= 6 else "aggregation first"
    assert [(g.details["relations"], g.details["one_gemm"], g.details["order"]) for g in groups] == \
        [(RELATIONS, True, order)]


@pytest.mark.parametrize("width", [16, 24], ids=["maps_first", "aggregation_first"])
def test_maps_first_keep_no_stacked_aggregation_for_the_backward(width):
    """What the compiled RGCNConv saves for its backward: with the maps first, nothing as large as the stacked
    aggregations ``Y [N, R * F]`` (the point of that order); aggregating first (a widening layer), ``Y`` itself."""
    torch.manual_seed(0)
    model = RGCNConv(16, width, RELATIONS).double()
    edge_index, edge_type = _graph()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gnn_io", options={"cpu_rewrite": True, "strict": True})
    x = torch.randn(NODES, 16, dtype=torch.float64, requires_grad=True)
    compiled(x, edge_index, edge_type).sum().backward()  # the compile, and the backward's
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        compiled(x, edge_index, edge_type)
    stacked = NODES * RELATIONS * 16
    assert (max(saved) >= stacked) == (width > 16), (sorted(saved)[-4:], stacked)
    assert [g.details["order"] for g in _groups(model)] == ["maps first" if width == 16 else "aggregation first"]


@pytest.mark.cuda
@pytest.mark.parametrize("bases", [None, 2], ids=["plain", "bases"])
def test_rgcn_relations_on_cuda_in_float32(bases):
    """The typed CSR built on the GPU and the SpMM's CUDA kernels, float32 against eager float32 on CUDA."""
    torch.manual_seed(0)
    model = RGCNConv(16, 8, RELATIONS, num_bases=bases).cuda()
    edge_index, edge_type = _graph(torch.int32)
    inputs = [torch.randn(NODES, 16, device="cuda"), edge_index.cuda(), edge_type.cuda()]
    # forced: on CUDA the cost model leaves an SpMM of a few hundred edges to Inductor
    groups = _check(model, inputs, tolerance(torch.float32), {"force": True})
    assert [(g.details["relations"], g.details["one_gemm"], g.details["order"]) for g in groups] == \
        [(RELATIONS, True, "maps first")]


def test_rgcn_relations_with_int32_plans_on_cpu(monkeypatch):
    """The plan's index arrays in int32, as CUDA builds them, on the CPU: the pass's index ops take them."""
    monkeypatch.setattr(csr, "index_dtype", lambda device: torch.int32)
    torch.manual_seed(0)
    model = RGCNConv(6, 5, RELATIONS, num_bases=2).double()
    edge_index, edge_type = _graph()
    groups = _check(model, [torch.randn(NODES, 6, dtype=torch.float64), edge_index, edge_type])
    assert [(g.details["relations"], g.details["one_gemm"]) for g in groups] == [(RELATIONS, True)]


def test_rgcn_relations_on_a_non_contiguous_input_and_a_graph_without_edges():
    torch.manual_seed(0)
    model = RGCNConv(6, 5, RELATIONS).double()
    wide = torch.randn(NODES, 12, dtype=torch.float64)
    edge_index, edge_type = _graph()
    groups = _check(model, [wide[:, ::2], edge_index, edge_type])  # a strided view of a wider tensor
    assert [g.details["relations"] for g in groups] == [RELATIONS]
    empty = torch.zeros(2, 0, dtype=torch.long)
    _check(RGCNConv(6, 5, RELATIONS).double(), [torch.randn(NODES, 6, dtype=torch.float64), empty,
                                               torch.zeros(0, dtype=torch.long)])


class _PerRelationMeans(torch.nn.Module):
    """The mean of the in-neighbours' rows per relation, side by side: a relation loop with no maps to sum."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64))  # the report finds the model by it

    def forward(self, x, edge_index, edge_type):
        outs = []
        for r in range(3):
            src, dst = edge_index[:, edge_type == r]
            outs.append(scatter(x.index_select(0, src), dst, dim=0, dim_size=x.shape[0], reduce="mean"))
        return torch.cat(outs, dim=1) * self.scale


def test_relations_without_maps_share_one_spmm():
    edge_index, edge_type = _graph()
    groups = _check(_PerRelationMeans(), [torch.randn(NODES, 3, dtype=torch.float64), edge_index, edge_type])
    assert [(g.details["relations"], g.details["one_gemm"]) for g in groups] == [(3, False)]


def test_the_setting_keeps_one_spmm_per_relation(monkeypatch):
    monkeypatch.setenv("GNN_IO_GROUP_RELATIONS", "0")
    torch.manual_seed(0)
    model = RGCNConv(6, 5, RELATIONS).double()
    edge_index, edge_type = _graph()
    groups = _check(model, [torch.randn(NODES, 6, dtype=torch.float64), edge_index, edge_type])
    assert groups == []
    assert sum(w.pattern == "spmm" for r in gnn_inductor.rewrite_report.reports(model) for w in r.rewrites) == RELATIONS


def _hetero():
    """Papers and authors: two relations into papers (from authors, from papers), one into authors."""
    return random_hetero_graph({"paper": 30, "author": 20}, {("author", "writes", "paper"): 60,
                                                            ("paper", "cites", "paper"): 50,
                                                            ("paper", "rev_writes", "author"): 60},
                               6, dtype=torch.float64)


class _Sage(torch.nn.Module):
    def __init__(self, width=5):
        super().__init__()
        self.conv = SAGEConv((6, 6), width)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


@pytest.mark.parametrize(("kind", "width"), covering(["hetero_conv", "to_hetero"], [5, 8]))
def test_relations_from_different_node_types_share_one_spmm(kind, width):
    """The relations into papers read authors and papers: one SpMM over both inputs concatenated, or, where each
    relation's map narrows the features (6 -> 5), over the mapped rows of each relation; outputs and every gradient
    (both node types' inputs, every parameter) against eager in float64."""
    x, edge_index, metadata = _hetero()
    torch.manual_seed(0)
    model = (HeteroConv({e: SAGEConv((6, 6), width) for e in edge_index}, aggr="sum") if kind == "hetero_conv"
             else to_hetero(_Sage(width), metadata, aggr="sum")).double()
    order = "maps first" if width < 6 else "aggregation first"
    assert _check_hetero(model, x, edge_index, FLOAT64) == [(2, order)]


@pytest.mark.filterwarnings("ignore:There exist node types")  # PyG: authors and fields are only sources here
def test_maps_first_on_hard_graphs():
    """Each relation's map first on the hard cases: three relations into papers, one from authors with a hub and
    duplicates, one among papers with self loops, one from fields with no edges; int32 indices and strided inputs to
    the compiled model (eager takes int64: PyG's SAGEConv gathers with int64 indices); outputs and every gradient
    against eager in float64."""
    sizes = {"paper": 30, "author": 20, "field": 5}
    x, edge_index, _ = random_hetero_graph(sizes, {("author", "writes", "paper"): 60, ("paper", "cites", "paper"): 50,
                                                  ("field", "has", "paper"): 0}, 12, dtype=torch.float64)
    writes = edge_index[("author", "writes", "paper")]
    hub = torch.stack([torch.zeros(25, dtype=torch.long), torch.arange(25)])  # author 0 writes 25 papers
    edge_index[("author", "writes", "paper")] = torch.cat([writes, writes[:, :10], hub], dim=1)
    cites = edge_index[("paper", "cites", "paper")]
    edge_index[("paper", "cites", "paper")] = torch.cat([cites, torch.arange(4).repeat(2, 1)], dim=1)  # self loops
    x = {t: v[:, ::2] for t, v in x.items()}  # strided views of 12-wide rows: 6 features
    torch.manual_seed(0)
    model = HeteroConv({e: SAGEConv((6, 6), 4) for e in edge_index}, aggr="sum").double()
    narrow = {e: v.int() for e, v in edge_index.items()}
    assert _check_hetero(model, x, edge_index, FLOAT64, compiled_edges=narrow) == [(3, "maps first")]


def test_a_group_kept_apart_by_changing_sizes_says_why():
    """A graph of symbolic sizes keeps one SpMM per relation (the typed CSR's rows must be known): the report's near
    miss says so, once per group that would have formed, and the outputs still match eager."""
    x, edge_index, _ = _hetero()
    torch.manual_seed(0)
    model = HeteroConv({e: SAGEConv((6, 6), 5) for e in edge_index}, aggr="sum").double()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gnn_io", dynamic=True, options={"cpu_rewrite": True, "strict": True})
    out, want = compiled(x, edge_index), eager(x, edge_index)
    for t in want:
        torch.testing.assert_close(out[t], want[t], **FLOAT64)
    assert _groups(model) == []
    misses = [m for r in gnn_inductor.rewrite_report.reports(model) for m in r.near_misses
              if m.pattern == "relation_groups"]
    assert [(m.kind, m.reason.split(":")[0]) for m in misses] == [
        ("declined", "2 SpMMs into the same rows kept one per relation")]
    assert "sizes change from call to call" in misses[0].reason


@pytest.mark.cuda
def test_relations_from_different_node_types_on_cuda_in_float32():
    """The maps-first group on the GPU (its GEMMs, the typed CSR built there, the SpMM's CUDA kernels), float32
    against eager float32 on CUDA."""
    x, edge_index, metadata = _hetero()
    torch.manual_seed(0)
    model = to_hetero(_Sage(), metadata, aggr="sum").cuda()
    x = {t: v.float().cuda() for t, v in x.items()}
    edge_index = {e: v.cuda() for e, v in edge_index.items()}
    # forced: on CUDA the cost model leaves an SpMM of a few dozen edges to Inductor
    assert _check_hetero(model, x, edge_index, tolerance(torch.float32), {"force": True}) == [(2, "maps first")]


def _check_hetero(model, x, edge_index, tol, options=None, compiled_edges=None) -> list:
    """Outputs and every gradient (a random cotangent per output) of the compiled dict-in, dict-out ``model`` against
    eager's, the compiled model given ``compiled_edges`` where set (int32 indices: eager's SAGEConv takes int64); the
    report's groups as ``(relations, order)``."""
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gnn_io", options={"cpu_rewrite": True, "strict": True, **(options or {})})
    leaves = {t: v.clone().requires_grad_() for t, v in x.items()}
    ref_leaves = {t: v.clone().requires_grad_() for t, v in x.items()}
    out = compiled(leaves, edge_index if compiled_edges is None else compiled_edges)
    want = eager(ref_leaves, edge_index)
    for t in want:
        torch.testing.assert_close(out[t], want[t], **tol)
    generator = torch.Generator().manual_seed(1)
    grads = {t: torch.randn(w.shape, generator=generator, dtype=w.dtype).to(w.device) for t, w in want.items()}
    torch.autograd.backward([out[t] for t in want], [grads[t] for t in want])
    torch.autograd.backward(list(want.values()), list(grads.values()))
    for t in x:
        torch.testing.assert_close(leaves[t].grad, ref_leaves[t].grad, **tol)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
    return [(g.details["relations"], g.details["order"]) for g in _groups(model)]


class _TwoLayers(torch.nn.Module):
    """Two relation loops of one width, the second reading the first's result: two groups, never one."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

    def forward(self, x, edge_index, edge_type):
        for _ in range(2):
            outs = []
            for r in range(2):
                src, dst = edge_index[:, edge_type == r]
                outs.append(scatter(x.index_select(0, src), dst, dim=0, dim_size=x.shape[0], reduce="sum"))
            x = (outs[0] - outs[1]).tanh() * self.scale
        return x


def test_a_layer_reading_the_previous_one_is_a_group_of_its_own():
    edge_index, edge_type = _graph()
    groups = _check(_TwoLayers(), [torch.randn(NODES, 3, dtype=torch.float64), edge_index, edge_type])
    assert [(g.details["relations"], g.details["one_gemm"]) for g in groups] == [(2, False), (2, False)]
