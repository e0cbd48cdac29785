"""The ``gnn_io`` torch.compile backend: capture, canonicalise, match, rewrite, hoist, compile.

``torch.compile(model, backend="gnn_io")`` finds this function through the
``torch_dynamo_backends`` entry point, so nothing needs importing first. Importing this module
turns on Dynamo's capture of dynamic-output-shape ops (``nonzero``, boolean masks), so that PyG
layers that add self loops (GCNConv, GATConv) are captured as one graph per layer instead of
being split at ``nonzero``; the data-dependent sizes then live in the graph plan.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from gnn_inductor import config
from gnn_inductor import kernels  # noqa: F401  (registers torch.ops.gnn_io.*)
from gnn_inductor.passes import dense_gemm, gather_linear, gemm_accumulate, linear_fusion, packed_grads, score_fold
from gnn_inductor.passes import direct_ops, inductor_fixes
from gnn_inductor import rewrite_report as _report
from gnn_inductor.canonical import canonicalize, fake_mode_of
from gnn_inductor.frontends import dgl as _dgl_frontend
from gnn_inductor.plan.cache import (
    PlanCache,
    hoist_structure,
    insert_index_checks,
    plan_stats_hook,
    reuse_contract,
    select_by_structure_masks,
)
from gnn_inductor.passes.patterns import RewriteContext, run_patterns
from gnn_inductor.patterns import attention as attention_pattern
from gnn_inductor.config import SettingError

inductor_fixes.apply()

torch._dynamo.config.capture_dynamic_output_shape_ops = True
_dgl_frontend.install()  # a traceable path through DGL when it is imported (docs/dgl.md)


def _inner_compile(gm, example_inputs, graph_report=None, static_inputs=None, inductor_tiles=False):
    from torch._inductor.compile_fx import compile_fx

    # The FX graph cache cannot pickle graphs holding Python custom ops' metadata; skip it quietly.
    # GNN_IO_CUDAGRAPHS=1: Inductor's CUDA graph trees (what mode="reduce-overhead" turns on for the
    # default backend), which replay the whole step with one launch: for small graphs, where the
    # per-call CPU work is larger than the GPU work.
    # Inductor's 3-D tiled reductions (``triton.max_tiles`` defaults to 3 when its coalescing analysis is on,
    # documented there as "experimental and may have bugs") faulted with "CUDA driver error: misaligned address"
    # on the H100 in GATConv's backward (the attention-vector gradient, a y/x/r0-tiled reduction over 2708
    # Cora nodes, float32). The rewritten graphs keep 2 tiles; GNN_IO_INDUCTOR_MAX_TILES overrides.
    # ``inductor_tiles``: a graph left to Inductor whole (:func:`_plain_compile`) keeps Inductor's own setting, so
    # it is exactly what torch.compile's default runs (MUSAE-github GATConv on the H100: 2% slower with 2 tiles).
    options = {"fx_graph_cache": False}
    if not inductor_tiles or config.is_set("inductor_max_tiles"):
        options["triton.max_tiles"] = _max_tiles()
    if config.get("inductor_max_autotune"):  # mode="max-autotune" (config.MODES)
        options.update({"max_autotune": True, "coordinate_descent_tuning": True})
    if _cuda_graphs():
        # Graphs with symbolic-shape inputs stay off CUDA graphs: on the H100, GCNConv and GATConv (whose self
        # loops give the plan a data-dependent size) failed after a no_grad forward with "accessing tensor
        # output of CUDAGraphs that has been overwritten"; :func:`_rewrite_and_compile` reports it.
        # A graph of fixed sizes turns that check off: in torch 2.11 Inductor's graph partition counts a kernel's
        # own loop indices as dynamic sizes (pytorch/pytorch#197139), so with it on, TransformerConv's fused
        # weight concatenation, its GEMM, the output add and the bias gradients ran outside the CUDA graphs
        # (seen on the H100, RMAT 2^17).
        options["triton.cudagraphs"] = True
        options["triton.cudagraph_skip_dynamic_graphs"] = _has_symbolic_sizes(example_inputs)
    if static_inputs is None:
        static_inputs = _parameter_positions(example_inputs)
    inner = functools.partial(_guarded_inner_compile, graph_report=graph_report, static_inputs=tuple(static_inputs),
                              num_inputs=len(example_inputs), settings=_SETTINGS.get())
    # config_patches, not a ``with inductor_config.patch(...)`` around the call: AOTAutograd compiles the backward
    # lazily, at the first backward, after such a block has exited; compile_fx also patches ``inner_compile`` so
    # the backward gets these options. Without them the backward would get no CUDA graphs under
    # GNN_IO_CUDAGRAPHS=1 (its kernels would launch one by one) and Inductor's default tiles.
    return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=options)


def _has_symbolic_sizes(example_inputs) -> bool:
    """Whether a graph's inputs carry a symbolic size: a SymInt input, or a tensor with a symbolic dimension."""
    return any(isinstance(e, torch.SymInt)
               or isinstance(e, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in e.shape)
               for e in example_inputs)


