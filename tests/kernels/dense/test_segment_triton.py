"""The segment matmul kernels (kernels/dense/segment_triton.py) against the op's loop of GEMMs, in float64: segment
layouts a block of rows meets (empty segments, segments shorter than a block, one spanning many blocks), operand
shapes off the tile sizes, strided operands, bounds on the host or the device in either integer type, half
precision; and the op choosing them by the setting, its gradients through autograd.

On CUDA where there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (marker
``triton``, tests/run.py).
"""

import pytest
import torch

from gnn_inductor import config
from gnn_inductor.kernels.dense import segment, segment_triton
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from gnn_inductor.testing import tolerance
from tests.tiers import tiered_at

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
pytestmark = pytest.mark.triton


def _loop(x, bounds, weight):
    out = torch.zeros(x.shape[0], weight.shape[-1], dtype=torch.float64)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        out[start:end] = x[start:end].double() @ weight[i].double()
    return out


def _loop_grad(x, bounds, grad, types):
    out = torch.zeros(types, x.shape[1], grad.shape[1], dtype=torch.float64)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        out[i] = x[start:end].double().t() @ grad[start:end].double()
    return out


def _error(value, exact) -> float:
    assert torch.isfinite(value).all()
    return ((value.double().cpu() - exact).abs().max() / exact.abs().max().clamp_min(1e-30)).item()


# (rows per segment, K, N): empty segments first, between and last; many segments within one block of 64 rows; one
# segment over several blocks; K over the largest K block (32) and N over the largest N block (64); tiny K and N
LAYOUTS = tiered_at([
    ([0, 5, 0, 70, 3, 0], 16, 16),
    ([1] * 40 + [7], 5, 7),
    ([300], 40, 80),
    ([17, 64, 1, 130], 24, 9),
], {0, 1})


@pytest.mark.parametrize("lengths,k,n", LAYOUTS)
def test_products_match_the_loop(lengths, k, n):
    torch.manual_seed(0)
    bounds = [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    x = torch.randn(bounds[-1], k)
    weight = torch.randn(len(lengths), k, n)
    grad = torch.randn(bounds[-1], n)
    type_ptr = torch.tensor(bounds)
    out = segment_triton.segment_mm(x.to(DEVICE), type_ptr, weight.to(DEVICE))
    assert _error(out, _loop(x, bounds, weight)) < 2e-6
    grad_w = segment_triton.segment_weight_grad(x.to(DEVICE), type_ptr, grad.to(DEVICE), len(lengths))
    assert grad_w.dtype == torch.float32 and _error(grad_w, _loop_grad(x, bounds, grad, len(lengths))) < 2e-6
    empty = [i for i, length in enumerate(lengths) if length == 0]
    assert (grad_w[empty] == 0).all()


@pytest.mark.parametrize("bounds_where", ["host_int64", "device_int32"])
def test_strided_operands_and_bounds_anywhere(bounds_where):
    torch.manual_seed(1)
    bounds = [0, 33, 33, 90]
    x = torch.randn(20, 90).t()  # [90, 20], column-major
    weight = torch.randn(3, 12, 20).transpose(1, 2)  # [3, 20, 12], what the input gradient multiplies by
    type_ptr = torch.tensor(bounds)
    if bounds_where == "device_int32":
        type_ptr = type_ptr.to(DEVICE, torch.int32)
    out = segment_triton.segment_mm(x.to(DEVICE), type_ptr, weight.to(DEVICE))
    assert _error(out, _loop(x, bounds, weight)) < 2e-6
    grad = torch.randn(12, 90).t()
    grad_w = segment_triton.segment_weight_grad(x.to(DEVICE), type_ptr, grad.to(DEVICE), 3)
    assert _error(grad_w, _loop_grad(x, bounds, grad, 3)) < 2e-6


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(
    torch.bfloat16, marks=pytest.mark.skipif(INTERPRETED, reason="interpreter's bf16 tl.dot"))])
def test_half_precision_is_within_its_rounding(dtype):
    torch.manual_seed(2)
    bounds = [0, 50, 51, 130]
    x, weight = torch.randn(130, 32).to(dtype), torch.randn(3, 32, 16).to(dtype)
    type_ptr = torch.tensor(bounds)
    out = segment_triton.segment_mm(x.to(DEVICE), type_ptr, weight.to(DEVICE))
    assert out.dtype == dtype
    assert _error(out, _loop(x, bounds, weight)) < 1e-2  # one rounding of the float32 sum to the half type
    grad = torch.randn(130, 16).to(dtype)
    grad_w = segment_triton.segment_weight_grad(x.to(DEVICE), type_ptr, grad.to(DEVICE), 3)
    assert grad_w.dtype == dtype and _error(grad_w, _loop_grad(x, bounds, grad, 3)) < 1e-2


