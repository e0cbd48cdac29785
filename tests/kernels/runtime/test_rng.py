"""The counter-based generator of attention dropout (kernels/runtime/rng.py): the torch implementation against Philox's
published answer and Triton's ``tl.randint`` bit for bit, its statistics, and the ``gnn_io::dropout_keep`` op.

The Triton side runs on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py).
"""

import pytest
import torch
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.runtime.launch import INTERPRETED


DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
SEEDS = [0, 1, 123456789, rng.SEED_HIGH - 1, 2**40 + 3]  # the last: a key with a high word

runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


def counters() -> torch.Tensor:
    """Edge-major counters of a small graph, random ones up to 2^40 and both sides of the 32-bit word boundary."""
    generator = torch.Generator().manual_seed(0)
    return torch.cat([torch.arange(4096), torch.randint(0, 2**40, (4096,), generator=generator),
                      torch.tensor([2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 7])])


# ---- torch (every machine) ----

def test_philox_known_answer():
    # Philox-4x32-10 of counter 0 and key 0 (Random123's known-answer test): first word 0x6627e8d5
    assert int(rng.random_bits(torch.tensor(0), torch.tensor([0]))[0]) == 0x6627E8D5


def test_uniform_is_exact_float32_in_unit_interval():
    u = rng.uniform(torch.tensor(5), counters())
    assert u.dtype == torch.float32 and bool((u >= 0).all()) and bool((u < 1).all())
    assert torch.equal(u * 2**24, (u * 2**24).round()), "24-bit values, exact in float32"


@pytest.mark.parametrize("p", [0.1, 0.3, 0.6])
def test_keep_rate_within_five_sigma(p):
    n = 1 << 20
    keep = rng.keep(torch.tensor(42), torch.arange(n), p)
    rate, sigma = float(keep.double().mean()), (p * (1 - p) / n) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma, f"kept {rate:.5f}, expected {1 - p} +- {5 * sigma:.5f}"


def test_uniform_histogram_and_seed_independence():
    n, bins = 1 << 20, 32
    u = rng.uniform(torch.tensor(7), torch.arange(n))
    counts = torch.histc(u, bins=bins, min=0.0, max=1.0)
    expected, sigma = n / bins, (n / bins * (1 - 1 / bins)) ** 0.5
    assert float((counts - expected).abs().max()) < 5 * sigma, counts
    # masks of two seeds agree where both keep or both drop: (1 - p)^2 + p^2 of the entries
    p = 0.3
    a, b = rng.keep(torch.tensor(7), torch.arange(n), p), rng.keep(torch.tensor(8), torch.arange(n), p)
    agree, q = float((a == b).double().mean()), (1 - p) ** 2 + p ** 2
    assert abs(agree - q) < 5 * (q * (1 - q) / n) ** 0.5
    # neighbouring counters (the heads of one edge, consecutive edges) are uncorrelated
    correlation = torch.corrcoef(torch.stack([u[:-1], u[1:]]).double())[0, 1]
    assert abs(float(correlation)) < 5 / n ** 0.5


def test_edge_keep_counts_edge_major():
    dropout = rng.Dropout(torch.tensor(3), 0.5)
    heads = 4
    mask = rng.edge_keep(dropout, torch.tensor([5, 0, 2]), (heads,))
    flat = rng.keep(dropout.seed, torch.arange(6 * heads), 0.5).view(6, heads)
    assert torch.equal(mask, flat[[5, 0, 2]])
    assert torch.equal(rng.dropout_keep(dropout.seed, [6, heads], 0.5), flat)


def test_dropout_keep_op():
    seed = torch.tensor(11)
    torch.library.opcheck(torch.ops.gnn_io.dropout_keep.default, (seed, [5, 3], 0.25))
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.gnn_io.dropout_keep(mode.from_tensor(seed), [7, 2], 0.25)
    assert fake.shape == (7, 2) and fake.dtype == torch.bool


# ---- Triton (CUDA, or the interpreter on CPU) ----

@runs_kernel
@pytest.mark.parametrize("seed", SEEDS)
def test_triton_is_torch_bit_for_bit(seed):
    c = counters()
    expected = rng.uniform(torch.tensor(seed), c)
    actual = rng.uniform_by_triton(torch.tensor(seed, device=DEVICE), c.to(DEVICE)).cpu()
    mismatched = int((actual != expected).sum())
    assert mismatched == 0, f"{mismatched} of {c.numel()} counters differ"


@runs_kernel
def test_dropout_keep_op_on_device_is_torch():
    seed = torch.tensor(123)
    expected = rng.keep(seed, torch.arange(1000 * 3), 0.3).view(1000, 3)
    assert torch.equal(rng.dropout_keep(seed.to(DEVICE), [1000, 3], 0.3).cpu(), expected)


def test_keep_bits_pack_the_mask_by_counter():
    dropout = rng.Dropout(torch.tensor(11), 0.3)
    for num_counters in (0, 1, 31, 32, 33, 1000):
        bits = rng.keep_bits(dropout, num_counters)
        assert bits.dtype == torch.int32 and bits.numel() == -(-num_counters // 32) + rng.KEEP_BITS_PAD
        unpacked = (bits.long().view(-1, 1) >> torch.arange(32)) & 1
        want = torch.zeros(bits.numel() * 32, dtype=torch.long)
        want[:num_counters] = rng.keep(dropout.seed, torch.arange(num_counters), dropout.p).long()
        assert torch.equal(unpacked.flatten(), want), num_counters


@runs_kernel
@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("num_counters", [1, 33, 4099])
def test_keep_bits_by_triton_is_torch(seed, num_counters):
    dropout = rng.Dropout(torch.tensor(seed), 0.3)
    expected = rng.keep_bits(dropout, num_counters)
    actual = rng.keep_bits_by_triton(rng.Dropout(dropout.seed.to(DEVICE), dropout.p), num_counters).cpu()
    assert torch.equal(actual, expected)


@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(rng._uniform_kernel, InterpretedFunction)

