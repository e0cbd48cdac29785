"""``GNN_IO_CUDAGRAPHS=1`` on CUDA: every rewritten family replays through Inductor's CUDA graph trees and
matches eager PyG, forward and gradients, over several steps (skipped without CUDA)."""
import copy

import pytest
import torch
from torch._dynamo.utils import counters
from torch_geometric import nn as pyg

from gnn_inductor import rewrite_report
from gnn_inductor.plan import state as graph_state
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.testing import random_graph

pytestmark = pytest.mark.cuda

LAYERS = {
    "gcn": lambda: pyg.GCNConv(32, 32),
    "gin": lambda: pyg.GINConv(torch.nn.Linear(32, 32)),
    "sage_mean": lambda: pyg.SAGEConv(32, 32, aggr="mean"),
    "sage_max": lambda: pyg.SAGEConv(32, 32, aggr="max"),
    "gat": lambda: pyg.GATConv(32, 8, heads=4),
    "transformer": lambda: pyg.TransformerConv(32, 8, heads=4),
    # the linear maps' gradients made by blocks of rows (gnn_io::attention_backward_projected), blocks of 32 KiB:
    # streams forked and joined inside the recorded graph
    "transformer_blocks": lambda: pyg.TransformerConv(32, 8, heads=4),
    "gatv2_blocks": lambda: pyg.GATv2Conv(32, 8, heads=4),
    # every GEMM of the layer by the 3xTF32 kernel (thresholds lowered to these sizes), replayed in the graph:
    # split-K partial buffers and the K-major weight copy allocated inside the recording
    "gat_x3": lambda: pyg.GATConv(32, 8, heads=4),
    "sage_max_x3": lambda: pyg.SAGEConv(32, 32, aggr="max"),
    "transformer_blocks_x3": lambda: pyg.TransformerConv(32, 8, heads=4),
    # without GNN_IO_FORCE: under CUDA graphs no edge threshold declines (gnn_inductor/cost.py, replayed), so these
    # 4k-edge graphs, far under every threshold, take the fused kernels all the same
    "gcn_unforced": lambda: pyg.GCNConv(32, 32),
    "sage_max_unforced": lambda: pyg.SAGEConv(32, 32, aggr="max"),
    "gat_unforced": lambda: pyg.GATConv(32, 8, heads=4),
    "transformer_unforced": lambda: pyg.TransformerConv(32, 8, heads=4),
}


@pytest.mark.parametrize("spmm_path", ["cusparse", "block"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_cuda_graph_replay_matches_eager(name, spmm_path, monkeypatch):
    if spmm_path == "block" and name.removesuffix("_unforced") not in ("gcn", "gin", "sage_mean"):
        pytest.skip("the block SpMM path concerns the SpMM family only")
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    unforced = name.endswith("_unforced")
    if unforced:
        for variable in ("GNN_IO_FORCE", "GNN_IO_SPMM_MIN_EDGES", "GNN_IO_GS_MIN_EDGES", "GNN_IO_ATTENTION_MIN_EDGES"):
            monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv("GNN_IO_FORCE", "1")  # small graph: rewrite anyway
    monkeypatch.setenv("GNN_IO_SPMM_PATH", spmm_path)
    if "_blocks" in name:
        monkeypatch.setenv("GNN_IO_GRAD_CHUNK_KB", "32")
    if name.endswith("_x3"):
        monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
        monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1)
        monkeypatch.setattr(dense_triton, "SMALL_SIDE", 128)
    torch._dynamo.reset()
    counters.clear()
    graph_state.clear()
    torch.manual_seed(0)
    device = torch.device("cuda")
    edge_index = random_graph(400, 4000, seed=3, hub_degree=1500).to(device)
    layer = LAYERS[name]().to(device)
    model = torch.compile(layer, backend="gnn_io")
    with torch.no_grad():  # an inference call first (its own graph), as an evaluation loop would make
        torch.compiler.cudagraph_mark_step_begin()
        model(torch.randn(400, 32, device=device), edge_index)
    # steps 2 and 3 read another graph of the same sizes, in two new tensors: each is a plan met first while a
    # graph is being recorded (a plan built there once kept its hub slots in the graph's pool), and stale structure of
    # the first graph would show in the outputs
    other = random_graph(400, 4000, seed=4, hub_degree=1500).to(device)
    exact_layer = copy.deepcopy(layer).double()  # the float64 reference both float32 runs are measured against
    for step, edges in enumerate([edge_index, edge_index, other, other.clone()]):
        x = torch.randn(400, 32, device=device)
        grad = torch.randn(400, 32, device=device)
        x_ref = x.clone().requires_grad_(True)
        out_ref = layer(x_ref, edges)
        want = torch.autograd.grad(out_ref, [x_ref] + list(layer.parameters()), grad)
        x_exact = x.double().requires_grad_(True)
        out_exact = exact_layer(x_exact, edges)
        exact = torch.autograd.grad(out_exact, [x_exact] + list(exact_layer.parameters()), grad.double())
        x_new = x.clone().requires_grad_(True)
        torch.compiler.cudagraph_mark_step_begin()
        out = model(x_new, edges)
        got = torch.autograd.grad(out, [x_new] + list(layer.parameters()), grad)
        # each tensor within 4x eager float32's own distance from float64 (plus 1e-6 of its norm): a flat
        # elementwise 1e-4 failed GIN's weight gradient (entries in the hundreds, a 1500-neighbour hub) by 1.9e-4 on
        # the H100, where eager float32 is itself about 9e-4 off float64 (on CPU, same seeds)
        for what, ours, eager, reference in [("output", out, out_ref, out_exact)] + [
                (f"grad {i}", g, w, e) for i, (g, w, e) in enumerate(zip(got, want, exact))]:
            assert torch.isfinite(ours).all(), f"step {step} {what}"
            error = (ours.double() - reference).norm().item()
            eager_error = (eager.double() - reference).norm().item()
            assert error <= 4 * eager_error + 1e-6 * reference.norm().item(), \
                f"step {step} {what}: {error:.3e} off float64, eager float32 {eager_error:.3e}"
    # every graph replayed (GCNConv's and GATConv's self-loop plans too, compiled at their concrete sizes)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    # ... whole, forward and backward: without this check a backward of fixed sizes went unrecorded and static
    # kernels were partitioned out of the forward with no skip counted
    # (the no_grad call's graph has a forward only)
    states = [g.cuda_graphs for g in rewrite_report.reports(layer)]
    assert states and all("forward" in s for s in states) and any("backward" in s for s in states), states
    assert all(state == "recorded as one CUDA graph" for s in states for state in s.values()), states
    if unforced:  # rewritten, and nothing declined by the cost model
        reports = rewrite_report.reports(layer)
        assert any(r.rewrites for r in reports), rewrite_report.format_text(layer)
        declined = [m.reason for r in reports for m in r.near_misses if m.reason.startswith("cost model")]
        assert not declined, declined
    if "_blocks" in name:
        assert sum(r.projected_grads for r in rewrite_report.reports(layer)) >= 1
    if name.startswith("gat_x3"):  # its GEMM and scores are one gnn_io::linear_scores call (kernels/attention/head_scores.py)
        assert "gnn_io::linear_scores" in rewrite_report.format_text(layer)
    elif name.endswith("_x3"):
        assert sum(sum(r.dense_gemms.values()) for r in rewrite_report.reports(layer)) >= 2
    torch._dynamo.reset()
