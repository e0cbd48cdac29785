"""The tests' comparison tolerances all come from ``gnn_inductor.testing.TOLERANCE_TABLE`` (through
``tolerance``): no test writes a number into an ``rtol=``/``atol=`` argument, so every tolerance is one of the
table's documented entries, and the table's helper gives what ``torch.testing.assert_close`` expects."""
import ast
import math
from pathlib import Path

import pytest
import torch

from gnn_inductor.testing import HUB_TERMS, TOLERANCE_TABLE, TOLERANCES, magnitude, tolerance

TESTS = Path(__file__).resolve().parent
TOLERANCE_ARGUMENTS = ("rtol", "atol")


def _numbers_in(node: ast.AST) -> list:
    return [n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)]


def inline_tolerances(path: Path) -> list:
    """``path:line: rtol=...`` for every call argument ``rtol=`` or ``atol=`` whose expression holds a number
    (``rtol=1e-5``, ``atol=4 * atol``, ``atol=1e-5 * max(1.0, ...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in TOLERANCE_ARGUMENTS and _numbers_in(keyword.value):
                    name = path.relative_to(TESTS.parent) if path.is_relative_to(TESTS.parent) else path
                    found.append(f"{name}:{keyword.value.lineno}: "
                                 f"{keyword.arg}={ast.unparse(keyword.value)}")
    return found


def test_no_test_writes_its_own_tolerance():
    """Every ``rtol=``/``atol=`` in tests/ comes from ``tolerance(dtype, kind)`` (or a name bound to it)."""
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in inline_tolerances(path)]
    assert not found, ("inline tolerances; take them from gnn_inductor.testing.tolerance(dtype, kind) and add a "
                       "named, documented TOLERANCE_TABLE entry where none fits:\n" + "\n".join(found))


def test_the_check_finds_inline_tolerances(tmp_path):
    sample = tmp_path / "sample.py"
    text = ("torch.testing.assert_close(a, b, rtol=1e-5, atol=4 * atol)\n"
            "torch.testing.assert_close(a, b, atol=atol * max(1.0, m))\n"
            "torch.testing.assert_close(a, b, **tolerance(torch.float32, scale=magnitude(b)))\n"
            "torch.testing.assert_close(a, b, rtol=rtol, atol=atol * m)\n")
    sample.write_text(text)
    hits = inline_tolerances(sample)
    assert [h.split(": ", 1)[1] for h in hits] == ["rtol=1e-05", "atol=4 * atol", "atol=atol * max(1.0, m)"]


def test_table_entries():
    """Every entry is a pair of finite non-negative numbers; the defaults are the documented standards (float32 at
    1e-5, float64 at 1e-10) and ``TOLERANCES`` is that default row; no named entry is tighter than exact or looser
    than the kernel entry of its dtype."""
    assert TOLERANCE_TABLE["default"][torch.float32] == (1e-5, 1e-5)
    assert TOLERANCE_TABLE["default"][torch.float64] == (1e-10, 1e-10)
    assert TOLERANCES == TOLERANCE_TABLE["default"]
    for kind, entries in TOLERANCE_TABLE.items():
        for dtype, (rtol, atol) in entries.items():
            assert isinstance(dtype, torch.dtype) and dtype.is_floating_point, (kind, dtype)
            assert math.isfinite(rtol) and math.isfinite(atol) and rtol >= 0 and atol >= 0, (kind, dtype)
            if kind not in ("tf32", "hub_sum", "layer"):
                kernel_rtol, kernel_atol = TOLERANCE_TABLE["kernel"][dtype]
                assert rtol <= kernel_rtol and atol <= kernel_atol, (kind, dtype)
    for dtype, (rtol, atol) in TOLERANCE_TABLE["default"].items():
        assert TOLERANCE_TABLE["kernel"][dtype] == (4 * rtol, 4 * atol)


def test_tolerance_helper():
    assert tolerance(torch.float32) == {"rtol": 1e-5, "atol": 1e-5}
    assert tolerance(torch.float64, "reassociated") == {"rtol": 1e-12, "atol": 1e-12}
    assert tolerance(torch.float32, "kernel", scale=3.0) == {"rtol": 4e-5, "atol": pytest.approx(1.2e-4)}
    assert tolerance(torch.bfloat16, "exact") == {"rtol": 0.0, "atol": 0.0}
    with pytest.raises(KeyError, match="no tolerance kind 'loose'"):
        tolerance(torch.float32, "loose")
    with pytest.raises(KeyError, match="no 'tf32' tolerance for torch.float64"):
        tolerance(torch.float64, "tf32")
    with pytest.raises(ValueError, match="scale"):
        tolerance(torch.float32, scale=float("nan"))
    assert magnitude(torch.tensor([0.5, -0.25])) == 1.0 and magnitude(torch.tensor([-3.0, 2.0])) == 3.0
    assert magnitude(torch.empty(0)) == 1.0
    assert HUB_TERMS > 0


def test_tolerance_in_assert_close():
    """``**tolerance(dtype)`` in ``torch.testing.assert_close``: within passes, beyond fails, NaN never passes."""
    expected = torch.linspace(-2, 2, 9, dtype=torch.float32)
    torch.testing.assert_close(expected * (1 + 5e-6), expected, **tolerance(torch.float32))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(expected + 1e-3, expected, **tolerance(torch.float32))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(expected + 1e-6, expected, **tolerance(torch.float32, "exact"))
    nan = expected.clone()
    nan[3] = float("nan")
    for kind, entries in TOLERANCE_TABLE.items():
        if torch.float32 in entries:
            with pytest.raises(AssertionError):
                torch.testing.assert_close(nan, expected, **tolerance(torch.float32, kind))
