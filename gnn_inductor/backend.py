"""The ``gnn_io`` torch.compile backend: capture, canonicalise, match, rewrite, hoist, compile.

``torch.compile(model, backend="gnn_io")`` finds this function through the ``torch_dynamo_backends`` entry point, so
nothing needs importing first. Importing this module turns on Dynamo's capture of dynamic-output-shape ops
(``nonzero``, boolean masks), so that PyG layers that add self loops (GCNConv, GATConv) are captured as one graph per
layer instead of being split at ``nonzero``; the data-dependent sizes then live in the graph plan.

Each compile takes one snapshot of every setting (``config.snapshot()``, under the ``torch.compile`` ``mode`` and
``options``), runs the passes of gnn_inductor/pipeline.py with it, and applies it around every call of what it
returns, the forward and backward Inductor compiled included.
"""
from __future__ import annotations

import contextvars
import copy
import functools
import time

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

from gnn_inductor import buckets, caching, config, logs, pipeline
from gnn_inductor import kernels  # noqa: F401  (registers torch.ops.gnn_io.*)
from gnn_inductor import rewrite_report as _report
from gnn_inductor.canonical import canonicalize
from gnn_inductor.churn import Churn
from gnn_inductor.config import SettingError
from gnn_inductor.frontends import dgl as _dgl_frontend
from gnn_inductor.frontends import pyg as _pyg_frontend
from gnn_inductor.kernels.gather_scatter.fused import split_summary
from gnn_inductor.passes import direct_ops, inductor_fixes
from gnn_inductor.pipeline import GRAPH_SOURCE, first_line
from gnn_inductor.plan.cache import PlanCache, plan_stats_hook, reuse_contract
from gnn_inductor.specialize import MAX_SPECIALIZED, size_specialized

inductor_fixes.apply()

torch._dynamo.config.capture_dynamic_output_shape_ops = True
_dgl_frontend.install()  # a traceable path through DGL when it is imported (docs/dgl.md)
_pyg_frontend.install_when_imported()  # HGTConv's HeteroLinear in one graph (gnn_inductor/frontends/pyg.py)

OP_BY_OP = "; it runs op by op instead"

# The settings snapshot of the graph compiling or running now in this thread (:func:`gnn_io`), which
# :func:`inductor_compile` hands to the forward and backward it compiles.
_SETTINGS: contextvars.ContextVar = contextvars.ContextVar("gnn_io_settings", default=None)


class settings_in_force:
    """``with settings_in_force(settings):`` ``settings`` applied (``config.applied``) and named as the compile's for
    what compiles inside. A plain class, not a generator context manager: it runs at every call of a compiled
    graph (forward and backward), where the generator's setup cost more than the work."""

    __slots__ = ("settings", "_token", "_applied")

    def __init__(self, settings: config.Snapshot):
        self.settings = settings

    def __enter__(self):
        self._token = _SETTINGS.set(self.settings)
        self._applied = config.applied(self.settings)
        self._applied.__enter__()
        return self

    def __exit__(self, *exc_info) -> bool:
        try:
            self._applied.__exit__(*exc_info)
        finally:
            _SETTINGS.reset(self._token)
        return False


class UnderSettings:
    """A compiled callable (the backend's, or an Inductor ``OutputCode``) that runs under ``settings``, its compile's
    snapshot, at each call: the kernels read some settings as they run, and a backward must see its forward's.
    Every other attribute is the callable's own, and its calling convention too (``_boxed_call``: one list of
    inputs, which the callee owns)."""

    def __init__(self, compiled, settings: config.Snapshot):
        self.compiled, self.settings = compiled, settings
        self._boxed_call = getattr(compiled, "_boxed_call", False)
        # what AOTAutograd reads of an Inductor graph to save it in its cache (copied by the wrappers it adds,
        # which take the wrapped callable's __dict__): without them a graph of the backend is never saved
        for name in caching.CACHE_ATTRIBUTES:
            if hasattr(compiled, name):
                setattr(self, name, getattr(compiled, name))

    def __call__(self, *args):
        if _SETTINGS.get() is self.settings:  # inside the backend's own call of this compile: already in force
            return self.compiled(*args)
        with settings_in_force(self.settings):
            return self.compiled(*args)

    def __getattr__(self, name):
        if "compiled" not in self.__dict__:  # a copy under construction
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _pointwise_autotune(settings: config.Snapshot) -> bool:
    """Whether Inductor times its pointwise kernels' launch configurations at their first call. Not under CUDA graphs
    (unless max-autotune asks for tuning): there that first call is the graph trees' warm-up, inside the pool that
    already holds the step's buffers, and the timing's L2-sized flush buffer (60 MB on the H200) set the step's peak.
    On one H200, 1024-seed arxiv-like batches: GCNConv's peak 235 -> 184 MB, SAGEConv mean's 298 -> 238 MB
    (docs/benchmarks/minibatch.md); the replayed steps are bound by the host, not by these kernels' launches."""
    if settings.is_set("inductor_pointwise_autotune"):
        return settings["inductor_pointwise_autotune"]
    return not settings["cuda_graphs"] or settings["inductor_max_autotune"]


