"""The test tiers' shared names. ``tiered(cases, keep)`` keeps the cases in ``keep`` in the default tier and marks
the others ``slow`` (run with ``--slow``: on the GPU machine and before a release); ``keep`` names the smallest set
that still exercises every behaviour (one case per kernel family and variant). ``runs_kernel`` marks a test of the
Triton kernels (the ``triton`` tier: on the GPU, or on the CPU under the interpreter, ``INTERPRETED``), which runs
them on ``KERNEL_DEVICE``."""
import itertools
import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


def _values(case) -> tuple:
    """A case's values: a ``pytest.param``'s, a tuple's own, or the one value (a dict among them)."""
    if isinstance(case, type(pytest.param(None))):
        return case.values
    return case if isinstance(case, tuple) else (case,)


def tiered(cases, keep) -> list:
    kept = list(keep)
    out = []
    for case in cases:
        values = _values(case)
        key = values if isinstance(case, tuple) or len(values) > 1 else values[0]
        out.append(case if key in kept else _slow(case))
    return out


def _slow(case):
    """``case`` marked ``slow``, its own marks and id kept."""
    return pytest.param(*_values(case), marks=list(getattr(case, "marks", ())) + [pytest.mark.slow],
                        id=getattr(case, "id", None))


def covering(*axes) -> list:
    """Every combination of ``axes`` (lists of values, as stacked ``parametrize`` decorators would give), as tuples
    for one ``parametrize`` over their names, with the default tier keeping a covering set: case ``i`` takes value
    ``i % len(axis)`` of each axis, for ``i`` up to the longest axis, so that each value of each axis runs at least
    once; the other combinations are ``slow``."""
    combos = list(itertools.product(*axes))
    keep = [tuple(axis[i % len(axis)] for axis in axes) for i in range(max(len(axis) for axis in axes))]
    return tiered(combos, keep)


def tiered_at(cases, positions) -> list:
    """:func:`tiered` for cases whose values cannot name them (lambdas, modules): the cases at ``positions`` stay in
    the default tier."""
    return [case if i in positions else _slow(case) for i, case in enumerate(cases)]
