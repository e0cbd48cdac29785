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

from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import block_format
import torch
from gnn_inductor.kernels.attention import block_dot as block_sparse  # (gnn_inductor.kernels registers the ops)
from gnn_inductor.kernels.attention import csr_backward, csr_delta, csr_forward, csr_split_backward
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.kernels.spmm import csr_triton as spmm_triton
from gnn_inductor.plan import work_items as work_items_module
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_SRC

from benchmarks.harness import copy_bandwidth, graph_suite, median_ms
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.plan import orders as reorder

HEADS, CHANNELS, FEATURES = 4, 32, 128
PARTITION_MAX_EDGES = 8_000_000
aten = torch.ops.aten
ROWS = []


def emit(**row):
    ROWS.append(row)
    print(json.dumps({"probe": row}), flush=True)


def _dot_score(a0, a1, a2):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), CHANNELS ** 0.5)


def _dot_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(a0, aten.view.default(alpha, [-1, HEADS, 1]))


def edge_fn(f) -> str:
    return edge_functions.register(torch.fx.symbolic_trace(f))


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


def sync_ms(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3


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
                     order="none", ms=round(fwd, 3), bwd_ms=round(bwd, 3), rel_err=_rel_err(out, reference),
                     launch=dict(launch), edges_per_tile=round(col.numel() / blocks.tile_edge.shape[0], 1),
                     build_s=round(build_s, 3))
    bss.LAUNCH.update(BLOCK_SPMM_LAUNCHES[0])


def _rel_err(a, b):
    return float((a.detach().float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def _gat_score(a0, a1, a2):
    return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gatv2_score(a0, a1, a2):
    return aten.sum.dim_IntList(aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(a1, a0), 0.2), a2), [-1])


def family_inputs(family, num_nodes, device, generator):
    """(score key, message key, roles, float32 inputs) of a GATConv / GATv2Conv / TransformerConv attention."""
    def vec(rows=num_nodes):
        return torch.randn(rows, HEADS, CHANNELS, device=device, generator=generator)
    if family == "dot":
        return edge_fn(_dot_score), edge_fn(_dot_message), [ROLE_SRC, ROLE_DST, ROLE_SRC], [vec(), vec(), vec()]
    if family == "gat":
        scalars = [torch.randn(num_nodes, HEADS, device=device, generator=generator) for _ in range(2)]
        return edge_fn(_gat_score), edge_fn(_gat_message), [ROLE_SRC, ROLE_SRC, ROLE_DST], [vec(), *scalars]
    return (edge_fn(_gatv2_score), edge_fn(_gat_message), [ROLE_SRC, ROLE_DST, ROLE_DENSE],
            [vec(), vec(), vec(1) * 0.2])


def reset_decisions():
    """Forget the path decisions (the orders and block formats of each plan stay cached)."""
    graph_state.forget_decisions()


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
                errs = [_rel_err(out, ref)] + [_rel_err(a.grad, g) for a, g in zip(args, ref_grads)]
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


BLOCK_KERNELS = {family: tuple(f"{family}_{k}" for k in kernels) for family, kernels in (
    ("dot", ("forward", "query", "source")), ("gat", ("forward", "row", "source")),
    ("gatv2", ("forward", "row", "source")))}
BLOCK_LAUNCH_SWEEP = [dict(num_warps=w, num_stages=st) for w in (1, 2, 4, 8) for st in (1, 3)]
# the dot and GAT kernels also take every head in one program (block_sparse.head_launch), swept the same way
BLOCK_HEADS_SWEEP = [dict(heads="all", num_warps=w, num_stages=st) for w in (1, 2, 4, 8) for st in (1, 3)]


