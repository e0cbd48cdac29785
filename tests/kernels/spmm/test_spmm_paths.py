"""The SpMM path choice (kernels/spmm/selector.py): ``gnn_io::spmm`` through the block-sparse kernel when it is
forced or chosen, against the op's exact CPU path (output, features' and values' gradients), and the
decisions' rules (duplicates, sparse tiles, the setting).

The kernel runs on CUDA when there is a GPU and on CPU under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py); the decision rules that need no kernel run on CPU directly.
"""
import pytest
import torch

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from gnn_inductor.kernels.spmm import block_sparse as block_sparse_spmm
from gnn_inductor.kernels.spmm import selector as spmm_paths
from gnn_inductor.plan import block_format
from gnn_inductor.plan import state as graph_state
from gnn_inductor.testing import TOLERANCES, tolerance

ops = torch.ops.gnn_io
NUM_NODES = 48

runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


def batched_graph(duplicates: bool = False, seed: int = 0):
    """Three dense little graphs side by side (locally dense: many edges per tile), self loops, an isolated
    node, a hub inside the first graph, and a duplicated edge when asked."""
    g = torch.Generator().manual_seed(seed)
    src, dst = [], []
    for first, size in ((0, 20), (20, 16), (36, 11)):
        mask = torch.rand(size, size, generator=g) < 0.5
        s, d = mask.nonzero().unbind(1)
        src.append(s + first)
        dst.append(d + first)
    src.append(torch.arange(1, 20))  # node 0: a hub of its graph
    dst.append(torch.zeros(19, dtype=torch.long))
    src, dst = torch.cat(src), torch.cat(dst)
    pairs = torch.unique(torch.stack([src, dst]), dim=1)  # coalesced: no duplicate pair
    src, dst = pairs[0], pairs[1]
    if duplicates:
        src, dst = torch.cat([src, src[:1]]), torch.cat([dst, dst[:1]])
    return src, dst  # node 47 has no edge


def sparse_random_plan(n: int) -> tuple:
    """``(rowptr, col)`` of a coalesced random graph of ``3 n`` edges: about one edge per 16 x 16 tile column."""
    g = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, n, (3 * n,), generator=g), torch.randint(0, n, (3 * n,), generator=g)
    pairs = torch.unique(torch.stack([src, dst]), dim=1)
    rowptr, col, *_ = ops.csr_plan(pairs[1], pairs[0], n, n)
    return rowptr, col


def plan_of(src, dst, device):
    return ops.csr_plan(dst.to(device), src.to(device), NUM_NODES, NUM_NODES)


def spmm_with_grads(x, w, plan, reduce):
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    values = w.index_select(0, perm)
    out = ops.spmm(x, values, values.index_select(0, t_perm), rowptr, col, row, t_rowptr, t_col, [], [], reduce)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    out.backward(grad)
    return out.detach(), x.grad, w.grad


@pytest.fixture
def path(monkeypatch):
    def set_path(value):
        monkeypatch.setenv(spmm_paths.PATH_ENV, value)
        graph_state.clear()
    yield set_path
    graph_state.clear()


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_forced_block_path_matches_exact_op(path, reduce):
    device = torch.device("cpu" if INTERPRETED else "cuda")
    src, dst = batched_graph()
    x = torch.randn(NUM_NODES, 24, dtype=torch.float64).float()
    w = torch.rand(src.numel()) + 0.1
    path("cusparse")  # on CPU: the exact segment-sum path
    expected = spmm_with_grads(x.double(), w.double(), plan_of(src, dst, "cpu"), reduce)
    path("block")
    actual = spmm_with_grads(x.to(device), w.to(device), plan_of(src, dst, device), reduce)
    (decision,) = [d for d in graph_state.decisions() if d["family"] == "spmm"]
    assert decision["path"] == "block" and decision["stats"]["edges_per_tile"] > 16
    rtol, atol = TOLERANCES[torch.float32]
    for name, a, e in zip(("out", "dX", "dvalues"), actual, expected):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.cpu().double(), e, rtol=rtol, atol=atol * e.abs().max().item(), msg=name)