def inductor_compile(gm, example_inputs, graph_report=None, static_inputs=None, inductor_tiles=False,
                     split_passes=None):
    """Inductor's compile of ``gm`` (AOTAutograd's split, then :func:`_guarded_inner_compile` per side, with
    ``split_passes``, by default ``pipeline.SPLIT_PASSES``) under the settings of the compile running now (a fresh
    snapshot outside one)."""
    from torch._inductor.compile_fx import compile_fx

    settings = _SETTINGS.get() or config.snapshot()
    # GNN_IO_CUDAGRAPHS=1: Inductor's CUDA graph trees (what mode="reduce-overhead" turns on for the
    # default backend), which replay the whole step with one launch: for small graphs, where the
    # per-call CPU work is larger than the GPU work.
    # Inductor's 3-D tiled reductions (``triton.max_tiles`` defaults to 3 when its coalescing analysis is on,
    # documented there as "experimental and may have bugs") faulted with "CUDA driver error: misaligned address"
    # on the H100 in GATConv's backward (the attention-vector gradient, a y/x/r0-tiled reduction over 2708
    # Cora nodes, float32). The rewritten graphs keep 2 tiles; GNN_IO_INDUCTOR_MAX_TILES overrides.
    # ``inductor_tiles``: a graph left to Inductor whole (:func:`_plain_compile`) keeps Inductor's own setting, so
    # it is exactly what torch.compile's default runs (MUSAE-github GATConv on the H100: 2% slower with 2 tiles).
    # Inductor's FX graph cache keys each graph after the passes of ``pipeline.SPLIT_PASSES`` (in
    # :func:`_guarded_inner_compile`), so a second process compiling the same model for the same sizes and settings
    # reuses the generated code; per-graph plans are built at run time from the structure tensors and so are never
    # in a cached graph. AOTAutograd's cache (``aot_cache``) applies where the compile's settings are the
    # environment's: its hit returns the bare compiled graphs, whose backward then reads the settings as they are
    # when autograd calls it (the environment's), not under :class:`UnderSettings`.
    options = {"fx_graph_cache": True}
    if not inductor_tiles or settings.is_set("inductor_max_tiles"):
        options["triton.max_tiles"] = settings["inductor_max_tiles"]
    if settings["inductor_max_autotune"]:  # mode="max-autotune" (config.MODES)
        options.update({"max_autotune": True, "coordinate_descent_tuning": True})
    if settings["cuda_graphs"]:
        # Graphs with symbolic-shape inputs stay off CUDA graphs: on the H100, GCNConv and GATConv (whose self
        # loops give the plan a data-dependent size) failed after a no_grad forward with "accessing tensor
        # output of CUDAGraphs that has been overwritten"; :func:`_rewrite_and_compile` reports it.
        # A graph of fixed sizes turns that check off: in torch 2.11 Inductor's graph partition counts a kernel's
        # own loop indices as dynamic sizes (pytorch/pytorch#197139), so with it on, TransformerConv's fused
        # weight concatenation, its GEMM, the output add and the bias gradients ran outside the CUDA graphs
        # (seen on the H100, RMAT 2^17).
        options["triton.cudagraphs"] = True
        options["triton.cudagraph_skip_dynamic_graphs"] = _has_symbolic_sizes(example_inputs)
    if not _pointwise_autotune(settings):
        options["triton.autotune_pointwise"] = False
    if static_inputs is None:
        static_inputs = _parameter_positions(example_inputs)
    inner = functools.partial(_guarded_inner_compile, graph_report=graph_report, static_inputs=tuple(static_inputs),
                              num_inputs=len(example_inputs), settings=settings, split_passes=split_passes)
    # config_patches, not a ``with inductor_config.patch(...)`` around the call: AOTAutograd compiles the backward
    # lazily, at the first backward, after such a block has exited; compile_fx also patches ``inner_compile`` so
    # the backward gets these options. Without them the backward would get no CUDA graphs under
    # GNN_IO_CUDAGRAPHS=1 (its kernels would launch one by one) and Inductor's default tiles.
    aot_cache = settings["aot_cache"] == "auto" and not settings["cuda_graphs"]
    if aot_cache:
        options["post_grad_custom_post_pass"] = caching.CacheKey(settings, inductor_config.post_grad_custom_post_pass)
        direct_ops.define_all()  # a loaded graph calls the twins its first compile's split passes made
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    with functorch_config.patch(enable_autograd_cache=aot_cache):
        compiled = compile_fx(gm, example_inputs, inner_compile=inner, config_patches=options)
    if counters["aot_autograd"]["autograd_cache_hit"] > hits and graph_report is not None:
        graph_report.passes.append(_report.PassRecord(
            "split_passes", "skipped", 0, "forward and backward loaded from AOTAutograd's cache, as these passes "
            "made them at their first compile", None))
    return compiled


