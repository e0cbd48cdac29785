"""Shared pieces of the kernel families: argument roles, CSR-ordered gathers, segment reductions.

An *edge function* argument carries a role saying how it reaches an edge ``e = (src -> dst)``:

========== ============================== ==========================================
role       tensor shape                   value seen by edge ``e``
========== ============================== ==========================================
SRC        ``[num_src, *F]``              ``arg[src[e]]``
DST        ``[num_dst, *F]``              ``arg[dst[e]]``
EDGE       ``[num_edges, *F]``            ``arg[e]`` (original edge order)
DENSE      anything broadcastable         ``arg`` (parameters, constants)
========== ============================== ==========================================

Kernels walk edges in CSR order (sorted by destination, stable), given by the plan tensors
``rowptr``, ``col`` (source of each CSR edge), ``row`` (destination of each CSR edge) and
``perm`` (original edge id of each CSR edge).
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.config import SettingError  # noqa: F401  (the tests import it from here)


ROLE_SRC, ROLE_DST, ROLE_EDGE, ROLE_DENSE = 0, 1, 2, 3
ROLE_NAMES = {ROLE_SRC: "src", ROLE_DST: "dst", ROLE_EDGE: "edge", ROLE_DENSE: "dense"}
REDUCTIONS = ("sum", "mean", "max", "min")


def check_reduce(reduce: str) -> None:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")


def edge_values(args, roles, col: Tensor, row: Tensor, perm: Tensor) -> list:
    """Per-edge values of each argument, in CSR order (see the module docstring)."""
    if len(args) != len(roles):
        raise ValueError(f"got {len(args)} arguments but {len(roles)} roles")
    gathered = []
    for arg, role in zip(args, roles):
        if role == ROLE_SRC:
            gathered.append(arg.index_select(0, col))
        elif role == ROLE_DST:
            gathered.append(arg.index_select(0, row))
        elif role == ROLE_EDGE:
            gathered.append(arg.index_select(0, perm))
        elif role == ROLE_DENSE:
            gathered.append(arg)
        else:
            raise ValueError(f"unknown argument role {role}")
    return gathered


def fake_edge_values(args, roles, num_edges) -> list:
    """Fake-mode counterpart of :func:`edge_values`: right shapes, no data."""
    return [a if r == ROLE_DENSE else a.new_empty((num_edges, *a.shape[1:])) for a, r in zip(args, roles)]


_HALF = (torch.float16, torch.bfloat16)


def in_float32(args: list):
    """Half-precision tensors of ``args`` as float32 (the ops accumulate in float32), and the dtype
    to cast the result back to (None when nothing was half precision)."""
    half = next((a.dtype for a in args if isinstance(a, Tensor) and a.dtype in _HALF), None)
    if half is None:
        return list(args), None
    return [a.float() if isinstance(a, Tensor) and a.dtype in _HALF else a for a in args], half


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over many elements of ``dtype`` accumulate in: float64 for float64 (its inputs are exact to
    1e-16 and a float32 sum would cut them to 1e-7), float32 for everything else (half precision included)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# rows per first-stage chunk of :func:`column_sum` (below twice this a single reduction runs)
COLUMN_SUM_CHUNKS = 256


def column_sum(t: Tensor) -> Tensor:
    """``t.sum(0)`` accumulated in :func:`accumulation_dtype` (a bias gradient over every node), in two stages: the
    rows cut into :data:`COLUMN_SUM_CHUNKS` slabs summed in parallel, then the slabs' sums. ATen's single reduction over the
    outer dimension of a ``[2^20, 128]`` tensor ran at 0.31 ms (float32) and 0.25 ms (bf16) on an H200 against
    0.15 and 0.09 for the two stages (``benchmarks/dense_ops.py``), with a smaller error than either ATen's
    reduction or a cuBLAS GEMV against ones. Returns the accumulation dtype, shape ``t.shape[1:]``."""
    rows, acc = t.shape[0], accumulation_dtype(t.dtype)
    if rows < 2 * COLUMN_SUM_CHUNKS:
        return t.sum(0, dtype=acc)
    flat = t.reshape(rows, -1)
    per_chunk = rows // COLUMN_SUM_CHUNKS
    main = COLUMN_SUM_CHUNKS * per_chunk
    total = flat[:main].view(COLUMN_SUM_CHUNKS, per_chunk, -1).sum(1, dtype=acc).sum(0)
    if main < rows:
        total = total + flat[main:].sum(0, dtype=acc)
    return total.view(t.shape[1:])


def segment_reduce(messages: Tensor, row, rowptr: Tensor, reduce: str) -> Tensor:
    """``out[i] = reduce(messages[rowptr[i]:rowptr[i+1]])``; empty rows give 0, as PyG's scatter.

    Ties of max/min share the gradient equally, which is what ``scatter_reduce`` (PyG eager) does.
    """
    num_dst = rowptr.numel() - 1
    if reduce in ("sum", "mean"):
        out = torch.segment_reduce(messages, "sum", offsets=rowptr.long(), axis=0, initial=0)
        if reduce == "mean":
            deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(messages.dtype)
            out = out / deg.view(-1, *([1] * (messages.dim() - 1)))
        return out
    index = row.long().view(-1, *([1] * (messages.dim() - 1))).expand_as(messages)
    base = messages.new_zeros((num_dst, *messages.shape[1:]))
    return base.scatter_reduce(0, index, messages, reduce="a" + reduce, include_self=False)


@contextlib.contextmanager
def _autograd_dispatch():
    """Custom-op implementations run with the autograd dispatch keys excluded; the recompute
    backward needs them back for the duration of its own differentiation."""
    keys = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther)
    before = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in keys]
    try:
        for k in keys:
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)
        yield
    finally:
        for k, excluded in zip(keys, before):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, excluded)


def recompute_grads(reference, args: list, grad_out: Tensor, needs_grad: list) -> list:
    """Gradients of ``reference(*args)`` with respect to the arguments flagged in ``needs_grad``.

    CPU backward of the fused ops: recompute the forward with autograd on and differentiate it.
    Arguments that are not floating point or not flagged get ``None``.
    """
    leaves = []
    for a, need in zip(args, needs_grad):
        if isinstance(a, Tensor) and need and a.is_floating_point():
            leaves.append(a.detach().requires_grad_(True))
        else:
            leaves.append(a)
    wanted = [leaf for leaf, need in zip(leaves, needs_grad) if isinstance(leaf, Tensor) and leaf.requires_grad]
    if not wanted:
        return [None] * len(args)
    with torch.enable_grad(), _autograd_dispatch():
        out = reference(*leaves)
        grads = torch.autograd.grad(out, wanted, grad_out, allow_unused=True)
    it = iter(grads)
    result = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.requires_grad:
            g = next(it)
            result.append(torch.zeros_like(leaf) if g is None else g)
        else:
            result.append(None)
    return result


CAPTURE_REASON = ("first call of this plan inside a CUDA-graph capture (a new edge_index under GNN_IO_CUDAGRAPHS=1): "
                  "no synchronising build or timing can run there; the CSR path runs, not kept")


def capturing(device) -> bool:
    """Whether the calling thread's stream on ``device`` is being captured into a CUDA graph (never on CPU)."""
    return getattr(device, "type", device) == "cuda" and torch.cuda.is_current_stream_capturing()


