"""The block and hybrid attention paths (kernels/attention/selector.py) through ``gnn_io::attention_forward``: the
forward and the gradient of every input against the float64 reference for TransformerConv (block, hybrid, a hub
window left to CSR), GAT and GATv2, a bias and attention dropout, and the first call's automatic choice, which times
the pick's training step and CSR's. On CUDA, or on CPU tensors under Triton's interpreter (forced paths)."""
import time

import pytest
import torch
from gnn_inductor.kernels.attention import dispatch, selector as attention_paths
from gnn_inductor.kernels.attention.op import attention_reference
from gnn_inductor.plan import block_format
from gnn_inductor.plan import state as graph_state
from gnn_inductor.testing import magnitude, tolerance

from tests.kernels.attention.cases import edge_fn
from tests.kernels.attention.paths_cases import (
    community_graph,
    fresh_cache,  # noqa: F401  (fixture)
    without_fixed_costs,
)
from tests.kernels.attention.test_block_sparse import CHANNELS, EPS, HEADS, dot_inputs, dropout_on, graph
from tests.tiers import KERNEL_DEVICE as DEVICE, runs_kernel, tiered


@runs_kernel
@pytest.mark.parametrize("path, dtype", tiered(
    [pytest.param(path, dtype, id=f"{path}-{'fp32' if dtype == torch.float32 else 'fp16'}")
     for dtype in (torch.float32, torch.float16) for path in ("block", "hybrid", "hub")],
    [("hybrid", torch.float16)]))
def test_paths_match_reference(path, dtype, monkeypatch):
    # forced block (duplicate windows still on CSR) and hybrid (cost model by window) through the op, forward
    # and the gradient of every input against the float64 reference on the whole graph
    monkeypatch.setenv(attention_paths.PATH_ENV, "hybrid" if path == "hybrid" else "block")
    for precision in ("ieee", "half"):  # constants that send some windows each way on this small graph
        monkeypatch.setitem(attention_paths.CALIBRATION["dot"], precision, {
            "csr_per_edge": 2.0, "csr_per_row": 1.0, "csr_fixed_ms": 0.0,
            "block_per_tile": 20.0, "block_per_row": 1.0, "block_fixed_ms": 0.0})
    num_nodes = 48
    src, dst = graph(num_nodes, 80 if path == "hub" else 260, seed=6, hub_degree=40, duplicates=2)
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    rowptr, col, row, perm = plan[:4]
    if path == "hub":  # the window of the most tiles (the hub's) goes to CSR
        tiles = block_format.build_block_format(rowptr, col, perm, num_nodes).tile_ptr.diff()
        assert int(tiles.max()) > int(tiles.min())
        monkeypatch.setattr(attention_paths, "MAX_WINDOW_TILES", int(tiles.max()) - 1)
    args, roles, score, message, _ = dot_inputs(num_nodes, False, dtype, seed=2)
    grad_out = torch.randn(num_nodes, HEADS, CHANNELS, generator=torch.Generator().manual_seed(3)).to(dtype)
    items = list(torch.ops.gnn_io.work_items(rowptr.to(DEVICE), col.to(DEVICE), 256))
    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    out = torch.ops.gnn_io.attention_forward(leaves, roles, rowptr.to(DEVICE), col.to(DEVICE), row.to(DEVICE),
                                             perm.to(DEVICE), score, message, EPS, items, 256)[0]
    out.backward(grad_out.to(DEVICE))
    (decision,) = graph_state.recorded()
    assert decision.path == "hybrid", decision.as_dict()  # duplicates (and the hub) leave windows to CSR
    assert 0 < decision.stats["block_windows"] < decision.stats["windows"]

    wide = [a.double().requires_grad_() for a in args]
    ref = attention_reference(wide, roles, rowptr, col, row, perm, score, message, EPS)
    ref.backward(grad_out.double())
    torch.testing.assert_close(out.cpu().double(), ref.to(dtype).double(),
                               **tolerance(dtype, "kernel", scale=magnitude(ref)))
    for name, leaf, expected in zip(["value", "query", "key"], leaves, wide):
        assert not torch.isnan(leaf.grad).any()
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad,
                                   **tolerance(dtype, "kernel", scale=magnitude(expected.grad)),
                                   msg=lambda m, name=name: f"grad of {name}: {m}")


