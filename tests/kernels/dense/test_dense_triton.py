"""The 3xTF32 GEMM (kernels/dense/gemm.py): values against float64 in every launch shape, operand layout and
epilogue, the policy that decides where it runs, and its errors.

The kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the
interpreter tier (marker ``triton``, tests/run.py). On the H100 the split is checked
against float64 at float32's tolerance, tighter than cuBLAS's own float32 error there (``docs/dense.md``); the
interpreter computes the products in plain float32.
"""

import pytest
import torch

from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.config import SettingError
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from tests.tiers import tiered

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier
# max abs error over the max magnitude of the float64 product; cuBLAS float32 measured 4.5e-7 to 3.4e-6 there
TOLERANCE = 2e-6


def _error(value: torch.Tensor, exact: torch.Tensor) -> float:
    assert torch.isfinite(value).all()
    return ((value.double() - exact).abs().max() / exact.abs().max()).item()


def _operands(m, k, n, seed=0, a_transposed=False, b_kmajor=False):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    a = a.t().contiguous().t() if a_transposed else a  # the same values, column-major storage
    b = b.t().contiguous().t() if b_kmajor else b
    return a.to(DEVICE), b.to(DEVICE)


PRODUCT_SHAPES = [(300, 40, 24, 1), (257, 128, 64, 1), (33, 5, 130, 1), (64, 700, 48, 5), (20, 1000, 9, None),
                  (1, 3, 1, 1)]
LAYOUTS = ["row", "a_transposed", "b_kmajor"]


# the default tier: each shape once, the layouts in turn
@runs_kernel
@pytest.mark.parametrize("m,k,n,split,layout", tiered(
    [shape + (layout,) for shape in PRODUCT_SHAPES for layout in LAYOUTS],
    [shape + (LAYOUTS[i % len(LAYOUTS)],) for i, shape in enumerate(PRODUCT_SHAPES)]))
def test_product_matches_float64(m, k, n, split, layout):
    a, b = _operands(m, k, n, a_transposed=layout == "a_transposed", b_kmajor=layout == "b_kmajor")
    exact = a.double() @ b.double()
    value = dense_triton.mm(a, b, split=split, launch=(32, 32, 16, 4, 2))
    assert value.shape == (m, n) and value.dtype == torch.float32
    assert _error(value, exact) < TOLERANCE


@runs_kernel
@pytest.mark.parametrize("split", [1, 4])
def test_bias_and_accumulate(split):
    a, b = _operands(90, 200, 40, seed=1)
    bias = torch.randn(40, device=DEVICE)
    exact = a.double() @ b.double() + bias.double()
    assert _error(dense_triton.mm(a, b, bias, split=split, launch=(32, 32, 16, 4, 2)), exact) < TOLERANCE
    out = torch.randn(90, 40, device=DEVICE)
    start = out.double().clone()
    result = dense_triton.mm(a, b, bias, out=out, accumulate=True, split=split, launch=(32, 32, 16, 4, 2))
    assert result.data_ptr() == out.data_ptr()
    assert _error(out, start + exact) < TOLERANCE
    # a bias that is a strided view (every other element of a longer vector)
    spaced = torch.randn(80, device=DEVICE)
    exact_spaced = a.double() @ b.double() + spaced[::2].double()
    assert _error(dense_triton.mm(a, b, spaced[::2], split=split, launch=(32, 32, 16, 4, 2)), exact_spaced) < TOLERANCE
    # into a strided view: rows of a wider buffer, the rest untouched
    wide = torch.zeros(90, 50, device=DEVICE)
    dense_triton.mm(a, b, out=wide[:, 5:45], split=split, launch=(32, 32, 16, 4, 2))
    assert _error(wide[:, 5:45], a.double() @ b.double()) < TOLERANCE
    assert (wide[:, :5] == 0).all() and (wide[:, 45:] == 0).all()


