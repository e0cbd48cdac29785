"""Rerun a Triton kernel test file on CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` only takes effect for kernels defined after it is set, and setting it in the
pytest process would turn every later Triton kernel (Inductor's included) into an interpreted one,
so each kernel test file runs itself again in a subprocess with it set.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rerun_under_interpreter(test_file: str, *, select: str = "", env: dict | None = None) -> None:
    """Run ``test_file`` (optionally only the tests ``select`` picks, pytest ``-k``) with
    ``TRITON_INTERPRET=1`` plus ``env``; fail with its output unless it ran tests and all passed."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(test_file).resolve())]
    if select:
        command[-1:-1] = ["-k", select]
    result = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TRITON_INTERPRET": "1", **(env or {})})
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and " failed" not in result.stdout, report
