"""gnn_inductor.testing's comparison rules: check_rewrites' float64 reference for float32 models (judged, as half
precision is against float32, by twice eager float32's own distance from it) and the errors it raises."""
import pytest
import torch

from gnn_inductor.testing import assert_close_to_reference, check_rewrites


def _scaled_backend(scale: float):
    """A torch.compile backend that runs the graph and multiplies every floating output by ``scale``."""
    def backend(gm, example_inputs):
        def run(*args):
            outs = gm(*args)
            return type(outs)(o * scale if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                              for o in outs)
        return run
    return backend


class _Std(torch.nn.Module):
    """A standard deviation by ``E[x^2] - E[x]^2`` of rows far from zero: float32 cancels most digits."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x) + 300.0
        return ((y * y).mean(0) - y.mean(0) ** 2).clamp(min=1e-5).sqrt()


def test_float32_against_float64_within_twice_eager_error_passes():
    expected = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    baseline = (expected + 1e-3).float()
    assert_close_to_reference("x", (expected + 1.5e-3).float(), expected, baseline)
    with pytest.raises(AssertionError, match="from torch.float64"):
        assert_close_to_reference("x", (expected + 3e-3).float(), expected, baseline)


def _float64_backend(gm, example_inputs):
    """A torch.compile backend that runs the graph in float64 and returns float32: more exact than eager."""
    def run(*args):
        outs = gm(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
        return type(outs)(o.float() if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs)
    return run


def test_float64_reference_passes_a_compile_more_exact_than_eager():
    """Eager float32 is far from exact here (the variance cancels), a compile that computes in float64 is not:
    the float32 check against eager fails it, the float64 reference passes it."""
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    with pytest.raises(AssertionError, match="not close"):
        check_rewrites(_Std(), x, expect={}, calls=1, backend=_float64_backend)
    check_rewrites(_Std(), x, expect={}, calls=1, backend=_float64_backend, float64_reference=True)


def test_float64_reference_fails_a_wrong_result():
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="from torch.float64"):
        check_rewrites(torch.nn.Linear(4, 3), torch.randn(16, 4), expect={}, calls=1,
                       backend=_scaled_backend(1.001), float64_reference=True)


def test_float64_reference_is_for_float32_models():
    with pytest.raises(ValueError, match="float32 model"):
        check_rewrites(torch.nn.Linear(4, 3).bfloat16(), torch.randn(16, 4).bfloat16(), expect={}, calls=1,
                       float64_reference=True)


def test_half_precision_gradient_that_cancels_to_zero_is_judged_at_the_step_gradient_scale():
    """A gradient that is exactly 0 in float32 and in eager bfloat16 (a softmax over one edge): rounding noise at
    bfloat16's tolerance of the step's gradient scale passes with ``scale``, fails without it, and a wrong gradient
    of that scale still fails."""
    expected = torch.zeros(6, 8)
    scale = 5.0  # root mean square element of the step's largest gradient
    noise = torch.full((6, 8), 4e-3 * scale).bfloat16()  # a quarter of bfloat16's tolerance per element
    assert_close_to_reference("g", noise, expected, expected.bfloat16(), scale)
    with pytest.raises(AssertionError, match="allowed 0"):
        assert_close_to_reference("g", noise, expected, expected.bfloat16())
    with pytest.raises(AssertionError, match="from torch.float32"):
        assert_close_to_reference("g", torch.full((6, 8), 0.1 * scale).bfloat16(), expected, expected.bfloat16(), scale)


def test_gradient_scale_is_the_largest_root_mean_square_element():
    from gnn_inductor.testing import gradient_scale

    assert gradient_scale([None, torch.full((4, 4), 2.0), torch.tensor([3.0, -3.0]), torch.empty(0)]) == pytest.approx(3.0)
    assert gradient_scale([None]) == 0.0