@runs_kernel
@pytest.mark.parametrize("case, dtype", tiered(
    [pytest.param(case, dtype, id=f"{case}-{'fp32' if dtype == torch.float32 else 'fp16'}")
     for dtype in (torch.float32, torch.float16) for case in ("gat", "gat_edge", "gatv2", "gatv2_dropout")],
    [("gat_edge", torch.float32), ("gatv2", torch.float16)]))
def test_gat_paths_match_reference(case, dtype, monkeypatch):
    # GAT and GATv2 through the op on the block path (duplicate windows on CSR): forward and every gradient
    from tests.kernels.attention.test_block_sparse_gat import CASES, NUM_NODES, dropout_of, make_args

    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    score_fn, message_fn, family, kinds = CASES[case]
    src, dst = graph(NUM_NODES, 200, seed=7, hub_degree=30, duplicates=2)
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    rowptr, col, row, perm = plan[:4]
    args, roles = make_args(kinds, src.numel(), dtype, seed=4), [role for role, _ in kinds]
    score, message, dropout = edge_fn(score_fn), edge_fn(message_fn), dropout_of(case)
    grad_out = torch.randn(NUM_NODES, 2, 4, generator=torch.Generator().manual_seed(3)).to(dtype)
    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    seed, p = (None, 0.0) if dropout is None else (dropout.seed.to(DEVICE), dropout.p)
    out = torch.ops.gnn_io.attention_forward(leaves, roles, rowptr.to(DEVICE), col.to(DEVICE), row.to(DEVICE),
                                             perm.to(DEVICE), score, message, EPS, [], 0, seed, p)[0]
    out.backward(grad_out.to(DEVICE))
    (decision,) = graph_state.recorded()
    assert decision.family == family and decision.path == "hybrid", decision.as_dict()

    wide = [a.double().requires_grad_() for a in args]
    ref = attention_reference(wide, roles, rowptr, col, row, perm, score, message, EPS, dropout)
    ref.backward(grad_out.double())
    torch.testing.assert_close(out.cpu().double(), ref.to(dtype).double(),
                               **tolerance(dtype, "kernel", scale=magnitude(ref)))
    for i, (leaf, expected) in enumerate(zip(leaves, wide)):
        assert not torch.isnan(leaf.grad).any()
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad,
                                   **tolerance(dtype, "kernel", scale=magnitude(expected.grad)),
                                   msg=lambda m, i=i: f"grad of argument {i}: {m}")


@runs_kernel
def test_bias_paths_match_reference(monkeypatch):
    # GAT with a bias on the hybrid path: the op adds the bias after the block and CSR kernels, and both backwards
    # get out - bias for D; the bias's gradient is dout summed over rows
    from tests.kernels.attention.test_block_sparse_gat import CASES, NUM_NODES, make_args

    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    score_fn, message_fn, _, kinds = CASES["gat"]
    src, dst = graph(NUM_NODES, 200, seed=7, hub_degree=30, duplicates=2)
    rowptr, col, row, perm = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:4]
    args, roles = make_args(kinds, src.numel(), torch.float32, seed=4), [role for role, _ in kinds]
    args.append(torch.randn(8, generator=torch.Generator().manual_seed(5)))
    score, message = edge_fn(score_fn), edge_fn(message_fn)
    grad_out = torch.randn(NUM_NODES, 2, 4, generator=torch.Generator().manual_seed(3))
    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    out = torch.ops.gnn_io.attention_forward(leaves[:-1], roles, rowptr.to(DEVICE), col.to(DEVICE), row.to(DEVICE),
                                             perm.to(DEVICE), score, message, EPS, [], 0, None, 0.0, leaves[-1])[0]
    out.backward(grad_out.to(DEVICE))
    (decision,) = graph_state.recorded()
    assert decision.path == "hybrid", decision.as_dict()
    wide = [a.double().requires_grad_() for a in args]
    ref = attention_reference(wide[:-1], roles, rowptr, col, row, perm, score, message, EPS) + wide[-1].view(2, 4)
    ref.backward(grad_out.double())
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), **tolerance(torch.float32, "layer"))
    for i, (leaf, expected) in enumerate(zip(leaves, wide)):
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad, **tolerance(torch.float32, "layer"),
                                   msg=lambda m, i=i: f"grad of argument {i}: {m}")