def part_block_launch(graph, plan, device, families, order="rcm", dtype="bf16"):
    """The block-sparse attention kernels' launch options (``block_sparse.BLOCK_LAUNCH``: warps, pipeline stages,
    heads per program), ``dtype`` bf16 or tf32 (fp32 inputs, TF32 allowed; the sweep then sets the kernels'
    ``name:fp32`` entries), the block path forced in ``order``: forward+backward of the op at the current launches
    (row ``default``), at each kernel's own (row ``kernels' own``: Triton's defaults for the dot kernels), and with
    one kernel's launch swept and the others current; each checked against the current launches."""
    rowptr, col, row, perm = plan[:4]
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    generator = torch.Generator(device=device).manual_seed(0)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    suffix = "" if dtype == "bf16" else ":fp32"
    grad = torch.randn(graph.num_nodes, HEADS, CHANNELS, device=device, generator=generator).to(torch_dtype)
    os.environ["GNN_IO_ATTENTION_PATH"], os.environ["GNN_IO_REORDER"] = "block", order
    if dtype == "tf32":
        torch.set_float32_matmul_precision("high")
    try:
        for family in families:
            score, message, roles, base = family_inputs(family, graph.num_nodes, device, generator)
            args = [b.detach().to(torch_dtype).requires_grad_() for b in base]

            def step():
                for a in args:
                    a.grad = None
                out = torch.ops.gnn_io.attention_forward(args, roles, rowptr, col, row, perm, score, message, 1e-16,
                                                         items, 256)[0]
                out.backward(grad)
                return [out] + [a.grad for a in args]
            reset_decisions()
            reference = [t.clone() for t in step()]
            chosen = graph_state.recorded()[-1].path if graph_state.recorded() else "?"
            saved = dict(block_sparse.BLOCK_LAUNCH)
            kernels = [name + suffix for name in BLOCK_KERNELS[family]]
            emit(part="block_launch", graph=graph.name, family=family, kernel="default", dtype=dtype, order=order,
                 ms=round(median_ms(step, reps=10), 3), chosen=chosen,
                 launch={k: block_sparse.launch_entry(k, torch_dtype) for k in BLOCK_KERNELS[family]})
            runs = [("kernels' own", {name: {} for name in kernels})]
            sweep = BLOCK_LAUNCH_SWEEP + (BLOCK_HEADS_SWEEP if family in ("dot", "gat") else [])
            runs += [(name, {name: launch}) for name in kernels for launch in sweep]
            if family in ("dot", "gat"):  # every kernel with all heads per program at once
                runs += [("all heads", {name: dict(heads="all", num_warps=w) for name in kernels}) for w in (1, 2, 4)]
            for name, launches in runs:
                block_sparse.BLOCK_LAUNCH.update(launches)
                try:
                    errs = [_rel_err(a, b) for a, b in zip(step(), reference)]
                    emit(part="block_launch", graph=graph.name, family=family, kernel=name, dtype=dtype,
                         order=order, ms=round(median_ms(step, reps=10), 3), max_rel_err=max(errs),
                         launch=launches)
                except Exception as exc:  # noqa: BLE001  (a failing launch is a row)
                    emit(part="block_launch", graph=graph.name, family=family, kernel=name, launch=launches,
                         error=f"{type(exc).__name__}: {exc}"[:300])
                finally:
                    block_sparse.BLOCK_LAUNCH.clear()
                    block_sparse.BLOCK_LAUNCH.update(saved)
    finally:
        for var in ("GNN_IO_ATTENTION_PATH", "GNN_IO_REORDER"):
            os.environ.pop(var, None)
        torch.set_float32_matmul_precision("highest")


SPMM_SWEEP = [dict(block_f=f, block_e=e, num_warps=w) for f in (32, 64, 128)
              for e, w in ((4, 1), (8, 1), (16, 1), (8, 2), (16, 2), (32, 4))]


def part_spmm_sweep(graph, plan, device):
    """The Triton SpMM's launch parameters (feature slice, edge block, warps) against cuSPARSE, fp32 ``A X``."""
    from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
    from gnn_inductor.kernels.spmm.common import spmm_state

    rowptr, col = plan[:2]
    x = torch.randn(graph.num_nodes, FEATURES, device=device)
    values = torch.rand(col.shape[0], device=device)
    if spmm_cusparse.available():
        entries = spmm_state(rowptr, col).slot("cusparse")
        ms = median_ms(lambda: spmm_cusparse.cusparse_spmm(x, values, rowptr, col, entries), reps=20)
        emit(part="spmm_sweep", graph=graph.name, kernel="cusparse", ms=round(ms, 3))
    for max_edges in (256, 64):
        items = work_items_module.work_items(rowptr, max_edges)
        reference = spmm_triton.triton_spmm(x, values, rowptr, col, items)
        for launch in SPMM_SWEEP:
            out = spmm_triton.triton_spmm(x, values, rowptr, col, items, **launch)
            err = float((out - reference).abs().max() / reference.abs().max())
            ms = median_ms(lambda: spmm_triton.triton_spmm(x, values, rowptr, col, items, **launch), reps=20)
            emit(part="spmm_sweep", graph=graph.name, kernel="triton", ms=round(ms, 3), rel_err=err,
                 max_edges=max_edges, **launch)


