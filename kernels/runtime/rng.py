r"""Counter-based random numbers for attention dropout: the same mask from a seed and an edge id, wherever and
however often it is drawn.

.. math::
    u(\mathrm{seed}, n) = \lfloor \mathrm{philox}(\mathrm{seed}, n) / 2^8 \rfloor \cdot 2^{-24} \in [0, 1),
    \qquad \mathrm{keep}(e, h) = u(\mathrm{seed}, e H + h) \ge p

``philox`` is Philox-4x32-10 (Salmon et al., SC'11) as Triton's ``tl.randint(seed, n)`` computes it: key
``(seed mod 2^32, seed >> 32)``, counter ``(n mod 2^32, n >> 32, 0, 0)``, the first 32-bit word of the result.
``n`` is a non-negative int64; ``e`` is the edge's position in the ``edge_index`` that reaches the attention op
(the original edge order, not the CSR order), ``h`` its head, ``H`` the heads. The top 24 bits give a float32
that is exact in both implementations, and ``p`` is compared as a float32, so the torch functions below and the
Triton helpers give bit-identical masks on every device: the forward and backward kernels regenerate the mask
instead of storing it, and the CPU reference (and anything in the graph that reads the mask, such as returned
attention weights) draws the same one. A kept value is scaled by ``1 / (1 - p)`` (inverted dropout).

``seed`` is an int64 scalar tensor drawn in the compiled graph from torch's default generator (so
``torch.manual_seed`` governs it and every call draws a new mask), read by the kernels on the device: no host
synchronisation, CUDA-graph safe.
"""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from gnn_inductor.kernels.runtime.launch import cdiv, fast_launch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results

SEED_HIGH = 2**31 - 1    # seeds are drawn from [0, SEED_HIGH)
# zero words after a keep bitset: a kernel's padded heads (up to the next power of two) may read past the last
# edge's counters; their values are masked out
KEEP_BITS_PAD = 4
_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
# Philox-4x32 constants (Triton's triton/language/random.py, after Salmon et al.)
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUNDS = 10
_UNIT = 2.0 ** -24      # u = (bits >> 8) * 2^-24


class Dropout(NamedTuple):
    """Attention dropout of one op call: ``seed`` (int64 scalar tensor on the op's device) and ``p``."""
    seed: Tensor
    p: float

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)


def dropout_of(seed: Tensor | None, p: float) -> Dropout | None:
    """The op arguments ``(dropout_seed, dropout_p)`` as a :class:`Dropout`, None when there is no dropout."""
    if seed is None or p == 0.0:
        return None
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {p} (p = 1 drops everything: no op needed)")
    if seed.dtype != torch.int64 or seed.numel() != 1:
        raise ValueError(f"dropout_seed must be one int64, got {seed.dtype} of shape {tuple(seed.shape)}")
    return Dropout(seed.reshape(()), float(p))


def as_float32(p: float) -> float:
    """``p`` rounded to float32, the value the kernels compare with."""
    return struct.unpack("f", struct.pack("f", p))[0]


# ---------------------------------------------------------------------------------------------
# torch (every device): int64 arithmetic on 32-bit words
# ---------------------------------------------------------------------------------------------

def _mul_hi_lo(a: int, b: Tensor) -> tuple[Tensor, Tensor]:
    """High and low 32-bit words of ``a * b`` (``a`` a 32-bit constant, ``b`` 32-bit words in int64), in 16-bit
    halves of ``b`` so that no product exceeds 2^48."""
    low = (b & _MASK16) * a
    high = (b >> 16) * a + (low >> 16)
    return high >> 16, ((high & _MASK16) << 16) | (low & _MASK16)