@runs_kernel
def test_dropout_paths_match_reference(monkeypatch):
    # TransformerConv with attention dropout on the hybrid path: the block kernels (their windows) and the CSR
    # kernels (the duplicate windows) regenerate the same mask from the seed, forward and backward
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    num_nodes = 48
    src, dst = graph(num_nodes, 260, seed=6, hub_degree=40, duplicates=2)  # as test_paths_match_reference
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    rowptr, col, row, perm = plan[:4]
    args, roles, score, message, dropout = dot_inputs(num_nodes, True, torch.float32)
    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    on_device = dropout_on(dropout, DEVICE)
    out = torch.ops.gnn_io.attention_forward(leaves, roles, rowptr.to(DEVICE), col.to(DEVICE), row.to(DEVICE),
                                             perm.to(DEVICE), score, message, EPS, [], 0, on_device.seed,
                                             on_device.p)[0]
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(grad_out.to(DEVICE))
    (decision,) = graph_state.recorded()
    assert decision.path == "hybrid", decision.as_dict()
    assert 0 < decision.stats["block_windows"] < decision.stats["windows"]
    wide = [a.double().requires_grad_() for a in args]
    ref = attention_reference(wide, roles, rowptr, col, row, perm, score, message, EPS, dropout)
    ref.backward(grad_out.double())
    assert (ref - attention_reference(wide, roles, rowptr, col, row, perm, score, message, EPS)).abs().max() > 0.1
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), **tolerance(torch.float32, "layer"))
    for leaf, expected in zip(leaves, wide):
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad, **tolerance(torch.float32, "layer"))


# timing both paths under the interpreter takes a minute: the GPU tier and --slow
@runs_kernel
@pytest.mark.parametrize("reorder", tiered(["off", "applied"], []))
def test_automatic_choice_times_both_steps(monkeypatch, reorder):
    """Left to the chooser (a cost model that predicts a hybrid), the first call times the forward and backward of
    the pick and of CSR through the op's own step function, records both, and the result matches the reference
    whichever path it kept. With an order predicted to pay, both orders' steps are timed first (the identity
    order's backward with its own transposed format)."""
    monkeypatch.setattr(dispatch, "CHOOSE_ON_CPU", True)
    timed_steps = []

    def once(device, runs):  # one timed run per candidate, not four: the interpreter is slow
        out = {}
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            timed_steps.append(name)
            out[name] = (time.perf_counter() - start) * 1e3
        return out
    monkeypatch.setattr(attention_paths, "_paired_ms", once)
    without_fixed_costs(monkeypatch)
    if reorder == "off":
        monkeypatch.setenv("GNN_IO_REORDER", "off")
        num_nodes = 48
        src, dst = graph(num_nodes, 260, seed=6, hub_degree=40, duplicates=2)
    else:  # hidden communities and many expected calls: an order is predicted to pay (rcm halves the tiles), then
        # kept or dropped by its measured gain; either way the identity order's pick is timed against CSR
        monkeypatch.setenv(attention_paths.CALLS_ENV, "100000000")
        num_nodes = 256
        src, dst = community_graph()
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    rowptr, col, row, perm = (t.to(DEVICE) for t in plan[:4])
    args, roles, score, message, _ = dot_inputs(num_nodes, False, torch.float16, seed=2)
    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    out = torch.ops.gnn_io.attention_forward(leaves, roles, rowptr, col, row, perm, score, message, EPS, items,
                                             256)[0]
    out.float().sum().backward()
    (decision,) = graph_state.recorded()
    timed = decision.measured_forward_ms
    assert "csr fwd+bwd (vs csr)" in timed, decision.as_dict()
    assert any(k.endswith(" fwd+bwd (vs csr)") and not k.startswith("csr") for k in timed), decision.as_dict()
    assert len(timed_steps) == (4 if reorder == "applied" else 2)
    if reorder == "applied":
        assert any(k.startswith("none fwd+bwd") for k in timed), timed
        assert len([k for k in timed if "fwd+bwd" in k and "(vs csr)" not in k]) == 2, timed
    assert all(v > 0 for v in timed.values())
    wide = [a.double().requires_grad_() for a in args]
    ref = attention_reference(wide, roles, plan[0], plan[1], plan[2], plan[3], score, message, EPS)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach().to(torch.float16).double(),
                               **tolerance(torch.float16, "kernel", scale=magnitude(ref.detach())))
    for leaf, expected in zip(leaves, wide):
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad,
                                   **tolerance(torch.float16, "kernel", scale=magnitude(expected.grad)))
