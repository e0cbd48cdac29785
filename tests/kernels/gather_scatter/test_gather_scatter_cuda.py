"""Fused gather-scatter kernels on CUDA: compiled PyG layers against eager PyG, forward and every
gradient, float32 and bfloat16 (skipped without CUDA; ``python tests/run.py`` on a GPU machine).

The graph has a hub of degree 3000, far above the split threshold the plan picks from its mean
degree (8 x mean degree, rounded up to a power of two: 128 here), isolated nodes, self loops and
duplicate edges. Each case also checks that the rewrite runs the Triton kernels (``lowering``). Layers with
several aggregations over the same messages (SAGEConv with a list of aggregations, ``MultiAggregation``,
PNAConv) check that they share one ``gnn_io::gather_scatter_multi`` pass.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as pyg
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import MultiAggregation

import gnn_inductor.kernels  # noqa: F401
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import fused, launches
from gnn_inductor.kernels.gather_scatter.op import gather_scatter_reference
from gnn_inductor.testing import check_rewrites, magnitude, random_graph, tolerance

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _force_rewrites(monkeypatch):
    """Test graphs are small: without this the cost model would leave them to Inductor."""
    monkeypatch.setenv("GNN_IO_FORCE", "1")


def test_cost_model_leaves_small_gather_scatter_to_inductor(monkeypatch):
    monkeypatch.delenv("GNN_IO_FORCE")
    torch.manual_seed(0)
    result = check_rewrites(pyg.SAGEConv(16, 16, aggr="max").cuda(), torch.randn(300, 16, device="cuda"),
                            random_graph(300, 3000, seed=1).cuda(), expect={"gather_scatter": 0})
    assert "cost model" in result.near_misses[0].reason
CUDA = torch.device("cuda")
NUM_NODES, NUM_EDGES, HUB = 400, 4000, 3000
CHANNELS, EDGE_DIM = 32, 8


class EdgeReluConv(MessagePassing):
    """``aggr_j relu(W x_j + edge_attr)`` (GINE-like, any aggregation)."""

    def __init__(self, channels: int, aggr: str):
        super().__init__(aggr=aggr)
        self.lin = nn.Linear(channels, channels)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=self.lin(x), edge_attr=edge_attr)

    def message(self, x_j, edge_attr):
        return F.relu(x_j + edge_attr)


class LeakyDifferenceConv(MessagePassing):
    """``aggr_j leaky_relu(x_j - x_i / 2) * w_ij + b``: destination rows, a per-edge scalar, a dense parameter
    (``x_i / 2``: with ``x_j - x_i`` the bias of ``lin`` cancels and its gradient is rounding noise)."""

    def __init__(self, channels: int, aggr: str):
        super().__init__(aggr=aggr)
        self.lin = nn.Linear(channels, channels)
        self.bias = nn.Parameter(torch.randn(channels) * 0.1)

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight)

    def message(self, x_j, x_i, edge_weight):
        return F.leaky_relu(x_j - 0.5 * x_i, 0.2) * edge_weight.view(-1, 1) + self.bias


def layer_inputs(num_nodes=NUM_NODES, num_edges=NUM_EDGES, hub=HUB, device=CUDA):
    """The layers' inputs by name (tests/kernels/gather_scatter/test_gather_scatter_compiled.py takes a small one on
    CPU)."""
    edge_index = random_graph(num_nodes, num_edges, seed=7, hub_degree=hub).to(device)
    generator = torch.Generator().manual_seed(3)
    num_edges = edge_index.shape[1]
    return {
        "x": torch.randn(num_nodes, CHANNELS, generator=generator).to(device),
        "edge_index": edge_index,
        "edge_attr": torch.randn(num_edges, EDGE_DIM, generator=generator).to(device),
        "edge_attr_x": torch.randn(num_edges, CHANNELS, generator=generator).to(device),
        "edge_weight": (torch.rand(num_edges, generator=generator) + 0.1).to(device),
    }


MODELS = {
    "sage_max": (lambda: pyg.SAGEConv(CHANNELS, 16, aggr="max"), ("x", "edge_index")),
    "graphconv_max": (lambda: pyg.GraphConv(CHANNELS, 16, aggr="max"), ("x", "edge_index")),
    "gine_sum": (lambda: pyg.GINEConv(nn.Linear(CHANNELS, 16), train_eps=True, edge_dim=EDGE_DIM),
                 ("x", "edge_index", "edge_attr")),
    **{f"edge_relu_{aggr}": ((lambda aggr=aggr: EdgeReluConv(CHANNELS, aggr)), ("x", "edge_index", "edge_attr_x"))
       for aggr in ("sum", "mean", "max", "min")},
    **{f"leaky_difference_{aggr}": ((lambda aggr=aggr: LeakyDifferenceConv(CHANNELS, aggr)),
                                    ("x", "edge_index", "edge_weight")) for aggr in ("sum", "max")},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_layer_matches_eager(name, dtype, monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    make, names = MODELS[name]
    graph = layer_inputs()
    model = make().to(CUDA, dtype)
    inputs = [graph[n].to(dtype) if graph[n].is_floating_point() else graph[n] for n in names]
    result = check_rewrites(model, *inputs, expect={"gather_scatter": 1, "near_miss": 0})
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "gather_scatter"]
    assert rewrite["details"]["lowering"] == "triton", rewrite
    assert rewrite["kernel"].startswith("fused degree-split Triton")


# a linear layer on gathered rows, moved before the gather (gnn_inductor/passes/gather_linear.py), then fused
GATHER_LINEAR = {
    "general_max": (lambda: pyg.GeneralConv(CHANNELS, 16, aggr="max"), ("x", "edge_index"), 1),
    "cg_sum": (lambda: pyg.CGConv(CHANNELS, dim=EDGE_DIM), ("x", "edge_index", "edge_attr"), 2),
    "edge_conv_max": (lambda: pyg.EdgeConv(nn.Linear(2 * CHANNELS, 16), aggr="max"), ("x", "edge_index"), 1),
    "pna": (lambda: pyg.PNAConv(CHANNELS, 16, ["mean", "min", "max", "std"], ["identity", "amplification"],
                                torch.tensor([0, 10, 30, 5]), edge_dim=EDGE_DIM), ("x", "edge_index", "edge_attr"), 1),
}


@pytest.mark.parametrize("name", list(GATHER_LINEAR))
def test_linear_on_gathered_rows_is_moved_and_fused(name, monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    make, names, moves = GATHER_LINEAR[name]
    graph = layer_inputs()
    result = check_rewrites(make().to(CUDA), *[graph[n] for n in names],
                            expect={"gather_linear": moves, "gather_scatter": 1, "near_miss": 0})
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "gather_scatter"]
    assert rewrite["details"]["lowering"] == "triton", rewrite


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_in_the_hub_share_the_gradient(reduce):
    """Integer features tie often, inside the split hub too; eager's scatter_reduce splits equally."""
    graph = layer_inputs()
    src, dst = graph["edge_index"]
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    x = torch.randint(-3, 4, (NUM_NODES, CHANNELS), device=CUDA).float().requires_grad_(True)
    rowptr, col, row, perm, *t_plan = plan
    out = torch.ops.gnn_io.gather_scatter([x], [0], rowptr, col, row, perm, key, reduce, t_plan)
    grad_out = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, [x], grad_out)
    x64 = x.detach().cpu().double().requires_grad_(True)
    ref = gather_scatter_reference([x64], [0], *(p.cpu() for p in plan[:4]), key, reduce)
    (rx,) = torch.autograd.grad(ref, [x64], grad_out.cpu().double())
    torch.testing.assert_close(out.cpu().double(), ref)
    torch.testing.assert_close(gx.cpu().double(), rx, **tolerance(torch.float32))


