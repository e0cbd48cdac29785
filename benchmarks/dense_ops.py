"""The dense ops around the message passing, timed in their variants: the column sum of a bias gradient and
the float32 GEMMs of a 128-wide linear layer over every node (forward, input gradient, weight gradient), in
each operand layout cuBLAS may see. Which variant is fastest decides how the backend issues them.

    python -m benchmarks.dense_ops --rows 1048576 --width 128
"""
import argparse

import torch

from benchmarks.harness import median_ms


def column_sums(rows: int, width: int, dtype) -> dict:
    g = torch.randn(rows, width, device="cuda", dtype=dtype)
    ones = torch.ones(rows, device="cuda", dtype=dtype)
    exact = g.double().sum(0)
    variants = {
        "sum(0, float32)": lambda: g.sum(0, dtype=torch.float32),
        "sum(0)": lambda: g.sum(0),
        "mv(g.t(), ones)": lambda: torch.mv(g.t(), ones),
        "ones @ g": lambda: ones @ g,
        "two-stage 256": lambda: g.view(256, -1, width).sum(1, dtype=torch.float32).sum(0),
        "two-stage 1024": lambda: g.view(1024, -1, width).sum(1, dtype=torch.float32).sum(0),
    }
    out = {}
    for name, fn in variants.items():
        err = ((fn().double() - exact).abs().max() / exact.abs().max()).item()
        out[name] = (median_ms(fn, reps=20), err)
    return out


def gemms(rows: int, width: int) -> dict:
    x = torch.randn(rows, width, device="cuda")
    g = torch.randn(rows, width, device="cuda")
    w = torch.randn(width, width, device="cuda")
    wt = w.t().contiguous()
    xt = x.t().contiguous()
    bias = torch.randn(width, device="cuda")
    exact_fwd = (x.double() @ w.double().t())
    exact_wgrad = g.double().t() @ x.double()
    variants = {
        "fwd x @ w.t()": (lambda: x @ w.t(), exact_fwd),
        "fwd x @ wt": (lambda: x @ wt, exact_fwd),
        "fwd (w @ x.t()).t()": (lambda: (w @ x.t()).t(), exact_fwd),
        "fwd addmm(b, x, w.t())": (lambda: torch.addmm(bias, x, w.t()), exact_fwd + bias.double()),
        "fwd addmm(b, x, wt)": (lambda: torch.addmm(bias, x, wt), exact_fwd + bias.double()),
        "fwd F.linear": (lambda: torch.nn.functional.linear(x, w), exact_fwd),
        # the same product as a batch of row blocks: does cuBLAS then pick its faster SIMT kernel (0.64 ms for a
        # weight gradient of this size on the H100, against 0.92 for the forward's xmma kernel; session 19)?
        "fwd bmm 8 row blocks": (lambda: torch.bmm(x.view(8, -1, width), wt.expand(8, width, width)).view(rows, width),
                                 exact_fwd),
        "fwd 8 mm row blocks": (lambda: torch.cat([c @ wt for c in x.chunk(8)]), exact_fwd),
        "dgrad g @ w": (lambda: g @ w, g.double() @ w.double()),
        "dgrad g @ w.t().contig.t()": (lambda: g @ wt.t(), g.double() @ w.double()),
        "wgrad g.t() @ x": (lambda: g.t() @ x, exact_wgrad),
        "wgrad (x.t() @ g).t()": (lambda: (x.t() @ g).t(), exact_wgrad),
        "wgrad g.t() @ xt.t()": (lambda: g.t() @ xt.t(), exact_wgrad),
    }
    out = {}
    for name, (fn, exact) in variants.items():
        err = ((fn().double() - exact).abs().max() / exact.abs().max()).item()
        out[name] = (median_ms(fn, reps=20), err)
    return out


