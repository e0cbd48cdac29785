"""kernels/runtime/launch.py: the fast launch path's cache, with a stand-in for a jitted kernel (the real one needs
CUDA; the CUDA tests run every kernel through it on the device)."""
import inspect

import pytest
import torch

from gnn_inductor.kernels.runtime import launch


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty, constexpr=False):
        self.name, self.default, self.is_constexpr = name, default, constexpr


class _Compiled:
    def __init__(self, key):
        self.key, self.function, self.packed_metadata, self.runs = key, object(), object(), []

    def run(self, *args):
        self.runs.append(args)


class _Jit:
    """What FastKernel reads of a JITFunction: ``params``, ``pre_run_hooks`` and ``[grid](...)``, which
    'compiles' one kernel per distinct specialisation the test names and records the call."""

    def __init__(self):
        self.params = [_Param("x_ptr"), _Param("n"), _Param("scale"), _Param("FLAG", constexpr=True),
                       _Param("BLOCK", 64, constexpr=True)]
        self.pre_run_hooks, self.jit_calls, self.compiled = [], [], {}

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            x, n = args[0], args[1]
            spec = (x.dtype, x.data_ptr() % 16 == 0, n == 1, n % 16 == 0, kwargs.get("FLAG"), kwargs.get("BLOCK", 64),
                    kwargs.get("num_warps"))
            return self.compiled.setdefault(spec, _Compiled(spec))
        return call


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.delenv(launch.ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    jit = _Jit()
    return jit, launch.FastKernel(jit)


def test_a_second_call_of_one_specialisation_skips_the_jit(kernel):
    jit, fast = kernel
    x = torch.zeros(64)
    first = fast[(3,)](x, 100, 0.5, FLAG=True, num_warps=4)
    assert len(jit.jit_calls) == 1 and first.runs == []
    second = fast[(5, 2)](x, 100, 0.25, FLAG=True, num_warps=4)
    assert second is first and len(jit.jit_calls) == 1
    (run,) = first.runs
    # grid, stream, function, metadata, no launch metadata or hooks, the arguments, then the constexpr tail
    assert run[:4] == (5, 2, 1, 1234) and run[4] is first.function and run[5] is first.packed_metadata
    assert run[6:9] == (None, None, None)
    assert run[9:] == (x.data_ptr(), 100, 0.25, True, 64)  # a tensor as its address


@pytest.mark.parametrize("change", ["misaligned", "dtype", "device", "int_is_one", "int_alignment", "int_range", "constexpr",
                                    "option", "positional_constexpr"])
def test_what_triton_specialises_on_goes_back_to_the_jit(kernel, change):
    jit, fast = kernel
    storage = torch.zeros(64)
    fast[(1,)](storage, 100, 0.5, FLAG=True, num_warps=4)
    args, kwargs = [storage, 100, 0.5], {"FLAG": True, "num_warps": 4}
    if change == "misaligned":
        args[0] = storage[1:]  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float64)
    elif change == "device":  # a tensor of another device is the JIT's to check (it rejects host memory)
        args[0] = torch.zeros(64, device="meta")
    elif change == "int_is_one":
        args[1] = 1
    elif change == "int_alignment":
        args[1] = 96
    elif change == "int_range":
        args[1] = 2**40 + 4
    elif change == "constexpr":
        kwargs["FLAG"] = False
    elif change == "option":
        kwargs["num_warps"] = 8
    else:  # a constexpr passed by position is keyed by its value
        args.append(False)
        kwargs.pop("FLAG")
    fast[(1,)](*args, **kwargs)
    assert len(jit.jit_calls) == 2


def test_an_unchanged_specialisation_with_other_values_stays_cached(kernel):
    jit, fast = kernel
    fast[(1,)](torch.zeros(64), 100, 0.5, FLAG=True)
    fast[(1,)](torch.ones(128), 116, 2.0, FLAG=True)  # 100 and 116: neither 1 nor a multiple of 16
    assert len(jit.jit_calls) == 1


@pytest.mark.parametrize("why", ["switched_off", "grid_function", "launch_hook", "pre_run_hook"])
def test_the_jit_runs_where_the_fast_path_cannot_mirror_it(kernel, monkeypatch, why):
    import triton

    jit, fast = kernel
    x = torch.zeros(64)
    fast[(1,)](x, 100, 0.5, FLAG=True)
    grid, hook = (1,), (lambda metadata: None)
    if why == "switched_off":
        monkeypatch.setenv(launch.ENV, "0")
    elif why == "grid_function":
        grid = lambda meta: (1,)  # noqa: E731
    elif why == "launch_hook":
        triton.knobs.runtime.launch_enter_hook.add(hook)
    else:
        jit.pre_run_hooks.append(lambda *a, **k: None)
    try:
        fast[grid](x, 100, 0.5, FLAG=True)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(jit.jit_calls) == 2


def test_under_the_interpreter_the_kernel_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRETED", True)
    jit = _Jit()
    assert launch.fast_launch(jit) is jit
    monkeypatch.setattr(launch, "INTERPRETED", False)
    assert isinstance(launch.fast_launch(jit), launch.FastKernel)