def _has_symbolic_sizes(example_inputs) -> bool:
    """Whether a graph's inputs carry a symbolic size: a SymInt input, or a tensor with a symbolic dimension."""
    return any(isinstance(e, torch.SymInt)
               or isinstance(e, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in e.shape)
               for e in example_inputs)


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
                           split_passes=None, **kwargs):
    """Inductor's own per-graph compile (forward, and the backward when it is first needed) under ``settings``
    (the compile's snapshot, in force while it compiles and at each call of what it returns: AOTAutograd compiles
    and calls the backward outside the forward's call), after the passes of ``pipeline.SPLIT_PASSES``, except that
    a crash of Inductor or Triton while compiling (bf16 GATConv's backward crashes a compile worker in Triton's
    LLVM lowering, on torch.compile's default backend too) leaves that graph to run op by op (aten ops and the
    gnn_io kernels), with a near miss in the report, instead of failing the user's step. ``GNN_IO_STRICT=1``
    re-raises."""
    settings = settings or config.snapshot()
    with settings_in_force(settings):
        compiled = _compile_split_graph(gm, example_inputs, graph_report, static_inputs, num_inputs, settings, kwargs,
                                        split_passes)
    return UnderSettings(compiled, settings)


def _compile_split_graph(gm, example_inputs, graph_report, static_inputs, num_inputs, settings, kwargs,
                         split_passes=None):
    from torch._inductor import compile_fx as inductor

    side = "backward" if kwargs.get("is_backward") else "forward"
    pristine = copy.deepcopy(gm)  # Inductor's passes rewrite gm in place before they can fail
    progress = pipeline.Progress()
    try:
        pipeline.run_split_passes(gm, graph_report, side, settings, progress, split_passes)
    except Exception as exc:  # noqa: BLE001  (a pass's failure must not become the user's crash)
        if settings["strict"]:
            raise
        gm = copy.deepcopy(pristine)
        if graph_report is not None:
            graph_report.near_misses.append(_report.NearMiss(
                "backend", f"the pass {progress.current} raised {type(exc).__name__}: {first_line(exc)[:160]}; "
                f"this graph compiles without the passes after the forward/backward split", GRAPH_SOURCE, "fallback"))
    if settings["cuda_graphs"]:
        kwargs = _with_static_inputs(kwargs, example_inputs, static_inputs, num_inputs)
    try:
        partitions_before = counters["inductor"]["cudagraph_partitions"]
        with caching.workers_on_cache_miss(inductor, example_inputs):
            compiled = inductor.compile_fx_inner(gm, example_inputs, **kwargs)
        if graph_report is not None and settings["cuda_graphs"]:
            graph_report.cuda_graphs[side] = \
                _cuda_graph_state(compiled, counters["inductor"]["cudagraph_partitions"] - partitions_before)
        return compiled
    except Exception as exc:  # noqa: BLE001  (a compiler crash must not become the user's crash)
        if "subprocess" in str(exc):
            _reset_compile_workers()
        if settings["strict"]:
            raise
        reason = (f"Inductor failed to compile this graph ({type(exc).__name__}: "
                  f"{first_line(exc)[:160]}){OP_BY_OP}")
        if graph_report is not None:
            graph_report.near_misses.append(_report.NearMiss("inductor", reason, GRAPH_SOURCE, "fallback"))
        return _OpByOp(pristine)


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