def x3_gemms(rows: int, width: int, out_width: int, precisions=("tf32x3", "x3split"), only: str = "") -> dict:
    """cuBLAS float32 against the 3xTF32 Triton GEMM (``kernels/dense/gemm.py``) in its launches, for a linear
    map ``width -> out_width`` over ``rows`` nodes: forward, input gradient, weight gradient. Errors are the max
    absolute error over the max magnitude, against float64."""
    from gnn_inductor.kernels.dense import gemm as dense_triton

    torch.manual_seed(0)
    x = torch.randn(rows, width, device="cuda")
    g = torch.randn(rows, out_width, device="cuda")
    w = torch.randn(out_width, width, device="cuda") / width ** 0.5
    bias = torch.randn(out_width, device="cuda")
    shapes = {
        "fwd x @ w.t() + b": ((x, w.t(), bias), (x.double() @ w.double().t()) + bias.double()),
        "dgrad g @ w": ((g, w, None), g.double() @ w.double()),
        "dgrad g @ w, w K-major": ((g, w.t().contiguous().t(), None), g.double() @ w.double()),
        "wgrad g.t() @ x": ((g.t(), x, None), g.double().t() @ x.double()),
    }
    tall = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (64, 64, 32, 4, 3),
            (128, 64, 64, 4, 3), (128, 64, 32, 4, 4), (128, 64, 32, 4, 5), (128, 128, 64, 8, 3), (64, 128, 64, 4, 3),
            (128, 64, 128, 8, 2), (128, 128, 128, 8, 2), (64, 64, 128, 4, 2), (256, 64, 32, 8, 3), (64, 64, 64, 4, 4),
            (128, 32, 32, 4, 3), (128, 32, 64, 4, 4)]
    splits = [(64, 64, 32, 4, 3), (128, 64, 64, 8, 3), (128, 64, 32, 4, 4), (64, 64, 64, 4, 3)]
    if only:  # session 28: more launches of the weight gradient's split kernel
        splits += [(128, 64, 32, 4, 3), (128, 64, 32, 4, 5), (128, 64, 32, 8, 4), (128, 64, 64, 4, 3),
                   (128, 32, 32, 4, 4), (64, 128, 32, 4, 4), (128, 64, 16, 4, 6), (64, 64, 32, 4, 5)]
        shapes = {name: case for name, case in shapes.items() if name.startswith(only)}
    out = {}
    for name, ((a, b, bias_), exact) in shapes.items():
        scale = exact.abs().max().item()

        def err(value):
            if not torch.isfinite(value).all():
                return float("nan")
            return ((value.double() - exact).abs().max() / scale).item()
        cublas = (lambda: torch.addmm(bias_, a, b)) if bias_ is not None else (lambda: a @ b)
        out[(name, "cuBLAS fp32")] = (median_ms(cublas, reps=20), err(cublas()))
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        out[(name, "cuBLAS tf32 (not used: reference)")] = (median_ms(cublas, reps=20), err(cublas()))
        torch.backends.cuda.matmul.allow_tf32 = prev
        wide = name.startswith("wgrad")
        for precision in precisions:
            for launch in (splits if wide else tall):
                for split in (((None, 66, 132, 198) if only else (None, 132)) if wide else (None,)):
                    key = (name, f"{precision} {launch} split {split}")
                    fn = (lambda l=launch, s=split, p=precision: dense_triton.mm(a, b, bias_, launch=l, split=s,
                                                                                precision=p))
                    try:
                        value = fn()
                        out[key] = (median_ms(fn, reps=20), err(value))
                    except Exception as e:  # noqa: BLE001 - a launch that does not compile is a row, not a stop
                        out[key] = (float("nan"), f"{type(e).__name__}: {str(e)[:60]}")
        fn = lambda: dense_triton.mm(a, b, bias_, precision="tf32")  # noqa: E731
        out[(name, "plain tf32 (accuracy reference)")] = (median_ms(fn, reps=20), err(fn()))
    return out


def loop_ms(fn, calls: int = 20, rounds: int = 5) -> float:
    """GPU time per call of ``fn`` issued ``calls`` times back to back (the launch latency hidden, as in a step),
    median over ``rounds``."""
    fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


# (BLOCK_M, BLOCK_N, warps, stages, programs per SM, inner chunk summed apart; 128: one chunk, the Tensor Cores
# accumulating all of K). Session 27's earlier sweeps also ran 128-row and 128-column tiles (out of shared memory at
# three stages or more, 2x slower at two), 64 x 32 tiles (slower) and five stages (out of shared memory).
STATIONARY_SWEEP = [(64, 64, 4, 3, p, c) for p in (1, 2) for c in (32, 64, 128)]