ATTENTION_SWEEP = [("per_head", e, w) for e, w in ((2, 1), (4, 1), (8, 1), (8, 2), (16, 2), (32, 4))]
ATTENTION_SWEEP += [("all", e, w) for e, w in ((2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (16, 4))]
# the split backward (all heads per program): the launch applies to the backward only; the forward rows above
# run it at its default launch (SPLIT_BACKWARD_LAUNCH)
ATTENTION_SWEEP += [("split", e, w) for e, w in ((2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (8, 4))]


SPLIT_PASS_SWEEP = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (16, 4), (16, 8)]


def part_split_sweep(graph, plan, device, families, max_edges_list=(64, 256, 1024)):
    """The split backward's two passes launched apart, fp32: per family, the whole backward timed with one pass's
    launch (``block_e`` edges per block, warps) swept and the other's at its default (rows ``src`` and ``dst``),
    and the src pass's work items at each ``max_edges`` (rows ``src_items``); each checked against the default."""

    rowptr, col, _, perm = plan[:4]
    generator = torch.Generator(device=device).manual_seed(0)
    grad = torch.randn(graph.num_nodes, HEADS, CHANNELS, device=device, generator=generator)
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    for family in families:
        score, message, roles, args = family_inputs(family, graph.num_nodes, device, generator)
        layout = attention_layout.prepare(args, roles, perm, score, message)
        needs = [True] * len(args)
        out, lse = csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256)
        delta = csr_delta.delta(grad, out)
        sources = {m: plan_source_csr.build_source_csr(rowptr, col, perm, graph.num_nodes, m) for m in max_edges_list}
        reference = csr_backward.backward(layout, grad, delta, lse, rowptr, col, perm, needs, items, 256, by_src=sources[256])
        runs = [("default", None, 256)] + [("src_items", None, m) for m in max_edges_list if m != 256]
        runs += [(p, {p: dict(block_e=e, num_warps=w)}, 256) for p in ("src", "dst") for e, w in SPLIT_PASS_SWEEP]
        for name, launch, src_max in runs:
            def bwd():
                return csr_backward.backward(layout, grad, delta, lse, rowptr, col, perm, needs, items, 256, config=launch,
                                   by_src=sources[src_max])
            try:
                errs = [_rel_err(g, r) for g, r in zip(bwd(), reference) if g is not None]
                ms = median_ms(bwd, reps=10)
                emit(part="split_sweep", graph=graph.name, family=family, kernel="csr", dtype="fp32", order=name,
                     ms=round(ms, 3), max_rel_err=max(errs), launch=(launch or {}).get(name, "default"),
                     src_max_edges=src_max)
            except Exception as exc:  # noqa: BLE001
                emit(part="split_sweep", graph=graph.name, family=family, order=name, launch=str(launch),
                     error=f"{type(exc).__name__}: {exc}"[:300])


SEGMENT_SUM_SWEEP = [(8, None, 1), (8, 4, 1), (16, 4, 1), (32, 4, 1), (64, 4, 1), (32, 4, 2), (64, 4, 2),
                     (128, 4, 4), (16, 16, 1), (32, 16, 1)]