@runs_kernel
def test_forced_block_path_stores_every_row(path, monkeypatch):
    """The block path's outputs are not zero-filled: the kernel must store every row, the isolated
    node's and the rows of windows without tiles included. Uninitialised outputs are poisoned with NaN here."""
    device = torch.device("cpu" if INTERPRETED else "cuda")
    fresh, poisoned = block_sparse_spmm._fresh_rows, []

    def nan_filled(blocks, num_rows, num_features, like):
        out = fresh(blocks, num_rows, num_features, like)
        if block_format.covers_every_row(blocks, num_rows):
            poisoned.append(num_rows)
            out.fill_(float("nan"))  # what an uninitialised tensor may hold
        return out
    monkeypatch.setattr(block_sparse_spmm, "_fresh_rows", nan_filled)
    src, dst = batched_graph()
    keep = (src < 32) & (dst < 32)  # nodes 32-47 without edges: the last window has no tile, either way
    src, dst = src[keep], dst[keep]
    x = torch.randn(NUM_NODES, 24, dtype=torch.float64).float()
    w = torch.rand(src.numel()) + 0.1
    path("cusparse")
    expected = spmm_with_grads(x.double(), w.double(), plan_of(src, dst, "cpu"), "mean")
    path("block")
    actual = spmm_with_grads(x.to(device), w.to(device), plan_of(src, dst, device), "mean")
    assert poisoned == [NUM_NODES, NUM_NODES]  # the forward's Y and the backward's dX
    rtol, atol = TOLERANCES[torch.float32]
    for name, a, e in zip(("out", "dX", "dvalues"), actual, expected):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.cpu().double(), e, rtol=rtol, atol=atol * e.abs().max().item(), msg=name)


def test_fresh_rows_are_zeros_unless_every_window_is_stored(monkeypatch):
    """Zeros where the kernel leaves rows alone (windows that are not dense_ok, or a format of other rows), an
    uninitialised tensor only where it stores every row: the allocation each case takes, recorded."""
    src, dst = batched_graph(duplicates=True)
    rowptr, col, row, perm = plan_of(src, dst, "cpu")[:4]
    blocks = block_format.build_block_format(rowptr, col, perm, NUM_NODES)
    assert 0 < blocks.dense_windows.shape[0] < blocks.window_rows.shape[0]  # the duplicate's window
    every = blocks._replace(dense_windows=torch.arange(blocks.window_rows.shape[0], dtype=torch.int32))
    x = torch.randn(NUM_NODES, 4)
    calls = []
    for name in ("empty", "zeros"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    cases = [(blocks, NUM_NODES), (every, NUM_NODES + 1), (every, NUM_NODES - 1), (every, NUM_NODES)]
    outs = [block_sparse_spmm._fresh_rows(b, n, 4, x) for b, n in cases]
    assert calls == ["zeros", "zeros", "zeros", "empty"]
    assert [tuple(o.shape) for o in outs] == [(n, 4) for _, n in cases] and {o.dtype for o in outs} == {x.dtype}
    assert all(bool((o == 0).all()) for o in outs[:3])


@runs_kernel
def test_duplicate_edges_stay_on_cusparse(path):
    device = torch.device("cpu" if INTERPRETED else "cuda")
    src, dst = batched_graph(duplicates=True)
    x, w = torch.randn(NUM_NODES, 8), torch.rand(src.numel()) + 0.1
    path("cusparse")
    expected = spmm_with_grads(x.double(), w.double(), plan_of(src, dst, "cpu"), "sum")
    path("block")
    actual = spmm_with_grads(x.to(device), w.to(device), plan_of(src, dst, device), "sum")
    (decision,) = [d for d in graph_state.decisions() if d["family"] == "spmm"]
    assert decision["path"] == "csr" and "duplicate" in decision["reason"]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu().double(), e, **tolerance(torch.float32))


def test_auto_keeps_sparse_graphs_on_cusparse(path):
    """A random sparse graph has about one edge per tile column: no kernel is timed, cuSPARSE stays."""
    path("auto")
    n = 2000
    rowptr, col = sparse_random_plan(n)
    decision = spmm_paths.decide(torch.randn(n, 8), torch.ones(col.numel()), rowptr, col, "sum")
    assert decision.path == "csr" and "edges per 16 x 16 tile" in decision.reason
    assert decision.stats["edges_per_tile"] < spmm_paths.MIN_EDGES_PER_TILE
    assert spmm_paths.min_edges_per_tile("half") == spmm_paths.MIN_EDGES_PER_TILE_HALF < 16  # timed in half
    # cached with the plan: the same object on the next call
    assert spmm_paths.decide(torch.randn(n, 8), torch.ones(col.numel()), rowptr, col, "sum") is decision


