"""GAT's feature GEMM with its attention scores in the epilogue (kernels/attention/head_scores.py, ``gnn_io::linear_scores``)
and the pass that puts it into compiled graphs (``GNN_IO_SCORE_FOLD=1``, gnn_inductor/passes/score_fold.py):
values and every gradient against eager, with the kernels running (CUDA, or CPU tensors under Triton's interpreter
with the thresholds lowered to the tests' sizes) and without them (ATen, exact)."""
import copy

import pytest
import torch
from torch_geometric.nn import GATConv

import gnn_inductor
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.attention import head_scores
from gnn_inductor.testing import random_graph, tolerance
from tests.tiers import INTERPRETED, runs_kernel

KERNEL_DEVICE = "cpu" if INTERPRETED else "cuda"


@pytest.fixture
def kernel_sizes(monkeypatch):
    """The tests' products count as tall (forward, input gradient) and wide (weight gradient), as a layer's do at
    a million nodes; CPU tensors are the kernels' device under the interpreter."""
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 48)
    if INTERPRETED:
        monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")


def _eager(x, weight, bias, att):
    h = torch.nn.functional.linear(x, weight, bias)
    by_head = h.view(x.shape[0], att.shape[1], att.shape[2])
    return h, torch.stack([(by_head * a).sum(-1) for a in att], dim=1)


def _inputs(rows, features, heads, channels, count, bias, dtype=torch.float32, device="cpu", seed=0):
    generator = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device).requires_grad_()
    return (make(rows, features), make(heads * channels, features), make(heads * channels) if bias else None,
            make(count, heads, channels))


