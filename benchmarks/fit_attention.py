"""Fit the attention path cost model's constants (``kernels/attention/selector.CALIBRATION``) to a probe run.

``python -m benchmarks.probe --parts attention --families dot --orders none,rcm --out DIR`` times the attention op
(forward+backward, 4 heads x 32 channels) per path, order and precision on a few graphs and writes
``DIR/probe.json``. This script fits, per family and precision, by non-negative least squares:

- the CSR kernel: ``ms = per_edge * E + per_identity_tile * T0 + fixed`` (``T0``: the graph's tiles in its own node
  order, taken from the block rows of order ``none``); ``--no-locality`` drops the tile term, as the half-precision
  and GAT models have none;
- the block kernel: ``ms = per_tile * tiles + per_row * rows + fixed`` over the rows where every window ran on the
  block kernel (a hybrid's time mixes both kernels and is left out).

It prints the constants in the unit of ``CALIBRATION`` (nanoseconds per edge, tile or row; milliseconds per call)
and each point's prediction against its measurement::

    python -m benchmarks.fit_attention DIR/probe.json --family dot --precision tf32 --block-per-row

(how the H200 entry of ``kernels/attention/selector.DEVICE_CALIBRATION`` was fitted). A block format's rows are
taken as its windows x 16 (``WINDOW`` of ``gnn_inductor/plan/block_format.py``).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.optimize import nnls

CSR_DTYPE = {"tf32": "fp32", "half": "bf16"}   # the CSR rows timed for each block precision
BLOCK_DTYPE = {"tf32": "tf32", "half": "bf16"}


def load(paths: list, family: str) -> list:
    rows = []
    for path in paths:
        rows += [r for r in json.load(open(path)) if r.get("part") == "attention" and r.get("family") == family
                 and "error" not in r]
    return rows


def identity_tiles(rows: list) -> dict:
    """``{graph: tiles}`` of the identity order (a block row of order ``none`` holds the format's statistics)."""
    return {r["graph"]: r["stats"]["tiles"] for r in rows
            if r["kernel"] == "block" and r["order"] == "none" and r.get("stats")}


def fit(design: list, times: list) -> tuple:
    a, b = np.asarray(design, dtype=float), np.asarray(times, dtype=float)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, b)
    coef = coef / scale
    return coef, a @ coef


def fit_csr(rows: list, precision: str, locality: bool) -> tuple:
    tiles = identity_tiles(rows)
    points = [r for r in rows if r["kernel"] == "csr" and r["dtype"] == CSR_DTYPE[precision] and r["graph"] in tiles]
    design = [[r["edges"], tiles[r["graph"]] if locality else 0.0, 1.0] for r in points]
    coef, predicted = fit(design, [r["ms"] for r in points])
    constants = {"csr_per_edge": coef[0] * 1e6, "csr_per_identity_tile": coef[1] * 1e6, "csr_per_row": 0.0,
                 "csr_fixed_ms": coef[2]}
    if not locality:
        del constants["csr_per_identity_tile"]
    return constants, [(r["graph"], "csr", "none", r["ms"], p) for r, p in zip(points, predicted)]


def fit_block(rows: list, precision: str, per_row: bool) -> tuple:
    points = [r for r in rows if r["kernel"] == "block" and r["dtype"] == BLOCK_DTYPE[precision]
              and r.get("chosen") == "block" and r.get("stats")]
    design = [[r["stats"]["tiles"], r["stats"]["windows"] * 16 if per_row else 0.0, 1.0] for r in points]
    coef, predicted = fit(design, [r["ms"] for r in points])
    constants = {"block_per_tile": coef[0] * 1e6, "block_per_row": coef[1] * 1e6, "block_fixed_ms": coef[2]}
    return constants, [(r["graph"], "block", r["order"], r["ms"], p) for r, p in zip(points, predicted)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe_json", nargs="+")
    parser.add_argument("--family", default="dot")
    parser.add_argument("--precision", default="tf32", choices=("tf32", "half"))
    parser.add_argument("--no-locality", action="store_true", help="CSR model without the identity-tile term")
    parser.add_argument("--block-per-row", action="store_true", help="fit a block per-row term too")
    args = parser.parse_args(argv)
    rows = load(args.probe_json, args.family)
    csr, csr_points = fit_csr(rows, args.precision, not args.no_locality)
    block, block_points = fit_block(rows, args.precision, args.block_per_row)
    constants = {k: round(float(v), 3) for k, v in {**csr, **block}.items()}
    print(f"{args.family} {args.precision}: {constants}")
    print("| graph | kernel | order | measured ms | fitted ms | error |")
    print("|---|---|---|---|---|---|")
    for graph, kernel, order, measured, predicted in csr_points + block_points:
        print(f"| {graph} | {kernel} | {order} | {measured:.3f} | {predicted:.3f} | {predicted / measured - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