@runs_kernel
def test_default_launches_of_matmul(monkeypatch):
    """``matmul`` with the thresholds lowered: the tall launch (a row-major weight made K-major), the split launch
    of a weight gradient, and cuBLAS below the thresholds, all the same values."""
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 100)
    monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")
    x, w = _operands(500, 64, 48, seed=2)
    g = torch.randn(500, 48, device=DEVICE)
    assert dense_triton.takes(x, w) and dense_triton.shape_kind(500, 64, 48) == "tall"
    assert _error(dense_triton.matmul(x, w), x.double() @ w.double()) < TOLERANCE
    assert dense_triton.shape_kind(48, 500, 64) == "wide"
    assert _error(dense_triton.matmul(g.t(), x), g.double().t() @ x.double()) < TOLERANCE
    monkeypatch.setenv("GNN_IO_FP32_GEMM", "cublas")
    assert not dense_triton.takes(x, w)
    assert _error(dense_triton.matmul(x, w), x.double() @ w.double()) < TOLERANCE


@runs_kernel
def test_inf_and_nan_propagate_as_in_float32():
    a, b = _operands(40, 16, 8, seed=3)
    a[3, 2] = float("inf")
    a[7, 0] = float("nan")
    value = dense_triton.mm(a, b, launch=(32, 32, 16, 4, 2))
    reference = a @ b
    torch.testing.assert_close(value.isnan(), reference.isnan())
    torch.testing.assert_close(value.isinf(), reference.isinf())
    finite = torch.isfinite(reference)
    assert _error(value[finite], (a.double() @ b.double())[finite]) < TOLERANCE


@runs_kernel
@pytest.mark.parametrize("m,k,n", tiered([(300, 128, 128), (257, 100, 40), (65, 5, 130), (1, 16, 64), (129, 128, 512)],
                                         [(300, 128, 128), (1, 16, 64)]))
def test_stationary_kernel_matches_float64(m, k, n):
    """The weight-stationary kernel: any row count, inner sizes up to 128 (padded to a power of two), outputs of
    several column tiles, a bias, each launch of programs per SM."""
    a, b = _operands(m, k, n, seed=4)
    bias = torch.randn(n, device=DEVICE)
    exact = a.double() @ b.double() + bias.double()
    for launch in [dense_triton.STATIONARY_LAUNCH, (64, 64, 4, 2, 1, 128), (64, 32, 4, 2, 3, 16)]:
        value = dense_triton.stationary_mm(a, b.t(), bias, launch=launch)
        assert value.shape == (m, n)
        assert _error(value, exact) < TOLERANCE
    assert _error(dense_triton.stationary_mm(a, b.t().contiguous()), a.double() @ b.double()) < TOLERANCE


