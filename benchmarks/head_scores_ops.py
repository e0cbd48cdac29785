"""GAT's feature GEMM with its head scores (kernels/attention/head_scores.py) product by product, against the same products
without the score terms, on the GPU: what each epilogue costs, and each form of the weight gradient's side product.

    python -m benchmarks.head_scores_ops --rows 1048576 --features 128 --heads 4 --channels 32

Prints one line per variant: median ms over 20 launches and the max error over the max magnitude of the float64
result (the plain products' errors are those of the 3xTF32 kernel itself). Session 25 also measured other forms of
the two backward terms here (a padded 3xTF32 dot for the input gradient's; the side product transposed, padded to 64
rows, by its own launch or by cuBLAS): all slower, removed after (docs/dense.md).
"""
import argparse

import torch

from benchmarks.harness import median_ms
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.attention import head_scores


def _error(value, exact) -> float:
    return ((value.double() - exact).abs().max() / exact.abs().max()).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--vectors", type=int, default=2)
    args = parser.parse_args()
    n, f, h, c, r = args.rows, args.features, args.heads, args.channels, args.vectors
    x = torch.randn(n, f, device="cuda")
    w = torch.randn(h * c, f, device="cuda") / f ** 0.5
    att = torch.randn(r, h, c, device="cuda")
    g = torch.randn(n, h * c, device="cuda")
    s = torch.randn(n, r * h, device="cuda")
    extra = torch.einsum("rhc,hcf->rhf", att, w.view(h, c, f)).reshape(r * h, f)
    xd, wd, gd, sd = x.double(), w.double(), g.double(), s.double()
    h_exact = xd @ wd.t()
    scores_exact = torch.einsum("nhc,rhc->nrh", h_exact.view(n, h, c), att.double())
    rows = []

    def record(name, fn, check):
        ms = median_ms(fn, reps=20)
        rows.append((name, ms, check(fn())))

    record("forward: matmul", lambda: dense_triton.matmul(x, w.t()), lambda out: _error(out, h_exact))
    record("forward: matmul + scores by ATen",
           lambda: head_scores.reference_scores(dense_triton.matmul(x, w.t()), att),
           lambda out: _error(out, scores_exact))
    record("forward: linear_scores (epilogue)", lambda: dense_triton.linear_scores(x, w, None, att),
           lambda out: max(_error(out[0], h_exact), _error(out[1], scores_exact)))
    dx_exact = gd @ wd + sd @ extra.double()
    record("dgrad: matmul", lambda: dense_triton.matmul(g, w), lambda out: _error(out, gd @ wd))
    record("dgrad: mm_extra", lambda: dense_triton.mm_extra(g, w, s, extra), lambda out: _error(out, dx_exact))
    dw_exact, side_exact = gd.t() @ xd, sd.t() @ xd
    record("wgrad: matmul", lambda: dense_triton.matmul(g.t(), x), lambda out: _error(out, dw_exact))
    record("wgrad: mm_side", lambda: dense_triton.mm_side(g.t(), x, s.t()),
           lambda out: max(_error(out[0], dw_exact), _error(out[1], side_exact)))
    print(f"\n{torch.cuda.get_device_name()}, {n} rows, {f} features, {h} heads x {c}, {r} vectors, float32 (3xTF32)\n")
    print("| variant | ms | error |")
    print("| --- | --- | --- |")
    for name, ms, err in rows:
        print(f"| {name} | {ms:.3f} | {err:.1e} |")


if __name__ == "__main__":
    main()