@pytest.mark.parametrize("op", ["segment_matmul", "device_segment_matmul"])
def test_the_op_runs_the_kernels_under_the_setting_with_the_loops_gradients(monkeypatch, op):
    """Both ops, the one for bounds on the device (what a CUDA graph may hold) with its bounds there."""
    torch.manual_seed(3)
    calls = []
    for name in ("segment_mm", "segment_weight_grad"):
        original = getattr(segment_triton, name)
        monkeypatch.setattr(segment_triton, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    type_ptr = torch.tensor([0, 4, 4, 21], device=DEVICE if op.startswith("device") else "cpu")
    x = torch.randn(21, 6, device=DEVICE, requires_grad=True)
    weight = torch.randn(3, 6, 5, device=DEVICE, requires_grad=True)
    with config.patch(segment_matmul="triton", triton_on_cpu=True):
        assert segment.device_kernels_take(x, weight)
        out = getattr(segment, op)(x, type_ptr, weight)
        out.square().sum().backward()
    assert calls == ["segment_mm", "segment_mm", "segment_weight_grad"]  # forward, input gradient, weight gradient
    got = (out.detach(), x.grad, weight.grad)
    x.grad = weight.grad = None
    with config.patch(segment_matmul="loop"):
        expected_out = segment.segment_matmul(x, type_ptr, weight)
        expected_out.square().sum().backward()
    for value, expected in zip(got, (expected_out.detach(), x.grad, weight.grad)):
        torch.testing.assert_close(value, expected, **tolerance(torch.float32))
    assert len(calls) == 3  # the loop ran the second time


def test_float64_and_missing_weights_stay_with_the_loop():
    type_ptr = torch.tensor([0, 2, 5])
    with config.patch(segment_matmul="triton", triton_on_cpu=True):
        x = torch.randn(5, 3, dtype=torch.float64, device=DEVICE)
        assert not segment._kernels_take(x, torch.randn(2, 3, 4, dtype=torch.float64, device=DEVICE), type_ptr, 2)
        x = x.float()
        assert not segment._kernels_take(x, torch.randn(1, 3, 4, device=DEVICE), type_ptr, 1)  # 2 bounds, 1 weight
        assert segment._kernels_take(x, torch.randn(2, 3, 4, device=DEVICE), type_ptr, 2)


def test_deterministic_algorithms_take_the_weight_gradient_from_the_loop(monkeypatch):
    """The weight gradient's kernel adds partial products atomically: under ``torch.use_deterministic_algorithms``
    the loop makes it, while the products still run the kernel."""
    calls = []
    for name in ("segment_mm", "segment_weight_grad"):
        original = getattr(segment_triton, name)
        monkeypatch.setattr(segment_triton, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    type_ptr = torch.tensor([0, 3, 9])
    x = torch.randn(9, 4, device=DEVICE)
    grad = torch.randn(9, 5, device=DEVICE)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with config.patch(segment_matmul="triton", triton_on_cpu=True):
            got = segment.segment_matmul_weight_grad(x, type_ptr, grad, 2)
            segment.segment_matmul(x, type_ptr, torch.randn(2, 4, 5, device=DEVICE))
    finally:
        torch.use_deterministic_algorithms(before)
    assert calls == ["segment_mm"]
    torch.testing.assert_close(got.double().cpu(), _loop_grad(x.cpu(), [0, 3, 9], grad.cpu(), 2),
                               **tolerance(torch.float32))


@pytest.mark.skipif(INTERPRETED, reason="on CPU tensors the op runs the loop, as a CUDA graph never holds it there")
def test_the_device_op_raises_on_cuda_where_its_kernels_cannot_run():
    """On CUDA the op for bounds on the device never reads them on the host (the loop would, inside a CUDA graph):
    float64 operands, which the kernels do not take, raise with the reason; the pass checks this before."""
    x = torch.randn(5, 3, dtype=torch.float64, device=DEVICE)
    weight = torch.randn(2, 3, 4, dtype=torch.float64, device=DEVICE)
    assert not segment.device_kernels_take(x, weight)
    with pytest.raises(RuntimeError, match="cannot take torch.float64"):
        segment.device_segment_matmul(x, torch.tensor([0, 2, 5], device=DEVICE), weight)