def random_bits(seed: Tensor, counter: Tensor) -> Tensor:
    """``tl.randint(seed, counter)`` in torch: Philox-4x32-10's first word, as int64 in ``[0, 2^32)``."""
    counter = counter.long()
    seed = seed.long().to(counter.device)
    c0, c1 = counter & _MASK32, (counter >> 32) & _MASK32
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(_ROUNDS):
        high_b, low_b = _mul_hi_lo(_ROUND_B, c2)
        high_a, low_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0


def uniform(seed: Tensor, counter: Tensor) -> Tensor:
    """``u(seed, counter)`` (module docstring): float32 in ``[0, 1)``, the shape of ``counter``."""
    return (random_bits(seed, counter) >> 8).to(torch.float32) * _UNIT


def keep(seed: Tensor, counter: Tensor, p: float) -> Tensor:
    """Bool mask ``u(seed, counter) >= p`` (``p`` as float32)."""
    return uniform(seed, counter) >= as_float32(p)


def edge_keep(dropout: Dropout, edge_ids: Tensor, per_edge_shape) -> Tensor:
    """The keep-mask ``[len(edge_ids), *per_edge_shape]`` of the edges ``edge_ids`` (original order): entry
    ``(i, k)`` (``k`` a flat index into ``per_edge_shape``, the head for ``[H]``) keeps with counter
    ``edge_ids[i] * K + k``, ``K`` the product of ``per_edge_shape``."""
    width = math.prod(per_edge_shape)
    counter = edge_ids.long().view(-1, 1) * width + torch.arange(width, device=edge_ids.device)
    return keep(dropout.seed, counter, dropout.p).view(edge_ids.shape[0], *per_edge_shape)


def keep_bits(dropout: Dropout, num_counters: int) -> Tensor:
    """The keep-mask of counters ``0 .. num_counters - 1`` as a bitset (torch, any device): int32 word ``w``
    holds ``keep(32 w + i)`` in bit ``i``, padded with :data:`KEEP_BITS_PAD` zero words. What
    :func:`keep_bits_by_triton` computes, for tests and CPU callers."""
    num_words = cdiv(num_counters, 32)
    counter = torch.arange(num_words * 32, device=dropout.seed.device)
    bits = (keep(dropout.seed, counter, dropout.p) & (counter < num_counters)).view(num_words, 32).long()
    words = (bits << torch.arange(32, device=bits.device)).sum(dim=1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 is the int32 sign
    return torch.cat([words, words.new_zeros(KEEP_BITS_PAD)])


def dropout_reference(alpha: Tensor, dropout: Dropout | None, edge_ids: Tensor) -> Tensor:
    """``alpha [E, *K]`` (rows in the order of ``edge_ids``) with dropout: ``alpha * keep / (1 - p)``."""
    if dropout is None:
        return alpha
    return alpha * edge_keep(dropout, edge_ids, alpha.shape[1:]) * dropout.scale


# ---------------------------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------------------------

@triton.jit
def uniform_triton(seed, counter):
    """``u(seed, counter)`` of an int64 ``counter`` block (module docstring), float32 in ``[0, 1)``."""
    bits = tl.randint(seed, counter)
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24 (_UNIT)


@triton.jit
def keep_triton(seed_ptr, counter, p):
    """Keep-mask ``u(seed, counter) >= p`` (``p`` a float32 argument), the seed read from ``seed_ptr``."""
    return uniform_triton(tl.load(seed_ptr), counter) >= p


@triton.jit
def dropped_triton(weight, seed_ptr, edge, head, num_heads, p, scale):
    """``weight`` times alpha's dropout factor: ``scale = 1 / (1 - p)`` where head ``head`` of edge ``edge`` (its
    original id) is kept, else 0; ``edge`` and ``head`` broadcast against ``weight``."""
    counter = edge.to(tl.int64) * num_heads + head
    return tl.where(keep_triton(seed_ptr, counter, p), weight * scale, 0.0)


@triton.jit
def packed_dropped_triton(weight, bits_ptr, edge, head, num_heads, scale):
    """:func:`dropped_triton` read from a keep bitset (:func:`keep_bits_by_triton`) instead of drawn: one load and
    a shift per (edge, head), where drawing is a Philox-10 chain per loop step of the CSR kernels."""
    counter = edge.to(tl.int64) * num_heads + head
    word = tl.load(bits_ptr + (counter >> 5))
    kept = ((word >> (counter & 31).to(tl.int32)) & 1) != 0
    return tl.where(kept, weight * scale, 0.0)


@fast_launch
@triton.jit
def _keep_bits_kernel(seed_ptr, out_ptr, num_counters, num_words, p, BLOCK_W: tl.constexpr):
    words = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    bit = tl.arange(0, 32)
    counter = words.to(tl.int64)[:, None] * 32 + bit[None, :]
    kept = keep_triton(seed_ptr, counter, p) & (counter < num_counters)
    # distinct bits: their int32 sum is their OR (bit 31 wraps to the sign, as intended)
    packed = tl.sum(kept.to(tl.int32) << bit[None, :], axis=1)
    tl.store(out_ptr + words, packed, mask=words < num_words)


def keep_bits_by_triton(dropout: Dropout, num_counters: int) -> Tensor:
    """:func:`keep_bits` computed on the device (CUDA, or CPU under ``TRITON_INTERPRET=1``): ``num_counters / 8``
    bytes, drawn once per op call and read by every CSR kernel of that call."""
    num_words = cdiv(num_counters, 32)
    out = torch.zeros(num_words + KEEP_BITS_PAD, dtype=torch.int32, device=dropout.seed.device)
    if num_words:
        _keep_bits_kernel[(cdiv(num_words, 32),)](dropout.seed.reshape(1), out, num_counters, num_words,
                                                         as_float32(dropout.p), BLOCK_W=32)
    return out


@fast_launch
@triton.jit
def _keep_kernel(seed_ptr, out_ptr, numel, p, BLOCK: tl.constexpr):
    counter = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + counter, keep_triton(seed_ptr, counter, p).to(tl.int8), mask=counter < numel)


