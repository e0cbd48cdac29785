"""The degree split of the fused gather-scatter kernels, chosen by measurement per device and degree profile.

The kernels (``kernels/gather_scatter_triton.py``) cut every row longer than ``max_edges`` into work
items whose partial results meet through atomics; shorter rows run whole on one program. A low threshold
spreads hubs over more programs (more atomics, more items); a high one leaves long programs in the tail of
the launch. Which wins depends on the device (its number of SMs and atomic throughput) and on the degree
profile, so on CUDA the threshold is measured once per (device, profile) and cached:

- the candidates are the powers of two from ``MIN_MAX_EDGES`` to ``MAX_MAX_EDGES``; those at or above the
  graph's largest degree cut nothing, so only the smallest of them is kept;
- each candidate's work items are built and a probe kernel is timed on them: the fused kernel of the
  identity message (``x_j``, summed) over ``PROBE_FEATURES`` float32 features, the bandwidth-bound walk every
  message shares (median of ``PROBE_REPS`` runs after a warm-up, CUDA events);
- the fastest wins. The profile key is the device name with the base-2 logarithms of the row count, the mean
  degree (half steps) and the largest degree, rounded: graphs that share it share the choice.

Picks persist in ``split_thresholds.json`` in the kernel cache folder (``codegen.cache_dir()``), so a new
process on the same device does not measure again. Off CUDA (CPU reference, Triton's interpreter) and where
no row is longer than ``MIN_MAX_EDGES`` nothing is measured and the rule of :func:`rule_threshold` holds.
``GNN_IO_GS_MAX_EDGES`` forces a threshold; ``GNN_IO_GS_SPLIT=rule`` turns the measurement off.
"""
from __future__ import annotations

import json
import math
import os
import statistics

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.runtime.launch import next_power_of_2

MIN_MAX_EDGES = 32     # the split threshold is at least this; the padded item count is sized with it
MAX_MAX_EDGES = 1024
PROBE_FEATURES = 128
PROBE_REPS = 5
SPLIT_ENV = config.SETTINGS["gs_split"].env  # "measure" (default on CUDA) or "rule"
OVERRIDE_ENV = config.SETTINGS["gs_max_edges"].env
CACHE_FILE = "split_thresholds.json"

_PICKS: dict = {}      # profile key -> {"max_edges", "source", "probe_ms"}
_DISK_LOADED = False


def rule_threshold(mean_degree: float) -> int:
    """8 times the mean degree rounded up to a power of two, clamped to [``MIN_MAX_EDGES``,
    ``MAX_MAX_EDGES``]: rows up to a few times the mean degree stay whole, hubs are cut into items of a
    length that bounds every program's work."""
    return min(MAX_MAX_EDGES, max(MIN_MAX_EDGES, next_power_of_2(max(1, math.ceil(8 * mean_degree)))))


def candidates(max_degree: int) -> list:
    """Powers of two in [``MIN_MAX_EDGES``, ``MAX_MAX_EDGES``], cut at the first that splits nothing."""
    out, t = [], MIN_MAX_EDGES
    while t <= MAX_MAX_EDGES:
        out.append(t)
        if t >= max_degree:
            break
        t *= 2
    return out


def profile_key(rowptr: Tensor, max_degree: int) -> str:
    rows = max(1, rowptr.numel() - 1)
    mean = max(int(rowptr[-1]), 1) / rows
    device = torch.cuda.get_device_name(rowptr.device) if rowptr.is_cuda else rowptr.device.type
    return (f"{device}|rows2^{round(math.log2(rows))}|mean2^{round(2 * math.log2(mean)) / 2}"
            f"|max2^{round(math.log2(max(max_degree, 1)))}")


def _cache_path() -> str:
    from gnn_inductor.kernels.gather_scatter import codegen

    return os.path.join(codegen.cache_dir(), CACHE_FILE)


