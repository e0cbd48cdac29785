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


def _other_thread_work(seconds: float) -> int:
    return _busy_inner(time.perf_counter() + seconds)


def test_all_threads_sees_a_worker_thread():
    """With ``all_threads`` the work of another thread is counted apart from the main thread's (as the autograd
    engine's device thread runs a CUDA backward while the main thread waits)."""
    import threading

    with StackSampler(interval=1e-3, all_threads=True) as sampler:
        worker = threading.Thread(target=_other_thread_work, args=(0.3,))
        worker.start()
        worker.join()
    assert sampler.ticks >= 20
    assert any(k.endswith("(_other_thread_work)") for k in sampler.other_inclusive)
    assert not any(k.endswith("(_other_thread_work)") for k in sampler.inclusive_counts)
    table = sampler.table(rows=1000)  # every function: the process's other threads (compile workers) rank too
    other = table.split("other threads", 1)
    assert len(other) == 2 and "(_other_thread_work)" in other[1] and "(_other_thread_work)" not in other[0]