def _max_tiles() -> int:
    return config.get("inductor_max_tiles")


def _parameter_positions(example_inputs) -> list:
    return [i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)]


def _with_static_inputs(kwargs: dict, example_inputs, static_inputs, num_inputs) -> dict:
    """Under CUDA graphs, mark the forward's parameters and graph-plan tensors as static inputs.

    Inductor takes the static inputs of a Dynamo graph from Dynamo's metadata, which the rewritten graph
    no longer carries, and the plan tensors are the backend's own inputs: unmarked, CUDA graph trees
    would copy every parameter and the whole CSR into the graph's pool at each replay, and per-plan
    caches would hold those copies. Marked, a replay reads them in place and a new plan (or a moved
    parameter) re-records. The forward's inputs are the graph's inputs in order (the count is checked;
    when AOTAutograd changed them, nothing is marked and Inductor's default applies); the backward's
    saved tensors are static already."""
    if kwargs.get("is_backward") or not static_inputs or len(example_inputs) != num_inputs:
        return kwargs
    marked = set(kwargs.get("static_input_idxs") or ()) | set(static_inputs)
    return {**kwargs, "static_input_idxs": sorted(marked)}


def _guarded_inner_compile(gm, example_inputs, graph_report=None, static_inputs=(), num_inputs=-1, settings=None,
                           **kwargs):
    """Inductor's own per-graph compile (forward, and the backward when it is first needed), except
    that a crash of Inductor or Triton while compiling (bf16 GATConv's backward crashes a compile
    worker in Triton's LLVM lowering, on torch.compile's default backend too) leaves that graph to
    run op by op (aten ops and the gnn_io kernels), with a near miss in the report, instead of failing
    the user's step. ``GNN_IO_STRICT=1`` re-raises. ``settings``: the ``torch.compile`` options of the graph
    (:func:`gnn_io`), in force while it compiles and at each call of what it returns: AOTAutograd compiles and
    calls the backward outside the forward's call."""
    from torch._inductor import compile_fx as inductor

    if settings:
        with _settings_in_force(settings):
            compiled = _guarded_inner_compile(gm, example_inputs, graph_report, static_inputs, num_inputs, **kwargs)
        return _UnderSettings(compiled, settings)

    pristine = copy.deepcopy(gm)  # Inductor's passes rewrite gm in place before they can fail
    progress = _PassProgress()
    try:
        _split_graph_passes(gm, graph_report, "backward" if kwargs.get("is_backward") else "forward", progress)
    except Exception as exc:  # noqa: BLE001  (a pass's failure must not become the user's crash)
        if _strict():
            raise
        gm = copy.deepcopy(pristine)
        if graph_report is not None:
            graph_report.near_misses.append(_report.NearMiss(
                "backend", f"the pass {progress.current} raised {type(exc).__name__}: {_first_line(exc)[:160]}; "
                f"this graph compiles without the passes after the forward/backward split",
                {"source": "<graph>", "layer": None, "frames": []}))
    if _cuda_graphs():
        kwargs = _with_static_inputs(kwargs, example_inputs, static_inputs, num_inputs)
    _compile_in_workers(example_inputs)
    try:
        partitions_before = counters["inductor"]["cudagraph_partitions"]
        compiled = inductor.compile_fx_inner(gm, example_inputs, **kwargs)
        if graph_report is not None and _cuda_graphs():
            graph_report.cuda_graphs["backward" if kwargs.get("is_backward") else "forward"] = \
                _cuda_graph_state(compiled, counters["inductor"]["cudagraph_partitions"] - partitions_before)
        return compiled
    except Exception as exc:  # noqa: BLE001  (a compiler crash must not become the user's crash)
        if "subprocess" in str(exc):
            _reset_compile_workers()
        if _strict():
            raise
        reason = (f"Inductor failed to compile this graph ({type(exc).__name__}: "
                  f"{_first_line(exc)[:160]}){OP_BY_OP}")
        if graph_report is not None:
            graph_report.near_misses.append(_report.NearMiss("inductor", reason,
                                                             {"source": "<graph>", "layer": None, "frames": []}))
        return _OpByOp(pristine)