def stationary_gemms(rows: int, width: int, out_width: int) -> dict:
    """The tall products of a ``width -> out_width`` linear map (forward ``x @ W^T + b``, input gradient ``g @ W``)
    by cuBLAS float32, session 24's 3xTF32 tile kernel (``tf32x3``), and the weight-stationary persistent kernel
    (``kernels/dense/gemm.py``'s ``stationary_mm``) at each launch of :data:`STATIONARY_SWEEP`: ms per call back
    to back (:func:`loop_ms`) and the max error over the max magnitude against float64."""
    from gnn_inductor.kernels.dense import gemm as dense_triton

    torch.manual_seed(0)
    x = torch.randn(rows, width, device="cuda")
    w = torch.randn(out_width, width, device="cuda") / width ** 0.5
    bias = torch.randn(out_width, device="cuda")
    g = torch.randn(rows, out_width, device="cuda")
    wt = w.t().contiguous()  # [width, out_width]: the input gradient's bt
    cases = {
        f"fwd {width}->{out_width}": (x, w, bias, x.double() @ w.double().t() + bias.double()),
        f"dgrad {out_width}->{width}": (g, wt, None, g.double() @ w.double()),
    }
    out = {}
    for name, (a, bt, b, exact) in cases.items():
        scale = exact.abs().max().item()

        def err(value):
            if not torch.isfinite(value).all():
                return float("nan")
            return ((value.double() - exact).abs().max() / scale).item()
        variants = {
            "cuBLAS fp32": lambda: torch.addmm(b, a, bt.t()) if b is not None else a @ bt.t(),
            "tf32x3 tile kernel": lambda: dense_triton.mm(a, bt.t(), b, split=1, launch=dense_triton.TALL_LAUNCH
                                                     if bt.shape[0] <= 128 else dense_triton.TALL_WIDE_LAUNCH),
        }
        if width <= 128:
            for launch in STATIONARY_SWEEP:
                variants[f"stationary {launch}"] = (lambda l=launch: dense_triton.stationary_mm(a, bt, b, launch=l))
        for variant, fn in variants.items():
            try:
                value = fn()
                out[(name, variant)] = (loop_ms(fn), err(value))
            except Exception as e:  # noqa: BLE001 - a launch that does not compile is a row, not a stop
                out[(name, variant)] = (float("nan"), f"{type(e).__name__}: {str(e)[:80]}")
    return out


def _gemm_table(shape: str, time_column: str, digits: int, rows: dict) -> None:
    """Print ``{(product, variant): (ms, error or failure)}`` as a markdown table, device and versions first."""
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    print(f"| {shape} | variant | {time_column} | max abs err / max |")
    print("| --- | --- | --- | --- |")
    for (name, variant), (ms, err) in rows.items():
        print(f"| {name} | {variant} | {ms:.{digits}f} | {err if isinstance(err, str) else f'{err:.1e}'} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--x3", type=int, default=0, metavar="OUT_WIDTH",
                        help="time the 3xTF32 Triton GEMMs against cuBLAS for a width -> OUT_WIDTH linear map")
    parser.add_argument("--stationary", type=int, default=0, metavar="OUT_WIDTH",
                        help="the tall products by the weight-stationary kernel's launches against the tile kernel "
                        "and cuBLAS")
    parser.add_argument("--only", default="", help="with --x3: only the products whose name starts so (e.g. wgrad), "
                        "over more launches and splits, tf32x3 only")
    args = parser.parse_args()
    if args.stationary:
        _gemm_table(f"{args.rows} rows", "ms (back to back)", 4,
                    stationary_gemms(args.rows, args.width, args.stationary))
        return
    if args.x3:
        precisions = ("tf32x3",) if args.only else ("tf32x3", "x3split")
        _gemm_table(f"{args.rows} x {args.width} -> {args.x3}", "ms", 3,
                    x3_gemms(args.rows, args.width, args.x3, precisions, args.only))
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "tf32", torch.backends.cuda.matmul.allow_tf32)
    print(f"| op ({args.rows} x {args.width}) | variant | ms | max rel err |")
    print("| --- | --- | --- | --- |")
    for dtype in (torch.float32, torch.bfloat16):
        for name, (ms, err) in column_sums(args.rows, args.width, dtype).items():
            print(f"| column sum {str(dtype)[6:]} | {name} | {ms:.3f} | {err:.1e} |")
    for name, (ms, err) in gemms(args.rows, args.width).items():
        print(f"| gemm fp32 | {name} | {ms:.3f} | {err:.1e} |")


if __name__ == "__main__":
    main()
