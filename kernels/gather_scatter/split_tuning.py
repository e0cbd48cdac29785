"""The degree split of the fused gather-scatter kernels, chosen by measurement per device and degree profile.

The kernels (``fused.py``) cut every row longer than ``max_edges`` into work
items whose partial results meet through atomics; shorter rows run whole on one program. A low threshold
spreads hubs over more programs (more atomics, more items); a high one leaves long programs in the tail of
the launch. Which wins depends on the device (its number of SMs and atomic throughput) and on the degree
profile, so on CUDA the threshold is measured once per (device, profile) and cached:

- the candidates are the powers of two from ``MIN_MAX_EDGES`` to ``MAX_MAX_EDGES``; those at or above the
  graph's largest degree cut nothing, so only the smallest of them is kept;
- each candidate's work items are built and a probe kernel is timed on them: the fused kernel of the
  identity message (``x_j``, summed) over ``PROBE_FEATURES`` float32 features, the bandwidth-bound walk every
  message shares (median of ``PROBE_REPS`` runs after a warm-up, CUDA events). The driver side passes the probe
  (``fused.probe_ms``) to :func:`choose`, so this module needs no kernel;
- the fastest wins. The profile key is the device name with the base-2 logarithms of the row count, the mean
  degree (half steps) and the largest degree, rounded: graphs that share it share the choice.

Picks are a tuning cache per device and profile, not per-graph state: :data:`PICKS` (a :class:`SplitPicks`) keeps
them for the process and in ``split_thresholds.json`` in the kernel cache folder (``codegen.cache_dir()``), so a
new process on the same device does not measure again. Off CUDA (CPU reference, Triton's interpreter) and where
no row is longer than ``MIN_MAX_EDGES`` nothing is measured and the rule of :func:`rule_threshold` holds.
``GNN_IO_GS_MAX_EDGES`` forces a threshold; ``GNN_IO_GS_SPLIT=rule`` turns the measurement off.
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Callable

import torch
from torch import Tensor

from gnn_inductor import config
from gnn_inductor.kernels.gather_scatter import codegen
from gnn_inductor.kernels.runtime import progress
from gnn_inductor.kernels.runtime.launch import INTERPRETED, next_power_of_2

log = logging.getLogger(__name__)
MIN_MAX_EDGES = 32     # the split threshold is at least this; the padded item count is sized with it
MAX_MAX_EDGES = 1024
PROBE_FEATURES = 128
PROBE_REPS = 5
SPLIT_ENV = config.SETTINGS["gs_split"].env  # "measure" (default on CUDA) or "rule"
OVERRIDE_ENV = config.SETTINGS["gs_max_edges"].env
CACHE_FILE = "split_thresholds.json"


class SplitPicks:
    """The measured picks of this process, per profile key (:func:`profile_key`: a device and a degree profile,
    shared by every graph that has it; no per-graph state), backed by ``CACHE_FILE`` in the kernel cache folder."""

    def __init__(self):
        self.picks: dict = {}      # profile key -> {"max_edges", "source", "probe_ms"}
        self.loaded = False

    @staticmethod
    def path() -> str:
        return os.path.join(codegen.cache_dir(), CACHE_FILE)

    def load(self) -> None:
        """Read the file once per process (after :meth:`clear`, again); the picks of this process win."""
        if self.loaded:
            return
        self.loaded = True
        try:
            with open(self.path()) as handle:
                for key, pick in json.load(handle).items():
                    self.picks.setdefault(key, dict(pick, source="measured (cached)"))
        except (OSError, ValueError):
            pass

    def save(self) -> None:
        """Write the measured picks to the file (atomically replaced)."""
        path = self.path()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            stored = {k: {"max_edges": v["max_edges"], "probe_ms": v.get("probe_ms")}
                      for k, v in self.picks.items() if v["source"].startswith("measured")}
            partial = f"{path}.{os.getpid()}.tmp"
            with open(partial, "w") as handle:
                json.dump(stored, handle, indent=1, sort_keys=True)
            os.replace(partial, path)
        except OSError:
            pass  # a read-only cache folder costs a measurement per process, nothing else

    def clear(self) -> None:
        """Forget the picks of this process (the file on disk stays; the next :meth:`load` reads it again)."""
        self.picks.clear()
        self.loaded = False


PICKS = SplitPicks()


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


def can_measure(rowptr: Tensor) -> bool:
    """Whether the probe can run: compiled kernels on a CUDA device (not Triton's interpreter)."""
    return rowptr.is_cuda and not INTERPRETED


def choose(rowptr: Tensor, col: Tensor, probe: Callable[[Tensor, Tensor, int, Tensor], float]) -> dict:
    """``{"max_edges", "source", "probe_ms"?, "key"?}``: the split threshold for this CSR and how it was
    chosen (``env``, ``rule``, ``no hubs``, ``measured``, ``measured (cached)``, or ``rule (probe failed: ...)``).
    ``probe(rowptr, col, max_edges, x)`` times the kernels on the work items of ``max_edges`` with the features
    ``x`` (milliseconds; the driver's ``fused.probe_ms``), called once per candidate where a pick is measured."""
    override = config.get("gs_max_edges")
    if override:
        return {"max_edges": max(MIN_MAX_EDGES, override), "source": "env"}
    num_rows = max(1, rowptr.numel() - 1)
    rule = rule_threshold(int(rowptr[-1]) / num_rows)
    if not can_measure(rowptr) or config.get("gs_split") == "rule":
        return {"max_edges": rule, "source": "rule"}
    max_degree = int((rowptr[1:] - rowptr[:-1]).max()) if rowptr.numel() > 1 else 0
    if max_degree <= MIN_MAX_EDGES:
        return {"max_edges": rule, "source": "no hubs"}
    key = profile_key(rowptr, max_degree)
    PICKS.load()
    if key not in PICKS.picks and col.numel() != int(rowptr[-1]):  # no neighbours to probe with (a report's query)
        return {"max_edges": rule, "source": "rule (not measured)"}
    if key not in PICKS.picks:
        try:
            num_src = int(col.max()) + 1 if col.numel() else 1
            x = torch.randn(num_src, PROBE_FEATURES, device=rowptr.device)
            with progress.timed(log, f"gather-scatter: timing the degree splits ({col.numel():,} edges)"):
                probe_ms = {t: round(probe(rowptr, col, t, x), 4) for t in candidates(max_degree)}
            del x
            best = min(probe_ms, key=probe_ms.get)
            PICKS.picks[key] = {"max_edges": best, "source": "measured", "probe_ms": probe_ms}
            PICKS.save()
        except Exception as exc:  # a failed probe must not fail the plan: the rule still gives a valid split
            return {"max_edges": rule, "source": f"rule (probe failed: {type(exc).__name__})"}
    return dict(PICKS.picks[key], key=key)
