"""Rerun a Triton kernel test file on CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` only takes effect for kernels defined after it is set, and setting it in the
pytest process would turn every later Triton kernel (Inductor's included) into an interpreted one,
so each kernel test file runs itself again in a subprocess with it set.

**Ahead of time, on the other core.** These reruns are a third of the suite's time, each a single-threaded
interpreter, while the main process runs its own tests on one core too (``cpp.threads = 1``, tests/conftest.py).
So tests/conftest.py hands the collected rerun tests to :func:`prefetch` once collection is done: it records each
one's command (by calling the test with :data:`_registering` set, so the command is the one the test itself
builds), starts them one after another in a background thread, and moves those tests to the end of the session,
where each waits for its own subprocess and checks its result as before. A rerun test collected alone, or with
``GNN_IO_TEST_PREFETCH=0``, runs its subprocess when it runs.
"""
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFETCH_ENV = "GNN_IO_TEST_PREFETCH"
TIMEOUT_S = 1800  # one file's rerun; the longest took 558 s alone (session 36), more beside the main process


class _Run:
    """One rerun's command, environment and, once :attr:`done` is set, its result (or the error that stopped it)."""

    def __init__(self, command: list, env: dict):
        self.command, self.env = command, env
        self.done = threading.Event()
        self.result: subprocess.CompletedProcess | None = None
        self.error: BaseException | None = None


_runs: dict[tuple, _Run] = {}  # registered reruns by (command, env), in registration order
_registering = False  # set while prefetch calls the tests: rerun_under_interpreter then only records its command
_stop = threading.Event()
_current: list = []  # the background thread's running subprocess, to kill at the session's end


def _command(test_file: str, select: str) -> list:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(test_file).resolve())]
    if select:
        command[-1:-1] = ["-k", select]
    return command


def _environment(env: dict | None) -> dict:
    return {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}


def _run(command: list, env: dict, track: bool = False) -> subprocess.CompletedProcess:
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if track:
        _current[:] = [process]
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        stderr += f"\nkilled after {TIMEOUT_S} s"
    finally:
        _current.clear()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def rerun_under_interpreter(test_file: str, *, select: str = "", env: dict | None = None) -> None:
    """Run ``test_file`` (optionally only the tests ``select`` picks, pytest ``-k``) with
    ``TRITON_INTERPRET=1`` plus ``env``; fail with its output unless it ran tests and all passed. Where
    :func:`prefetch` started the same run ahead of time, wait for that one instead."""
    command = _command(test_file, select)
    key = (tuple(command), tuple(sorted((env or {}).items())))
    if _registering:
        _runs.setdefault(key, _Run(command, _environment(env)))
        return
    run = _runs.get(key)
    if run is None:
        result = _run(command, _environment(env))
    else:
        run.done.wait()
        if run.error is not None:
            raise AssertionError(f"the interpreter rerun started ahead of time failed to run: {run.error!r}")
        result = run.result
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and " failed" not in result.stdout, report


def _skipped(item) -> bool:
    """Whether a skip or skipif marker (a plain boolean condition) skips ``item``; a condition given as a string is
    taken as skipping (its test then runs its own rerun, if any)."""
    for mark in item.iter_markers():
        if mark.name == "skip":
            return True
        if mark.name == "skipif":
            condition = mark.args[0] if mark.args else mark.kwargs.get("condition", True)
            if not isinstance(condition, bool) or condition:
                return True
    return False


def prefetch(items: list) -> list:
    """Start the interpreter reruns of the rerun tests among ``items`` (test functions without arguments that call
    :func:`rerun_under_interpreter`, not skipped) in a background thread, one at a time, in their order; return
    those tests. Nothing under the interpreter itself or with ``GNN_IO_TEST_PREFETCH=0``. A module's autouse
    fixtures do not run for the recording (tests/kernels/test_attention_paths.py's clears path settings from the
    environment, which CI does not set): each rerun gets the session's environment as it is at collection."""
    global _registering
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get(PREFETCH_ENV, "1") == "0":
        return []
    picked = []
    _registering = True
    try:
        for item in items:
            function = getattr(item, "obj", None)
            code = getattr(function, "__code__", None)
            if code is None or "rerun_under_interpreter" not in code.co_names or code.co_argcount or _skipped(item):
                continue
            before = len(_runs)
            try:
                function()
            except (Exception, pytest.skip.Exception):  # a skip inside the test, or anything else: it runs its own
                continue
            if len(_runs) > before:
                picked.append(item)
    finally:
        _registering = False
    if picked:
        threading.Thread(target=_background, args=(list(_runs.values()),), daemon=True,
                         name="interpreter-reruns").start()
    return picked


def _background(runs: list) -> None:
    for run in runs:
        try:
            if _stop.is_set():
                raise RuntimeError("the test session ended first")
            run.result = _run(run.command, run.env, track=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting test
            run.error = exc
        finally:
            run.done.set()


def stop() -> None:
    """At the session's end: no further rerun starts, and a running one is killed (a session stopped early,
    ``-x`` or Ctrl-C, must not leave it behind)."""
    _stop.set()
    for process in list(_current):
        if process.poll() is None:
            process.kill()