@pytest.mark.parametrize("with_backward", [True, False])
def test_auto_choice_weighs_the_backward_when_it_has_the_transposed_plan(path, monkeypatch, with_backward):
    """The block kernel's forward may be slower and its step still faster (GCN on the block model, H100):
    with the plan's transposed CSR the timed choice adds each path's backward dX product. Timings are canned
    here (cuSPARSE forward 1.0 ms, block 1.1; backward 1.2 against 0.6): block wins only when the backward
    counts."""
    path("auto")
    n, size = 64, 16
    blocks = [torch.cartesian_prod(torch.arange(size), torch.arange(size)) + k * size for k in range(n // size)]
    pairs = torch.cat(blocks).t()  # four dense 16-node communities: 256 edges per tile
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = ops.csr_plan(pairs[1], pairs[0], n, n)[:7]
    values = torch.ones(col.numel())
    canned = iter([1.0, 1.1, 1.2, 0.6])
    monkeypatch.setattr(spmm_paths, "_time", lambda fn, device, reps=5: next(canned))
    transposed = (values.index_select(0, t_perm), t_rowptr, t_col) if with_backward else None
    decision = spmm_paths.decide(torch.randn(n, 8), values, rowptr, col, "sum", transposed)
    if with_backward:
        assert decision.path == "block" and "forward and backward" in decision.reason, decision.reason
        assert decision.measured_forward_ms == pytest.approx({"cusparse": 2.2, "block": 1.7})
    else:
        assert decision.path == "csr" and decision.measured_forward_ms == pytest.approx({"cusparse": 1.0,
                                                                                           "block": 1.1})


def test_half_precision_times_tiles_of_one_edge_per_column(path, monkeypatch):
    """In fp16/bf16 a graph of about one edge per tile column is still timed (the block model's 15.7 edges per
    tile won 1.05x in bf16 on the H100); in float32 it stays on cuSPARSE untimed."""
    path("auto")
    n = 2000
    rowptr, col = sparse_random_plan(n)
    monkeypatch.setattr(spmm_paths, "_time", lambda fn, device, reps=5: 1.0)  # a tie: cuSPARSE stays
    half = spmm_paths.decide(torch.randn(n, 8).to(torch.bfloat16), torch.ones(col.numel()), rowptr, col, "sum")
    assert half.path == "csr" and "measured" in half.reason and half.measured_forward_ms, half.reason
    single = spmm_paths.decide(torch.randn(n, 8), torch.ones(col.numel()), rowptr, col, "sum")
    assert single.path == "csr" and "edges per 16 x 16 tile" in single.reason and not single.measured_forward_ms


def test_setting_is_checked(path):
    path("fastest")
    with pytest.raises(ValueError, match="GNN_IO_SPMM_PATH"):
        spmm_paths.path_setting()


def test_cpu_without_interpreter_keeps_exact_path(path):
    path("block")
    if INTERPRETED:
        pytest.skip("the interpreter runs the kernel on CPU")
    assert not spmm_paths.applies(torch.randn(3, 2))


def test_first_call_inside_a_cuda_graph_capture_takes_cusparse_uncached(monkeypatch):
    """Inside a CUDA-graph capture a new plan's SpMM cannot build its block format (``torch.unique`` synchronises)
    or time the two paths: cuSPARSE runs with the reason and nothing is kept; outside the capture a forced block
    path is then taken as before."""
    monkeypatch.setenv(spmm_paths.PATH_ENV, "block")
    graph_state.clear()
    src, dst = batched_graph()
    rowptr, col = plan_of(src, dst, "cpu")[:2]
    x, values = torch.randn(NUM_NODES, 8), torch.ones(col.numel())
    monkeypatch.setattr(spmm_paths, "capturing", lambda device: True)
    during = spmm_paths.decide(x, values, rowptr, col, "sum")
    assert during.path == "csr" and "CUDA-graph capture" in during.reason and during.blocks is None
    assert not graph_state.state_of(rowptr, col, col).slot("decisions")
    monkeypatch.setattr(spmm_paths, "capturing", lambda device: False)
    assert spmm_paths.decide(x, values, rowptr, col, "sum").path == "block"
