"""Run the test tiers: ``python tests/run.py [--slow] [pytest arguments]``.

On a machine with CUDA one pytest process runs every tier but ``slow`` (the Triton kernels on the GPU). On a CPU
machine the Triton kernel tests (marker ``triton``) run under Triton's interpreter in a pytest process of their own,
``TRITON_INTERPRET=1 pytest -m triton``, beside the main process (``-m "not triton"``): the interpreter only
takes effect for kernels defined after it is set, and set in the main process it would interpret Inductor's
kernels too. The two run at the same time, one per core; the main tier prints as it goes, the interpreter
tier's output follows when both have ended. The exit status is the first non-zero one (pytest's: 1 a failure, 5 no test ran).
``--slow`` adds the ``slow`` tier (the full grids: on the device, and before a release).
"""
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pytest(marker: str, extra: list, env: dict, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15", "-m", marker,
               *extra, "tests"]
    print("$", ("TRITON_INTERPRET=1 " if env.get("TRITON_INTERPRET") == "1" else "") + "python "
          + shlex.join(command[1:]), flush=True)
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def main(argv: list) -> int:
    slow = "--slow" in argv
    extra = [a for a in argv if a != "--slow"] + (["--slow"] if slow else [])
    import torch  # after the arguments: a typo fails fast

    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if torch.cuda.is_available():
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=30",
                                *extra, "tests"], cwd=ROOT, env=base)
    tiers = [("not triton", base), ("triton", {**base, "TRITON_INTERPRET": "1"})]
    start = time.monotonic()
    runs = []
    for i, (marker, env) in enumerate(tiers):
        log = None if i == 0 else tempfile.TemporaryFile(mode="w+")
        runs.append((marker, log, _pytest(marker, extra, env, log)))
    status = 0
    for marker, log, process in runs:
        code = process.wait()
        print(f"\n===== tier -m '{marker}': exit {code} after {time.monotonic() - start:.0f} s =====", flush=True)
        if log is not None:
            log.seek(0)
            sys.stdout.write(log.read())
        status = status or code
    print(f"\nall tiers: {time.monotonic() - start:.0f} s, exit {status}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