def test_split_threshold_cuts_the_hub():
    graph = layer_inputs()
    src, dst = graph["edge_index"]
    rowptr, col = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:2]
    shared = torch.ops.gnn_io.gather_scatter_items(rowptr, col)[3]
    max_edges = fused.split_threshold(rowptr, col)  # the pick the items op made
    assert max_edges < HUB
    assert int((shared == 1).sum()) >= HUB // max_edges


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_kernel_on_a_large_hub(dtype):
    """A hub of 100k neighbours runs as many items; forward and gradient against the reference."""
    num_nodes = 2000
    edge_index = random_graph(num_nodes, 20000, seed=9, hub_degree=100_000).to(CUDA)
    src, dst = edge_index
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j, e: torch.relu(x_j + e)))
    x = torch.randn(num_nodes, 64, device=CUDA, dtype=dtype, requires_grad=True)
    e = torch.randn(src.numel(), 64, device=CUDA, dtype=dtype, requires_grad=True)
    rowptr, col, row, perm, *t_plan = plan
    for reduce in ("sum", "max"):
        out = torch.ops.gnn_io.gather_scatter([x, e], [0, 2], rowptr, col, row, perm, key, reduce, t_plan)
        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, [x, e], grad_out)
        leaves = [t.detach().cpu().double().requires_grad_(True) for t in (x, e)]
        ref = gather_scatter_reference(leaves, [0, 2], *(p.cpu() for p in plan[:4]), key, reduce)
        ref_grads = torch.autograd.grad(ref, leaves, grad_out.cpu().double())
        for got, want in zip((out, *grads), (ref, *ref_grads)):
            want = want.to(dtype).double()
            torch.testing.assert_close(got.cpu().double(), want, **tolerance(dtype, "kernel", scale=magnitude(want)))


