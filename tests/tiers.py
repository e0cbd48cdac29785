"""The ``slow`` tier of a parametrized test: ``tiered(cases, keep)`` keeps the cases in ``keep`` in the default tier
and marks the others ``slow`` (run with ``--slow``: on the GPU machine and before a release). ``keep`` names the
smallest set that still exercises every behaviour (one case per kernel family and variant)."""
import pytest


def tiered(cases, keep) -> list:
    kept = list(keep)
    out = []
    for case in cases:
        values = case.values if hasattr(case, "values") else (case if isinstance(case, tuple) else (case,))
        key = values if isinstance(case, tuple) or len(values) > 1 else values[0]
        if key in kept:
            out.append(case)
        else:
            marks = list(getattr(case, "marks", ())) + [pytest.mark.slow]
            out.append(pytest.param(*values, marks=marks, id=getattr(case, "id", None)))
    return out
