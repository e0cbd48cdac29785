"""Benchmark harness: PyG eager, torch.compile default (Inductor) and gnn_io, side by side in one
process, forward and forward+backward, peak memory, plan build time and a roofline column.

    python -m benchmarks.harness --layers gcn,sage_mean,gin --graphs suite --out docs/benchmarks

Times are medians of ``--reps`` runs timed with CUDA events after warm-up, on random (never zero)
inputs, each forward+backward starting with every gradient set to None (as ``optimizer.zero_grad()``
leaves them); peak memory is ``torch.cuda.max_memory_allocated`` over one forward+backward step (inputs,
parameters and gradients included); "step GB" is that peak less what was allocated before the step (inputs,
weights, ``edge_index``, the output cotangent, cached plans), i.e. what the step itself adds. In the CUDA-graph
modes a replayed step allocates nothing (its memory is the graphs' pool, allocated when they are recorded), so their
peak is taken over every training step from the first (warm-up, recording, replays) above what was allocated before
it (the no-grad forward's graph already among that). Outputs kept
for comparison (the mode's own no-grad output, eager's as the reference) are held on the host, so they count
in no mode's peak, and the input that requires grad shares the no-grad input's storage (no second copy of the
input in any peak). The roofline column is the least bytes a layer must move
(see ``min_bytes``) over the copy bandwidth measured in the same run. Writes ``results.json``, the results page
``results.md``, ``speedup.png`` and ``memory.png`` to ``--out`` (benchmarks/results_page.py): the JSON and the
page after every case, so a run cut off by a time limit keeps what it measured, the charts at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch

import gnn_inductor  # registers the backend; also enables Dynamo's dynamic-output-shape capture for Inductor
from gnn_inductor.plan import state as graph_state
from gnn_inductor.testing import plain_torch_compile
from benchmarks.graphs import SUITE, graph_suite  # noqa: F401  (the harness's graphs; other scripts import them here)
from benchmarks.layers import LAYERS, DenseFloor, is_random, layer_and_depth, make_layer, with_graph
from benchmarks.results_page import merge, write_outputs
from benchmarks.run_info import run_metadata

def min_bytes(layer: str, num_nodes: int, num_edges: int, features: int, elem: int) -> tuple:
    """Least bytes moved by (forward, forward+backward): the dense transform reads X and writes H,
    the aggregation reads H once, the CSR (int64 col + values + rowptr) once, and writes Y; the
    backward moves the same again twice (dH and dX / dW). Attention adds 2 more node tensors. A model of
    ``DEPTH`` layers (``NAME:DEPTH``) moves ``DEPTH`` times a layer's bytes."""
    layer, depth = layer_and_depth(layer)
    dense = num_nodes * features * elem
    node_tensors = 4 + (2 if layer.removesuffix("_drop") in ("gat", "gatv2", "transformer") else 0)
    structure = num_edges * (8 + 4) + num_nodes * 8
    forward = node_tensors * dense + structure
    if layer == "pna":  # its messages are an edge GEMM's output: written once, read once by the shared pass
        forward += 2 * num_edges * features * elem
    return depth * forward, depth * 3 * forward


def _added_gb(fn) -> float:
    """GiB a no-grad call of ``fn`` allocates at its peak above what was allocated before it."""
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - resident) / 2**30


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return float("nan")
    src = torch.randn(256 * 1024 * 1024, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=20)
    return 2 * src.numel() * 4 / (ms / 1e3)


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    gc.collect()  # no collector pause inside the timed steps (as timeit does)
    gc.disable()
    try:
        return _median_ms(fn, reps)
    finally:
        gc.enable()


def _median_ms(fn, reps: int) -> float:
    if not torch.cuda.is_available():
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


_MODE_BACKENDS: dict = {}


def _mode_backend(mode: str):
    """``gnn_io`` itself, or for another gnn_io mode its own callable around it: Dynamo keeps compiled code per
    backend, so two modes compiled in one process (``benchmarks/ab.py``) never share a compile made under the
    other's environment (instances of one module class otherwise pass each other's guards)."""
    if mode == "gnn_io":
        return "gnn_io"
    if mode not in _MODE_BACKENDS:
        _MODE_BACKENDS[mode] = functools.partial(torch._dynamo.lookup_backend("gnn_io"))
    return _MODE_BACKENDS[mode]


