"""Per-graph state and CUDA graphs: building what a plan keeps outside a CUDA-graph pool, and knowing when a capture
is running."""
from __future__ import annotations

import threading

import torch

from gnn_inductor import config


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
