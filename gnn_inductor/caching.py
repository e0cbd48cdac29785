"""What lets a second process reuse the backend's compiled graphs through PyTorch's caches (Inductor's FX graph
cache, AOTAutograd's cache): the cache identity of a compiled graph, a key part for the backend's code and
settings, and the compile-worker wait that only a cache miss needs."""
from __future__ import annotations

import contextlib
import functools
import pathlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from gnn_inductor import config, kernels, patterns

# what AOTAutograd reads of an Inductor graph to save it in its cache
CACHE_ATTRIBUTES = ("_fx_graph_cache_key", "_fx_graph_cache_debug_lines", "_time_taken_ns", "guards_expr")


class CacheKey(CustomGraphPass):
    """Inductor's ``post_grad_custom_post_pass`` while the backend compiles: it runs the user's own pass, if any,
    and adds to the FX graph and AOTAutograd cache keys what decides the backend's graphs beyond the graph
    AOTAutograd traces: the backend's code (a change to a pass after the split must not load what the old one
    made) and the compile's settings."""

    def __init__(self, settings: config.Snapshot, inner=None):
        self.settings, self.inner = settings, inner

    def __call__(self, graph) -> None:
        if self.inner is not None:
            self.inner(graph)

    def uuid(self):
        inner = self.inner.uuid() if self.inner is not None else None
        settings = repr(sorted((name, repr(value)) for name, value in self.settings.items()))
        return get_hash_for_files(source_files(), f"{settings}|{inner!r}").hex()


@functools.lru_cache(maxsize=1)
def source_files() -> tuple:
    """The backend's Python sources (gnn_inductor, kernels, patterns), for :class:`CacheKey`."""
    roots = [pathlib.Path(__file__).parent, pathlib.Path(kernels.__file__).parent,
             pathlib.Path(patterns.__file__).parent]
    return tuple(str(p) for root in roots for p in sorted(root.rglob("*.py")))


@contextlib.contextmanager
def workers_on_cache_miss(inductor, example_inputs):
    """While Inductor compiles one CUDA graph: its Triton kernels compile in Inductor's worker processes. Inductor
    compiles in the calling process while its worker pool is still starting (the first compile of a process, or
    the first after a worker died); a Triton crash there aborts the whole process (bf16 GATConv's backward did,
    on the H100), where in a worker it is an exception :func:`gnn_inductor.backend._guarded_inner_compile` catches.

    The wait for the pool happens only on an FX graph cache miss, when Inductor generates code
    (``fx_codegen_and_compile``): a hit loads kernels Triton has compiled before, and waiting there for the pool
    to start cost 1.8-4.7 s of a 2-layer GAT's warm first call on the H200."""
    codegen = getattr(inductor, "fx_codegen_and_compile", None)
    if codegen is None or not any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs):
        yield
        return

    @functools.wraps(codegen)
    def codegen_in_workers(*args, **kwargs):
        try:
            from torch._inductor.async_compile import AsyncCompile

            AsyncCompile.wait_pool_ready(timeout=120)
        except Exception:  # noqa: BLE001,S110  (no pool, e.g. one compile thread: Inductor compiles in process)
            pass
        return codegen(*args, **kwargs)

    inductor.fx_codegen_and_compile = codegen_in_workers
    try:
        yield
    finally:
        inductor.fx_codegen_and_compile = codegen