def build(mode: str, layer: torch.nn.Module):
    torch._dynamo.reset()
    if mode == "eager":
        return layer
    if mode == "inductor":
        return torch.compile(layer)
    if mode == "inductor_cg":
        return torch.compile(layer, mode="reduce-overhead")
    if mode.startswith("gnn_io"):
        return torch.compile(layer, backend=_mode_backend(mode))
    if mode in ("compile_fx", "inner_compile"):
        # diagnostics: Inductor called from a custom backend callable, as gnn_io calls it for a graph it leaves
        # whole (plainly, or through the backend's own options: gnn_inductor.backend.inductor_compile)
        from torch._inductor.compile_fx import compile_fx

        from gnn_inductor import backend

        return torch.compile(layer, backend=compile_fx if mode == "compile_fx" else
                             (lambda gm, example_inputs: backend.inductor_compile(gm, list(example_inputs))))
    raise ValueError(mode)


# gnn_io variants: the SpMM binding each one compiles with (docs/spmm_binding.md)
MODE_ENV = {"gnn_io": {}, "gnn_io_triton": {"GNN_IO_SPMM": "triton"}, "gnn_io_cusparse": {"GNN_IO_SPMM": "cusparse"},
            "gnn_io_torch_sparse": {"GNN_IO_SPMM": "torch_sparse"},
            "gnn_io_all_heads": {"GNN_IO_ATTENTION_HEADS": "all"},
            "gnn_io_bwd_atomic": {"GNN_IO_ATTENTION_BACKWARD": "atomic"},
            "gnn_io_one_pass_segment": {"GNN_IO_ATTENTION_BACKWARD": "one_pass_segment"},
            "gnn_io_split": {"GNN_IO_ATTENTION_BACKWARD": "split"},
            "gnn_io_src_maxnreg56": {"GNN_IO_SRC_MAXNREG": "56"}, "gnn_io_src_uncapped": {"GNN_IO_SRC_MAXNREG": "0"},
            "gnn_io_no_gather_linear": {"GNN_IO_GATHER_LINEAR": "0"},
            "gnn_io_no_bias_fold": {"GNN_IO_ATTENTION_BIAS": "0"}, "gnn_io_fuse_all": {"GNN_IO_FUSE_LINEARS": "all"},
            "gnn_io_csr": {"GNN_IO_ATTENTION_PATH": "csr"}, "gnn_io_block": {"GNN_IO_ATTENTION_PATH": "block"},
            "gnn_io_hybrid": {"GNN_IO_ATTENTION_PATH": "hybrid"},
            "gnn_io_csr_one_chunk": {"GNN_IO_ATTENTION_PATH": "csr", "GNN_IO_GRAD_CHUNK_KB": "0"},
            "gnn_io_csr_no_projected": {"GNN_IO_ATTENTION_PATH": "csr", "GNN_IO_PROJECTED_GRADS": "0"},
            "gnn_io_reorder_off": {"GNN_IO_REORDER": "off"},
            "gnn_io_spmm_cusparse": {"GNN_IO_SPMM_PATH": "cusparse"}, "gnn_io_spmm_block": {"GNN_IO_SPMM_PATH": "block"},
            "gnn_io_split_rule": {"GNN_IO_GS_SPLIT": "rule"},
            "gnn_io_nofuse": {"GNN_IO_FUSE_LINEARS": "0"}, "gnn_io_no_gemm_acc": {"GNN_IO_GEMM_ACCUMULATE": "0"},
            "gnn_io_dispatch": {"GNN_IO_DIRECT_OPS": "0"}, "gnn_io_force_dispatch": {"GNN_IO_DIRECT_OPS": "0", "GNN_IO_FORCE": "1"},
            "gnn_io_force": {"GNN_IO_FORCE": "1"},
            "gnn_io_jit_launch": {"GNN_IO_FAST_LAUNCH": "0"}, "gnn_io_churn_off": {"GNN_IO_CHURN": "off"},
            "gnn_io_tiles3": {"GNN_IO_INDUCTOR_MAX_TILES": "3"},
            "gnn_io_one_launch": {"GNN_IO_GS_LIGHT_LAUNCH": "off"}, "gnn_io_light_both": {"GNN_IO_GS_LIGHT_LAUNCH": "both"},
            "gnn_io_light_forward": {"GNN_IO_GS_LIGHT_LAUNCH": "forward"}, "gnn_io_light_rows": {"GNN_IO_GS_LIGHT_ROWS": "1"},
            "gnn_io_light_items": {"GNN_IO_GS_LIGHT_ROWS": "0"},
            "gnn_io_cg_light_rows": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_GS_LIGHT_ROWS": "1"},
            "gnn_io_cg_light_both": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_GS_LIGHT_LAUNCH": "both"},
            "gnn_io_cg_one_launch": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_GS_LIGHT_LAUNCH": "off"},
            "gnn_io_cg": {"GNN_IO_CUDAGRAPHS": "1"}, "gnn_io_cg_triton": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_SPMM": "triton"},
            "gnn_io_cg_tall33": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_FP32_TALL_LOG2": "33"}, "gnn_io_no_packed": {"GNN_IO_PACKED_GRADS": "0"},
            "gnn_io_no_projected": {"GNN_IO_PROJECTED_GRADS": "0"}, "gnn_io_cublas": {"GNN_IO_FP32_GEMM": "cublas"},
            "gnn_io_chunk64": {"GNN_IO_GRAD_CHUNK_KB": "65536"}, "gnn_io_one_stream": {"GNN_IO_GRAD_CHUNK_STREAMS": "0"},
            "gnn_io_pass_streams": {"GNN_IO_GRAD_CHUNK_STREAMS": "1"}, "gnn_io_chunk256": {"GNN_IO_GRAD_CHUNK_KB": "262144"},
            "gnn_io_cg_force": {"GNN_IO_CUDAGRAPHS": "1", "GNN_IO_FORCE": "1"},
            "gnn_io_no_score_epilogue": {"GNN_IO_SCORE_FOLD": "0"},
            "gnn_io_fuse_pairs": {"GNN_IO_FUSE_MIN_GROUP": "2"}, "gnn_io_no_pairs": {"GNN_IO_FUSE_MIN_GROUP": "3"},
            "gnn_io_plan_version": {"GNN_IO_PLAN_CHECK": "version"},
            "gnn_io_plan_fingerprint": {"GNN_IO_PLAN_CHECK": "fingerprint"}}


