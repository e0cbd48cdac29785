"""The probe's launch sweeps (``benchmarks/probe.py --parts``): the launch parameters of the block-sparse attention
kernels (``block_launch``), of the Triton SpMM (``spmm_sweep``), of the CSR attention kernels' passes
(``attn_launch``, ``split_sweep``), of the segment sums (``segment_sum``) and of the mass backward
(``mass_launch``), each timed and checked against the current launch. GPU only, as the probe is.
"""
from __future__ import annotations

import os

import torch

from benchmarks.harness import median_ms
from benchmarks.probe_common import CHANNELS, FEATURES, HEADS, emit, family_inputs, rel_err, reset_decisions
from gnn_inductor.kernels.attention import block_dot as block_sparse
from gnn_inductor.kernels.attention import csr_backward, csr_delta, csr_forward, csr_split_backward
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.kernels.spmm import csr_triton as spmm_triton
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import work_items as work_items_module


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
                    errs = [rel_err(a, b) for a, b in zip(step(), reference)]
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
                errs = [rel_err(g, r) for g, r in zip(bwd(), reference) if g is not None]
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
                 max_rel_err=rel_err(got, reference), block_e=block_e, block_f=block_f or "default",
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
                    errs = [rel_err(out, reference[0])] + [rel_err(g, r) for g, r in zip(grads, reference[1])
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
             max_rel_err=max(rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
    for e, w in MASS_SWEEP if os.environ.get("PROBE_MASS_SWEEP") == "1" else ():
        config = dict(block_e=e, num_warps=w)
        try:
            def fwd():
                return csr_forward.forward(layout, rowptr, col, perm, 1e-16, items, 256, config=config, mass=True)
            got = fwd()
            emit(**row, order="forward_mass", launch=config or "default", ms=round(median_ms(fwd, reps=10), 3),
                 max_rel_err=max(rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
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
                     max_rel_err=max(rel_err(g, r) for g, r in zip(got, (out, lse, mass))))
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
            errs = [rel_err(g, r) for g, r in zip(bwd(), reference) if g is not None]
            emit(**row, order="src_pass", launch=(config or {}).get("src", "default"),
                 ms=round(median_ms(bwd, reps=10), 3), max_rel_err=max(errs))
        except Exception as exc:  # noqa: BLE001
            emit(**row, order="src_pass", launch=str(config), error=f"{type(exc).__name__}: {exc}"[:300])
    for key, (compiled, _) in getattr(csr_split_backward.split_backward_kernel, "_compiled", {}).items():
        options = dict(key[1])
        emit(**row, order="registers", launch={"kernel": "split backward", "maxnreg": options.get("maxnreg")},
             n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None))