@fast_launch
@triton.jit
def _uniform_kernel(seed_ptr, counter_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    counter = tl.load(counter_ptr + offsets, mask=mask, other=0)
    tl.store(out_ptr + offsets, uniform_triton(tl.load(seed_ptr), counter), mask=mask)


def uniform_by_triton(seed: Tensor, counter: Tensor) -> Tensor:
    """:func:`uniform` computed by :func:`uniform_triton` (CUDA, or CPU under ``TRITON_INTERPRET=1``)."""
    counter = counter.long().contiguous()
    out = torch.empty(counter.shape, dtype=torch.float32, device=counter.device)
    if counter.numel():
        _uniform_kernel[(cdiv(counter.numel(), 1024),)](seed.reshape(1), counter, out, counter.numel(),
                                                               BLOCK=1024)
    return out


# ---------------------------------------------------------------------------------------------
# The keep-mask as an op (for what reads the mask outside the fused attention)
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("gnn_io::dropout_keep", mutates_args=())
@contiguous_results
def dropout_keep(seed: Tensor, size: list[int], p: float) -> Tensor:
    """Bool ``[*size]``: ``keep(flat index)`` of a contiguous tensor of ``size``, i.e. entry ``(e, h)`` of an
    ``[E, H]`` tensor keeps with counter ``e * H + h``: the mask the fused attention draws for edge ``e``."""
    numel = math.prod(size)
    if seed.is_cuda:
        out = torch.empty(numel, dtype=torch.int8, device=seed.device)
        if numel:
            _keep_kernel[(cdiv(numel, 1024),)](seed.reshape(1), out, numel, as_float32(p), BLOCK=1024)
        return out.view(torch.bool).view(size)
    return keep(seed, torch.arange(numel, device=seed.device), p).view(size)


@dropout_keep.register_fake
def _(seed, size, p):
    return seed.new_empty(size, dtype=torch.bool)