@runs_kernel
def test_stationary_kernel_epilogues(monkeypatch):
    """``matmul``'s tall products on the weight-stationary kernel: accumulating into a strided view of a wider
    buffer, the extra inner range of ``mm_extra`` and the head scores of ``linear_scores``, which takes the tile
    kernel for an inner size above :data:`STATIONARY_MAX_K`."""
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")
    a, b = _operands(200, 96, 64, seed=5)
    assert dense_triton.stationary_takes(a, b.t().contiguous().t())
    wide = torch.randn(200, 80, device=DEVICE)
    start = wide.double().clone()
    dense_triton.matmul(a, b, out=wide[:, 8:72], accumulate=True)
    assert _error(wide[:, 8:72], start[:, 8:72] + a.double() @ b.double()) < TOLERANCE
    assert torch.equal(wide[:, :8].double(), start[:, :8]) and torch.equal(wide[:, 72:].double(), start[:, 72:])
    bias = torch.randn(64, device=DEVICE)
    dense_triton.matmul(a, b, bias, out=wide[:, 8:72])  # written over, with a bias
    assert _error(wide[:, 8:72], a.double() @ b.double() + bias.double()) < TOLERANCE
    assert torch.equal(wide[:, :8].double(), start[:, :8]) and torch.equal(wide[:, 72:].double(), start[:, 72:])
    with pytest.raises(ValueError, match="bias must be"):
        dense_triton.matmul(a, b, torch.randn(63, device=DEVICE))
    for k2 in (6, 16):  # the extra inner range, up to MAX_SCORES; its eb split once per program
        ea = torch.randn(200, k2, device=DEVICE)
        eb = torch.randn(k2, 64, device=DEVICE)
        exact = a.double() @ b.double() + ea.double() @ eb.double()
        assert _error(dense_triton.mm_extra(a, b, ea, eb), exact) < TOLERANCE
        assert _error(dense_triton.mm_extra(a, b, ea.t().contiguous().t(), eb.t().contiguous().t()), exact) < TOLERANCE
    for features in (96, 160):  # the weight-stationary kernel, then the tile kernel
        x = torch.randn(200, features, device=DEVICE)
        weight = torch.randn(128, features, device=DEVICE) / 10
        bias = torch.randn(128, device=DEVICE)
        assert dense_triton.stationary_takes(x, weight.t()) == (features <= dense_triton.STATIONARY_MAX_K)
        for count in (1, 2, 3):  # two attention rows held per program, a third read per tile
            att = torch.randn(count, 4, 32, device=DEVICE)
            h_exact = x.double() @ weight.double().t() + bias.double()
            scores_exact = torch.einsum("nhc,rhc->nrh", h_exact.view(200, 4, 32), att.double())
            h, scores = dense_triton.linear_scores(x, weight, bias, att)
            assert _error(h, h_exact) < TOLERANCE and _error(scores, scores_exact) < TOLERANCE


@runs_kernel
def test_stationary_kernel_inf_and_nan():
    """An infinite operand gives the infinite product (not the NaN of ``inf - inf`` in the tail products); a NaN
    gives NaN; the rest stays at float32's accuracy."""
    a, b = _operands(70, 128, 64, seed=6)
    a[3, 5] = float("inf")
    a[4, 6] = float("nan")
    a[9, 1] = -float("inf")
    value = dense_triton.stationary_mm(a, b.t())
    reference = a @ b
    torch.testing.assert_close(value.isnan(), reference.isnan())
    torch.testing.assert_close(value.isinf(), reference.isinf())
    torch.testing.assert_close(value[value.isinf()], reference[reference.isinf()])
    finite = torch.isfinite(reference)
    assert _error(value[finite], (a.double() @ b.double())[finite]) < TOLERANCE
    # an infinite weight: its column infinite (signs as float32's), the other columns untouched
    a, b = _operands(70, 128, 64, seed=7)
    b[10, 3] = float("inf")
    value, reference = dense_triton.stationary_mm(a, b.t()), a @ b
    torch.testing.assert_close(value.isinf(), reference.isinf())
    torch.testing.assert_close(value[:, 3], reference[:, 3])
    assert _error(value[:, 4:], (a.double() @ b.double())[:, 4:]) < TOLERANCE


def test_stationary_kernel_refuses_what_it_cannot_run():
    a = torch.zeros(8, 129)
    with pytest.raises(ValueError, match="K<=128"):
        dense_triton.stationary_mm(a, torch.zeros(4, 129))
    with pytest.raises(ValueError, match="float32"):
        dense_triton.stationary_mm(torch.zeros(8, 4, dtype=torch.float64), torch.zeros(4, 4))
    assert not dense_triton.stationary_takes(torch.zeros(8, 129), torch.zeros(129, 4))
    assert not dense_triton.stationary_takes(torch.zeros(4, 8).t(), torch.zeros(4, 4))  # rows not at unit stride


def test_stationary_kernel_needs_the_shared_memory(monkeypatch):
    """A CUDA device whose programs get less shared memory than the launch needs (an A100) keeps the tile kernel;
    the device's facts are read once."""
    props = type("Props", (), {"multi_processor_count": 108, "shared_memory_per_block_optin": 166912})
    calls = []
    monkeypatch.setattr(dense_triton, "_DEVICES", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: calls.append(index) or props)
    a = torch.zeros(8, 128, device="meta")
    b = torch.zeros(4, 128, device="meta").t()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    device = torch.device("cuda", 0)
    assert dense_triton._device_facts(device) == (108, False)
    assert dense_triton._device_facts(device) == (108, False) and calls == [0]
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: device))
    assert not dense_triton.stationary_takes(a, b)
    props.shared_memory_per_block_optin = 232448  # an H100
    monkeypatch.setattr(dense_triton, "_DEVICES", {})
    assert dense_triton.stationary_takes(a, b)


