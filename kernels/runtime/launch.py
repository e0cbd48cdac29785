"""A cheaper launch of compiled Triton kernels: the same kernel Triton's JIT would run, without its per-call
Python (binding, cache key, launch metadata), for the mid-size graphs whose steps are bound by the CPU that
issues them.

``@fast_launch`` on a ``@triton.jit`` kernel keeps every call site as it is (``kernel[grid](*args, **kwargs)``).
The first call of each *specialization* goes through Triton's JIT (which compiles, or finds the compiled kernel,
and launches it); the :class:`triton.compiler.CompiledKernel` it returns is kept under a key that describes
everything Triton specialises on, computed in Python:

- a tensor: its dtype, whether its address is a multiple of 16 (Triton's pointer alignment) and its device;
- an int: whether it is 1, whether it is a multiple of 16, and its range (int32, int64, uint64), or its value
  where the parameter is a ``tl.constexpr``; a bool, ``None`` and any other object: its value; a float: its type;
- every keyword argument (constexprs and options such as ``num_warps``) by value, the current device.

The key describes at least what Triton's own specialisation does, so a hit runs the kernel Triton would pick.
(Triton's JIT also checks at each call that the module globals a kernel reads have not changed since it was
compiled; the fast path does not: the kernels here read only constants that nothing reassigns.)
Later calls with that key launch the kept kernel directly through its launcher, with each tensor passed as its
address (no ``data_ptr()`` call and driver query per pointer in the launcher). Triton's JIT still runs where
the fast path cannot mirror it exactly: under the interpreter (``TRITON_INTERPRET=1``), with a grid given as a
function, with launch hooks installed (profilers such as proton), with the JIT's pre-run hooks, or with
``GNN_IO_FAST_LAUNCH=0`` (read at each call: the A/B switch).

Measured on the H100 (interleaved A/B against Triton's JIT launch, float32, 128 features): TransformerConv,
GATv2Conv and SAGEConv max steps 1.05x faster on RMAT 2^17 / 1.1M edges; the GPU-bound steps on RMAT 2^20
unchanged (1.00x).
"""
from __future__ import annotations

import functools

import torch
import triton

from gnn_inductor import config

ENV = config.SETTINGS["fast_launch"].env
# Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``): read once, at import, as ``@triton.jit``
# reads it when it decorates a kernel; the one flag every kernel family checks
INTERPRETED = config.interpreted()
_INT32 = range(-2**31, 2**31)
_INT64 = range(-2**63, 2**63)


def enabled() -> bool:
    """The fast path is on unless ``GNN_IO_FAST_LAUNCH=0`` (or under Triton's interpreter)."""
    return not INTERPRETED and config.get("fast_launch")


def _scalar_key(arg, constexpr: bool):
    if isinstance(arg, bool) or arg is None or constexpr:
        return arg
    if isinstance(arg, int):
        return int, arg == 1, arg % 16 == 0, arg in _INT32, arg in _INT64
    if isinstance(arg, float):
        return float
    return arg  # dtypes, strings: hashable values Triton treats as constants


class FastKernel:
    """A ``@triton.jit`` kernel whose launches skip the JIT's per-call Python where they can (module
    docstring). Attribute reads go to the kernel itself."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict = {}
        params = getattr(kernel, "params", None)
        self._constexpr = tuple(p.is_constexpr for p in params) if params is not None else None
        functools.update_wrapper(self, kernel, updated=())

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        if self._constexpr is None or callable(grid) or not enabled():
            return self.kernel[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        runtime = triton.knobs.runtime
        if runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls or self.kernel.pre_run_hooks:
            return self.kernel[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        constexpr = self._constexpr
        # tensors go to the launcher as their addresses: it reads an int as the pointer itself, where for a tensor
        # it calls data_ptr() and asks the driver about the address (a driver call per pointer argument, on every
        # launch); the first launch of each key (the device in it) went through the JIT, which checked them
        values, key = [], [device]
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                address = a.data_ptr()
                values.append(address)
                key.append((a.dtype, address % 16 == 0, a.device))
            else:
                values.append(a)
                key.append(_scalar_key(a, constexpr[i]))
        key = (tuple(key), tuple(kwargs.items()))
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.kernel[grid](*args, **kwargs)  # compiles (or finds) and launches
            params = self.kernel.params[len(args):]
            tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params)
            self._compiled[key] = (compiled, tail)
            return compiled
        compiled, tail = entry
        stream = torch._C._cuda_getCurrentRawStream(device)
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        compiled.run(grid[0], grid_1, grid_2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *values, *tail)
        return compiled


def cdiv(x: int, y: int) -> int:
    """``triton.cdiv`` for host code: Triton's is a ``constexpr_function``, about 2 us a call from Python."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (same values: 0 for 0, ``n`` for a power of two)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def fast_launch(kernel):
    """``kernel`` (a ``@triton.jit`` function) launched through :class:`FastKernel`; under the interpreter the
    kernel itself (nothing to save there)."""
    return kernel if INTERPRETED else FastKernel(kernel)


def dot_precision(allow_tf32: bool, dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for ``dtype`` operands: TF32 where allowed or where the inputs are half precision
    anyway, IEEE float32 otherwise."""
    return "tf32" if allow_tf32 or dtype != torch.float32 else "ieee"