@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_default_split_at_scale_runs_the_rows_kernel(reduce, monkeypatch):
    """Above ``LIGHT_LAUNCH_MIN_ITEMS`` work items, with no setting, the forward launches its hub items and its light
    items apart and the light items run the rows kernel; forward and gradient against the reference (float32 for
    max, float64 for mean: comment below), on a graph of 600k rows (isolated ones too) with a hub of 100k
    neighbours."""
    for name in (launches.LIGHT_LAUNCH_ENV, launches.LIGHT_ROWS_ENV):
        monkeypatch.delenv(name, raising=False)
    kinds, real = [], launches.kernel
    monkeypatch.setattr(launches, "kernel", lambda lowered, spec: kinds.append(spec.kind) or
                        real(lowered, spec))
    num_nodes = 600_000
    edge_index = random_graph(num_nodes, 2_400_000, seed=11, hub_degree=100_000).to(CUDA)
    src, dst = edge_index
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    rowptr, col, row, perm, *t_plan = plan
    assert torch.ops.gnn_io.gather_scatter_items(rowptr, col)[0].numel() >= launches.LIGHT_LAUNCH_MIN_ITEMS
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j, e: torch.relu(x_j + e)))
    x = torch.randn(num_nodes, 32, device=CUDA, requires_grad=True)
    e = torch.randn(src.numel(), 32, device=CUDA, requires_grad=True)
    out = torch.ops.gnn_io.gather_scatter([x, e], [0, 2], rowptr, col, row, perm, key, reduce, t_plan)
    assert "rows" in kinds
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, e], grad_out)
    # max in float32: its messages round as the kernel's, so both see the same ties (two messages equal in float32
    # but not in float64 would split the gradient in the kernel and not in a float64 reference); mean in float64
    ref_dtype = torch.float32 if reduce == "max" else torch.float64
    leaves = [t.detach().cpu().to(ref_dtype).requires_grad_(True) for t in (x, e)]
    ref = gather_scatter_reference(leaves, [0, 2], *(p.cpu() for p in plan[:4]), key, reduce)
    ref_grads = torch.autograd.grad(ref, leaves, grad_out.cpu().to(ref_dtype))
    for got, want in zip((out, *grads), (ref, *ref_grads)):
        assert not got.isnan().any()
        torch.testing.assert_close(got.cpu().double(), want.double(), **tolerance(torch.float32))


class FeatureSumMessage(MessagePassing):
    """``max_j <x_j, x_i>``: a reduction over features, which the generator refuses."""

    def __init__(self):
        super().__init__(aggr="max")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_j, x_i):
        return (x_j * x_i).sum(-1, keepdim=True)


