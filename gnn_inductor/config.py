"""Every setting of the ``gnn_io`` backend, declared once: its Python name, type, default, allowed values,
environment variable, one-line doc, and whether users may set it (``public``).

A setting resolves, each time it is read, to the first of:

1. an active override: :class:`patch` (tests, ``torch.compile(..., options=...)``), or an :class:`applied`
   :class:`Snapshot`;
2. its environment variable (``GNN_IO_PLAN_CHECK`` for ``plan_check``), parsed and checked here;
3. its default.

Reads are cheap (a few dict lookups and ``os.environ.get``; a parsed value is cached by its raw string). The backend
takes one :func:`snapshot` of every setting at the start of each compile, hands it to its passes, and applies it
around the compile and around every call of the compiled forward and backward: a compiled model keeps the values
of its compile (a variable changed later does not reach it, nor a forward and its backward apart), and the kernels'
own reads inside it see them too. Outside compiled code (the ops called eagerly) a read sees the environment of the
moment.

Overrides are process-wide, as the environment variables they override are: a lock guards the stack of active
patches, each :class:`patch` removes its own entry on exit (patches of different threads may exit in any order),
and a read takes the merged overrides without the lock. So the threads that run the backend's work for the caller
see its patches: the autograd engine's device threads (a CUDA backward) and the worker thread on which
kernels/runtime/cuda_graphs.py's ``outside_graph_pool`` builds per-plan caches. Two threads running under different patches at
once see both, the later-entered one winning per setting.

``python -m gnn_inductor.config`` prints the settings table of docs/usage.md (:func:`markdown_table`). This module
imports nothing from the rest of the package, so every module of it (kernels included) may import it.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SettingError(ValueError):
    """A setting given a value it does not take (an environment variable, a :class:`patch` or a
    ``torch.compile`` option). The backend raises it to the user instead of falling back to Inductor (a misspelt
    setting would otherwise pass unnoticed)."""


@dataclass(frozen=True)
class Setting:
    """One setting. ``kind``: ``bool`` (``0`` / ``1``), ``int`` (from ``minimum``, up to ``maximum``), ``choice``
    (one of ``choices``; ``any_case``: matched ignoring case, read as spelled in ``choices``) or ``path`` (any
    string). ``default`` None: unset, the reader decides (``default_doc`` says how)."""

    name: str
    kind: str
    default: Any
    doc: str
    public: bool = False
    choices: tuple = ()
    minimum: int = 0
    maximum: int | None = None
    any_case: bool = False
    env: str = ""  # GNN_IO_ + the upper-case name unless given
    default_doc: str = ""  # the table's default where ``default`` alone does not say it
    more: str = ""  # where the docs explain it

    def __post_init__(self):
        if not self.env:
            object.__setattr__(self, "env", "GNN_IO_" + self.name.upper())

    def allowed(self) -> str:
        """The values it takes, as an error message and the docs table say them."""
        if self.kind == "bool":
            return "0 or 1"
        if self.kind == "int":
            if self.maximum is not None:
                return f"an integer from {self.minimum} to {self.maximum}"
            return "a non-negative integer" if self.minimum == 0 else f"an integer of at least {self.minimum}"
        if self.kind == "choice":
            if len(self.choices) == 2:
                return "one of " + ", ".join(self.choices)
            return "one of " + ", ".join(self.choices[:-1]) + " or " + self.choices[-1]
        return "a path"

    def _invalid(self, label: str, value) -> SettingError:
        return SettingError(f"{label}={value!r}: set it to {self.allowed()} (or leave it unset)")

    def parse(self, raw: str, label: str | None = None):
        """The value of the string ``raw`` (an environment variable's); blank is the default. ``label`` names the
        source in the error (the environment variable unless given)."""
        label = label or self.env
        text = raw.strip()
        if not text:
            return self.default
        if self.kind == "bool":
            if text not in ("0", "1"):
                raise self._invalid(label, raw)
            return text == "1"
        if self.kind == "int":
            try:
                number = int(text)
            except ValueError:
                raise self._invalid(label, raw) from None
            return self.check_int(number, label, raw)
        if self.kind == "choice":
            if self.any_case:
                text = next((c for c in self.choices if c.lower() == text.lower()), text)
            if text not in self.choices:
                raise self._invalid(label, raw)
            return text
        return text

    def check_int(self, number: int, label: str, raw) -> int:
        if number < self.minimum or (self.maximum is not None and number > self.maximum):
            raise self._invalid(label, raw)
        return number

    def coerce(self, value):
        """A Python value given to :class:`patch` (or as a ``torch.compile`` option), checked as the environment
        variable is: a string is parsed as one; a bool for a ``bool``, an int for an ``int``, a path-like for a
        ``path``. None or a blank string: the default, the environment variable ignored."""
        label = f"{self.name} ({self.env})"
        if value is None or isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str):
            return self.parse(value, label)
        if self.kind == "bool" and isinstance(value, bool):
            return value
        if self.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return self.check_int(value, label, value)
        if self.kind == "path" and isinstance(value, os.PathLike):
            return os.fspath(value)
        raise self._invalid(label, value)


_DECLARED = (
    # public: users may set these (environment variables, or torch.compile(..., options={name: value}))
    Setting("report", "path", None, "path of a JSON rewrite report, rewritten after each compile and each plan's "
            "first build", public=True, more='this page, "The report"'),
    Setting("strict", "bool", False, "`1`: raise instead of falling back to Inductor (the project's tests)",
            public=True, more="this page"),
    Setting("plan_check", "choice", "auto", "which reuses of a graph plan first compare the structure tensors' "
            "fingerprint with the build's: `auto` CPU graphs, `fingerprint` all, `version` none",
            public=True, choices=("auto", "fingerprint", "version"), more='this page, "Editing a graph in place"'),
    Setting("cuda_graphs", "bool", False, "`1`: compile with Inductor's CUDA graph trees (what "
            "`mode=\"reduce-overhead\"` sets); the edge thresholds are then off unless set",
            public=True, env="GNN_IO_CUDAGRAPHS", more="this page"),
    Setting("force", "bool", False, "`1`: take every rewrite the cost model would decline (small graphs on CUDA, "
            "the CPU)", public=True, more="kernel_selection.md"),
    Setting("cpu_rewrite", "bool", False, "`1`: take the rewrites on the CPU too (the ops' references)",
            public=True, more="kernel_selection.md"),
    Setting("churn", "choice", "auto", "mini-batch switch to `torch.compile`'s code once most calls build a new plan "
            "(`off` keeps the rewrites)", public=True, choices=("auto", "on", "off"), any_case=True,
            more='this page, "Mini-batch training"'),
    Setting("buckets", "choice", "auto", "mini-batches padded to a few fixed sizes, compiled once per size: `auto` "
            "under CUDA graphs (`mode=\"reduce-overhead\"`) on CUDA, `on` everywhere, `off`", public=True,
            choices=("auto", "on", "off"), any_case=True, more='this page, "Mini-batch training"'),
    Setting("churn_edges", "int", 1_000_000, "the largest graph (edges) the mini-batch switch applies to",
            public=True, more='this page, "Mini-batch training"'),
    Setting("spmm_min_edges", "int", 2_000_000, "the cost model's edge threshold for SpMM rewrites on CUDA",
            public=True, more="kernel_selection.md"),
    Setting("gs_min_edges", "int", 1_000_000, "the cost model's edge threshold for fused gather-scatter rewrites "
            "on CUDA", public=True, more="kernel_selection.md"),
    Setting("attention_min_edges", "int", None, "one edge threshold for every case of fused attention the cost "
            "model declines on CUDA", public=True, default_doc="per family and precision",
            more="kernel_selection.md"),
    Setting("aot_cache", "choice", "auto", "AOTAutograd's cache for the backend's graphs (a warm start skips the "
            "joint trace and the passes after it): `auto` where the compile's settings are the environment's (no "
            "`options`, no patch) and CUDA graphs are off, `off`", public=True, choices=("auto", "off"),
            any_case=True, more='this page, "Warm starts"'),
    Setting("logs", "choice", None, "log level of the `gnn_inductor` logger, applied at a compile where it changed "
            "(`info`: a line per compiled graph and the plan build's slow steps; `debug`: the details)", public=True,
            choices=("debug", "info", "warning", "error"), any_case=True, default_doc="unset (the logging setup's)",
            more='this page, "Logging"'),
    # internal: tuning knobs, to compare, force or debug a path; their defaults are the measured choices
    Setting("inductor_max_tiles", "int", 2, "Inductor's `triton.max_tiles` for the graphs the backend rewrites (3 "
            "crashed GATConv); a graph left to Inductor whole keeps Inductor's own unless this is set",
            minimum=1, maximum=3, more="architecture.md"),
    Setting("inductor_pointwise_autotune", "bool", None, "`0`: Inductor's pointwise kernels take their one heuristic "
            "launch configuration instead of timing several at their first call; that timing allocates an L2-sized "
            "buffer (60 MB on the H200) inside the CUDA graphs' pool, which set the peak of small steps",
            default_doc="`0` under CUDA graphs unless `inductor_max_autotune`, else Inductor's (`1`)",
            more="benchmarks/minibatch.md"),
    Setting("inductor_max_autotune", "bool", False, "`1`: Inductor's `max_autotune` and `coordinate_descent_tuning` "
            "for the graphs the backend compiles (what `mode=\"max-autotune\"` sets)", more="this page"),
    Setting("fp32_gemm", "choice", "x3", "float32 GEMMs: `x3` by the 3xTF32 Triton kernels where they pay, "
            "`cublas` cuBLAS only", choices=("x3", "cublas"), more="dense.md"),
    Setting("segment_matmul", "choice", "triton", "`HeteroLinear`'s products (HGTConv's maps) on CUDA: `triton`, "
            "one kernel for every segment (HGTConv mini-batch step 13.1 against 21.2 ms, H200), or `loop`, a GEMM "
            "per segment (PyG's products to the bit)", choices=("loop", "triton"), more="dense.md"),
    Setting("fp32_tall_log2", "int", None, "sets the tall 3xTF32 GEMM threshold to `2**value` multiply-adds (a "
            "measurement knob)", minimum=20, maximum=40, default_doc="measured", more="dense.md"),
    Setting("spmm", "choice", "cusparse", "the CUDA SpMM binding", choices=("cusparse", "torch_sparse", "triton"),
            more="spmm_binding.md"),
    Setting("spmm_path", "choice", "auto", "SpMM on CUDA: block-sparse where it measured faster (`auto`), or "
            "forced", choices=("auto", "cusparse", "block"), any_case=True, more="kernel_selection.md"),
    Setting("cusparse_alg", "choice", None, "forces cuSPARSE's SpMM algorithm",
            choices=("CSR_ALG1", "CSR_ALG2", "CSR_ALG3"), default_doc="measured", more="spmm_binding.md"),
    Setting("gs_split", "choice", "measure", "degree split of the reduction kernels: measured on the device, or by "
            "rule", choices=("measure", "rule"), more="reductions.md"),
    Setting("gs_max_edges", "int", None, "a fixed item size for the reduction kernels' degree split (0: unset)",
            default_doc="measured", more="reductions.md"),
    Setting("gs_light_rows", "bool", None, "`1` / `0`: the forward's light items through the rows kernel (several "
            "rows per program) at any size / never", default_doc="from 2^19 work items", more="reductions.md"),
    Setting("gs_light_launch", "choice", "auto", "reduction kernels: light items in a launch of their own (`auto`: "
            "the forward from 2^19 work items or under CUDA graphs)", choices=("auto", "forward", "both", "off"),
            more="reductions.md"),
    Setting("triton_on_cpu", "bool", False, "`1`: the Triton kernels on CPU tensors under Triton's interpreter "
            "(`TRITON_INTERPRET=1`; the tests)", more="reductions.md"),
    Setting("kernel_cache", "path", None, "where generated kernels are written", default_doc="a per-user temp folder",
            more="reductions.md"),
    Setting("attention_path", "choice", "auto", "fused attention on CUDA: CSR, block-sparse or hybrid (`auto`: the "
            "cost model, then a timing)", choices=("auto", "csr", "block", "hybrid"), any_case=True,
            more="kernel_selection.md"),
    Setting("reorder", "choice", "auto", "the node order of the attention kernels (`partition` needs pymetis)",
            choices=("auto", "off", "none", "degree", "rcm", "partition"), any_case=True, more="reordering.md"),
    Setting("expected_calls", "int", 1000, "calls a node order must pay its build back over", more="reordering.md"),
    Setting("calibration", "choice", "auto", "the attention path cost model's table: by the GPU's name, or forced",
            choices=("auto", "H100", "H200"), any_case=True, more="kernel_selection.md"),
    Setting("attention_backward", "choice", "auto", "attention backward variant (`mass`: GATConv's dst score terms "
            "from the forward)",
            choices=("auto", "split", "atomic", "one_pass_segment", "mass"), more="attention.md"),
    Setting("attention_heads", "choice", None, "heads per program of the CSR attention kernels",
            choices=("per_head", "all"), default_doc="`all` (the atomic backward: `per_head`)", more="attention.md"),
    Setting("src_maxnreg", "int", None, "a register cap for the attention backward's src pass (0: none)",
            default_doc="no cap", more="attention.md"),
    Setting("attention_bias", "bool", True, "`0`: keep the bias add outside the attention op", more="attention.md"),
    Setting("group_relations", "bool", True, "one SpMM over a typed CSR for the relations of a layer (RGCNConv, "
            "HeteroConv, `to_hetero`), their linear maps first where they do not widen the features",
            more="architecture.md"),
    Setting("relation_segments", "bool", True, "in a padded mini-batch bucket, the relations of a layer (RGCNConv) "
            "as one product per edge, the edges sorted by relation on the device, instead of a GEMM per relation "
            "over every node", more="architecture.md"),
    Setting("fuse_linears", "choice", "1", "one GEMM for the linear maps of a shared input (`all`: the short-lived "
            "ones too)", choices=("0", "1", "all"), more="architecture.md"),
    Setting("fuse_min_group", "int", None, "the least number of maps fused into one GEMM", minimum=2,
            default_doc="measured", more="architecture.md"),
    Setting("gather_linear", "bool", True, "GEMMs of gathered rows moved before their gathers",
            more="architecture.md"),
    Setting("gemm_accumulate", "bool", True, "a GEMM plus a fresh tensor summed in that tensor's memory",
            more="architecture.md"),
    Setting("packed_grads", "bool", True, "attention gradients into the fused linear map's packed gradient",
            more="attention.md"),
    Setting("projected_grads", "bool", True, "that map's gradients from the packed one, by blocks of rows",
            more="attention.md"),
    Setting("score_fold", "bool", True, "GATConv's attention scores from its GEMM's kernel "
            "(`gnn_io::linear_scores`); `0`: Inductor's reductions", more="dense.md, architecture.md"),
    Setting("grad_chunk_kb", "int", 256 << 10, "KiB per block of rows of the projected gradients (0: one block)",
            more="attention.md"),
    Setting("grad_whole_kb", "int", 768 << 10, "a gradient under this many KiB, of a graph under 2^19 nodes, is one "
            "block (0 by default once `grad_chunk_kb` is set)", more="attention.md"),
    Setting("grad_chunk_streams", "bool", True, "a block's two passes on two CUDA streams", more="attention.md"),
    Setting("direct_ops", "bool", True, "compiled graphs call the gnn_io ops without the dispatcher",
            more="architecture.md"),
    Setting("fast_launch", "bool", True, "kernels launch without Triton's JIT path (always through it under the "
            "interpreter)", more="architecture.md"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}

_MISSING = object()
_PARSED: dict = {}  # (name, raw string) -> value
_LOCK = threading.Lock()
_FRAMES: list = []  # (token, {name: value}, names given) of the active overrides, in the order they were entered
_OVERRIDES: dict = {}  # their merge, replaced (never changed) under _LOCK, so a read needs no lock
_GIVEN: frozenset = frozenset()  # the merged names that count as set (:func:`is_set`), replaced with it


def get(name: str):
    """The value of setting ``name``: an active :class:`patch`, else its environment variable, else its default.
    :class:`SettingError` naming the variable when it holds a value the setting does not take."""
    value = _OVERRIDES.get(name, _MISSING)
    setting = SETTINGS[name]
    if value is not _MISSING:
        return setting.default if value is None else value
    raw = os.environ.get(setting.env)
    if raw is None:
        return setting.default
    key = (name, raw)
    value = _PARSED.get(key, _MISSING)
    if value is _MISSING:
        value = _PARSED[key] = setting.parse(raw)
    return value


def is_set(name: str) -> bool:
    """Whether setting ``name`` is given (an active :class:`patch`, or a non-blank environment variable) rather
    than left to its default."""
    if name in _OVERRIDES:
        return name in _GIVEN
    return bool(os.environ.get(SETTINGS[name].env, "").strip())


def patched() -> bool:
    """Whether a :class:`patch` (or :class:`applied`) is active, so that a setting may read other than the
    environment says."""
    return bool(_OVERRIDES)


def default(name: str):
    return SETTINGS[name].default


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``, Triton's own variable, not a
    setting of the backend: the tests set it to run the kernels on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _unknown(names, valid, what: str) -> SettingError:
    return SettingError(f"unknown {what} {', '.join(sorted(names))}: the {what}s are {', '.join(valid)}")


def _checked(settings: dict) -> dict:
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown:
        raise _unknown(unknown, SETTINGS, "setting")
    return {name: SETTINGS[name].coerce(value) for name, value in settings.items()}


class patch(contextlib.ContextDecorator):
    """``with config.patch(plan_check="version"):`` or ``@config.patch(cuda_graphs=True)``: these settings win over
    their environment variables until the block or call ends; patches nest, the innermost winning. The values are
    checked when the patch is made (:meth:`Setting.coerce`); None restores the default."""

    def __init__(self, **settings):
        self.settings = _checked(settings)
        self._given = frozenset(name for name, value in self.settings.items() if value is not None)
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(_push(self.settings, self._given))
        return self

    def __exit__(self, *exc_info) -> bool:
        _pop(self._tokens.pop())
        return False


def _push(values: dict, given: frozenset):
    token = object()
    with _LOCK:
        _FRAMES.append((token, values, given))
        _merge()
    return token


def _pop(token) -> None:
    with _LOCK:
        _FRAMES[:] = [frame for frame in _FRAMES if frame[0] is not token]
        _merge()


def _merge() -> None:
    global _OVERRIDES, _GIVEN
    if len(_FRAMES) == 1:  # the common case (one applied snapshot): its own mappings, no copy
        _, _OVERRIDES, _GIVEN = _FRAMES[0]
        return
    merged: dict = {}
    given: set = set()
    for _, values, names in _FRAMES:
        merged.update(values)
        given.difference_update(values)
        given.update(names)
    _OVERRIDES, _GIVEN = merged, frozenset(given)


class Snapshot(Mapping):
    """Every setting's value at one moment (:func:`snapshot`), immutable: ``snapshot["plan_check"]``, and
    :meth:`is_set` as :func:`is_set` answered then. The backend takes one per compile and hands it to its passes."""

    def __init__(self, values: dict, given: frozenset):
        self._values, self._given = dict(values), frozenset(given)

    def __getitem__(self, name: str):
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Snapshot({self._values!r})"

    def is_set(self, name: str) -> bool:
        """Whether setting ``name`` was given (a patch or the environment) rather than left to its default."""
        SETTINGS[name]  # noqa: B018  (a KeyError for an unknown name, as get's)
        return name in self._given


def snapshot() -> Snapshot:
    """The value of every setting now (:func:`get` of each: an active override, else its environment variable,
    else its default). :class:`SettingError` for any variable holding a value its setting does not take."""
    return Snapshot({name: get(name) for name in SETTINGS}, frozenset(name for name in SETTINGS if is_set(name)))


class applied:
    """``with config.applied(snapshot):``: every setting reads as in ``snapshot`` until the block ends, whatever the
    environment says (:func:`is_set` too). Nests with :class:`patch` as one more override."""

    __slots__ = ("snapshot", "_tokens")

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(_push(self.snapshot._values, self.snapshot._given))
        return self

    def __exit__(self, *exc_info) -> bool:
        _pop(self._tokens.pop())
        return False


# torch.compile's modes for the backend, as settings. "max-autotune" is Inductor's mode on top of the backend's
# kernels: CUDA graphs as "reduce-overhead" and Inductor's own autotuning (max_autotune, coordinate_descent_tuning)
# for what Inductor compiles; "max-autotune-no-cudagraphs" the autotuning alone. The backend's own kernels keep their
# measured launch rules under every mode.
MODES = {
    "default": {},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"cuda_graphs": True, "inductor_max_autotune": True},
    "max-autotune-no-cudagraphs": {"inductor_max_autotune": True},
}


def compile_settings(mode: str | None = None, options: dict | None = None) -> dict:
    """The checked settings of ``torch.compile(model, backend="gnn_io", mode=mode, options=options)``: the mode's
    (:data:`MODES`), then ``options``, whose keys are the public settings' names. Empty for neither."""
    if mode is not None and mode not in MODES:
        raise SettingError(f"mode={mode!r}: the gnn_io backend's modes are {', '.join(MODES)}")
    options = dict(options or {})
    public = [name for name, setting in SETTINGS.items() if setting.public]
    unknown = [name for name in options if name not in public]
    if unknown:
        raise _unknown(unknown, public, "option")
    return _checked({**MODES.get(mode or "default"), **options})


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The settings table of docs/usage.md: the public settings first, then the internal ones."""
    lines = ["| setting | variable | public | default | values | what it does | more |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for public in (True, False):
        for s in _DECLARED:
            if s.public != public:
                continue
            if s.default_doc:
                shown = s.default_doc
            elif s.default is None:
                shown = "unset"
            elif s.kind == "bool":
                shown = f"`{int(s.default)}`"
            elif s.kind == "int":
                shown = f"{s.default:,}"
            else:
                shown = f"`{s.default}`"
            values = (" ".join(f"`{c}`" for c in s.choices) if s.kind == "choice"
                      else "`0` `1`" if s.kind == "bool" else s.allowed())
            lines.append(f"| `{s.name}` | `{s.env}` | {'yes' if public else 'no'} | {shown} | {values} | "
                         f"{_cell(s.doc)} | {s.more} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
