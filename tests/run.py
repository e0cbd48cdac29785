"""Run the test tiers: ``python tests/run.py [--slow] [pytest arguments]``.

On a machine with CUDA one pytest process runs every tier but ``slow`` (the Triton kernels on the GPU). On a CPU
machine the Triton kernel tests (marker ``triton``) run under Triton's interpreter, ``TRITON_INTERPRET=1 pytest -m
triton``, in pytest processes of their own: the interpreter only takes effect for kernels defined after it
is set, and set in the main process it would interpret Inductor's kernels too. The main tier (``-m "not triton"``)
runs in two processes (tests/models, tests/test_examples.py, tests/benchmarks, the heterogeneous buckets' tests, the
DGL layer zoo and the warm starts apart) and the interpreter tier in two (the attention kernel files of
:data:`HEAVY_INTERPRETED` apart). The four share CI's two cores; while at least two run, both cores are busy.
The first process prints as it goes, the others' output follows when all have ended. The exit status is pytest's: 1
when a test failed in any process, 5 when no process ran a test.
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
# the interpreter tier's slowest files, run in a process of their own (the rest of the tier in another)
HEAVY_INTERPRETED = ["tests/kernels/attention/test_attention_triton.py",
                     "tests/kernels/attention/test_attention_pyg.py",
                     "tests/kernels/attention/test_attention_split_backward.py",
                     "tests/kernels/attention/test_block_sparse_gat.py",
                     "tests/kernels/attention/test_score_factor.py"]


def _pytest(marker: str, paths: list, extra: list, env: dict, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15", "-m", marker,
               *extra, *paths]
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
    # the main tier in two processes (the model-level tests, the examples, the benchmarks' tests, the heterogeneous
    # buckets, the DGL zoo and the warm starts apart) and the interpreter tier in two: a fresh clone on a 2-core
    # machine ended them after 1276, 1198, 642 and 473 s, the two cores busy throughout (install 163 s, 1440 s in all)
    interpreted = {**base, "TRITON_INTERPRET": "1"}
    apart = ["tests/models", "tests/test_examples.py", "tests/benchmarks", "tests/test_buckets_hetero.py",
             "tests/frontends/dgl/test_dgl_zoo.py", "tests/test_warm_start.py"]
    tiers = [("not triton", ["tests", *(f"--ignore={path}" for path in apart)], base),
             ("not triton", apart, base),
             ("triton", HEAVY_INTERPRETED, interpreted),
             ("triton", ["tests", *(f"--ignore={path}" for path in HEAVY_INTERPRETED)], interpreted)]
    start = time.monotonic()
    runs = []
    for i, (marker, paths, env) in enumerate(tiers):
        log = None if i == 0 else tempfile.TemporaryFile(mode="w+")
        label = ("TRITON_INTERPRET=1 " if "TRITON_INTERPRET" in env else "") + f"-m '{marker}' {' '.join(paths)}"
        runs.append((label, log, _pytest(marker, paths, extra, env, log)))
    ended = {}
    while len(ended) < len(runs):  # each process's own end time, to keep the four balanced
        for i, (_, _, process) in enumerate(runs):
            if i not in ended and process.poll() is not None:
                ended[i] = time.monotonic() - start
        time.sleep(0.5)
    codes = []
    for i, (label, log, process) in enumerate(runs):
        codes.append(process.returncode)
        print(f"\n===== {label}: exit {codes[-1]} after {ended[i]:.0f} s =====", flush=True)
        if log is not None:
            log.seek(0)
            sys.stdout.write(log.read())
    # pytest's 5 (no test ran) is a failure only when no process ran a test (a -k that selects one file's tests)
    status = next((code for code in codes if code not in (0, 5)), 5 if all(code == 5 for code in codes) else 0)
    print(f"\nall tiers: {time.monotonic() - start:.0f} s, exit {status}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
