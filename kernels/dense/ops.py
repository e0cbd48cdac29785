"""The dense family's operators, both on :func:`gnn_inductor.kernels.dense.gemm.matmul` (the 3xTF32 GEMM where it
takes the shape, cuBLAS otherwise, the same value to rounding):

- ``gnn_io::mm(a, b, bias=None)``: ``a @ b (+ bias)``, what ``gnn_inductor/passes/dense_gemm.py`` turns the
  rewritten graphs' large float32 ``aten.mm``/``aten.addmm`` calls into.
- ``gnn_io::addmm_into(out, a, b)``: ``out += a @ b`` in ``out``'s own memory, what
  ``gnn_inductor/passes/gemm_accumulate.py`` turns ``add(mm(a, b), t)`` into where ``t`` is a fresh buffer. It is
  our own op rather than ``aten.addmm_`` because ATen's in-place op has a decomposition, which Inductor would lower
  back into a copy (or refuse as a fallback when ``CI`` is set).

Both exist only inside compiled graphs: no autograd formula (a fallthrough at the Autograd key).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor.kernels.dense import gemm as dense_triton

_LIB = torch.library.Library("gnn_io", "FRAGMENT")
_LIB.define("mm(Tensor a, Tensor b, Tensor? bias=None) -> Tensor")
_LIB.define("addmm_into(Tensor(a!) out, Tensor a, Tensor b) -> ()")


def _mm(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    return dense_triton.matmul(a, b, bias)


def _mm_meta(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _addmm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    dense_triton.matmul(a, b, out=out, accumulate=True)  # cuBLAS's addmm_ unless the 3xTF32 GEMM takes it


_LIB.impl("mm", _mm, "CompositeExplicitAutograd")
_LIB.impl("mm", _mm_meta, "Meta")  # fake tensors: shapes only (a fake CUDA tensor would otherwise reach Triton)
_LIB.impl("mm", torch.library.fallthrough_kernel, "Autograd")  # only inside compiled graphs: no autograd
_LIB.impl("addmm_into", _addmm_into, "CompositeExplicitAutograd")  # every backend, Meta (fake tensors) included
_LIB.impl("addmm_into", torch.library.fallthrough_kernel, "Autograd")  # only inside compiled graphs: no autograd

MM = torch.ops.gnn_io.mm.default
ADDMM_INTO = torch.ops.gnn_io.addmm_into.default
