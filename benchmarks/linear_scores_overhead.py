"""CPU time per call of the GEMM ops that start a GATConv step (H100 session 25: the GPU waited 0.43 ms for
``gnn_io::linear_scores`` after the step's first kernel), each called 300 times on small CUDA tensors with the
3xTF32 thresholds lowered so the kernel path runs; the GPU work is tiny, so the time is the op's Python and launch.

    python -m benchmarks.linear_scores_overhead
"""
import time

import torch

from gnn_inductor.kernels.dense import ops as dense_ops  # noqa: F401  (registers gnn_io::mm)
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.attention import head_scores


def per_call_us(fn, calls=300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    dense_triton.TALL_MIN_WORK = dense_triton.WIDE_MIN_WORK = 1
    x = torch.randn(4096, 128, device="cuda")
    w = torch.randn(128, 128, device="cuda")
    att = torch.randn(2, 4, 32, device="cuda")
    wt = w.t()
    ops = torch.ops.gnn_io
    from gnn_inductor.passes import direct_ops
    direct = direct_ops.twin(ops.linear_scores.default)
    rows = [
        ("torch.mm (cuBLAS)", lambda: torch.mm(x, wt)),
        ("dense_triton.mm (launch only)", lambda: dense_triton.mm(x, wt, launch=dense_triton.TALL_LAUNCH, split=1)),
        ("dense_triton.matmul", lambda: dense_triton.matmul(x, wt)),
        ("dense_triton.linear_scores", lambda: dense_triton.linear_scores(x, w, None, att)),
        ("head_scores.fused", lambda: head_scores.fused(x, w, att)),
        ("gnn_io::linear_scores", lambda: ops.linear_scores(x, w, None, att)),
        ("gnn_io::linear_scores_direct", lambda: direct(x, w, None, att)),
        ("gnn_io::mm", lambda: ops.mm(x, wt, None)),
    ]
    print(f"{torch.cuda.get_device_name()}: CPU us per call (300 calls)")
    for name, fn in rows:
        print(f"| {name} | {per_call_us(fn):.1f} |")


if __name__ == "__main__":
    main()