def _split_graph_passes(gm, graph_report, side: str, progress) -> None:
    """The passes on a forward or backward graph after AOTAutograd split them, in ``gm``, in order."""
    progress("direct_ops")
    direct_ops.retarget(gm)  # the gnn_io ops without custom_op's per-call Python (gnn_inductor/direct_ops.py)
    if graph_report is None or not graph_report.rewrites:
        return
    if packed_grads.enabled():
        # attention gradients into the fused linear map's packed gradient (gnn_inductor/packed_grads.py)
        progress("packed_grads")
        graph_report.packed_grads += packed_grads.pack(gm)
        if packed_grads.projection_enabled():
            # ... and its GEMMs run on it one block of rows at a time (gnn_inductor/packed_grads.py)
            progress("projected_grads")
            graph_report.projected_grads += packed_grads.project_all(gm)
    if gemm_accumulate.enabled():
        # GEMM + fresh tensor summed in the fresh tensor's memory (gnn_inductor/gemm_accumulate.py)
        progress("gemm_accumulate")
        graph_report.gemm_accumulates[side] = gemm_accumulate.fold(gm)
    # large float32 GEMMs by the 3xTF32 split on Tensor Cores (gnn_inductor/dense_gemm.py)
    progress("dense_gemm")
    graph_report.dense_gemms[side] = dense_gemm.rewrite(gm)


OP_BY_OP = "; it runs op by op instead"


def _cuda_graph_state(compiled, partitions: int) -> str:
    """What Inductor made of one compiled graph under ``GNN_IO_CUDAGRAPHS=1``, from its compiled artifact: recorded
    whole, recorded in part (Inductor's graph partition leaves some kernels to launch from the CPU between the
    recorded parts; ``partitions`` is how many parts its scheduler made, 0 when it made one), or not recorded and
    why. A backward left unrecorded, or kernels of fixed size partitioned out of the recording, otherwise shows only
    in a profile; the report says it."""
    if "cuda" not in (getattr(compiled, "device_types", None) or ()):
        return "not recorded (no CUDA tensors)"
    info = getattr(compiled, "cudagraph_info", None)
    reason = getattr(compiled, "disabled_cudagraphs_reason", None) or (info and info.cudagraph_fail_reasons)
    if reason:
        return f"not recorded ({reason})"
    recorded = len(getattr(compiled, "partition_maps", None) or ())
    if recorded == 0:
        return "not recorded (Inductor made no CUDA-graph partition of it)"
    if partitions > recorded:
        return (f"{recorded} of {partitions} parts recorded; the kernels of the other {partitions - recorded} launch "
                f"from the CPU at every call (TORCH_LOGS=+cudagraphs gives Inductor's reasons)")
    return "recorded as one CUDA graph" if recorded == 1 else f"recorded as {recorded} CUDA graphs"


def _compile_in_workers(example_inputs) -> None:
    """Make Inductor compile this graph's Triton kernels in its worker processes. Inductor compiles in
    the calling process while its worker pool is still starting (the first compile of a process, or the
    first after a worker died); a Triton crash there aborts the whole process (bf16 GATConv's backward
    did, on the H100), where in a worker it is an exception :func:`_guarded_inner_compile` catches."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs):
        return
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.wait_pool_ready(timeout=120)
    except Exception:  # noqa: BLE001,S110  (no pool, e.g. one compile thread: Inductor compiles in process)
        pass


def _reset_compile_workers() -> None:
    """After a compile worker died: a fresh pool for the next compile (the old one is broken)."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    except Exception:  # noqa: BLE001,S110
        pass


class _OpByOp:
    """What :func:`_guarded_inner_compile` returns when Inductor cannot compile a graph: Inductor's
    ``OutputCode`` calling convention (a list of inputs in, the graph's outputs out) over the graph."""

    _boxed_call = True

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *inputs):
        if len(inputs) == 1 and isinstance(inputs[0], list):  # boxed: one list, which the callee owns
            boxed = inputs[0]
            inputs = tuple(boxed)
            boxed.clear()
        return self.gm(*inputs)

    def post_compile(self, *args, **kwargs) -> None:
        return None

    def set_triton_bundle(self, *args, **kwargs) -> None:
        return None

    def prepare_for_serialization(self) -> None:
        return None


