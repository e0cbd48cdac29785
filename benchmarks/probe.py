"""Kernel-level probe on one GPU: times and checks many variants of the SpMM and attention kernels
against each other, prints a short table last (block-sparse against CSR, node orders; the work-item order of the
Triton SpMM against cuSPARSE). Its ``attention`` part is the calibration run of the attention path cost model
(``kernels/attention/selector.py``), fitted by ``python -m benchmarks.fit_attention``.

    python -m benchmarks.probe --parts build,spmm,attention [--graphs sbm-dense,batch-random,...]

Parts:
- ``build``: block-format build (and transposed build) time on the device per graph, tile statistics.
- ``spmm``: fp32 ``A X`` (128 features) with cuSPARSE, and with the Triton SpMM whose work items run in
  each candidate node order (the order lives in the item arrays: the output stays in the original order).
- ``spmm_sweep``: the Triton SpMM's launch parameters (feature slice, edge block, warps, item size) against
  cuSPARSE, fp32 ``A X``.
- ``attn_launch``: the CSR attention kernels' launch parameters (edge block, warps, item size), forward and
  split backward timed apart, per family, fp32, each checked against the default launch.
- ``reduction``: the fused gather-scatter forward (identity message; sum, mean, max) at each split threshold
  candidate, against the least bytes over the measured copy bandwidth (target: 50% of it).
- ``attention``: the GATConv, GATv2Conv and TransformerConv attentions (4 heads x 32 channels) through
  ``gnn_io::attention_forward``, forward+backward, with the path forced: CSR (fp32, bf16), block
  (TF32, bf16) in each candidate order, and the chooser's own pick (``auto``); max relative error of each
  (output and every gradient) against the CSR fp32 result, and the decision's predicted times.

Every row of the table is printed as JSON too (``{"probe": ...}``); ``--out DIR`` writes ``probe.md`` and
``probe.json``, the input of ``benchmarks/fit_attention.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.harness import copy_bandwidth, graph_suite, median_ms
from benchmarks.probe_common import (CHANNELS, FEATURES, HEADS, ROWS, edge_fn, emit, family_inputs, rel_err,
                                     reset_decisions, sync_ms)
from benchmarks.probe_sweeps import (BLOCK_KERNELS, part_attention_launch, part_block_launch, part_mass_launch,
                                     part_segment_sum, part_spmm_sweep, part_split_sweep)
from gnn_inductor.kernels.runtime.roles import ROLE_SRC
from gnn_inductor.kernels.spmm import csr_triton as spmm_triton
from gnn_inductor.plan import block_format
from gnn_inductor.plan import orders as reorder
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import work_items as work_items_module

PARTITION_MAX_EDGES = 8_000_000


def plan_of(graph, device):
    src, dst = graph.edge_index.to(device)
    return torch.ops.gnn_io.csr_plan(dst, src, graph.num_nodes, graph.num_nodes)


def orders(plan, names, device):
    """{name: (order on device, build seconds)} for the candidates available here."""
    rowptr, col = plan[0].cpu(), plan[1].cpu()
    out = {}
    for name in names:
        if name not in reorder.available_candidates():
            continue
        if name == "partition" and col.numel() > PARTITION_MAX_EDGES:
            continue  # METIS into parts of 64 nodes took 489 s on RMAT 2^20 / 15.4M edges (CPU)
        start = time.perf_counter()
        order = reorder.CANDIDATES[name](rowptr, col)
        out[name] = (order.to(device), time.perf_counter() - start)
    return out



def part_build(graph, plan, device):
    rowptr, col, _, perm = plan[:4]
    build_block = lambda: block_format.build_block_format(rowptr, col, perm, graph.num_nodes)
    build_block()  # warm-up (allocator, kernels)
    blocks, ms = sync_ms(build_block)
    _, t_ms = sync_ms(lambda: block_format.transpose_block_format(blocks, graph.num_nodes))
    emit(part="build", graph=graph.name, nodes=graph.num_nodes, edges=graph.num_edges, build_ms=round(ms, 1),
         transpose_ms=round(t_ms, 1), **blocks.stats)


def part_spmm(graph, plan, device, order_names):
    from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
    from gnn_inductor.kernels.spmm.common import spmm_state

    rowptr, col, _, perm = plan[:4]
    x = torch.randn(graph.num_nodes, FEATURES, device=device)
    values = torch.rand(col.shape[0], device=device)
    if spmm_cusparse.available():
        entries = spmm_state(rowptr, col).slot("cusparse")
        ms = median_ms(lambda: spmm_cusparse.cusparse_spmm(x, values, rowptr, col, entries), reps=20)
        emit(part="spmm", graph=graph.name, kernel="cusparse", order="none", ms=round(ms, 3))
    part_block_spmm(graph, plan, x, values, device)
    items = work_items_module.work_items(rowptr, work_items_module.DEFAULT_MAX_EDGES)
    reference = spmm_triton.triton_spmm(x, values, rowptr, col, items)
    for name, (order, seconds) in orders(plan, order_names, device).items():
        position = reorder.inverse_order(order)
        by_order = torch.sort(position[items.row.long()], stable=True).indices
        ordered = work_items_module.WorkItems(*(t[by_order].contiguous() for t in items))
        out = spmm_triton.triton_spmm(x, values, rowptr, col, ordered)
        err = float((out - reference).abs().max() / reference.abs().max())
        ms = median_ms(lambda: spmm_triton.triton_spmm(x, values, rowptr, col, ordered), reps=20)
        stats = reorder.locality_stats(*reorder.permute_csr(rowptr, col, order)[:2])
        emit(part="spmm", graph=graph.name, kernel="triton", order=name, ms=round(ms, 3), order_s=round(seconds, 2),
             rel_err=err, block_ratio=round(stats["block_ratio"], 4), source_reuse=round(stats["source_reuse"], 4))


BLOCK_SPMM_LAUNCHES = [{"block_f": 128, "num_warps": 4, "num_stages": 3}, {"block_f": 64, "num_warps": 4, "num_stages": 3},
                       {"block_f": 128, "num_warps": 8, "num_stages": 3}, {"block_f": 64, "num_warps": 2, "num_stages": 4},
                       {"block_f": 32, "num_warps": 2, "num_stages": 4}]


def part_block_spmm(graph, plan, x, values, device):
    """The block-sparse SpMM (forward ``A X`` and the transposed ``A^T dY``) in fp32 IEEE, TF32 and bf16 with
    each launch of :data:`BLOCK_SPMM_LAUNCHES`, against cuSPARSE (fp32) and torch.sparse (bf16)."""
    from gnn_inductor.kernels.spmm import block_sparse as bss
    from gnn_inductor.kernels.spmm.csr_product import csr_matmul_sum

    rowptr, col = plan[:2]
    start = time.perf_counter()
    ids = torch.arange(col.numel(), device=device, dtype=torch.int32)
    blocks = block_format.build_block_format(rowptr, col, ids, graph.num_nodes)
    transposed = block_format.transpose_block_format(blocks, graph.num_nodes)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - start
    if blocks.dense_windows.numel() < blocks.window_rows.shape[0]:
        emit(part="spmm", graph=graph.name, kernel="block", error="duplicate pairs: not all windows dense")
        return
    reference = csr_matmul_sum(x, values, rowptr, col, None)
    grad = torch.randn_like(x)
    for dtype in (torch.float32, torch.bfloat16):
        xd, gd = x.to(dtype), grad.to(dtype)
        ms = median_ms(lambda: csr_matmul_sum(xd, values, rowptr, col, None), reps=20)
        emit(part="spmm", graph=graph.name, kernel="csr-" + ("cusparse" if dtype == torch.float32 else "torch.sparse"),
             dtype=str(dtype).split(".")[-1], order="none", ms=round(ms, 3))
        for tf32 in ((False, True) if dtype == torch.float32 else (False,)):
            for launch in BLOCK_SPMM_LAUNCHES:
                bss.LAUNCH.update(launch)
                out = bss.block_spmm_forward(xd, values, blocks, graph.num_nodes, tf32)
                fwd = median_ms(lambda: bss.block_spmm_forward(xd, values, blocks, graph.num_nodes, tf32), reps=20)
                bwd = median_ms(lambda: bss.block_spmm_backward(gd, xd, values, blocks, transposed, graph.num_nodes,
                                                                tf32), reps=20)
                emit(part="spmm", graph=graph.name, kernel="block", dtype=("tf32" if tf32 else str(dtype).split(".")[-1]),
                     order="none", ms=round(fwd, 3), bwd_ms=round(bwd, 3), rel_err=rel_err(out, reference),
                     launch=dict(launch), edges_per_tile=round(col.numel() / blocks.tile_edge.shape[0], 1),
                     build_s=round(build_s, 3))
    bss.LAUNCH.update(BLOCK_SPMM_LAUNCHES[0])



def part_attention(graph, plan, device, order_names, families):
    rowptr, col, row, perm = plan[:4]
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    generator = torch.Generator(device=device).manual_seed(0)
    grad = torch.randn(graph.num_nodes, HEADS, CHANNELS, device=device, generator=generator)
    orders_here = [n for n in order_names if n in reorder.available_candidates()
                   and not (n == "partition" and graph.num_edges > PARTITION_MAX_EDGES)]
    for family in families:
        score, message, roles, base = family_inputs(family, graph.num_nodes, device, generator)

        def run(args):
            out = torch.ops.gnn_io.attention_forward(args, roles, rowptr, col, row, perm, score, message, 1e-16,
                                                     items, 256)[0]
            out.backward(grad.to(out.dtype))
            return out

        def leaves(dtype):
            return [b.detach().to(dtype).requires_grad_() for b in base]

        os.environ["GNN_IO_ATTENTION_PATH"] = "csr"
        args = leaves(torch.float32)
        ref = run(args)
        ref_grads = [a.grad for a in args]
        configs = [("csr", "fp32", "off"), ("csr", "bf16", "off")]
        configs += [("block", p, o) for p in ("tf32", "bf16") for o in orders_here]
        configs += [("auto", "tf32", "auto"), ("auto", "bf16", "auto")]
        for path, precision, order in configs:
            os.environ["GNN_IO_ATTENTION_PATH"] = path
            os.environ["GNN_IO_REORDER"] = order
            torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
            reset_decisions()
            try:
                args = leaves(torch.bfloat16 if precision == "bf16" else torch.float32)
                out = run(args)
                errs = [rel_err(out, ref)] + [rel_err(a.grad, g) for a, g in zip(args, ref_grads)]
                decision = graph_state.recorded()[-1].as_dict() if graph_state.recorded() else {}

                def step(args=args):
                    for a in args:
                        a.grad = None
                    run(args)
                ms = median_ms(step, reps=10)
                emit(part="attention", graph=graph.name, edges=graph.num_edges, family=family, kernel=path,
                     dtype=precision, order=decision.get("order", order), ms=round(ms, 3), max_rel_err=max(errs),
                     nan=bool(torch.isnan(out).any()), chosen=decision.get("path", "csr"),
                     predicted=decision.get("predicted_ms"), stats=decision.get("stats"),
                     order_build_ms=decision.get("order_build_ms"), measured=decision.get("measured_forward_ms"))
            except Exception as exc:  # noqa: BLE001  (a failing variant is a row)
                emit(part="attention", graph=graph.name, family=family, kernel=path, dtype=precision, order=order,
                     error=f"{type(exc).__name__}: {exc}"[:300])
        for var in ("GNN_IO_ATTENTION_PATH", "GNN_IO_REORDER"):
            os.environ.pop(var, None)
        torch.set_float32_matmul_precision("highest")



def part_reduction(graph, plan, device, bandwidth):
    """The fused gather-scatter forward (identity message, fp32, 128 features) per reduction, at the measured
    split pick and at each candidate threshold: its time against the least bytes (each input read once: the
    features, rowptr, col, the work items; the output written once) over the measured copy bandwidth
    (the target: at least 50% on the RMAT graph)."""
    from gnn_inductor.kernels.gather_scatter import fused as gs
    from gnn_inductor.kernels.gather_scatter import split_tuning

    rowptr, col, row, perm = plan[:4]
    n = graph.num_nodes
    x = torch.randn(n, FEATURES, device=device)
    key = edge_fn(lambda x_j: x_j)
    pick = split_tuning.choose(rowptr, col, gs.probe_ms)
    max_degree = int((rowptr[1:] - rowptr[:-1]).max())
    base = gs.make_plan(rowptr, col, row, perm, n)
    for max_edges in split_tuning.candidates(max_degree):
        w = work_items_module.work_items(rowptr, max_edges)
        items = (w.row, w.start, w.end, w.shared)
        p = gs.Plan(*(getattr(base, f) for f in ("rowptr", "col", "row", "perm", "t_rowptr", "t_col", "t_perm")),
                    items, base.t_items)
        least = (x.numel() * 4 + rowptr.numel() * rowptr.element_size() + col.numel() * col.element_size()
                 + sum(t.numel() * t.element_size() for t in items) + n * FEATURES * 4)
        for reduce in ("sum", "mean", "max"):
            ms = median_ms(lambda: gs.forward([x], [ROLE_SRC], p, key, reduce), reps=20)
            emit(part="reduction", graph=graph.name, kernel="gather_scatter", dtype="fp32", order=reduce,
                 ms=round(ms, 3), max_edges=max_edges, picked=max_edges == pick["max_edges"],
                 source=pick["source"], least_mb=round(least / 1e6, 1),
                 bandwidth_share=round(least / (ms / 1e3) / bandwidth, 3))


def table(rows) -> str:
    lines = ["| part | graph | family | kernel | dtype | order | ms | err | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = {k: v for k, v in r.items() if k not in ("part", "graph", "kernel", "dtype", "order", "ms",
                                                         "max_rel_err", "rel_err", "family", "stats", "edges")}
        err = r.get("max_rel_err", r.get("rel_err", ""))
        lines.append(f"| {r['part']} | {r['graph']} | {r.get('family', '')} | {r.get('kernel', '')} | {r.get('dtype', '')} | "
                     f"{r.get('order', '')} | {r.get('ms', '')} | {err if err == '' else f'{err:.1e}'} | "
                     f"{json.dumps(notes)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="build,spmm,attention")
    parser.add_argument("--graphs", default="sbm-dense,batch-random,tu-batch,MUSAE-wikipedia-squirrel,"
                                            "SNAP-facebook_combined,rmat-arxiv,rmat-large")
    parser.add_argument("--spmm-graphs", default="rmat-large,rmat-arxiv,sbm-dense")
    parser.add_argument("--attention-graphs", default="sbm-dense,batch-random,tu-batch,MUSAE-wikipedia-squirrel,"
                                                      "SNAP-facebook_combined,rmat-arxiv,rmat-large")
    parser.add_argument("--orders", default="none,rcm,partition")
    parser.add_argument("--families", default="dot,gat,gatv2")
    parser.add_argument("--block-dtype", default="bf16", choices=("bf16", "tf32"),
                        help="inputs of the block_launch sweep (tf32: float32 with TF32 allowed)")
    parser.add_argument("--out", default=None, help="folder for probe.md and probe.json (fit_attention's input)")
    parser.add_argument("--data-root", default=os.environ.get("GNN_IO_DATA", os.path.join("..", "shared", "data")))
    args = parser.parse_args()
    device = torch.device("cuda")
    parts = args.parts.split(",")
    order_names = args.orders.split(",")
    data_root = args.data_root
    names = list(dict.fromkeys(args.graphs.split(",")))
    bandwidth = copy_bandwidth(device)
    emit(part="copy", graph="-", kernel="copy_", ms="", copy_gbps=round(bandwidth / 1e9))
    for name in names:
        try:
            (graph,) = graph_suite([name], data_root, device)
            plan = plan_of(graph, device)
            if "build" in parts:
                part_build(graph, plan, device)
            if "spmm" in parts and name in args.spmm_graphs.split(","):
                part_spmm(graph, plan, device, order_names)
            if "spmm_sweep" in parts and name in args.spmm_graphs.split(","):
                part_spmm_sweep(graph, plan, device)
            if "attn_launch" in parts and name in args.attention_graphs.split(","):
                part_attention_launch(graph, plan, device, args.families.split(","))
            if "block_launch" in parts and name in args.attention_graphs.split(","):
                part_block_launch(graph, plan, device, [f for f in args.families.split(",") if f in BLOCK_KERNELS],
                                  dtype=args.block_dtype)
            if "segment_sum" in parts and name in args.attention_graphs.split(","):
                part_segment_sum(graph, plan, device)
            if "mass_launch" in parts and name in args.attention_graphs.split(","):
                part_mass_launch(graph, plan, device)
            if "split_sweep" in parts and name in args.attention_graphs.split(","):
                part_split_sweep(graph, plan, device, args.families.split(","))
            if "reduction" in parts:
                part_reduction(graph, plan, device, bandwidth)
            if "attention" in parts and name in args.attention_graphs.split(","):
                part_attention(graph, plan, device, order_names, args.families.split(","))
        except Exception as exc:  # noqa: BLE001  (one graph's failure is its row; the rest still runs)
            emit(part="error", graph=name, error=f"{type(exc).__name__}: {exc}"[:300])
        torch.cuda.empty_cache()
    text = table(ROWS)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "probe.json"), "w") as f:
            json.dump(ROWS, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