def part_segment_sum(graph, plan, device, heads=HEADS):
    """GAT's segment backward sums an ``[E, H]`` float32 buffer (one value per edge and head, stored at each edge's
    transposed-CSR position) over each destination's CSR row, reading it through ``source_positions``: the Triton
    SpMM's launch swept for these four-wide rows (``block_e``, ``block_f``, warps; ``block_f`` None is the SpMM's
    default, 16), each checked against the default launch."""

    rowptr, col, _, perm = plan[:4]
    by_src = plan_source_csr.build_source_csr(rowptr, col, perm, graph.num_nodes, 256)
    positions = plan_source_csr.source_positions(rowptr, col, perm, by_src)
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    ones = torch.ones(col.numel(), dtype=torch.float32, device=device)
    terms = torch.randn(col.numel(), heads, device=device, generator=torch.Generator(device=device).manual_seed(0))
    reference = None
    for block_e, block_f, warps in SEGMENT_SUM_SWEEP:
        def run():
            return spmm_triton.triton_spmm(terms, ones, rowptr, positions, items, "sum", block_e=block_e,
                                           block_f=block_f, num_warps=warps)
        try:
            got = run()
            reference = got if reference is None else reference
            ms = median_ms(run, reps=20)
            emit(part="segment_sum", graph=graph.name, kernel="triton_spmm", ms=round(ms, 3),
                 max_rel_err=_rel_err(got, reference), block_e=block_e, block_f=block_f or "default",
                 num_warps=warps)
        except Exception as exc:  # noqa: BLE001
            emit(part="segment_sum", graph=graph.name, block_e=block_e, block_f=block_f, num_warps=warps,
                 error=f"{type(exc).__name__}: {exc}"[:300])


def part_attention_launch(graph, plan, device, families, max_edges_list=(256,)):
    """The CSR attention kernels' launch parameters, fp32: forward alone (rows ``per_head`` and ``all``) and the
    split backward alone (rows ``split``), per family, each against the default launch."""

    rowptr, col, _, perm = plan[:4]
    generator = torch.Generator(device=device).manual_seed(0)
    grad = torch.randn(graph.num_nodes, HEADS, CHANNELS, device=device, generator=generator)
    for family in families:
        score, message, roles, args = family_inputs(family, graph.num_nodes, device, generator)
        layout = attention_layout.prepare(args, roles, perm, score, message)
        needs = [True] * len(args)
        reference = None
        for max_edges in max_edges_list:
            items = list(torch.ops.gnn_io.work_items(rowptr, col, max_edges))
            by_src = csr_backward.source_csr(layout, rowptr, col, perm, max_edges)
            launches = [("per_head", None)] + [(v, dict(block_e=e, num_warps=w)) for v, e, w in ATTENTION_SWEEP]
            for variant, launch in launches:
                try:
                    def fwd():
                        if variant == "split":
                            return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, max_edges)
                        return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, max_edges, config=launch,
                                          variant=variant)
                    out, lse = fwd()
                    delta = csr_delta.delta(grad, out)

                    def bwd():  # by_src: the split backward, whatever GNN_IO_ATTENTION_BACKWARD says
                        return csr_backward.backward(layout, grad, delta, lse, rowptr, col, perm, needs, items, max_edges,
                                           config=launch if variant == "split" else None, by_src=by_src)
                    grads = bwd()
                    if reference is None:
                        reference = (out, grads)
                    errs = [_rel_err(out, reference[0])] + [_rel_err(g, r) for g, r in zip(grads, reference[1])
                                                           if g is not None]
                    f_ms = median_ms(fwd, reps=10)
                    b_ms = median_ms(bwd, reps=10)
                    emit(part="attn_launch", graph=graph.name, family=family, kernel="csr", dtype="fp32",
                         order=f"max_edges={max_edges}", ms=round(f_ms + b_ms, 3), fwd_ms=round(f_ms, 3),
                         bwd_ms=round(b_ms, 3), max_rel_err=max(errs), variant=variant, launch=launch or "default")
                except Exception as exc:  # noqa: BLE001
                    emit(part="attn_launch", graph=graph.name, family=family, kernel="csr",
                         order=f"max_edges={max_edges}", variant=variant, launch=launch or "default",
                         error=f"{type(exc).__name__}: {exc}"[:300])


MASS_SWEEP = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 2), (8, 4)]
MASS_MAXNREG = (40, 48, 56, 64, 80)