def test_unlowerable_message_runs_the_reference_and_says_so(monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    graph = layer_inputs()
    result = check_rewrites(FeatureSumMessage(), graph["x"], graph["edge_index"],
                            expect={"gather_scatter": 1, "near_miss": 0})
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"]]
    assert rewrite["details"]["lowering"].startswith("reference: aten.sum")
    assert rewrite["kernel"].startswith("segment reference: aten.sum")


# ---- several aggregations over the same messages: one pass (gnn_io::gather_scatter_multi) ----

class SeveralAggregations(nn.Module):
    """``MultiAggregation(['sum', 'mean', 'max', 'min', 'std'])`` of transformed source rows."""

    def __init__(self, channels: int):
        super().__init__()
        self.lin = nn.Linear(channels, 16)
        self.aggr = MultiAggregation(["sum", "mean", "max", "min", "std"])

    def forward(self, x, edge_index):
        return self.aggr(self.lin(x)[edge_index[0]], edge_index[1], dim_size=x.shape[0])


def _pna(graph):
    degree = torch.bincount(torch.bincount(graph["edge_index"][1], minlength=NUM_NODES)).cpu()
    return pyg.PNAConv(CHANNELS, 16, aggregators=["mean", "min", "max", "std"],
                       scalers=["identity", "amplification", "attenuation"], deg=degree, towers=2, edge_dim=EDGE_DIM)


MULTI_MODELS = {
    "sage_mean_max_min": (lambda graph: pyg.SAGEConv(CHANNELS, 16, aggr=["mean", "max", "min"]), ("x", "edge_index")),
    "multi_aggregation": (lambda graph: SeveralAggregations(CHANNELS), ("x", "edge_index")),
    "pna": (_pna, ("x", "edge_index", "edge_attr")),
}


@pytest.mark.parametrize("name", list(MULTI_MODELS))
def test_several_aggregations_share_one_pass(name, monkeypatch):
    """Compiled against eager PyG (float32, forward and every gradient) on the graph with the 3000-edge hub:
    one merged rewrite whose members the fused kernel computes in one walk."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    make, names = MULTI_MODELS[name]
    graph = layer_inputs()
    model = make(graph).to(CUDA)
    result = check_rewrites(model, *[graph[n] for n in names],
                            expect={"gather_scatter": 1, "spmm": 0, "near_miss": 0})
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "gather_scatter"]
    assert rewrite["op"] == "gnn_io.gather_scatter_multi" and rewrite["details"]["lowering"] == "triton", rewrite
    assert rewrite["kernel"].endswith(f"one pass for {len(rewrite['details']['members'])} reductions")
    assert rewrite["graph_stats"]["split"]["hub_rows"] >= 1


def test_multi_on_a_large_hub():
    """Every reduction of ``relu(x_j + e)`` and the mean of ``x_j * x_j`` over a 100k-neighbour hub (many work
    items meeting through atomics) in one call: each output and the summed gradients against the reference."""
    num_nodes = 2000
    edge_index = random_graph(num_nodes, 20000, seed=9, hub_degree=100_000).to(CUDA)
    src, dst = edge_index
    rowptr, col, row, perm, *t_plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    relu_edge = edge_functions.register(torch.fx.symbolic_trace(lambda x_j, e: torch.relu(x_j + e)))
    square = edge_functions.register(torch.fx.symbolic_trace(lambda x_j, e: x_j * x_j))
    keys = [relu_edge] * 4 + [square]
    reduces = ["sum", "mean", "max", "min", "mean"]
    x = torch.randn(num_nodes, 64, device=CUDA, requires_grad=True)
    e = torch.randn(src.numel(), 64, device=CUDA, requires_grad=True)
    outs = torch.ops.gnn_io.gather_scatter_multi([x, e], [0, 2], rowptr, col, row, perm, keys, reduces, t_plan)
    grad_outs = [torch.randn_like(out) for out in outs]
    grads = torch.autograd.grad(outs, [x, e], grad_outs)
    leaves = [t.detach().cpu().double().requires_grad_(True) for t in (x, e)]
    refs = [gather_scatter_reference(leaves, [0, 2], rowptr.cpu(), col.cpu(), row.cpu(), perm.cpu(), key, reduce)
            for key, reduce in zip(keys, reduces)]
    ref_grads = torch.autograd.grad(refs, leaves, [g.cpu().double() for g in grad_outs])
    for got, want in zip((*outs, *grads), (*refs, *ref_grads)):
        torch.testing.assert_close(got.cpu().double(), want, **tolerance(torch.float32, scale=magnitude(want)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_multi_backward_keeps_one_edge_gradient(compiled):
    """PNA's case: four reductions of one computed edge tensor ``m`` (mean, min, max of ``m``, mean of ``m * m``:
    four backward walks). The walks' kernels add into one float32 gradient buffer, so the backward's peak above
    what was allocated before it stays under 1.5 edge tensors, where summing the members' gradients in the graph
    held three or more (and adding each walk's gradient into the first one's, two)."""
    num_nodes = 2000
    edge_index = random_graph(num_nodes, 200_000, seed=10, hub_degree=20_000).to(CUDA)
    src, dst = edge_index
    rowptr, col, row, perm, *t_plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    identity = edge_functions.register(torch.fx.symbolic_trace(lambda m: m))
    square = edge_functions.register(torch.fx.symbolic_trace(lambda m: m * m))
    keys, reduces = [identity, identity, identity, square], ["mean", "min", "max", "mean"]

    def aggregate(m):
        outs = torch.ops.gnn_io.gather_scatter_multi([m], [2], rowptr, col, row, perm, keys, reduces, t_plan)
        return sum(outs)

    run = torch.compile(aggregate, fullgraph=True) if compiled else aggregate
    m = torch.randn(src.numel(), 64, device=CUDA, requires_grad=True)
    out = run(m)
    grad_out = torch.randn_like(out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    (grad,) = torch.autograd.grad(out, [m], grad_out)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    edge_bytes = m.numel() * m.element_size()
    assert extra <= 1.5 * edge_bytes, f"backward peak {extra / edge_bytes:.2f} edge tensors"
    leaf = m.detach().cpu().double().requires_grad_(True)
    refs = [gather_scatter_reference([leaf], [2], rowptr.cpu(), col.cpu(), row.cpu(), perm.cpu(), key, reduce)
            for key, reduce in zip(keys, reduces)]
    (want,) = torch.autograd.grad(sum(refs), [leaf], grad_out.cpu().double())
    torch.testing.assert_close(grad.cpu().double(), want, **tolerance(torch.float32, scale=magnitude(want)))
