"""One issue-8 table from harness tables measured in several device calls.

The block-sparse suite (``benchmarks/block_sparse_suite.sh``) takes longer than one 10-minute device call, so it
runs in pieces; ``python -m benchmarks.harness --merge`` joins pieces from their ``results.json``. This script joins
the markdown tables (``results.md``, or the harness's stdout, which prints the same table), for pieces whose JSON
did not come back. A later file's cell replaces an earlier one only where it holds a number. Per (graph, layer) row:
PyG eager, ``torch.compile`` default, gnn_io's automatic pick and each forced mode, gnn_io's speedups over eager and
over ``torch.compile``, and the pick against the fastest gnn_io mode of the row (the chooser's cost; where the pick
and the fastest mode ran the same path the difference is the noise between processes), with the file of each row::

    python -m benchmarks.suite_table FILE.md ... > table.md
"""
from __future__ import annotations

import argparse
import os

FORCED = ("gnn_io_csr", "gnn_io_block", "gnn_io_hybrid", "gnn_io_reorder_off")
COLUMNS = ("eager", "inductor", "gnn_io", "gnn_io path") + FORCED + ("err vs fp32 (eager / gnn_io)",)


def tables(path: str):
    """Each markdown table row of the file as a dict keyed by its header."""
    header = None
    for line in open(path):
        line = line.strip()
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "graph":
            header = cells
        elif header and not set(line) <= set("|-"):
            yield dict(zip(header, cells))


def number(cell):
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def merge(paths: list) -> dict:
    rows = {}
    for path in paths:
        for row in tables(path):
            key = (row["graph"], row["layer"])
            merged = rows.setdefault(key, {"sources": []})
            took = False
            for column in COLUMNS:
                value = row.get(column)
                if value is None or not value.strip("-/ "):  # "-", "- / -": nothing measured
                    continue
                if column not in merged or number(value) is not None or number(merged[column]) is None:
                    merged[column] = value
                    took = True
            if took:
                merged["sources"].append(os.path.relpath(path))
    return rows


def render(rows: dict) -> str:
    lines = ["| graph | layer | eager | inductor | gnn_io | gnn_io path | csr | block | hybrid | reorder off | "
             "x eager | x inductor | pick vs fastest gnn_io mode | err vs fp32 (eager / gnn_io) | from |",
             "|" + "---|" * 15]
    for (graph, layer), r in rows.items():
        pick = number(r.get("gnn_io"))
        modes = [number(r.get(m)) for m in ("gnn_io",) + FORCED]
        best = min((m for m in modes if m is not None), default=None)
        eager, inductor = number(r.get("eager")), number(r.get("inductor"))

        def ratio(a, b):
            return f"{a / b:.2f}" if a is not None and b else "-"
        lines.append("| " + " | ".join([
            graph, layer, r.get("eager", "-"), r.get("inductor", "-")[:28], r.get("gnn_io", "-")[:28],
            r.get("gnn_io path", "-"), *(r.get(m, "-")[:28] for m in FORCED), ratio(eager, pick), ratio(inductor, pick),
            f"{pick / best - 1:+.0%}" if pick is not None and best else "-",
            r.get("err vs fp32 (eager / gnn_io)", "-"), ", ".join(dict.fromkeys(r["sources"]))]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="results.md files or harness stdout, earliest first")
    args = parser.parse_args(argv)
    print(render(merge(args.tables)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