# The torch.compile options of the graph compiling or running now in this thread (:func:`gnn_io`), which
# :func:`_inner_compile` hands to the forward and backward it compiles.
_SETTINGS: contextvars.ContextVar = contextvars.ContextVar("gnn_io_settings", default=None)


@contextlib.contextmanager
def _settings_in_force(settings: dict):
    token = _SETTINGS.set(settings)
    try:
        with config.patch(**settings):
            yield
    finally:
        _SETTINGS.reset(token)


class _UnderSettings:
    """A compiled callable (the backend's, or an Inductor ``OutputCode``) that runs under ``settings``, the graph's
    ``torch.compile`` options, at each call: the kernels read some settings as they run. Every other attribute is
    the callable's own, and its calling convention too (``_boxed_call``: one list of inputs, which the callee
    owns)."""

    def __init__(self, compiled, settings: dict):
        self.compiled, self.settings = compiled, settings
        self._boxed_call = getattr(compiled, "_boxed_call", False)

    def __call__(self, *args):
        with _settings_in_force(self.settings):
            return self.compiled(*args)

    def __getattr__(self, name):
        if "compiled" not in self.__dict__:  # a copy under construction
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message; empty for one raised without a message (``AssertionError()``),
    where ``str(exc).splitlines()`` is an empty list."""
    return next(iter(str(exc).splitlines()), "")


def gnn_io(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None, options: dict | None = None):
    """Dynamo backend: rewrite message passing into ``torch.ops.gnn_io`` ops, hand the rest to Inductor.

    If the graph cannot be lowered or rewritten (an op the canonical tracer cannot handle, a
    matcher bug), it goes to Inductor unchanged and the report says why: the backend never fails
    where plain ``torch.compile`` would work.

    ``mode`` and ``options`` are ``torch.compile``'s: ``options`` sets public settings by name
    (``{"plan_check": "version"}``, gnn_inductor/config.py), ``mode`` those of :data:`config.MODES`. They are in
    force while the graph compiles and at each call of its forward and backward; without them nothing is wrapped.
    """
    settings = config.compile_settings(mode, options)
    if not settings:
        return _compile(gm, example_inputs)
    with _settings_in_force(settings):
        return _UnderSettings(_compile(gm, example_inputs), settings)


def _compile(gm: torch.fx.GraphModule, example_inputs: list):
    """:func:`gnn_io` under the settings in force."""
    progress = _PassProgress()
    try:
        return _rewrite_and_compile(gm, example_inputs, progress)
    except Exception as exc:  # noqa: BLE001  (fallback is the point)
        # RestartAnalysis is Dynamo's signal, not a failure: with dynamic=True, AOT autograd's pass that turns float
        # scalars into tensors raises TensorifyScalarRestartAnalysis where it cannot, and Dynamo traces again with
        # that float specialised. A SettingError is the user's own misspelt setting. Anything else raised by the
        # backend's passes is the backend's failure, never the user's: the graph goes to Inductor as captured.
        if isinstance(exc, (SettingError, torch._dynamo.exc.RestartAnalysis)) or _strict():
            raise
        graph_report = _report.GraphReport(0, [], [_report.NearMiss(
            "backend", f"graph left to Inductor unchanged: the pass {progress.current} raised "
            f"{type(exc).__name__}: {_first_line(exc)}", {"source": "<graph>", "layer": None, "frames": []})])
        graph_report.track_parameters(example_inputs)
        _report.add(graph_report)
        return _inner_compile(gm, list(example_inputs), graph_report)


def _edge_count(example_inputs: list):
    """Edges of the example graph: the longest ``[2, E]`` integer input (None when there is none)."""
    counts = [t.shape[1] for t in example_inputs if isinstance(t, torch.Tensor) and t.dim() == 2
              and t.shape[0] == 2 and not t.is_floating_point()]
    return max(counts) if counts else None


def _attention_declined(ctx, device: str) -> list:
    """Near misses for a graph whose rewrites are all fused attention the cost model declines (float32, or
    bfloat16 TransformerConv, on a small graph, ``cost.attention_declined``); empty when any rewrite stays.
    Decided per graph: the edge softmax was rewritten before the family was known, so the graph goes to Inductor
    as Dynamo captured it."""
    from gnn_inductor import cost

    if not ctx.rewrites or any(r.pattern != "attention" for r in ctx.rewrites):
        return []
    tf32 = torch.get_float32_matmul_precision() != "highest"
    reasons = [cost.attention_declined(device, ctx.num_edges_hint, r.details.get("family"), r.details.get("dtype"),
                                       tf32, r.details.get("rows")) for r in ctx.rewrites]
    if not all(reasons):
        return []
    return [_report.NearMiss(r.pattern, reason, r.source) for r, reason in zip(ctx.rewrites, reasons)]


def _cuda_graphs() -> bool:
    return config.get("cuda_graphs")


def _strict() -> bool:
    """``GNN_IO_STRICT=1`` turns the Inductor fallback off (for the project's own tests)."""
    return config.get("strict")


def _fuse_linears(aten_gm: torch.fx.GraphModule, graph_report) -> None:
    """One GEMM for the linear maps of a shared input (gnn_inductor/linear_fusion.py), in graphs the backend
    rewrote; each fused group is listed in the report as a rewrite."""
    if not graph_report.rewrites or not linear_fusion.enabled():
        return
    for group in linear_fusion.fuse_shared_input_linears(aten_gm):
        widths = " + ".join(str(w) for w in group["widths"])
        graph_report.rewrites.append(_report.Rewrite(
            "shared_input_linears", "aten::addmm / aten::mm (weights concatenated)", group["source"],
            {"weights": group["weights"], "widths": group["widths"]},
            kernel=f"one GEMM of {len(group['widths'])} maps ({widths} output columns), Inductor/cuBLAS"))


def _fold_attention_bias(aten_gm: torch.fx.GraphModule, graph_report) -> None:
    """The bias added to an attention output, made inside the op (patterns/attention.py ``fold_bias``); each fold
    listed in the report as a rewrite."""
    for folded in attention_pattern.fold_bias(aten_gm):
        graph_report.rewrites.append(_report.Rewrite(
            "attention_bias", "aten::add of the attention output and a bias", folded["source"],
            {"bias": folded["bias"]},
            kernel="added in the attention op's output memory; the backward's D reads out - bias"))


def _fold_score_projections(aten_gm: torch.fx.GraphModule, graph_report) -> None:
    """GAT's attention-vector projections as more columns of its feature GEMM (gnn_inductor/score_fold.py), in
    graphs the backend rewrote; each fold listed in the report as a rewrite."""
    if not graph_report.rewrites:
        return
    for folded in score_fold.fold_score_projections(aten_gm):
        if folded.get("epilogue"):
            kernel = ("gnn_io::linear_scores: the scores made from the feature GEMM's tiles (3xTF32 kernel), their "
                      "gradients inside the backward GEMMs: no pass over the features for either")
        elif folded["scores_only"]:
            kernel = (f"the scores alone from the GEMM ({folded['columns']} columns): the projected features are "
                      f"never made, Inductor/cuBLAS")
        else:
            kernel = (f"columns of the feature GEMM ({folded['columns']} wide): no pass over the features for the "
                      f"scores or their gradients, Inductor/cuBLAS")
        graph_report.rewrites.append(_report.Rewrite(
            "score_projection", "aten::sum of (features * attention vector) over channels", folded["source"],
            {k: folded[k] for k in ("weight", "vectors", "columns", "scores_only")}, kernel=kernel))


def _moved_linears(aten_gm: torch.fx.GraphModule) -> tuple:
    """GEMMs of gathered rows moved before their gathers (gnn_inductor/gather_linear.py), as report rewrites,
    and near misses for those the graph's sizes kept per edge."""
    if not gather_linear.enabled():
        return [], []
    kept: list = []
    moved = [_report.Rewrite(
        "gather_linear", "aten::mm of node rows, then index_select", moved["source"],
        {"weight": moved["weight"], "gathers": moved["gathers"], "edge_pieces": moved["edge_pieces"]},
        kernel=f"{moved['gathers']} GEMM(s) over the gathered tensors' rows instead of one over the edges")
        for moved in gather_linear.move_linears_before_gathers(aten_gm, kept)]
    misses = [_report.NearMiss(
        "gather_linear", f"the linear map {k['weight']} of gathered rows stays one GEMM over the edges: the graph "
        f"compiled here has {k['edges']} edges, no more than the {k['rows']} rows of a gathered tensor, so moving it "
        "before the gather would not pay",
        k["source"])
        for k in kept]
    return moved, misses


class _PassProgress:
    """The backend pass running now, named in the report when one fails (:func:`gnn_io`)."""

    def __init__(self):
        self.current = "canonicalize"

    def __call__(self, name: str) -> None:
        self.current = name


def _rewrite_and_compile(gm: torch.fx.GraphModule, example_inputs: list, progress=None):
    progress = progress or _PassProgress()
    aten_gm = canonicalize(gm)
    progress("gather_linear")
    moved, kept = _moved_linears(aten_gm)
    progress("patterns")
    ctx = run_patterns(aten_gm, RewriteContext(aten_gm, fake_mode_of(aten_gm),
                                               num_edges_hint=_edge_count(example_inputs)))
    ctx.near_misses[:0] = kept
    device = next((t.device.type for t in example_inputs if isinstance(t, torch.Tensor)), "cpu")
    progress("cost_model")
    declined = _attention_declined(ctx, device)
    if declined:  # the whole graph is what torch.compile's default runs, faster at this size
        plain, failure = _plain_compile(gm, example_inputs)
        dynamic = any(isinstance(e, torch.SymInt) for e in example_inputs)
        if plain is not None or dynamic:
            graph_report = _report.GraphReport(0, [], ctx.near_misses + declined)
            graph_report.track_parameters(example_inputs)
            _report.add(graph_report)
            if plain is not None:
                return plain
            # Inductor cannot compile a graph of changing sizes (mini-batch GATConv: an unbacked-size assertion).
            # Its AOT graphs op by op took 1.5x eager PyG's step (H100), the fused attention with a plan built per
            # step 1.9x (H200): Dynamo's graph runs as captured, in eager mode
            graph_report.near_misses.append(_report.NearMiss(
                "inductor", f"Inductor failed on this graph, which the cost model left to it ({failure}); its sizes "
                f"change from call to call (mini-batches), so it runs as captured, in eager mode",
                {"source": "<graph>", "layer": None, "frames": []}))
            return gm
        # a graph of fixed sizes: its plan is built once, and the fused attention runs after all
        ctx.near_misses.append(_report.NearMiss(
            "attention", f"the cost model left this graph to Inductor, which failed on it ({failure}); the fused "
            f"attention runs instead", {"source": "<graph>", "layer": None, "frames": []}))
    for rewrite in ctx.rewrites:
        rewrite.kernel = kernels.kernel_for(rewrite.op, device, rewrite.details)
    graph_report = _report.GraphReport(0, ctx.rewrites + moved, ctx.near_misses)
    graph_report.track_parameters(example_inputs)
    progress("index_checks")
    insert_index_checks(aten_gm, ctx)
    progress("attention_bias")
    _fold_attention_bias(aten_gm, graph_report)
    progress("score_projection")
    _fold_score_projections(aten_gm, graph_report)
    progress("shared_input_linears")
    _fuse_linears(aten_gm, graph_report)
    progress("structure_masks")
    select_by_structure_masks(aten_gm)
    progress("hoist_structure")
    hoisted = hoist_structure(aten_gm)
    progress("inductor")
    if hoisted is None:
        _report.add(graph_report)
        if not ctx.rewrites and not moved:  # nothing of ours in it: exactly what torch.compile's default would run
            return _inner_compile(gm, list(example_inputs), graph_report)
        return _inner_compile(aten_gm, list(example_inputs), graph_report)

    graph_report.hoisted_nodes = hoisted.num_nodes
    num_sizes = len(hoisted.output_vals) - len(hoisted.outputs)
    outputs_index = {node: i for i, node in enumerate(hoisted.outputs)}
    cache = PlanCache(hoisted.structure_gm, plan_stats_hook(ctx.rewrites, outputs_index), config.get("plan_check"))
    graph_report.plan_check = reuse_contract(cache.check, device == "cuda")
    plan_inputs = [len(example_inputs) + j for j, v in enumerate(hoisted.output_vals) if isinstance(v, torch.Tensor)]
    static_inputs = _parameter_positions(example_inputs) + plan_inputs
    positions = hoisted.input_positions

    def plan_of(args) -> tuple:
        """The plan of the graph in ``args``, cached per graph: data-dependent sizes first, then tensors."""
        plan = cache([args[i] for i in positions])
        graph_report.plan_builds, graph_report.plan_hits = cache.builds, cache.hits
        graph_report.plan_stale = cache.stale
        if cache.hits == 0:
            _report.write_env_report()
        return plan[len(plan) - num_sizes:] + plan[:len(plan) - num_sizes]

    if num_sizes and _cuda_graphs():
        graph_report.near_misses.append(_report.NearMiss(
            "cuda_graphs", f"GNN_IO_CUDAGRAPHS=1: its plan has {num_sizes} data-dependent size(s) (self loops "
            f"found by nonzero); compiled once per graph at its concrete sizes so CUDA graph trees replay it "
            f"(at most {MAX_SPECIALIZED} graphs, then one dynamic-shape graph without CUDA graphs)",
            {"source": "<graph>", "layer": None, "frames": []}))
        _report.add(graph_report)
        run = _size_specialized(aten_gm, len(example_inputs), num_sizes, static_inputs, graph_report, plan_of,
                                lambda: _inner_compile(aten_gm, list(example_inputs) + list(hoisted.output_vals),
                                                       graph_report, static_inputs))
        run._gnn_io_cache = cache
        return run
    compiled = _inner_compile(aten_gm, list(example_inputs) + list(hoisted.output_vals), graph_report,
                              static_inputs)
    _report.add(graph_report)
    churn = _Churn(gm, example_inputs, cache, positions, graph_report)

    def run(*args):
        if churn.plain_now:
            return churn.plain(*args)
        out = compiled(*args, *plan_of(args))
        churn.observe(args)
        return out

    run._gnn_io_cache = cache
    run._gnn_io_churn = churn
    return run


def _plain_compile(gm, example_inputs) -> tuple:
    """``(compiled, None)``: Dynamo's graph compiled as ``torch.compile``'s default compiles it, forward and backward
    both now; or ``(None, why)`` where Inductor could not (an exception, or a failure that
    :func:`_guarded_inner_compile` would have turned into an op-by-op graph), so the caller can pick what runs
    instead (the rewritten graph, or Dynamo's graph in eager mode). Nothing of this compile lands in a graph's
    report. ``GNN_IO_STRICT=1`` re-raises."""
    import torch._functorch.config as functorch_config

    scratch = _report.GraphReport(0, [], [])
    try:
        # the backward compiled now too (AOTAutograd otherwise lowers it at the first backward, where a failure
        # could no longer fall back to the rewritten graph)
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            compiled = _inner_compile(gm, list(example_inputs), scratch, inductor_tiles=True)
    except Exception as exc:  # noqa: BLE001  (the rewritten graph still runs)
        if _strict():
            raise
        return None, f"{type(exc).__name__}: {_first_line(exc)[:160]}"
    if scratch.near_misses:  # the guarded compile's fallback, which the caller replaces
        return None, scratch.near_misses[0].reason.replace(OP_BY_OP, "")
    return compiled, None


class _Churn:
    """Mini-batch training meets a new graph at every step: the plan (CSR builds, index checks, self loops and
    normalisation run eagerly, op by op) is rebuilt every call and never reused. On small graphs that costs more
    than the fused kernels save: on the H100, RMAT 2^17 subgraphs of about 18k edges (two layers, a new subgraph
    per step, ``benchmarks/minibatch.py``), GCNConv took 2.2 ms against torch.compile's 1.3 (docs/usage.md).

    A graph Dynamo compiled with dynamic shapes (its input sizes changed: the mini-batch case) and a plan is
    also compiled as ``torch.compile``'s default would compile it (``plain``, structure work inside, no gnn_io
    ops). Once at least :data:`CHURN_CALLS` calls ran, at least :data:`CHURN_SHARE` of them built a new plan,
    and the current graph has at most ``GNN_IO_CHURN_EDGES`` (default :data:`CHURN_EDGES`) edges, every later
    call runs ``plain``, and the report says so. ``GNN_IO_CHURN``: ``auto`` (the default) or ``on``, on CUDA and
    CPU graphs alike (the CPU's default leaves the aggregations to Inductor, but the hoisted structure work still
    ran op by op per graph: GCNConv's CPU step took 1.8x torch.compile's), ``off``."""

    def __init__(self, gm, example_inputs, cache, positions, graph_report):
        self.cache, self.positions, self.graph_report = cache, positions, graph_report
        self.calls, self.plain, self.plain_now = 0, None, False
        self.limit = config.get("churn_edges")
        if config.get("churn") == "off" or not any(isinstance(e, torch.SymInt) for e in example_inputs):
            return
        plain, failure = _plain_compile(gm, example_inputs)
        if plain is None:
            self._note(f"not compiled as torch.compile's default ({failure}): a new graph every step keeps the "
                       f"rewrites")
        self.plain = plain

    def _note(self, reason: str) -> None:
        self.graph_report.near_misses.append(_report.NearMiss(
            "mini_batch", reason, {"source": "<graph>", "layer": None, "frames": []}))

    def observe(self, args) -> None:
        if self.plain is None:
            return
        self.calls += 1
        builds = self.cache.builds
        if self.calls < CHURN_CALLS or builds < CHURN_SHARE * self.calls:
            return
        edges = _structure_edges([args[i] for i in self.positions])
        if edges is None or edges > self.limit:
            return
        self.plain_now = True
        self._note(f"a new graph on {builds} of {self.calls} calls ({edges} edges, at most {self.limit}): its plan "
                   f"was rebuilt every step, so later calls run as torch.compile's default compiles the graph "
                   f"(GNN_IO_CHURN=off keeps the rewrites)")


# The mini-batch switch (:class:`_Churn`): calls seen first, the share of them that built a plan, and the largest
# graph (edges) it applies to. The edge bound is not calibrated: at 1.1M edges a fixed graph's fused kernels
# run at 1.0-1.4x of torch.compile's step on the H100, less than a plan rebuilt per step costs there.
CHURN_CALLS = 8
CHURN_SHARE = 0.75
CHURN_EDGES = config.default("churn_edges")


def _structure_edges(tensors) -> int | None:
    """Edges of the graph among a plan's inputs: :func:`_edge_count` (a ``[2, E]`` index), else the length of the
    longest one-dimensional integer tensor (DGL's separate source and destination tensors)."""
    edges = _edge_count(tensors)
    if edges is not None:
        return edges
    lengths = [t.numel() for t in tensors if isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point()]
    return max(lengths) if lengths else None


# Concrete-size compiles kept per data-dependent-size graph under CUDA graphs before the dynamic fallback.
MAX_SPECIALIZED = 4


def _size_specialized(aten_gm, num_args, num_sizes, static_inputs, graph_report, plan_of, dynamic):
    """The step of a graph whose plan has data-dependent sizes, compiled under CUDA graphs at the sizes of each
    graph it meets (one compile per distinct size signature, the plan sizes and the arguments' shapes and
    integers): a graph with symbolic sizes stays off CUDA graph trees (Inductor skips it), a graph of fixed
    sizes replays. Past :data:`MAX_SPECIALIZED` signatures (a stream of different graphs, as in mini-batch
    training) the shape-generic graph, compiled once, runs everything else without CUDA graphs."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    compiled, refused = {}, set()
    fallback = []
    shifted_static = [i if i < num_args else i - num_sizes for i in static_inputs]

    def run(*args):
        plan = plan_of(args)
        sizes, tensors = tuple(int(s) for s in plan[:num_sizes]), plan[num_sizes:]
        key = (sizes,) + tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        fn = compiled.get(key)
        if fn is None and key not in refused and len(compiled) < MAX_SPECIALIZED:
            gm = _with_constant_sizes(aten_gm, num_args, sizes)
            try:
                fn = compiled[key] = _inner_compile(gm, list(args) + list(tensors), graph_report, shifted_static)
            except DynamicOutputShapeException as exc:
                # an operator whose output size depends on values is left even at fixed sizes: PyG's boolean
                # indexing of edge inputs that need a gradient, on a graph Dynamo compiled for 0 or 1 edge, which
                # plan.select_by_structure_masks leaves as it is; the shape-generic graph runs it
                refused.add(key)
                graph_report.near_misses.append(_report.NearMiss(
                    "cuda_graphs", f"a graph of sizes {sizes} keeps an operator of a data-dependent output shape "
                    f"({_first_line(exc)[:80]}); it runs the shape-generic graph, without CUDA graphs",
                    {"source": "<graph>", "layer": None, "frames": []}))
        if fn is not None:
            return fn(*args, *tensors)
        if not fallback:
            fallback.append(dynamic())
        return fallback[0](*args, *sizes, *tensors)

    return run


def _with_constant_sizes(aten_gm, num_args: int, sizes: tuple):
    """A copy of ``aten_gm`` whose plan-size placeholders (right after the ``num_args`` arguments) are the
    integers ``sizes``."""
    graph = copy.deepcopy(aten_gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, size in zip(placeholders[num_args:num_args + len(sizes)], sizes):
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n, node=node, size=size: size if n is node else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, node=node, size=size: size if n is node else n)
        graph.erase_node(node)
    graph.lint()
    return torch.fx.GraphModule(aten_gm, graph)
