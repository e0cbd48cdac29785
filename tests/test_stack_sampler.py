"""benchmarks/stack_sampler.py: the samples land on the functions the sampled thread runs, and the interpreter's
switch interval is restored."""
import sys
import time

from benchmarks.stack_sampler import StackSampler


def _busy_inner(deadline: float) -> int:
    count = 0
    while time.perf_counter() < deadline:
        count += 1
    return count


def _busy_outer(seconds: float) -> int:
    return _busy_inner(time.perf_counter() + seconds)


def test_samples_land_on_the_running_functions():
    switch = sys.getswitchinterval()
    with StackSampler(interval=1e-3) as sampler:
        _busy_outer(0.3)
    assert sys.getswitchinterval() == switch
    assert sampler.samples >= 20
    inner = next(k for k in sampler.inclusive_counts if k.endswith("(_busy_inner)"))
    outer = next(k for k in sampler.inclusive_counts if k.endswith("(_busy_outer)"))
    assert sampler.self_counts[inner] > 0.8 * sampler.samples  # the loop is the innermost frame
    assert sampler.inclusive_counts[outer] >= sampler.inclusive_counts[inner]
    assert "(_busy_inner)" in sampler.table(rows=5)