def part_mass_launch(graph, plan, device):
    """GAT's mass form, fp32 (kernels/attention/op.py's ``attention_forward_mass``): the forward with the mass at
    each launch of :data:`MASS_SWEEP` (``block_e`` edges per block, warps; rows ``forward_mass``) against the plain
    forward at its default (row ``forward``), the D kernel with and without the mass, and the src pass without
    the dst term's gradient (rows ``src_pass``) at each launch; each checked against the default launch."""

    rowptr, col, _, perm = plan[:4]
    generator = torch.Generator(device=device).manual_seed(0)
    grad = torch.randn(graph.num_nodes, HEADS, CHANNELS, device=device, generator=generator)
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    score, message, roles, args = family_inputs("gat", graph.num_nodes, device, generator)
    layout = attention_layout.prepare(args, roles, perm, score, message)
    by_src = csr_backward.source_csr(layout, rowptr, col, perm, 256)
    out, lse, mass = csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256, mass=True)
    row = dict(part="mass_launch", graph=graph.name, family="gat", kernel="csr", dtype="fp32")
    for with_mass in (False, True):
        def run():
            return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256, mass=with_mass)
        got = run()
        emit(**row, order="forward_mass" if with_mass else "forward", launch="default",
             ms=round(median_ms(run, reps=10), 3),
             max_rel_err=max(_rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
    for e, w in MASS_SWEEP if os.environ.get("PROBE_MASS_SWEEP") == "1" else ():
        config = dict(block_e=e, num_warps=w)
        try:
            def fwd():
                return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256, config=config, mass=True)
            got = fwd()
            emit(**row, order="forward_mass", launch=config or "default", ms=round(median_ms(fwd, reps=10), 3),
                 max_rel_err=max(_rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
        except Exception as exc:  # noqa: BLE001
            emit(**row, order="forward_mass", launch=str(config), error=f"{type(exc).__name__}: {exc}"[:300])
    for maxnreg in MASS_MAXNREG:  # a register cap: more programs resident per SM, or spills
        for with_mass in (False, True):
            config = dict(maxnreg=maxnreg)

            def capped():
                return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256, config=config, mass=with_mass)
            try:
                got = capped()
                emit(**row, order="forward_mass" if with_mass else "forward", launch=config,
                     ms=round(median_ms(capped, reps=10), 3),
                     max_rel_err=max(_rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
            except Exception as exc:  # noqa: BLE001
                emit(**row, order="forward", launch=str(config), error=f"{type(exc).__name__}: {exc}"[:300])
    for key, (compiled, _) in getattr(csr_forward.forward_all_heads_kernel, "_compiled", {}).items():
        options = dict(key[1])
        emit(**row, order="registers", launch={k: options.get(k) for k in ("MASS", "maxnreg")},
             n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None))
    emit(**row, order="delta", launch="default", ms=round(median_ms(lambda: csr_delta.delta(grad, out), reps=20), 3))
    emit(**row, order="delta_mass", launch="default",
         ms=round(median_ms(lambda: csr_delta.delta(grad, out, None, mass), reps=20), 3))
    delta = csr_delta.delta(grad, out)
    needs = [True, True, False]
    reference = csr_backward.backward(layout, grad, delta, lse, rowptr, col, perm, needs, items, 256, by_src=by_src)
    sweep = [{"src": dict(block_e=e, num_warps=w)} for e, w in MASS_SWEEP] \
        if os.environ.get("PROBE_MASS_SWEEP") == "1" else []
    for config in [None] + sweep + [{"src": dict(maxnreg=r)} for r in MASS_MAXNREG]:
        try:
            def bwd():
                return csr_backward.backward(layout, grad, delta, lse, rowptr, col, perm, needs, items, 256, config=config,
                                   by_src=by_src)
            errs = [_rel_err(g, r) for g, r in zip(bwd(), reference) if g is not None]
            emit(**row, order="src_pass", launch=(config or {}).get("src", "default"),
                 ms=round(median_ms(bwd, reps=10), 3), max_rel_err=max(errs))
        except Exception as exc:  # noqa: BLE001
            emit(**row, order="src_pass", launch=str(config), error=f"{type(exc).__name__}: {exc}"[:300])
    for key, (compiled, _) in getattr(csr_split_backward.split_backward_kernel, "_compiled", {}).items():
        options = dict(key[1])
        emit(**row, order="registers", launch={"kernel": "split backward", "maxnreg": options.get("maxnreg")},
             n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None))


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