def gnn_io(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None, options: dict | None = None):
    """Dynamo backend: rewrite message passing into ``torch.ops.gnn_io`` ops, hand the rest to Inductor.

    If the graph cannot be lowered or rewritten (an op the canonical tracer cannot handle, a
    matcher bug), it goes to Inductor unchanged and the report says why: the backend never fails
    where plain ``torch.compile`` would work.

    ``mode`` and ``options`` are ``torch.compile``'s: ``options`` sets public settings by name
    (``{"plan_check": "version"}``, gnn_inductor/config.py), ``mode`` those of :data:`config.MODES`. With the
    environment and any active patch they make the compile's snapshot of every setting, in force while the graph
    compiles and at each call of its forward and backward.
    """
    given = config.compile_settings(mode, options)
    if given or config.patched():
        # settings other than the environment's: kept in force at every call (:class:`UnderSettings`), which a graph
        # loaded from AOTAutograd's cache would not be, its backward being called by autograd
        given = {**given, "aot_cache": "off"}
    with config.patch(**given):
        settings = config.snapshot()
    logs.follow_setting(settings["logs"])
    logs.compile_started(gm)
    start, known = time.perf_counter(), len(_report.reports())
    with settings_in_force(settings):
        buckets_of = _buckets(gm, example_inputs, settings)
        compiled = _compile(gm, example_inputs, settings, padded=buckets_of is not None)
        if buckets_of is not None:
            compiled = buckets_of(compiled)
    logs.graph_compiled(_report.reports()[known:], time.perf_counter() - start)
    return UnderSettings(compiled, settings)


