"""The max/min forward kernel's launch, hub items and light items apart (issue 4's degree split).

    python -m benchmarks.gather_launch_probe --graphs rmat-large,rmat-arxiv

``gather_scatter_triton.forward`` launches one grid over every work item with one ``LAUNCH``. The plan's hub
items (rows above the split threshold, cut into items of ``max_edges`` entries) lead its items; the rest are light
rows of a few edges each. This probe launches the forward kernel (identity message, SAGEConv max) over the hub
items alone and over the light items alone, for each launch candidate, and prints each one's time (CUDA events,
median), its registers and spills, and the best pair against the single launch of today. It also runs the light items
through the *rows* kernel (``GNN_IO_GS_LIGHT_ROWS=1``: several light rows per program, the s-th edge of each at step
s) for each of its candidates. The outputs are compared with the single launch's (max is exact: they must be equal).
"""
import argparse
import os

import torch

from benchmarks.harness import graph_suite, median_ms
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import fused as g, launches
from gnn_inductor.kernels.gather_scatter.template import KernelSpec
from gnn_inductor.kernels.runtime.launch import cdiv
from gnn_inductor.plan.work_items import hub_item_count

CANDIDATES = [  # (block_e, num_warps), block_f 128
    (1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8),
]
ROWS_CANDIDATES = [  # the rows kernel (GNN_IO_GS_LIGHT_ROWS=1): (rows per program, num_warps), block_f 128
    (2, 1), (4, 1), (8, 1), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8),
]


def _regs(kernel, known: int) -> str:
    """Registers/spills of the kernel the last launch compiled (the fast launcher's newest entry, if it added one)."""
    compiled = list(getattr(kernel, "_compiled", {}).values())
    if len(compiled) <= known:
        return "-"
    c = compiled[-1][0]
    return f"{getattr(c, 'n_regs', '?')}/{getattr(c, 'n_spills', '?')}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", default="rmat-large")
    parser.add_argument("--reduce", default="max")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    args = parser.parse_args()
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    summary = []
    for graph in graph_suite(args.graphs.split(","), os.environ.get("GNN_IO_DATA", "../shared/data"), args.device):
        src, dst = graph.edge_index
        n, f = graph.num_nodes, args.features
        plan_t = torch.ops.gnn_io.csr_plan(dst, src, n, n)
        plan = g.make_plan(*plan_t[:4], n, *plan_t[4:])
        hubs = hub_item_count(plan.items)
        num_items = plan.items[0].numel()
        torch.manual_seed(0)
        x = torch.randn(n, f, device=args.device)
        reference = g.forward([x], [0], plan, key, args.reduce)
        whole_ms = median_ms(lambda: g.forward([x], [0], plan, key, args.reduce), args.reps)
        fns, index = launches.lowered_members([key], launches.argument_specs([x], [0]))
        spec = KernelSpec("forward", "dst", args.reduce, members=((args.reduce, index[0]),))
        kernel = launches.kernel(fns, spec)
        out = reference.clone()
        print(f"== {graph.name}: {num_items} items, {hubs} hub items; forward as today {whole_ms:.3f} ms (with its "
              "output's allocation and prefill)", flush=True)

        rows_kernel = launches.kernel(fns, KernelSpec("rows", "dst", args.reduce, members=((args.reduce, index[0]),)))

        def launch(part, block_e, warps):
            lo, hi = (0, hubs) if part == "hub" else (hubs, num_items)
            items = [t[lo:hi] for t in plan.items]
            tensors = [x, out, plan.rowptr, plan.col, plan.col, plan.perm, *items]
            setting = {"block_e": block_e, "block_f": 128, "num_warps": warps}
            if part == "rows":  # the rows kernel over the light items: block_e rows per program
                launches.launch(rows_kernel, cdiv(hi - lo, block_e), [*tensors, hi - lo], f, setting)
            else:
                launches.launch(kernel, hi - lo, tensors, f, setting)

        best = {}
        for part in ("hub", "light", "rows"):
            for block_e, warps in (ROWS_CANDIDATES if part == "rows" else CANDIDATES):
                # the hub rows' atomics start from the prefill value; the light rows are stored over NaN
                out.fill_(float("-inf") if part == "hub" else float("nan"))
                which = rows_kernel if part == "rows" else kernel
                known = len(getattr(which, "_compiled", {}))
                launch(part, block_e, warps)
                regs = _regs(which, known)
                rows = plan.items[0][:hubs] if part == "hub" else plan.items[0][hubs:][plan.items[3][hubs:] == 0]
                ok = torch.equal(out[rows.long()], reference[rows.long()])
                ms = median_ms(lambda: launch(part, block_e, warps), args.reps)
                print(f"   {part:5s} block_e {block_e:3d} warps {warps}: {ms:.3f} ms, regs/spills {regs}, "
                      f"{'equal' if ok else 'DIFFERENT'}", flush=True)
                if ok and (part not in best or ms < best[part][0]):
                    best[part] = (ms, block_e, warps)
        summary.append((graph.name, whole_ms, best))
    print("\n| graph | forward today (ms) | hub launch best | light launch best | rows kernel best | hub + best light "
          "(ms) |\n|---|---|---|---|---|---|")
    for name, whole, best in summary:
        h, li, r = best.get("hub"), best.get("light"), best.get("rows")
        cell = [f"{b[1:]} {b[0]:.3f}" if b else "-" for b in (h, li, r)]
        total = (h[0] if h else 0) + min((b[0] for b in (li, r) if b), default=0)
        print(f"| {name} | {whole:.3f} | {cell[0]} | {cell[1]} | {cell[2]} | {total:.3f} |")


if __name__ == "__main__":
    main()