@contextlib.contextmanager
def mode_env(mode: str):
    """The mode's environment (:data:`MODE_ENV`) set inside the block, the previous values restored after."""
    saved = {k: os.environ.get(k) for k in MODE_ENV.get(mode, {})}
    os.environ.update(MODE_ENV.get(mode, {}))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_case(layer_name, graph, mode, features, dtype, device, reps, reference=None) -> dict:
    # Importing gnn_inductor turns Dynamo's capture of data-dependent output shapes on for the process (the
    # backend needs PyG's self-loop masks in one graph); torch.compile's own modes run with Dynamo's default, as
    # they do in a process that never imports the backend.
    plain = mode in ("inductor", "inductor_cg")
    dynamo = plain_torch_compile() if plain else contextlib.nullcontext()
    with mode_env(mode), dynamo:
        return _run_case(layer_name, graph, mode, features, dtype, device, reps, reference)


def _new_graph_costs(record, model, x, x_grad, edge_index, device, mode, reps) -> None:
    """``plan_build_ms`` (a forward on a new copy of the graph, less a forward on the graph with its plan),
    ``fwd_gb`` and ``new_graph_fwd_gb`` (what a no-grad forward adds, on a graph with its plan and on a new one: the
    plan's build and the plan itself on top). The copies of ``edge_index`` and a second plan live beside the first
    one: on a graph near the device's memory they may not fit, which is recorded as ``new_graph_error`` and leaves
    the step's figures standing."""
    try:
        fresh = edge_index.clone()  # same graph, new tensor: plan cache miss
        record["plan_build_ms"] = max(0.0, median_ms(lambda: model(x_grad, fresh.clone()), 3, warmup=0)
                                      - record["fwd_ms"]) if reps else None
        if device.type == "cuda" and "cg" not in mode:
            record["fwd_gb"], record["new_graph_fwd_gb"] = (_added_gb(lambda: model(x, g)) for g in
                                                            (edge_index, fresh.clone()))
    except torch.OutOfMemoryError as exc:
        record["new_graph_error"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:160]}"