def _buckets(gm: torch.fx.GraphModule, example_inputs: list, settings: config.Snapshot):
    """For a graph of changing sizes (mini-batches) that :mod:`gnn_inductor.buckets` may pad: a function that
    wraps the shape-generic compile into the bucketed callable; else None, with the report saying why where the
    setting asked for buckets. Its own report entry lists the buckets compiled (their padded sizes, in the order
    its ``sizes`` names: node counts, then edge counts)."""
    choice = settings["buckets"]
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    if choice == "off" or not _has_symbolic_sizes(example_inputs) or \
            (choice == "auto" and not (settings["cuda_graphs"] and on_cuda)):
        return None
    graph_report = _report.GraphReport(0, [], [])
    graph_report.track_parameters(example_inputs)
    why = None
    try:
        canonical = functools.cache(lambda: canonicalize(buckets.copy_module(gm)))
        layout, why = buckets.layout_of(gm, canonical)
        if layout is not None:
            why = buckets.why_unsafe(canonical(), layout)
    except Exception as exc:  # noqa: BLE001  (the analysis failing is a reason not to pad, never the user's error)
        if settings["strict"]:
            raise
        why = f"the padding analysis raised {type(exc).__name__}: {first_line(exc)[:160]}"
    if why:
        graph_report.near_misses.append(_report.NearMiss(
            "buckets", f"not padded to fixed sizes: {why}; the graph runs at its changing sizes", GRAPH_SOURCE,
            "declined"))
        _report.add(graph_report)
        return None
    pristine, captured = buckets.copy_module(gm), buckets.copy_module(gm)
    # edge filters (self loops removed) kept at fixed sizes, so the bucket has no data-dependent size
    filters, kept_why = buckets.redirect_filters(pristine, layout)
    if filters and any(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in example_inputs):
        # the edges a filter drops (all but one relation's, per relation of RGCNConv) meet at the padded nodes: a
        # float16 sum there can overflow, and inf times the zero gradient of a padded row is NaN in a weight gradient
        graph_report.near_misses.append(_report.NearMiss(
            "buckets", "not padded to fixed sizes: float16 inputs and edge filters, whose dropped edges all join "
                       "padded nodes, where a float16 sum could overflow; the graph runs at its changing sizes",
            GRAPH_SOURCE, "declined"))
        _report.add(graph_report)
        return None
    details = {"buckets": [], "sizes": layout.describe(), "edge_filters_at_fixed_size": filters}
    if layout.scalars:  # numbers read from 0-d tensors, fixed per bucket (their values are part of its key)
        details["fixed_numbers"] = [layout.names[i] for i in sorted(layout.scalars)]
    if kept_why:
        details["edge_filters_kept"] = kept_why
    rewrite = _report.Rewrite("buckets", "padded shape buckets", GRAPH_SOURCE, details,
                              kernel="one fixed-size compile per bucket (torch.compile's code with its large "
                              "float32 GEMMs by 3xTF32, CUDA graphs under reduce-overhead)")
    graph_report.rewrites.append(rewrite)
    _report.add(graph_report)

    def compile_at(bucket_gm, inputs):
        # at the bucket's fixed sizes, in a fake mode of its own whose ShapeEnv takes the data-dependent sizes
        # (GCNConv's self loops: nonzero); the inputs' sizes stay static
        from torch._guards import TracingContext, tracing
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fakes = [fake_mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in inputs]
        records = []
        with tracing(TracingContext(fake_mode)):
            graph = _bucket_rewrites(bucket_gm, fakes, settings, rewrite)
            compiled, failure = _plain_compile(graph or bucket_gm, fakes, settings, _parameter_positions(inputs),
                                               pipeline.BUCKET_SPLIT_PASSES, records)
        gemms = sum(r.count for r in records if r.name == "dense_gemm" and r.status == "ran")
        rewrite.details["gemms_3xtf32"] = rewrite.details.get("gemms_3xtf32", 0) + gemms
        if compiled is None:
            graph_report.near_misses.append(_report.NearMiss(
                "buckets", f"the fixed-size compile failed ({failure}); this bucket runs the shape-generic graph",
                GRAPH_SOURCE, "fallback"))
        return compiled

    def unpadded_call():
        rewrite.details["unpadded_calls"] = rewrite.details.get("unpadded_calls", 0) + 1

    def wrap(dynamic):
        # a rare size after the buckets settled runs the captured graph as it is: eager PyTorch, no compile
        return buckets.Bucketed(pristine, layout, compile_at, dynamic,
                                on_compile=lambda key: rewrite.details["buckets"].append(list(key[:layout.width])),
                                unpadded=captured.forward, on_unpadded=unpadded_call)

    return wrap


def _bucket_rewrites(bucket_gm, fakes: list, settings: config.Snapshot, rewrite):
    """A bucket's graph rewritten by ``pipeline.BUCKET_GRAPH_PASSES``, counted in the buckets entry ``rewrite``; None
    where no pass rewrote it or one raised (the bucket then compiles the graph as ``torch.compile`` would)."""
    try:
        graph, report = pipeline.bucket_graph(bucket_gm, fakes, settings)
    except Exception as exc:  # noqa: BLE001  (the graph as Dynamo gave it still compiles)
        if settings["strict"]:
            raise
        rewrite.details["bucket_passes_failed"] = f"{type(exc).__name__}: {first_line(exc)[:160]}"
        return None
    if report.rewrites:  # the relations of each group rewritten
        rewrite.details["relation_segments"] = [entry.details["relations"] for entry in report.rewrites]
    return graph