def test_policy_thresholds_and_setting(monkeypatch):
    assert dense_triton.shape_kind(1 << 20, 128, 128) == "tall"
    assert dense_triton.shape_kind(1 << 17, 128, 512) == "tall"
    # a tie or a loss on the H100; with the weight-stationary kernel, 0.91x per SAGEConv max step
    # (the kernel's own 0.09 ms against cuBLAS's 0.12 did not pay for its call's CPU time)
    assert dense_triton.shape_kind(1 << 17, 128, 128) is None
    assert dense_triton.shape_kind(128, 1 << 20, 128) == "wide"
    assert dense_triton.shape_kind(128, 1 << 17, 128) is None
    assert dense_triton.shape_kind(1 << 20, 4096, 128) is None  # a wide weight: not the measured shapes
    assert dense_triton.shape_kind(1 << 17, 128, 384) is None  # TransformerConv's arxiv-size GEMM: cuBLAS
    # under CUDA graphs a replay has no launch cost: the tall kernels from 2^31 multiply-adds
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert dense_triton.shape_kind(1 << 17, 128, 384) == "tall"
    assert dense_triton.shape_kind(1 << 17, 128, 128) == "tall"
    assert dense_triton.shape_kind(1 << 16, 128, 128) is None
    assert dense_triton.shape_kind(128, 1 << 17, 128) is None  # the wide threshold stays
    monkeypatch.setenv("GNN_IO_FP32_TALL_LOG2", "33")  # the measurement knob sets it
    assert dense_triton.shape_kind(1 << 17, 128, 384) is None
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS")
    monkeypatch.setenv("GNN_IO_FP32_TALL_LOG2", "31")
    assert dense_triton.shape_kind(1 << 17, 128, 128) == "tall"
    monkeypatch.setenv("GNN_IO_FP32_TALL_LOG2", "x")
    with pytest.raises(SettingError, match="GNN_IO_FP32_TALL_LOG2"):
        dense_triton.shape_kind(1 << 17, 128, 128)
    monkeypatch.delenv("GNN_IO_FP32_TALL_LOG2")
    cpu = torch.zeros(4, 4)
    monkeypatch.delenv("GNN_IO_TRITON_ON_CPU", raising=False)
    assert not dense_triton.takes(cpu, cpu)  # CPU tensors outside the tests' interpreter mode: cuBLAS's place
    monkeypatch.setenv("GNN_IO_FP32_GEMM", "cublas")
    assert dense_triton.setting() == "cublas"
    monkeypatch.setenv("GNN_IO_FP32_GEMM", "fast")
    with pytest.raises(SettingError, match="GNN_IO_FP32_GEMM"):
        dense_triton.setting()


def test_bad_operands_raise():
    with pytest.raises(TypeError, match="float32"):
        dense_triton.mm(torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="do not multiply"):
        dense_triton.mm(torch.zeros(4, 3), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="out must be"):
        dense_triton.mm(torch.zeros(4, 3), torch.zeros(3, 4), out=torch.zeros(4, 5))
    with pytest.raises(ValueError, match="bias must be"):
        dense_triton.mm(torch.zeros(4, 3), torch.zeros(3, 4), torch.zeros(5))


def test_empty_sizes():
    assert dense_triton.mm(torch.zeros(0, 3), torch.zeros(3, 4)).shape == (0, 4)
    bias = torch.arange(4.0)
    torch.testing.assert_close(dense_triton.mm(torch.zeros(2, 0), torch.zeros(0, 4), bias), bias.expand(2, 4))