def _csr_build_costs(record, edge_index, num_nodes, device) -> None:
    """``csr_build_ms`` and ``csr_build_gb``: the backend's CSR build of the graph (``gnn_io::csr_plan``, both
    directions, in the index type the kernels read) timed to the end of its device work, and the GiB it allocates
    at its peak above what was allocated before it (its outputs included); ``csr_gb``: its outputs alone. Run
    before the model exists, so that on a graph near the device's memory it has the room the first call has."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        parts = torch.ops.gnn_io.csr_plan(edge_index[1], edge_index[0], num_nodes, num_nodes)
        torch.cuda.synchronize()
        record["csr_build_ms"] = (time.perf_counter() - start) * 1e3
        record["csr_build_gb"] = (torch.cuda.max_memory_allocated() - resident) / 2**30
        record["csr_gb"] = sum(p.numel() * p.element_size() for p in parts) / 2**30
        del parts
    except torch.OutOfMemoryError as exc:
        record["csr_build_error"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:160]}"
    torch.cuda.empty_cache()


def _run_case(layer_name, graph, mode, features, dtype, device, reps, reference=None) -> dict:
    if mode == "turbo_gnn":
        from benchmarks import peers

        missing = peers.missing(layer_name, device)
        if missing:  # a row of the table, not the end of the run
            return {"layer": layer_name, "graph": graph.name, "mode": mode, "nodes": graph.num_nodes,
                    "edges": graph.num_edges, "error": missing}
    torch.manual_seed(0)
    x = torch.randn(graph.num_nodes, features, device=device, dtype=dtype)
    edge_index = graph.edge_index.to(device)
    if mode == "turbo_gnn":
        layer = peers.TurboLayer(layer_name, features, edge_index, graph.num_nodes).to(device=device, dtype=dtype)
        model, reference = layer, None  # different normalisation on directed graphs: no rel_err
    elif mode == "dense_floor":
        layer = DenseFloor(make_layer(layer_name, features)).to(device=device, dtype=dtype)
        model, reference = layer, None  # not the layer's function
    else:
        layer = with_graph(make_layer(layer_name, features).to(device=device, dtype=dtype), edge_index)
        model = build(mode, layer)
    record = {"layer": layer_name, "graph": graph.name, "mode": mode, "nodes": graph.num_nodes,
              "edges": graph.num_edges}
    if mode == "gnn_io":
        _csr_build_costs(record, edge_index, graph.num_nodes, device)
    try:
        def forward():
            if "cg" in mode:
                torch.compiler.cudagraph_mark_step_begin()  # CUDA-graph modes overwrite their outputs on replay
            return model(x, edge_index)

        if device.type == "cuda":
            # the first call's memory above the inputs: the compile's, the plan's build and the plan itself (for
            # gnn_io) and the forward's; measured where a second graph's plan (``new_graph_fwd_gb``) may not fit
            record["first_fwd_gb"] = _added_gb(lambda: forward().clone())
        with torch.no_grad():
            out = forward().clone()
            record["fwd_ms"] = median_ms(forward, reps)
        if mode.startswith("gnn_io"):  # the host time of each plan build so far (the first on this graph)
            record["plan_builds_ms"] = [round(ms, 1) for r in gnn_inductor.rewrite_report.reports(layer)
                                        for ms in r.plan_build_ms]
        x_grad = x.detach().requires_grad_(True)  # the same storage: no second copy of the input in the peak
        grad = torch.randn_like(out)
        # the no-grad output goes to the host: left on the device it would count in this mode's peak, and as a
        # reference (eager's) in every later mode's
        out = out.cpu()

        params = list(layer.parameters())

        def step():
            # A training step starts from no gradients, as after optimizer.zero_grad() (set_to_none=True, the
            # default): backward then stores each gradient instead of adding it to the previous step's.
            x_grad.grad = None
            for p in params:
                p.grad = None
            if "cg" in mode:
                torch.compiler.cudagraph_mark_step_begin()  # a new training step: earlier outputs are dead
            model(x_grad, edge_index).backward(grad)

        def peak_of(fn):
            """``fn()``, with the peak allocated while it ran (``peak_gb``) and that peak less what was allocated
            before it (``step_gb``: inputs, weights, edge_index, output cotangent, plans) in the record."""
            torch.cuda.synchronize()
            resident = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            result = fn()
            torch.cuda.synchronize()
            record["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            record["step_gb"] = (torch.cuda.max_memory_allocated() - resident) / 2**30
            return result

        if device.type == "cuda" and "cg" in mode:  # the graphs' pool, allocated at their recording among these steps
            record["fwdbwd_ms"] = peak_of(lambda: median_ms(step, reps))
        else:
            record["fwdbwd_ms"] = median_ms(step, reps)
            if device.type == "cuda":
                x_grad.grad = None  # the timed steps' gradients out of what the step starts from
                for p in params:
                    p.grad = None
                peak_of(step)
        if mode.startswith("gnn_io"):
            _new_graph_costs(record, model, x, x_grad, edge_index, device, mode, reps)
        if reference is not None:
            ref = reference.float().cpu()
            record["rel_err"] = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
        record["out"] = out.detach()
        picks = [f"{d['family']}:{d['path']}" + (f"[{d['order']}]" if d["order"] != "none" else "")
                 for d in graph_state.decisions()]
        if picks:
            record["paths"] = ",".join(sorted(set(picks)))
            record["path_decisions"] = [{k: d[k] for k in ("family", "path", "order", "reason", "predicted_ms",
                                                           "order_build_ms", "measured_forward_ms")}
                                        for d in graph_state.decisions()]
    except Exception as exc:  # a crash or OOM of one mode is a result, not the end of the run
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        traceback.print_exc(limit=2)
    finally:
        model = layer = None  # freed before the next mode
        torch._dynamo.reset()
        graph_state.clear()  # block formats held for plans of this mode must not count in the next one's peak
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="gcn,sage_mean,gin", help="comma list of make_layer's names, or 'all'")
    parser.add_argument("--graphs", default="suite", help="comma list, or 'suite'")
    parser.add_argument("--modes", default="eager,inductor,gnn_io",
                        help="eager (PyG), inductor (torch.compile default), gnn_io; also turbo_gnn (turbo-gnn's "
                             "SpMM, gcn/sage_mean/gin, when installed: benchmarks/peers.py), dense_floor (the "
                             "layer's GEMMs alone, DenseFloor), inductor_cg (reduce-overhead) and the gnn_io "
                             "variants of MODE_ENV (gnn_io_csr, gnn_io_block, gnn_io_cg, ...)")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 for float32 matmuls (all modes)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", default=os.environ.get("GNN_IO_DATA", os.path.join("..", "shared", "data")))
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks"))
    parser.add_argument("--merge", nargs="+", help="results.json files of earlier runs to merge into --out")
    parser.add_argument("--reference-eager", action="store_true",
                        help="run PyG eager first, unrecorded, as the reference of rel_err when 'eager' is not among "
                             "--modes (the rerun of an --isolate case after a crash)")
    parser.add_argument("--isolate", action="store_true",
                        help="run each (graph, layer) in its own process: a CUDA error that poisons the context "
                             "(a kernel fault) then costs that case only, and is recorded as its result")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.layers == "all":
        args.layers = ",".join(LAYERS)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    names = SUITE if args.graphs == "suite" else args.graphs.split(",")
    bandwidth = copy_bandwidth(device)
    meta = run_metadata("benchmarks.harness", device, argv) | {
        "dtype": args.dtype + (" (TF32 allowed)" if args.tf32 else ""), "features": args.features,
        "copy_gbps": bandwidth / 1e9}
    records = []
    def keep(records_so_far):  # after every case: a run cut off by a time limit keeps what it measured
        write_outputs(records_so_far, meta, args.out, with_chart=False)

    if args.isolate:
        records = _isolated_records(args, names, keep)
        table = write_outputs(records, meta, args.out)
        print(table)
        return 0
    for graph in graph_suite(names, args.data_root, device):
        graph.edge_index = graph.edge_index.cpu()
        for layer in args.layers.split(","):
            reference = None
            exact = None if is_random(layer) else float32_reference(layer, graph, args.features, dtype, device)
            exact = None if exact is None else exact.cpu()  # off the device: not in any mode's peak
            if args.reference_eager and "eager" not in args.modes.split(",") and not is_random(layer):
                reference = run_case(layer, graph, "eager", args.features, dtype, device, 1).get("out")
            for mode in args.modes.split(","):
                r = run_case(layer, graph, mode, args.features, dtype, device, args.reps, reference)
                if mode == "eager" and "out" in r and not is_random(layer):
                    reference = r["out"]
                if exact is not None and "out" in r:
                    r["err_vs_fp32"] = float((r["out"].float() - exact).norm() / exact.norm().clamp_min(1e-30))
                fwd, total = min_bytes(layer, graph.num_nodes, graph.num_edges, args.features,
                                       torch.finfo(dtype).bits // 8)
                r["roofline_ms"] = total / bandwidth * 1e3 if bandwidth == bandwidth else None
                r.pop("out", None)
                records.append(r)
                print(json.dumps({k: v for k, v in r.items()}), flush=True)
                keep(records)
            reference = None
    table = write_outputs(records, meta, args.out)
    print(table)
    return 0


def float32_reference(layer_name: str, graph, features: int, dtype, device):
    """For half-precision runs: the eager layer's output in float32 from the same half-precision inputs and
    weights as every mode's (same seed as :func:`_run_case`), for each mode's ``err_vs_fp32`` (the accuracy
    bound: gnn_io's bf16 error against PyG eager's own). None for float32 runs."""
    if dtype not in (torch.float16, torch.bfloat16):
        return None
    torch.manual_seed(0)
    x = torch.randn(graph.num_nodes, features, device=device, dtype=dtype)
    layer = with_graph(make_layer(layer_name, features).to(device=device, dtype=dtype), graph.edge_index.to(device))
    layer = layer.float()
    with torch.no_grad():
        out = layer(x.float(), graph.edge_index.to(device)).float()
    del layer
    return out


def _isolated_records(args, names: list, keep=lambda records: None) -> list:
    """Records of every (graph, layer) case, each run by a child harness process. The child prints one
    JSON line per finished mode, so a child that dies mid-case still gives the modes it finished. The modes
    it did not finish run again in a fresh child (with PyG eager run first, unrecorded, as their ``rel_err``
    reference): a CUDA error in one mode (``torch.compile`` default's "misaligned address" on GATConv in bf16)
    leaves the process's CUDA context unusable, and every later mode of that child would die with it (every
    gnn_io mode after it, on each graph where it happens). A mode that kills a fresh child as its first mode gets an ``error``
    record with the exit status and the last line of the child's stderr. ``keep`` gets the records so far
    after each case."""
    records = []
    modes = args.modes.split(",")
    for name in names:
        for layer in args.layers.split(","):
            pending, finished, blamed, template = list(modes), [], {}, {"layer": layer, "graph": name}
            while pending:
                with tempfile.TemporaryDirectory() as out:
                    command = [sys.executable, "-m", "benchmarks.harness", "--graphs", name, "--layers", layer,
                               "--modes", ",".join(pending), "--features", str(args.features), "--dtype",
                               args.dtype, "--reps", str(args.reps), "--device", args.device, "--data-root",
                               args.data_root, "--out", out] + (["--tf32"] if args.tf32 else []) \
                        + (["--reference-eager"] if "eager" in modes and "eager" not in pending else [])
                    child = subprocess.run(command, capture_output=True, text=True, check=False)
                done = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
                finished.extend(done)
                template = dict(done[0]) if done else template
                first = pending[0]
                pending = [m for m in pending if m not in {r["mode"] for r in done}]
                if not pending:
                    break
                stderr = [line for line in child.stderr.splitlines() if line.strip()]
                reason = f"process died (exit {child.returncode}): {stderr[-1][:160] if stderr else 'no stderr'}"
                # the mode it died in is the first unfinished one: its own crash when it was the child's first
                # mode (or the child exited cleanly without it), else it runs again in a fresh child
                for mode in pending if child.returncode == 0 else pending[:1] if pending[0] == first else []:
                    blamed[mode] = reason
                pending = [m for m in pending if m not in blamed]
            # error records named after the graph as the finished modes resolved it (one table row per case)
            records.extend(finished)
            records.extend({"layer": template["layer"], "graph": template["graph"], "mode": mode,
                            "nodes": template.get("nodes"), "edges": template.get("edges"), "error": reason}
                           for mode, reason in blamed.items())
            print(f"{name} {layer}: {len(finished)}/{len(modes)} modes finished", flush=True)
            keep(records)
    return records


if __name__ == "__main__":
    sys.exit(main())
