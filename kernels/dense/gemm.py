"""Float32 GEMMs of message-passing layers on Tensor Cores at float32 accuracy (the 3xTF32 split).

A GNN layer's linear maps are tall and thin: ``[N, K] @ [K, F]`` with ``N`` nodes (a million) and ``K, F`` of
128-512, plus the weight gradient ``[K, N] @ [N, F]``, whose inner size is the node count. In float32 with TF32 off
(PyTorch's default, ``torch.backends.cuda.matmul.allow_tf32 = False``) cuBLAS runs them on the CUDA cores: about
0.94 ms for ``[2^20, 128] @ [128, 128]`` on the H100, where reading and writing the operands takes 0.3 ms.

Here each operand is split into a TF32 head and a TF32 tail, ``a = a_hi + a_lo`` (Triton's
``input_precision="tf32x3"``), and the product is ``a_hi b_hi + a_hi b_lo + a_lo b_hi`` on Tensor Cores with a
float32 accumulator. The dropped ``a_lo b_lo`` is below ``2^-22`` of each product, so the result carries float32's
accuracy (``docs/dense.md`` has the measured errors against float64 and against cuBLAS's float32), not TF32's
``2^-11``. It is used only for float32 operands with TF32 off: where TF32 is allowed, cuBLAS's TF32 is the faster
and the user's chosen precision.

Two launch shapes:

- ``[M, K] @ [K, N]`` with ``M`` large: one program per ``BLOCK_M x BLOCK_N`` output tile, over all of ``K``;
- the weight gradient, inner size ``K`` large and the output small: the inner range split over :data:`SPLITS`
  programs per output tile, each writing a float32 partial, summed afterwards in a fixed order (deterministic, no
  atomics).
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.runtime.launch import INTERPRETED, cdiv, fast_launch, next_power_of_2

SETTING = config.SETTINGS["fp32_gemm"].env
# Where the split GEMM is taken (H100, each product timed alone against cuBLAS float32): a product of at least
# TALL_MIN_WORK multiply-adds with a large row count (the forward and the input gradient: 1.31-1.66x over cuBLAS at
# 2^20 rows, a tie or a loss at 2^17 x 128 x 128 = 2^31), and a weight gradient (inner size large) of at least
# WIDE_MIN_WORK (1.05x at 2^20 x 128 x 128, 1.12x at 2^20 x 128 x 512, a loss at 2^17 rows).
TALL_MIN_WORK = 1 << 33
WIDE_MIN_WORK = 1 << 34
# Under CUDA graphs (GNN_IO_CUDAGRAPHS=1) a replay issues the step's kernels without their per-call CPU cost, which is
# what kept the tall kernels out of arxiv-size steps. There they are taken from this many multiply-adds: H100,
# RMAT 2^17, interleaved A/B against cuBLAS's float32 GEMMs in the same replays: TransformerConv 2.71 -> 2.40 ms,
# SAGEConv max 1.62 -> 1.42 (1.15x each). Such steps measure a tie where the backward does not replay and Inductor
# partitions the forward's GEMMs out of the CUDA graph.
REPLAYED_TALL_MIN_WORK = 1 << 31
SMALL_SIDE = 1024  # the thin sides: at most this (the weights stay small)


@triton.jit
def _split_tf32(v):
    """``(head, tail)`` of float32 ``v``: the head rounded to TF32's 10 mantissa bits (to nearest, ties away from
    zero, as ``cvt.rna.tf32.f32``; by integer ops, so the interpreter runs it too), the tail ``v - head`` exact in
    float32 and 0 where ``v`` is a TF32 value or infinite; a NaN gives a NaN tail. The tail products take the
    heads through :func:`_finite`, so an infinite operand gives the infinite product of the heads alone, not the
    NaN of ``inf - inf``."""
    head = ((v.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
    tail = tl.where(head == v, 0.0, v - head)
    return head, tail


@triton.jit
def _finite(head):
    """``head`` with its infinities set to 0: the factor a tail multiplies (finite by finite stays finite)."""
    return tl.where(tl.abs(head) == float("inf"), 0.0, head)


@fast_launch  # the JIT's per-call Python skipped: these launch first in a step (kernels/runtime/launch.py)
@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, k_per_split,
               stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
               att_ptr, score_ptr, stride_sm, stride_sr,
               ea_ptr, eb_ptr, k_extra, stride_eam, stride_eak, stride_ebk, stride_ebn,
               side_ptr, side_out_ptr, side_rows, stride_sdm, stride_sdk, stride_sos, stride_som,
               BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               SCORES: tl.constexpr = 0, HEAD_C: tl.constexpr = 1, EXTRA_K: tl.constexpr = 0,
               SIDE: tl.constexpr = 0):
    """``c = a @ b (+ bias) (+ c)`` over the inner range of program axis 1's piece, and the terms GAT's head scores
    add (:func:`linear_scores`, :func:`mm_extra`, :func:`mm_side`; kernels/attention/head_scores.py derives them):

    - ``SCORES`` (``R``, 0: none): ``score[m, r, h] = sum_c c[m, h HEAD_C + c] att[r, h HEAD_C + c]`` for the
      heads of this tile (``BLOCK_N`` a multiple of ``HEAD_C``), from the accumulator, bias included;
    - ``EXTRA_K`` (0: none, else ``k_extra``): ``+ ea @ eb``, a second inner range of ``k_extra``
      (``ea [M, k_extra]``, ``eb [k_extra, N]``), one piece only, summed by rank-1 float32 updates on the CUDA
      cores (a padded 3xTF32 dot measured slower);
    - ``SIDE`` (0: none, else a power of two >= 16 and >= ``side_rows``): ``side_out[piece] = side @ b`` over this
      piece's inner range (``side [side_rows, K]``), written by the programs of the first row tile."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP_M row tiles share the columns of B while they are in cache
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SIDE > 0:
        side_index = tl.arange(0, SIDE)
        side_mask = (side_index < side_rows) & (pid_m == 0)  # one row tile makes it
        side_acc = tl.zeros((SIDE, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < k_end
        a = tl.load(a_ptr + rows[:, None].to(tl.int64) * stride_am + ks[None, :].to(tl.int64) * stride_ak,
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptr + ks[:, None].to(tl.int64) * stride_bk + cols[None, :].to(tl.int64) * stride_bn,
                    mask=k_mask[:, None] & col_mask[None, :], other=0.0)
        if SIDE > 0:
            side = tl.load(side_ptr + side_index[:, None].to(tl.int64) * stride_sdm
                           + ks[None, :].to(tl.int64) * stride_sdk, mask=side_mask[:, None] & k_mask[None, :],
                           other=0.0)
            side_acc = tl.dot(side, b, side_acc, input_precision=PRECISION)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if SIDE > 0:
        tl.store(side_out_ptr + split * stride_sos + side_index[:, None].to(tl.int64) * stride_som + cols[None, :],
                 side_acc, mask=side_mask[:, None] & col_mask[None, :])
    _epilogue(acc, rows, cols, row_mask, col_mask, pid_n, N, c_ptr + split * stride_cs, stride_cm, stride_cn,
              _columns_row(bias_ptr, cols, col_mask, BIAS), att_ptr, score_ptr, stride_sm, stride_sr, ea_ptr, eb_ptr,
              stride_eam, stride_eak, stride_ebk, stride_ebn, BIAS, ACCUMULATE, SCORES, HEAD_C, EXTRA_K, BLOCK_M,
              BLOCK_N)


@triton.jit
def _columns_row(row_ptr, cols, col_mask, LOAD: tl.constexpr):
    """A row of per-column values (the bias, an attention vector) at these columns, zeros unless ``LOAD``: loaded
    once per program, outside any row-tile loop."""
    if LOAD:
        return tl.load(row_ptr + cols, mask=col_mask, other=0.0)
    return tl.zeros(cols.shape, dtype=tl.float32)


@triton.jit
def _epilogue(acc, rows, cols, row_mask, col_mask, pid_n, N, c_ptr, stride_cm, stride_cn, bias, att_ptr, score_ptr,
              stride_sm, stride_sr, ea_ptr, eb_ptr, stride_eam, stride_eak, stride_ebk, stride_ebn,
              BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, SCORES: tl.constexpr, HEAD_C: tl.constexpr,
              EXTRA_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, att0=None, att1=None,
              ATT_LOADED: tl.constexpr = 0):
    """A ``[BLOCK_M, BLOCK_N]`` output tile's extra terms and store (:func:`_mm_kernel`'s docstring): ``+ ea @ eb``,
    ``+ bias`` (the tile's columns, :func:`_columns_row`), the head scores, ``+ c`` when ``ACCUMULATE``. The first
    ``ATT_LOADED`` (at most 2) attention rows come loaded as ``att0``, ``att1`` (:func:`_columns_row`), the rest are
    read here."""
    for e in tl.static_range(EXTRA_K):  # the second inner range as rank-1 float32 updates
        ea = tl.load(ea_ptr + rows.to(tl.int64) * stride_eam + e * stride_eak, mask=row_mask, other=0.0)
        eb = tl.load(eb_ptr + e * stride_ebk + cols * stride_ebn, mask=col_mask, other=0.0)
        acc += ea[:, None] * eb[None, :]
    if BIAS:
        acc += bias[None, :]
    if SCORES > 0:
        tile_heads = pid_n * (BLOCK_N // HEAD_C) + tl.arange(0, BLOCK_N // HEAD_C)
        head_mask = row_mask[:, None] & (tile_heads < N // HEAD_C)[None, :]
        for r in tl.static_range(SCORES):
            if r < ATT_LOADED:
                att = att0 if r == 0 else att1
            else:
                att = tl.load(att_ptr + r * N + cols, mask=col_mask, other=0.0)
            score = tl.sum(tl.reshape(acc * att[None, :], (BLOCK_M, BLOCK_N // HEAD_C, HEAD_C)), axis=2)
            tl.store(score_ptr + rows[:, None].to(tl.int64) * stride_sm + r * stride_sr + tile_heads[None, :], score,
                     mask=head_mask)
    out = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    mask = row_mask[:, None] & col_mask[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=mask, other=0.0)
    tl.store(out, acc, mask=mask)


@triton.jit
def _weight_chunk(bt_ptr, cols, col_mask, stride_btn, K, chunk, K_CHUNK: tl.constexpr, stride_btk=1):
    """The TF32 head, tail and finite head (:func:`_finite`) of ``bt``'s inner chunk ``chunk`` for these columns, as
    ``[K_CHUNK, BLOCK_N]`` operands."""
    ks = chunk * K_CHUNK + tl.arange(0, K_CHUNK)
    b = tl.load(bt_ptr + cols[None, :].to(tl.int64) * stride_btn + ks[:, None] * stride_btk,
                mask=(ks < K)[:, None] & col_mask[None, :], other=0.0)
    head, tail = _split_tf32(b)
    return head, tail, _finite(head)


@triton.jit
def _chunk_product(a_ptr, rows, row_mask, stride_am, K, chunk, K_CHUNK: tl.constexpr, b_hi, b_lo, b_hi_finite,
                   stride_ak=1):
    """``a[rows, chunk] @ b[chunk]`` by three TF32 products, tails first into a fresh accumulator."""
    ks = chunk * K_CHUNK + tl.arange(0, K_CHUNK)
    a = tl.load(a_ptr + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak,
                mask=row_mask[:, None] & (ks < K)[None, :], other=0.0)
    a_hi, a_lo = _split_tf32(a)
    part = tl.dot(a_lo, b_hi_finite, input_precision="tf32")
    part = tl.dot(_finite(a_hi), b_lo, part, input_precision="tf32")
    return tl.dot(a_hi, b_hi, part, input_precision="tf32")


@fast_launch
@triton.jit
def _stationary_kernel(a_ptr, bt_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_btn, stride_cm, stride_cn, programs_m,
                       att_ptr, score_ptr, stride_sm, stride_sr,
                       ea_ptr, eb_ptr, stride_eam, stride_eak, stride_ebk, stride_ebn,
                       BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, K_CHUNK: tl.constexpr,
                       SCORES: tl.constexpr = 0, HEAD_C: tl.constexpr = 1, EXTRA_K: tl.constexpr = 0,
                       ATT_LOADED: tl.constexpr = 0, EXTRA_DOT: tl.constexpr = 0):
    """``c = a @ bt^T`` and :func:`_epilogue`'s terms for a tall ``a [M, K]`` and a small ``bt [N, K]`` (``K <=
    BLOCK_K``, at most four ``K_CHUNK``s), both at unit stride along ``K``. Each program owns one column
    tile, whose TF32 head and tail of ``bt`` it splits once and keeps, and walks every ``programs_m``-th row tile (a
    persistent grid of ``programs_m`` x column tiles): per row tile only ``a`` is loaded and split, the loop
    software-pipelined over ``NUM_STAGES`` row tiles. The inner range is taken ``K_CHUNK`` at a time: each chunk's
    three TF32 products go tails first into a fresh accumulator, then the heads' product, and the chunk's sum is
    added to the tile's in float32 on the CUDA cores (as Triton's ``tf32x3`` does per step: the Tensor Cores'
    own accumulation over a long inner range loses low bits, measured 4.6e-7 against 1.9e-7 at one 128 chunk).
    ``mm_extra``'s second inner range is one more such chunk (``EXTRA_DOT`` rows, ``eb`` split once), not the tile
    kernel's rank-1 updates."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_n = pid % tiles_n
    first_m = pid // tiles_n
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # each inner chunk's TF32 head and tail of bt, split once per program (at most four chunks)
    b0_hi, b0_lo, b0_fin = _weight_chunk(bt_ptr, cols, col_mask, stride_btn, K, 0, K_CHUNK)
    if BLOCK_K // K_CHUNK > 1:
        b1_hi, b1_lo, b1_fin = _weight_chunk(bt_ptr, cols, col_mask, stride_btn, K, 1, K_CHUNK)
    if BLOCK_K // K_CHUNK > 2:
        b2_hi, b2_lo, b2_fin = _weight_chunk(bt_ptr, cols, col_mask, stride_btn, K, 2, K_CHUNK)
        b3_hi, b3_lo, b3_fin = _weight_chunk(bt_ptr, cols, col_mask, stride_btn, K, 3, K_CHUNK)
    bias = _columns_row(bias_ptr, cols, col_mask, BIAS)
    # the epilogue's column operands, loaded once per program too: the first ATT_LOADED (<= 2) attention rows, and
    # the extra inner range's eb as one more TF32-split chunk of EXTRA_DOT rows (a power of two >= 16, >= EXTRA_K;
    # 0 without one). Read per row tile inside the pipelined loop, they cost GAT's step 0.47 ms (H100)
    att0 = _columns_row(att_ptr, cols, col_mask, ATT_LOADED > 0)
    att1 = _columns_row(att_ptr + N, cols, col_mask, ATT_LOADED > 1)
    if EXTRA_DOT > 0:
        e_hi, e_lo, e_fin = _weight_chunk(eb_ptr, cols, col_mask, stride_ebn, EXTRA_K, 0, EXTRA_DOT, stride_ebk)
    for tile_m in tl.range(first_m, tl.cdiv(M, BLOCK_M), programs_m, num_stages=NUM_STAGES):
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        acc = _chunk_product(a_ptr, rows, row_mask, stride_am, K, 0, K_CHUNK, b0_hi, b0_lo, b0_fin)
        if BLOCK_K // K_CHUNK > 1:
            acc += _chunk_product(a_ptr, rows, row_mask, stride_am, K, 1, K_CHUNK, b1_hi, b1_lo, b1_fin)
        if BLOCK_K // K_CHUNK > 2:
            acc += _chunk_product(a_ptr, rows, row_mask, stride_am, K, 2, K_CHUNK, b2_hi, b2_lo, b2_fin)
            acc += _chunk_product(a_ptr, rows, row_mask, stride_am, K, 3, K_CHUNK, b3_hi, b3_lo, b3_fin)
        if EXTRA_DOT > 0:
            acc += _chunk_product(ea_ptr, rows, row_mask, stride_eam, EXTRA_K, 0, EXTRA_DOT, e_hi, e_lo, e_fin,
                                  stride_eak)
        _epilogue(acc, rows, cols, row_mask, col_mask, pid_n, N, c_ptr, stride_cm, stride_cn, bias, att_ptr,
                  score_ptr, stride_sm, stride_sr, ea_ptr, eb_ptr, stride_eam, stride_eak, stride_ebk, stride_ebn,
                  BIAS, ACCUMULATE, SCORES, HEAD_C, 0, BLOCK_M, BLOCK_N, att0, att1, ATT_LOADED)


# (BLOCK_M, BLOCK_N, num_warps, num_stages, programs per SM[, inner chunk]) of the weight-stationary kernel, measured
# on the H100 (a sweep of launches, each product timed alone; docs/dense.md): 64 x 64 tiles on one warpgroup,
# three stages, two programs per SM, inner chunks of 32 (STATIONARY_K_CHUNK). [2^20, 128] @ [128, 128] took 0.552 ms
# (forward, with a bias) and 0.546 (input gradient) against 0.634 / 0.620 for TALL_LAUNCH's tile kernel and 0.849 /
# 0.884 for cuBLAS float32, at the tile kernel's error (1.9e-7 of the largest value against float64). 128-row or
# 128-column tiles ran out of shared memory at three stages and were 2x slower at two.
STATIONARY_LAUNCH = (64, 64, 4, 3, 2)
STATIONARY_MAX_K = 128
STATIONARY_K_CHUNK = 32
# the launch above needs about 200 KiB of shared memory per program (the H100 and B200 give 227 KiB; an A100's 163
# KiB would fail to compile it): devices with less keep the tile kernel
STATIONARY_SHARED_MEMORY = 200 * 1024
_DEVICES: dict = {}


def _device_facts(device) -> tuple:
    """(SM count, whether its programs get :data:`STATIONARY_SHARED_MEMORY`) of a CUDA device, read once."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICES:
        props = torch.cuda.get_device_properties(index)
        _DEVICES[index] = (props.multi_processor_count, props.shared_memory_per_block_optin >= STATIONARY_SHARED_MEMORY)
    return _DEVICES[index]


def stationary_takes(a: Tensor, b: Tensor) -> bool:
    """Whether the tall ``a @ b`` can run on the weight-stationary kernel: the inner size at most
    :data:`STATIONARY_MAX_K`, ``a`` and ``b.T`` at unit stride along it, and (on CUDA) a device with the shared
    memory its launch needs. The callers have checked :func:`takes`."""
    return (a.shape[1] <= STATIONARY_MAX_K and (a.stride(1) == 1 or a.shape[1] == 1)
            and (b.stride(0) == 1 or b.shape[0] == 1)
            and (not a.is_cuda or _device_facts(a.device)[1]))


def _launch_stationary(a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, accumulate: bool,
                       scores: tuple | None = None, extra: tuple | None = None,
                       launch: tuple = STATIONARY_LAUNCH) -> None:
    """One :func:`_stationary_kernel` launch for ``c (+)= a @ b`` (:func:`stationary_takes`), with
    :func:`_launch`'s ``scores`` and ``extra``."""
    m, k = a.shape
    n = b.shape[1]
    block_m, block_n, warps, stages, per_sm = launch[:5]
    block_k = max(16, next_power_of_2(k))
    k_chunk = max(block_k // 4, min(block_k, launch[5] if len(launch) > 5 else STATIONARY_K_CHUNK))  # <= 4 chunks
    tiles_n = cdiv(n, block_n)
    programs_m = max(1, min(cdiv(m, block_m), per_sm * (_device_facts(a.device)[0] if a.is_cuda else 4) // tiles_n))
    att, score, head_dim = scores if scores is not None else (c, c, 1)
    ea, eb = extra if extra is not None else (c, c)
    extra_k = ea.shape[1] if extra else 0
    bt = b.t()
    _stationary_kernel[(programs_m * tiles_n,)](
        a, bt, c, bias if bias is not None else c, m, n, k, a.stride(0), bt.stride(0), c.stride(0), c.stride(1),
        programs_m, att, score, score.stride(0) if scores else 0, score.stride(1) if scores else 0,
        ea, eb, ea.stride(0) if extra else 0, ea.stride(1) if extra else 0, eb.stride(0) if extra else 0,
        eb.stride(1) if extra else 0,
        BIAS=bias is not None, ACCUMULATE=accumulate, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, NUM_STAGES=stages, K_CHUNK=k_chunk, SCORES=att.shape[0] if scores else 0,
        HEAD_C=head_dim, EXTRA_K=extra_k, ATT_LOADED=min(2, att.shape[0]) if scores else 0,
        EXTRA_DOT=max(16, next_power_of_2(extra_k)) if extra_k else 0, num_warps=warps)


def stationary_mm(a: Tensor, bt: Tensor, bias: Tensor | None = None, launch: tuple = STATIONARY_LAUNCH) -> Tensor:
    """``a @ bt.T (+ bias)`` by the weight-stationary kernel (benchmarks and tests), float32, ``K <= 128``."""
    m, k = a.shape
    n = bt.shape[0]
    if a.dtype != torch.float32 or bt.dtype != torch.float32 or bt.shape[1] != k or k > STATIONARY_MAX_K:
        raise ValueError(f"stationary_mm: float32 [M, K<=128] and [N, K] operands, got {a.dtype} {tuple(a.shape)} "
                         f"and {bt.dtype} {tuple(bt.shape)}")
    a = a if a.stride(1) == 1 else a.contiguous()
    bt = bt if bt.stride(1) == 1 else bt.contiguous()
    bias, out = _checked_bias_out(a, bt.t(), bias, None, False)
    if m and n:
        _launch_stationary(a, bt.t(), out, bias, False, launch=launch)
    return out


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); the fastest of a sweep of launches (H100, 2^20 x 128 x 128)
TALL_LAUNCH = (128, 64, 32, 4, 3)  # output width up to 128
TALL_WIDE_LAUNCH = (128, 128, 64, 8, 3)  # wider outputs
SPLIT_LAUNCH = (128, 64, 32, 4, 4)
SPLITS = 132  # inner pieces per output tile (one per H100 SM; 64 and 264 measured slower)
PRECISION = "tf32x3"


def setting() -> str:
    return config.get("fp32_gemm")


def _tall_min_work() -> int:
    """The tall kernels' threshold in multiply-adds: :data:`TALL_MIN_WORK`, or under CUDA graphs
    (``GNN_IO_CUDAGRAPHS=1``) :data:`REPLAYED_TALL_MIN_WORK` where that is lower; ``GNN_IO_FP32_TALL_LOG2`` sets it to
    ``2**value`` (a measurement knob)."""
    value = config.get("fp32_tall_log2")
    if value is not None:
        return 1 << value
    if config.get("cuda_graphs"):
        return min(TALL_MIN_WORK, REPLAYED_TALL_MIN_WORK)
    return TALL_MIN_WORK


def shape_kind(m: int, k: int, n: int) -> str | None:
    """``"tall"`` (rows many, the rest thin), ``"wide"`` (the inner size many, the output small) or None, by the
    module's measured thresholds."""
    work = m * k * n
    # the environment is read only for products of at least 2^20, the knob's least value, or TALL_MIN_WORK where the
    # tests lower it (small graphs stop first)
    if k <= SMALL_SIDE and n <= SMALL_SIDE and work >= min(1 << 20, TALL_MIN_WORK) and work >= _tall_min_work():
        return "tall"
    if m <= SMALL_SIDE and n <= SMALL_SIDE and work >= WIDE_MIN_WORK:
        return "wide"
    return None


def float32_exact() -> bool:
    """Whether float32 GEMMs must keep float32's accuracy: TF32 is not allowed (PyTorch's default)."""
    return not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"


def kernel_device(device_type: str) -> bool:
    """CUDA, or the CPU under the Triton interpreter when ``GNN_IO_TRITON_ON_CPU=1`` (the tests)."""
    return device_type == "cuda" or (device_type == "cpu" and INTERPRETED and config.get("triton_on_cpu"))


def takes(a: Tensor, b: Tensor) -> bool:
    """Whether ``a @ b`` runs here rather than in cuBLAS: float32 operands on the kernels' device, TF32 off, the
    setting on, and a shape of :func:`shape_kind`."""
    # cheapest first: most calls (small graphs) stop at the sizes, before the environment is read
    return (a.dim() == 2 == b.dim() and shape_kind(a.shape[0], a.shape[1], b.shape[1]) is not None
            and a.dtype == torch.float32 == b.dtype and a.device == b.device and kernel_device(a.device.type)
            and float32_exact() and setting() == "x3")


def matmul(a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None,
           accumulate: bool = False) -> Tensor:
    """``a @ b`` (``+ bias``; ``+= `` into ``out`` when ``accumulate``, else written into ``out`` when given): here
    where :func:`takes` says so, else by cuBLAS (``torch.mm`` / ``addmm``), the same value to rounding."""
    if not takes(a, b):
        if accumulate:
            out.addmm_(a, b)
            if bias is not None:
                out += bias
            return out
        if bias is not None:
            return torch.addmm(bias, a, b, out=out) if out is not None else torch.addmm(bias, a, b)
        return torch.mm(a, b, out=out) if out is not None else torch.mm(a, b)
    if shape_kind(a.shape[0], a.shape[1], b.shape[1]) == "tall":
        if b.stride(0) != 1:
            b = b.t().contiguous().t()  # K-major, as the TF32 Tensor Cores read it from shared memory (small)
        if stationary_takes(a, b):
            bias, out = _checked_bias_out(a, b, bias, out, accumulate)
            if a.shape[0] and b.shape[1]:
                _launch_stationary(a, b, out, bias, accumulate)
            return out
        launch = TALL_LAUNCH if b.shape[1] <= 128 else TALL_WIDE_LAUNCH
        return mm(a, b, bias, out, accumulate, launch=launch, split=1)
    return mm(a, b, bias, out, accumulate, launch=SPLIT_LAUNCH)


def _launch(a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, accumulate: bool, split: int, k_per_split: int,
            launch: tuple, precision: str, scores: tuple | None = None, extra: tuple | None = None,
            side: tuple | None = None) -> None:
    """One ``_mm_kernel`` launch. ``scores``: ``(att [R, N] contiguous, score [M, R, H] with unit head stride,
    head_dim)``; ``extra``: ``(ea [M, k2], eb [k2, N])``; ``side``: ``(side [s, K], side_out [split, s, N]
    contiguous rows)`` (the kernel's docstring)."""
    m, k = a.shape
    n = b.shape[1]
    block_m, block_n, block_k, warps, stages = launch
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split)
    stride_cs = c.stride(0) if c.dim() == 3 else 0
    stride_cm, stride_cn = c.stride(-2), c.stride(-1)
    att, score, head_dim = scores if scores is not None else (c, c, 1)
    ea, eb = extra if extra is not None else (c, c)
    side_a, side_out = side if side is not None else (c, c)
    _mm_kernel[grid](a, b, c, bias if bias is not None else c, m, n, k, k_per_split,
                     a.stride(0), a.stride(1), b.stride(0), b.stride(1), stride_cs, stride_cm, stride_cn,
                     att, score, score.stride(0) if scores else 0, score.stride(1) if scores else 0,
                     ea, eb, ea.shape[1] if extra else 0, ea.stride(0) if extra else 0, ea.stride(1) if extra else 0,
                     eb.stride(0) if extra else 0, eb.stride(1) if extra else 0,
                     side_a, side_out, side_a.shape[0] if side else 0, side_a.stride(0) if side else 0,
                     side_a.stride(1) if side else 0, side_out.stride(0) if side else 0,
                     side_out.stride(1) if side else 0,
                     BIAS=bias is not None, ACCUMULATE=accumulate, PRECISION=precision,
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                     SCORES=att.shape[0] if scores else 0, HEAD_C=head_dim,
                     EXTRA_K=ea.shape[1] if extra else 0,
                     SIDE=max(16, next_power_of_2(side_a.shape[0])) if side else 0,
                     num_warps=warps, num_stages=stages)


def _checked_bias_out(a: Tensor, b: Tensor, bias: Tensor | None, out: Tensor | None,
                      accumulate: bool) -> tuple[Tensor | None, Tensor]:
    """``bias`` at unit stride (the kernels read it so) and ``out`` (made when None) for ``a @ b``, or a ValueError
    where either does not fit the product."""
    m, n = a.shape[0], b.shape[1]
    if bias is not None:
        if bias.dtype != torch.float32 or tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be a float32 [{n}] tensor, got {bias.dtype} {tuple(bias.shape)}")
        bias = bias.contiguous()
    if out is None:
        if accumulate:
            raise ValueError("accumulate needs out")
        out = torch.empty(m, n, device=a.device, dtype=torch.float32)
    elif out.shape != (m, n) or out.dtype != torch.float32:
        raise ValueError(f"out must be a float32 [{m}, {n}] tensor, got {out.dtype} {tuple(out.shape)}")
    return bias, out


def splits_for(m: int, n: int, k: int, launch: tuple = SPLIT_LAUNCH) -> int:
    """How many pieces the inner range is cut into: :data:`SPLITS` (each at least four ``BLOCK_K`` steps) where the
    output has fewer tiles than two per SM, 1 where it has more."""
    if triton.cdiv(m, launch[0]) * triton.cdiv(n, launch[1]) >= 2 * SPLITS:
        return 1
    return max(1, min(SPLITS, triton.cdiv(k, 4 * launch[2])))


def mm(a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None, accumulate: bool = False,
       launch: tuple | None = None, split: int | None = None, precision: str = PRECISION) -> Tensor:
    """``a @ b`` (``+ bias`` broadcast over rows; ``+ out`` when ``accumulate``, written into ``out``), float32
    operands of any strides, float32 result. ``split`` pieces of the inner range (default: by
    :func:`splits_for`) are summed after the kernel in a fixed order."""
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise TypeError(f"dense_triton.mm takes float32 operands, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"dense_triton.mm: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    m, k = a.shape
    n = b.shape[1]
    bias, out = _checked_bias_out(a, b, bias, out, accumulate)
    if m == 0 or n == 0:
        return out
    if k == 0:
        base = bias.expand(m, n) if bias is not None else torch.zeros((), device=a.device)
        return out.add_(base) if accumulate else out.copy_(base)
    if split is None:
        split = splits_for(m, n, k)
    launch = launch or (TALL_LAUNCH if split == 1 and m >= 4096 else SPLIT_LAUNCH)
    if split == 1:
        _launch(a, b, out, bias, accumulate, 1, k, launch, precision)
        return out
    k_per_split = triton.cdiv(triton.cdiv(k, split), launch[2]) * launch[2]
    split = triton.cdiv(k, k_per_split)
    partial = torch.empty(split, m, n, device=a.device, dtype=torch.float32)
    _launch(a, b, partial, None, False, split, k_per_split, launch, precision)
    total = partial.sum(0)
    if bias is not None:
        total += bias
    return out.add_(total) if accumulate else out.copy_(total)


# Head scores: GAT's attention-vector projections made by its feature GEMM (kernels/attention/head_scores.py)
MAX_SCORES = 16  # R * H: the score columns of one GEMM, the extra inner range of its input gradient


def score_launch(width: int, head_dim: int) -> tuple | None:
    """The tall launch whose column tiles hold whole heads of ``head_dim`` channels (a power of two dividing the
    tile width), for an output ``width`` columns wide; None where no launch does."""
    launch = TALL_LAUNCH if width <= 128 else TALL_WIDE_LAUNCH
    if head_dim < 1 or head_dim & (head_dim - 1) or launch[1] % head_dim or width % head_dim:
        return None
    return launch


def linear_scores(x: Tensor, weight: Tensor, bias: Tensor | None, att: Tensor) -> tuple[Tensor, Tensor]:
    """``h = x @ weight^T (+ bias)`` (``[N, H C]``) and ``score[n, r, h] = sum_c h[n, h C + c] att[r, h, c]``
    (``[N, R, H]``) in one launch, the scores made from the accumulator tiles. ``att``: ``[R, H, C]``. The caller
    checks :func:`takes` (tall) and :func:`score_launch`."""
    rows, width = x.shape[0], weight.shape[0]
    count, heads, head_dim = att.shape
    launch = score_launch(width, head_dim)
    if launch is None or count * heads > MAX_SCORES:
        raise ValueError(f"linear_scores: no launch for {heads} heads of {head_dim} channels and {count} vectors")
    b = weight.t()
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    if bias is not None:
        bias = bias.contiguous()
    h = torch.empty(rows, width, device=x.device, dtype=torch.float32)
    scores = torch.empty(rows, count, heads, device=x.device, dtype=torch.float32)
    if rows:
        score_args = (att.reshape(count, width).contiguous(), scores, head_dim)
        if stationary_takes(x, b) and STATIONARY_LAUNCH[1] % head_dim == 0:
            _launch_stationary(x, b, h, bias, False, scores=score_args)
        else:
            _launch(x, b, h, bias, False, 1, x.shape[1], launch, PRECISION, scores=score_args)
    return h, scores


def mm_extra(a: Tensor, b: Tensor, ea: Tensor, eb: Tensor) -> Tensor:
    """``a @ b + ea @ eb`` with a short second inner range (``ea [M, k2]``, ``k2 <= MAX_SCORES``): one tall launch
    where :func:`takes` says so, else by ATen."""
    if not (takes(a, b) and shape_kind(a.shape[0], a.shape[1], b.shape[1]) == "tall" and ea.shape[1] <= MAX_SCORES
            and ea.dtype == torch.float32 == eb.dtype):
        return torch.addmm(ea @ eb, a, b)
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    if a.shape[0] and stationary_takes(a, b):
        _launch_stationary(a, b, out, None, False, extra=(ea, eb))
    elif a.shape[0]:
        _launch(a, b, out, None, False, 1, a.shape[1], TALL_LAUNCH if b.shape[1] <= 128 else TALL_WIDE_LAUNCH,
                PRECISION, extra=(ea, eb))
    return out


def mm_side(a: Tensor, b: Tensor, side: Tensor) -> tuple[Tensor, Tensor]:
    """``(a @ b, side @ b)`` for a weight gradient (``a [M, K]``, ``K`` the rows) and a few more rows ``side
    [s, K]`` (``s <= MAX_SCORES``) of the same product, read ``b`` once: the split launch where :func:`takes` says
    so, else by ATen."""
    if not (takes(a, b) and shape_kind(a.shape[0], a.shape[1], b.shape[1]) == "wide" and side.shape[0] <= MAX_SCORES
            and side.dtype == torch.float32):
        return a @ b, side @ b
    m, k = a.shape
    n = b.shape[1]
    split = splits_for(m, n, k)
    k_per_split = triton.cdiv(triton.cdiv(k, split), SPLIT_LAUNCH[2]) * SPLIT_LAUNCH[2]
    split = triton.cdiv(k, k_per_split)
    partial = torch.empty(split, m, n, device=a.device, dtype=torch.float32)
    side_partial = torch.empty(split, side.shape[0], n, device=a.device, dtype=torch.float32)
    _launch(a, b, partial, None, False, split, k_per_split, SPLIT_LAUNCH, PRECISION, side=(side, side_partial))
    return partial.sum(0), side_partial.sum(0)