def kept_outside_graph_pool(cache: dict, key, build, device):
    """``cache[key]``, built by ``build()`` at the first call outside any CUDA-graph pool
    (:func:`outside_graph_pool`) and kept. While the calling thread's stream is being captured into a CUDA graph
    (Inductor's graph trees record a partition whose gnn_io op meets a plan for the first time, as with a new
    ``edge_index``), ``build()`` runs in place and nothing is kept: its tensors are then the graph's own
    intermediates, rebuilt by every replay from the tensors the replay reads. Kept, they would sit in the graph's
    pool untracked (the graph trees refuse that: "tensors in the cudagraph pool not tracked as outputs";
    seen on GATv2Conv and TransformerConv at a new edge_index), and they could not be built outside it
    either: inputs made inside the capture hold no values until it replays."""
    if key in cache:
        return cache[key]
    if capturing(device):
        return build()
    cache[key] = outside_graph_pool(build, device)
    return cache[key]


def outside_graph_pool(build, device):
    """``build()``, with what it allocates kept out of a CUDA-graph memory pool.

    Per-plan caches (block formats, the transposed CSR of the split attention backward, cuSPARSE
    workspaces) are built at an op's first call. Under ``GNN_IO_CUDAGRAPHS=1`` that call is Inductor's
    CUDA-graph warm-up, during which every allocation of the calling thread goes to the graph's private
    pool: a tensor kept there outlives the step and later replays would overwrite it (cudagraph trees
    refuse it: "tensors in the cudagraph pool not tracked as outputs"). The pool takes the calling thread's
    allocations only, so the build runs on a worker thread, on the caller's stream (same order of work),
    and the caller waits for it. Without CUDA graphs, or while a graph is being captured, it runs in place.
    """
    if getattr(device, "type", device) != "cuda" or not config.get("cuda_graphs") or \
            torch.cuda.is_current_stream_capturing():
        return build()
    stream, box = torch.cuda.current_stream(device), {}

    def work():
        try:
            with torch.cuda.device(device), torch.cuda.stream(stream), torch.no_grad():
                box["value"] = build()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = exc

    worker = threading.Thread(target=work, name="gnn_io-plan-build")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