def _load_disk() -> None:
    global _DISK_LOADED
    if _DISK_LOADED:
        return
    _DISK_LOADED = True
    try:
        with open(_cache_path()) as handle:
            for key, pick in json.load(handle).items():
                _PICKS.setdefault(key, dict(pick, source="measured (cached)"))
    except (OSError, ValueError):
        pass


def _save_disk() -> None:
    path = _cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        stored = {k: {"max_edges": v["max_edges"], "probe_ms": v.get("probe_ms")}
                  for k, v in _PICKS.items() if v["source"].startswith("measured")}
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            json.dump(stored, handle, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache folder costs a measurement per process, nothing else


def _probe_ms(rowptr: Tensor, col: Tensor, max_edges: int, x: Tensor) -> float:
    """Median time of the identity-message sum kernel on the work items of ``max_edges``."""
    from gnn_inductor.kernels.gather_scatter import fused as gs
    from gnn_inductor.kernels.runtime.roles import ROLE_SRC
    from gnn_inductor.plan.work_items import work_items

    w = work_items(rowptr, max_edges)
    items = (w.row, w.start, w.end, w.shared)
    plan = gs.Plan(rowptr, col, col, col, rowptr, col, col, items, items)  # the forward walk reads rowptr/col/items
    key = _identity_key()

    def run():
        gs.forward([x], [ROLE_SRC], plan, key, "sum")

    run()
    times = []
    for _ in range(PROBE_REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


_IDENTITY = []


def _identity_key() -> str:
    if not _IDENTITY:
        from gnn_inductor.kernels.runtime import edge_functions

        _IDENTITY.append(edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j)))
    return _IDENTITY[0]


def _measures(rowptr: Tensor) -> bool:
    """Whether the probe can run: compiled kernels on a CUDA device (not Triton's interpreter)."""
    return rowptr.is_cuda and not config.interpreted()


def choose(rowptr: Tensor, col: Tensor) -> dict:
    """``{"max_edges", "source", "probe_ms"?, "key"?}``: the split threshold for this CSR and how it was
    chosen (``env``, ``rule``, ``no hubs``, ``measured``, ``measured (cached)``, or ``rule (probe failed: ...)``)."""
    override = config.get("gs_max_edges")
    if override:
        return {"max_edges": max(MIN_MAX_EDGES, override), "source": "env"}
    num_rows = max(1, rowptr.numel() - 1)
    rule = rule_threshold(int(rowptr[-1]) / num_rows)
    if not _measures(rowptr) or config.get("gs_split") == "rule":
        return {"max_edges": rule, "source": "rule"}
    max_degree = int((rowptr[1:] - rowptr[:-1]).max()) if rowptr.numel() > 1 else 0
    if max_degree <= MIN_MAX_EDGES:
        return {"max_edges": rule, "source": "no hubs"}
    key = profile_key(rowptr, max_degree)
    _load_disk()
    if key not in _PICKS and col.numel() != int(rowptr[-1]):  # no neighbours to probe with (a report's query)
        return {"max_edges": rule, "source": "rule (not measured)"}
    if key not in _PICKS:
        try:
            num_src = int(col.max()) + 1 if col.numel() else 1
            x = torch.randn(num_src, PROBE_FEATURES, device=rowptr.device)
            probe = {t: round(_probe_ms(rowptr, col, t, x), 4) for t in candidates(max_degree)}
            del x
            best = min(probe, key=probe.get)
            _PICKS[key] = {"max_edges": best, "source": "measured", "probe_ms": probe}
            _save_disk()
        except Exception as exc:  # a failed probe must not fail the plan: the rule still gives a valid split
            return {"max_edges": rule, "source": f"rule (probe failed: {type(exc).__name__})"}
    return dict(_PICKS[key], key=key)


def clear() -> None:
    """Forget the picks of this process (the file on disk stays)."""
    global _DISK_LOADED
    _PICKS.clear()
    _DISK_LOADED = False