def _compile(gm: torch.fx.GraphModule, example_inputs: list, settings: config.Snapshot, padded: bool = False):
    """:func:`gnn_io` under its ``settings``."""
    state = pipeline.CompileState(gm, example_inputs, settings, _declined_graph, padded=padded)
    try:
        return _rewrite_and_compile(state)
    except Exception as exc:  # noqa: BLE001  (fallback is the point)
        # RestartAnalysis is Dynamo's signal, not a failure: with dynamic=True, AOT autograd's pass that turns float
        # scalars into tensors raises TensorifyScalarRestartAnalysis where it cannot, and Dynamo traces again with
        # that float specialised. A SettingError is the user's own misspelt setting. Anything else raised by the
        # backend's passes is the backend's failure, never the user's: the graph goes to Inductor as captured.
        if isinstance(exc, (SettingError, torch._dynamo.exc.RestartAnalysis)) or settings["strict"]:
            raise
        graph_report = _report.GraphReport(0, [], [_report.NearMiss(
            "backend", f"graph left to Inductor unchanged: the pass {state.current} raised "
            f"{type(exc).__name__}: {first_line(exc)}", GRAPH_SOURCE, "fallback")], passes=state.report.passes)
        graph_report.track_parameters(example_inputs)
        _report.add(graph_report)
        return inductor_compile(gm, list(example_inputs), graph_report)


def _declined_graph(state: pipeline.CompileState, declined: list):
    """The cost model declined every rewrite of the graph (``pipeline.attention_declined``): the whole graph is what
    torch.compile's default runs, faster at this size. Returns what runs instead, or None where the rewrites run
    after all (Inductor failed on a graph of fixed sizes: its plan is built once)."""
    ctx, gm, example_inputs = state.ctx, state.dynamo_gm, state.example_inputs
    plain, failure = _plain_compile(gm, example_inputs, state.settings)
    dynamic = any(isinstance(e, torch.SymInt) for e in example_inputs)
    if plain is not None or dynamic:
        graph_report = _report.GraphReport(0, [], ctx.near_misses + declined, passes=state.report.passes)
        graph_report.track_parameters(example_inputs)
        _report.add(graph_report)
        if plain is not None:
            return plain
        # Inductor cannot compile a graph of changing sizes (mini-batch GATConv: an unbacked-size assertion).
        # Its AOT graphs op by op took 1.5x eager PyG's step (H100), the fused attention with a plan built per
        # step 1.9x (H200): Dynamo's graph runs as captured, in eager mode
        graph_report.near_misses.append(_report.NearMiss(
            "inductor", f"Inductor failed on this graph, which the cost model left to it ({failure}); its sizes "
            f"change from call to call (mini-batches), so it runs as captured, in eager mode", GRAPH_SOURCE,
            "fallback"))
        return gm
    # a graph of fixed sizes: its plan is built once, and the fused attention runs after all
    ctx.near_misses.append(_report.NearMiss(
        "attention", f"the cost model left this graph to Inductor, which failed on it ({failure}); the fused "
        f"attention runs instead", GRAPH_SOURCE, "fallback"))
    return None