def _check_against_eager(inputs, rtol, atol):
    """Forward values and the gradients of every input match eager's, for upstream gradients of both outputs."""
    reference = [t.detach().double().requires_grad_() if t is not None else None for t in inputs]
    h, scores = head_scores.linear_scores(*inputs)
    h_ref, scores_ref = _eager(*reference)
    torch.testing.assert_close(h.double(), h_ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(scores.double(), scores_ref, rtol=rtol, atol=atol)
    generator = torch.Generator().manual_seed(5)
    grad_h = torch.randn(h.shape, generator=generator).to(h)
    grad_scores = torch.randn(scores.shape, generator=generator).to(h)
    ((h * grad_h).sum() + (scores * grad_scores).sum()).backward()
    ((h_ref * grad_h.double()).sum() + (scores_ref * grad_scores.double()).sum()).backward()
    for got, want in zip(inputs, reference):
        if got is None:
            continue
        assert got.grad is not None and torch.isfinite(got.grad).all()
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_aten_path_matches_eager(count, bias):
    """On the CPU without the interpreter the op is eager's computation: float32 at float32's tolerance."""
    inputs = _inputs(50, 12, 4, 8, count, bias)
    assert not head_scores.fused(inputs[0], inputs[1], inputs[3])
    _check_against_eager(inputs, **tolerance(torch.float32))


def test_backward_keeps_no_features():
    """The op's backward reads ``x``, the weights and the vectors, never ``h``: nothing ``[N, H C]`` is saved, so
    the GEMM's output is freed once the attention's backward is done with it."""
    x, weight, bias, att = _inputs(30, 12, 4, 8, 2, True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        h, scores = head_scores.linear_scores(x, weight, bias, att)
    assert saved and (30, 32) not in saved, saved


def test_half_precision_is_eager():
    """bfloat16 takes eager's formulas (``h`` made again in the backward), at bfloat16's tolerance."""
    inputs = _inputs(40, 12, 4, 8, 2, True, dtype=torch.bfloat16)
    reference = [t.detach().clone().requires_grad_() for t in inputs]
    got, want = head_scores.linear_scores(*inputs), _eager(*reference)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, **tolerance(torch.bfloat16, "reassociated"))
    (got[0].float().square().sum() + got[1].float().sum()).backward()
    (want[0].float().square().sum() + want[1].float().sum()).backward()
    for g, w in zip(inputs, reference):
        assert g.grad.dtype == torch.bfloat16 and torch.isfinite(g.grad).all()
        torch.testing.assert_close(g.grad.float(), w.grad.float(),
                                   **tolerance(torch.bfloat16, scale=w.grad.abs().max().item()))


def test_gradcheck_float64():
    inputs = _inputs(9, 5, 2, 3, 2, True, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *a: head_scores.linear_scores(*a), inputs)


@runs_kernel
@pytest.mark.parametrize("heads,channels,count,bias", [(4, 8, 2, False), (2, 16, 2, True), (8, 4, 1, False),
                                                       (1, 32, 2, True)])
def test_kernels_match_eager(heads, channels, count, bias, kernel_sizes):
    """The score epilogue, the input gradient's second inner range and the weight gradient's side product (the
    module docstring's products) against float64 eager; 70 rows: a partial row tile, heads split across tiles."""
    inputs = _inputs(70, 20, heads, channels, count, bias, device=KERNEL_DEVICE)
    assert head_scores.fused(inputs[0], inputs[1], inputs[3])
    _check_against_eager(inputs, **tolerance(torch.float32, "gemm"))


@runs_kernel
def test_kernels_read_strided_inputs(kernel_sizes):
    """A column slice of a wider tensor as ``x`` (row stride 33) and a transposed copy of the weight: the kernels
    read them through their strides."""
    x, weight, bias, att = _inputs(70, 20, 4, 8, 2, True, device=KERNEL_DEVICE)
    wide = torch.randn(70, 33, device=KERNEL_DEVICE)
    wide[:, 5:25] = x.detach()
    x = wide[:, 5:25].requires_grad_()
    weight = weight.detach().t().contiguous().t().requires_grad_()
    assert not x.is_contiguous() and not weight.is_contiguous() and head_scores.fused(x, weight, att)
    _check_against_eager((x, weight, bias, att), **tolerance(torch.float32, "gemm"))


@runs_kernel
def test_backward_products_match_float64(kernel_sizes):
    """``mm_extra`` (a second inner range of 8) and ``mm_side`` (8 side rows) alone, against float64."""
    generator = torch.Generator().manual_seed(3)
    a, w, x, s, m = (torch.randn(*shape, generator=generator).to(KERNEL_DEVICE)
                     for shape in ((70, 32), (32, 20), (70, 20), (70, 8), (8, 20)))
    assert dense_triton.takes(a, w) and dense_triton.takes(a.t(), x)
    exact = a.double() @ w.double() + s.double() @ m.double()
    torch.testing.assert_close(dense_triton.mm_extra(a, w, s, m).double(), exact, **tolerance(torch.float32, "gemm"))
    weight_grad, side = dense_triton.mm_side(a.t(), x, s.t())
    torch.testing.assert_close(weight_grad.double(), a.double().t() @ x.double(), **tolerance(torch.float32, "gemm"))
    torch.testing.assert_close(side.double(), s.double().t() @ x.double(), **tolerance(torch.float32, "gemm"))


@runs_kernel
def test_no_gradient_for_one_output(kernel_sizes):
    """Only the scores read (or only the features): the other output's gradient is zero, not garbage."""
    x, weight, bias, att = _inputs(40, 20, 4, 8, 2, True, device=KERNEL_DEVICE)
    head_scores.linear_scores(x, weight, bias, att)[1].sum().backward()
    h_grads = [t.grad.clone() for t in (x, weight, bias, att)]
    reference = [t.detach().double().requires_grad_() for t in (x, weight, bias, att)]
    _eager(*reference)[1].sum().backward()
    for got, want in zip(h_grads, reference):
        torch.testing.assert_close(got.double(), want.grad, **tolerance(torch.float32, "gemm"))


@pytest.mark.parametrize("case", ["inner", "att", "bias", "dtype"])
def test_bad_input_is_a_clear_error(case):
    x, weight, bias, att = _inputs(10, 6, 2, 4, 2, True)
    if case == "inner":
        x = torch.randn(10, 7)
    elif case == "att":
        att = torch.randn(2, 3, 4)
    elif case == "bias":
        bias = torch.randn(5)
    else:
        att = att.double()
    with pytest.raises(TypeError if case == "dtype" else ValueError, match="linear_scores"):
        head_scores.linear_scores(x, weight, bias, att)


# a compiled layer through the interpreted kernels takes about a minute of CPU: --slow, and the GPU (the kernels' own
# tests stay in the default tier)
@pytest.mark.slow
@runs_kernel
def test_compiled_gatconv_with_the_epilogue(kernel_sizes, monkeypatch):
    """GATConv compiled with ``GNN_IO_SCORE_FOLD=1``: its projections and GEMM are one ``linear_scores``
    call, and the output, the input gradient and every parameter's gradient match eager PyG."""
    monkeypatch.setenv("GNN_IO_SCORE_FOLD", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    calls, real = [], dense_triton.linear_scores
    monkeypatch.setattr(dense_triton, "linear_scores", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    model = GATConv(20, 8, heads=4).to(KERNEL_DEVICE)
    edge_index = random_graph(70, 500, seed=1, hub_degree=50).to(KERNEL_DEVICE)
    x = torch.randn(70, 20, device=KERNEL_DEVICE, requires_grad=True)
    eager = copy.deepcopy(model)
    x_ref = x.detach().clone().requires_grad_()
    expected = eager(x_ref, edge_index)
    expected.square().sum().backward()
    torch._dynamo.reset()
    out = torch.compile(model, backend="gnn_io")(x, edge_index)
    torch.testing.assert_close(out, expected, **tolerance(torch.float32, "layer"))
    out.square().sum().backward()
    for got, want in zip([x.grad] + [p.grad for p in model.parameters()],
                         [x_ref.grad] + [p.grad for p in eager.parameters()]):
        assert got is not None and torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tolerance(torch.float32, "layer"))
    assert calls, "the fused kernel did not run"
    assert "linear_scores" in gnn_inductor.rewrite_report.format_text(model)


def test_pass_leaves_graphs_the_kernel_does_not_run(monkeypatch):
    """On the CPU without the interpreter (or with TF32 allowed, or below the thresholds) the pattern stays for
    Inductor: no ``linear_scores`` in the report, and the compiled layer still matches eager."""
    monkeypatch.setenv("GNN_IO_SCORE_FOLD", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = GATConv(20, 8, heads=4)
    edge_index = random_graph(70, 500, seed=1, hub_degree=50)
    x = torch.randn(70, 20)
    torch._dynamo.reset()
    out = torch.compile(model, backend="gnn_io")(x, edge_index)
    torch.testing.assert_close(out, model(x, edge_index), **tolerance(torch.float32, "layer"))
    assert "linear_scores" not in gnn_inductor.rewrite_report.format_text(model)

