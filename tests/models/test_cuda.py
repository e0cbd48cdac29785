"""GPU paths against eager PyG on CUDA (skipped without CUDA; run on the device machine with
``python tests/run.py`` on a GPU machine)."""
import pytest
import torch
from torch_geometric import nn as pyg

import gnn_inductor.kernels  # noqa: F401
from gnn_inductor.testing import check_rewrites, random_graph, tolerance

pytestmark = pytest.mark.cuda
ops = torch.ops.gnn_io
CUDA = torch.device("cuda")


def plan_on(device, num_nodes=300, num_edges=3000, hub=2000):
    src, dst = random_graph(num_nodes, num_edges, seed=5, hub_degree=hub).to(device)
    return ops.csr_plan(dst, src, num_nodes, num_nodes)


@pytest.mark.parametrize("binding", ["triton", "cusparse", "torch_sparse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_matches_cpu_reference(dtype, reduce, binding, monkeypatch):
    monkeypatch.setenv("GNN_IO_SPMM", binding)
    cpu_plan, gpu_plan = plan_on("cpu"), plan_on(CUDA)
    n, e = cpu_plan[0].numel() - 1, cpu_plan[1].numel()
    x = torch.randn(n, 2, 16, dtype=torch.float64)
    w = torch.rand(e, dtype=torch.float64) + 0.1
    grad = torch.randn(n, 2, 16, dtype=torch.float64)

    def run(plan, device, dt):
        rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
        xx = x.to(device, dt).requires_grad_(True)
        ww = w.to(device, dt).requires_grad_(True)
        values = ww.index_select(0, perm)
        items, t_items = [], []
        if device == CUDA and binding == "triton":
            items, t_items = list(ops.work_items(rowptr, col, 64)), list(ops.work_items(t_rowptr, t_col, 64))
        out = ops.spmm(xx, values, values.detach().index_select(0, t_perm), rowptr, col, row, t_rowptr, t_col,
                       items, t_items, reduce)
        out.backward(grad.to(device, dt))
        return [t.double().cpu() for t in (out, xx.grad, ww.grad)]

    for got, want in zip(run(gpu_plan, CUDA, dtype), run(cpu_plan, "cpu", torch.float64)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tolerance(dtype, "kernel", scale=float(want.abs().max())))


ZOO = [
    ("gcn", lambda: pyg.GCNConv(16, 16), {"spmm": 1}),
    ("gcn_plain", lambda: pyg.GCNConv(16, 16, normalize=False, add_self_loops=False), {"spmm": 1}),
    ("sage_mean", lambda: pyg.SAGEConv(16, 16, aggr="mean"), {"spmm": 1}),
    ("gin", lambda: pyg.GINConv(torch.nn.Linear(16, 16)), {"spmm": 1}),
    ("gin_eps", lambda: pyg.GINConv(torch.nn.Linear(16, 16), eps=0.3), {"spmm": 1}),   # self term folded
    ("gin_train_eps", lambda: pyg.GINConv(torch.nn.Linear(16, 16), eps=0.3, train_eps=True), {"spmm": 1}),
    ("graphconv", lambda: pyg.GraphConv(16, 16, aggr="add"), {"spmm": 1}),
    ("sage_max", lambda: pyg.SAGEConv(16, 16, aggr="max"), {"gather_scatter": 1}),
    ("gat", lambda: pyg.GATConv(16, 4, heads=4), {"attention": 1}),
    ("gatv2", lambda: pyg.GATv2Conv(16, 4, heads=4), {"attention": 1}),
    ("transformer", lambda: pyg.TransformerConv(16, 4, heads=4), {"attention": 1}),
]


@pytest.mark.parametrize("binding", ["triton", "cusparse", "torch_sparse"])
@pytest.mark.parametrize("name, make, expect", ZOO, ids=[z[0] for z in ZOO])
def test_zoo_on_cuda_matches_eager(name, make, expect, binding, monkeypatch):
    monkeypatch.setenv("GNN_IO_SPMM", binding)
    monkeypatch.setenv("GNN_IO_FORCE", "1")  # small graph: the cost model would leave SpMM to Inductor
    torch.manual_seed(0)
    model = make().to(CUDA)
    edge_index = random_graph(300, 3000, seed=1, hub_degree=2000).to(CUDA)
    x = torch.randn(300, 16, device=CUDA)
    check_rewrites(model, x, edge_index, expect={**expect, "near_miss": 0})


def test_native_cusparse_entries_follow_the_matrix():
    """Two graphs of identical sizes alternate: every product must be that of its own graph (each keeps its
    entry in its own graph state; the ALG3 analysis is redone when the matrix tensors change)."""
    from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
    from gnn_inductor.kernels.spmm.common import spmm_state

    if not spmm_cusparse.available():
        pytest.skip("nvmath-python's cuSPARSE bindings are not installed")
    plans = [ops.csr_plan(*random_graph(500, 8000, seed=s, num_isolated=0, self_loops=0, duplicates=0)
                          .flip(0).to(CUDA), 500, 500) for s in (1, 2)]
    x = torch.randn(500, 64, device=CUDA)
    for _ in range(3):
        for rowptr, col, row, *_ in plans:
            values = torch.rand(col.numel(), device=CUDA)
            want = torch.zeros(500, 64, device=CUDA).index_add_(0, row.long(), x[col.long()] * values[:, None])
            entries = spmm_state(rowptr, col).slot("cusparse")
            torch.testing.assert_close(spmm_cusparse.cusparse_spmm(x, values, rowptr, col, entries), want,
                                       **tolerance(torch.float32, "hub_sum"))
    assert all(spmm_cusparse.chosen_algorithms(spmm_state(rowptr, col).slot("cusparse"))
               for rowptr, col, *_ in plans)


def test_cost_model_leaves_small_spmm_to_inductor(monkeypatch):
    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(pyg.GCNConv(16, 16).to(CUDA), torch.randn(300, 16, device=CUDA),
                            random_graph(300, 3000, seed=1).to(CUDA), expect={"spmm": 0, "gather_scatter": 0})
    assert "cost model" in result.near_misses[0].reason


def test_gat_bf16_compiles_and_is_close():
    """torch.compile default crashes here (misaligned address); gnn_io must not."""
    torch.manual_seed(0)
    model = pyg.GATConv(16, 4, heads=4).to(CUDA, torch.bfloat16)
    edge_index = random_graph(300, 3000, seed=1, hub_degree=2000).to(CUDA)
    check_rewrites(model, torch.randn(300, 16, device=CUDA, dtype=torch.bfloat16), edge_index,
                   expect={"attention": 1})


def test_cost_model_leaves_small_float32_attention_to_inductor(monkeypatch):
    """Below each family's threshold the whole graph runs as torch.compile's default, correctly, with a
    near miss naming the cost model; GNN_IO_FORCE=1 keeps the fused kernel."""
    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    torch.manual_seed(0)
    edge_index = random_graph(300, 3000, seed=1, hub_degree=2000).to(CUDA)
    x = torch.randn(300, 16, device=CUDA)
    for layer, family in ((pyg.TransformerConv(16, 4, heads=4), "dot"), (pyg.GATConv(16, 4, heads=4), "gat"),
                          (pyg.GATv2Conv(16, 4, heads=4), "gatv2")):
        result = check_rewrites(layer.to(CUDA), x, edge_index,
                                expect={"attention": 0, "edge_softmax": 0, "near_miss": 1})
        reason = result.near_misses[0].reason
        assert "cost model" in reason and f"{family} attention" in reason, reason
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    check_rewrites(pyg.GATConv(16, 4, heads=4).to(CUDA), x, edge_index, expect={"attention": 1})