def _rewrite_and_compile(state: pipeline.CompileState):
    pipeline.run_graph_passes(state)
    if state.result is not None:
        return state.result
    gm, example_inputs, settings = state.dynamo_gm, state.example_inputs, state.settings
    aten_gm, graph_report, hoisted, ctx = state.gm, state.report, state.hoisted, state.ctx
    state.current = "inductor"
    if hoisted is None:
        _report.add(graph_report)
        if not ctx.rewrites and not state.moved:  # nothing of ours in it: exactly what torch.compile's default runs
            return inductor_compile(gm, list(example_inputs), graph_report)
        return inductor_compile(aten_gm, list(example_inputs), graph_report)

    graph_report.hoisted_nodes = hoisted.num_nodes
    num_sizes = len(hoisted.output_vals) - len(hoisted.outputs)
    outputs_index = {node: i for i, node in enumerate(hoisted.outputs)}
    cache = PlanCache(hoisted.structure_gm, plan_stats_hook(ctx.rewrites, outputs_index,
                                                            {"gather_scatter": ("split", split_summary)}),
                      settings["plan_check"])
    graph_report.plan_check = reuse_contract(cache.check, state.device == "cuda")
    graph_report.plan_build_ms = cache.build_ms  # the same list: the cache appends each build's time
    plan_inputs = [len(example_inputs) + j for j, v in enumerate(hoisted.output_vals) if isinstance(v, torch.Tensor)]
    static_inputs = _parameter_positions(example_inputs) + plan_inputs
    positions = hoisted.input_positions

    def plan_of(args) -> tuple:
        """The plan of the graph in ``args``, cached per graph: data-dependent sizes first, then tensors."""
        builds = cache.builds
        plan = cache([args[i] for i in positions])
        if cache.builds != builds:
            logs.plan_built(graph_report, cache.build_ms[-1] / 1e3, cache.builds)
        graph_report.plan_builds, graph_report.plan_hits = cache.builds, cache.hits
        graph_report.plan_stale = cache.stale
        if cache.hits == 0:
            _report.write_env_report()
        return plan[len(plan) - num_sizes:] + plan[:len(plan) - num_sizes]

    if num_sizes and settings["cuda_graphs"]:
        graph_report.near_misses.append(_report.NearMiss(
            "cuda_graphs", f"GNN_IO_CUDAGRAPHS=1: its plan has {num_sizes} data-dependent size(s) (self loops "
            f"found by nonzero); compiled once per graph at its concrete sizes so CUDA graph trees replay it "
            f"(at most {MAX_SPECIALIZED} graphs, then one dynamic-shape graph without CUDA graphs)", GRAPH_SOURCE,
            "declined"))
        _report.add(graph_report)
        step = size_specialized(aten_gm, len(example_inputs), num_sizes, static_inputs, graph_report, plan_of,
                                lambda *args: inductor_compile(*args),
                                lambda: inductor_compile(aten_gm, list(example_inputs) + list(hoisted.output_vals),
                                                         graph_report, static_inputs))
    else:
        compiled = inductor_compile(aten_gm, list(example_inputs) + list(hoisted.output_vals), graph_report,
                                    static_inputs)
        _report.add(graph_report)

        def step(*args):
            return compiled(*args, *plan_of(args))
    # a graph of changing sizes that builds a plan at nearly every call (a mini-batch stream the buckets do not pad)
    # runs torch.compile's default after a few calls, with CUDA graphs on too: on the H200, RGCNConv's mini-batches
    # (an edge_type input, not padded) took 61 ms per step at their concrete sizes and then shape-generic, with a
    # plan per step, against torch.compile's 17. Not where the calls run padded to buckets: this graph then runs only
    # past them, and compiling torch.compile's default for it would cost every padded model one more compile
    churn = Churn(gm, example_inputs, cache, positions, graph_report, settings, _plain_compile,
                  enabled=not state.padded)

    def run(*args):
        if churn.plain_now:
            return churn.plain(*args)
        out = step(*args)
        churn.observe(args)
        return out

    run._gnn_io_cache = cache
    run._gnn_io_churn = churn
    return run


def _plain_compile(gm, example_inputs, settings: config.Snapshot, static_inputs=None, split_passes=None,
                   records=None) -> tuple:
    """``(compiled, None)``: Dynamo's graph compiled as ``torch.compile``'s default compiles it, forward and backward
    both now; or ``(None, why)`` where Inductor could not (an exception, or a failure that
    :func:`_guarded_inner_compile` would have turned into an op-by-op graph), so the caller can pick what runs
    instead (the rewritten graph, or Dynamo's graph in eager mode). Nothing of this compile lands in a graph's
    report; ``records`` (a list) gets its passes' records. ``split_passes``: :func:`inductor_compile`'s.
    ``GNN_IO_STRICT=1`` re-raises."""
    scratch = _report.GraphReport(0, [], [])
    try:
        # the backward compiled now too (AOTAutograd otherwise lowers it at the first backward, where a failure
        # could no longer fall back to the rewritten graph)
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            compiled = inductor_compile(gm, list(example_inputs), scratch, static_inputs, inductor_tiles=True,
                                        split_passes=split_passes)
    except Exception as exc:  # noqa: BLE001  (the rewritten graph still runs)
        if settings["strict"]:
            raise
        return None, f"{type(exc).__name__}: {first_line(exc)[:160]}"
    if records is not None:
        records.extend(scratch.passes)
    if scratch.near_misses:  # the guarded compile's fallback, which the caller replaces
        return None, scratch.near_misses[0].reason.replace(OP_BY_OP, "")
    return compiled, None
