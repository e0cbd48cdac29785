r"""cuSPARSE SpMM through nvmath-python's low-level bindings, with what cuSPARSE lets us cache.

``Y = A X`` for the CSR matrix ``A = (rowptr, col, values)`` of a graph plan and row-major dense
``X [num_cols, F]``; the same product as :func:`gnn_inductor.kernels.spmm.csr_product.csr_matmul` with
``reduce='sum'``.

``torch.sparse`` (the fallback binding) builds a sparse tensor, cuSPARSE descriptors, a workspace
and a zero-filled output on every call and always runs cuSPARSE's default algorithm. Here, per
graph, number of feature rows, feature width and dtype, one :class:`_Entry` keeps:

- the sparse matrix descriptor (``cusparseCreateCsr``) and the two dense descriptors, whose data
  pointers are re-pointed per call (``cusparseDnMatSetValues``, ``cusparseCsrSetPointers``; cheap);
- the algorithm, chosen once on the first call by timing the candidates (CUDA events; skipped while a
  CUDA graph is being captured, which then takes ``CSR_ALG2``). The candidates are ``CSR_ALG2`` alone
  (see :data:`CANDIDATE_ALGORITHMS` for why); ``GNN_IO_CUSPARSE_ALG=CSR_ALG1|CSR_ALG3`` forces another;
- its workspace, and ``cusparseSpMM_preprocess`` for ``CSR_ALG3`` (the one that benefits);
- the output is ``torch.empty`` with ``beta = 0``: no zero fill.

Entries live in the graph's state (``gnn_inductor/plan/state.py``): the caller passes the slot of its CSR
(:func:`~gnn_inductor.kernels.spmm.common.spmm_state` ``(rowptr, col).slot("cusparse")``), keyed by
``(num_cols, features, dtype)``. That state is valid only for those very ``rowptr``/``col`` tensors, unchanged
(identity and version counter), and dies with them: a new or changed CSR gets a new state, so new descriptors and
the one content-dependent piece, ``CSR_ALG3``'s preprocessed analysis, done again; it is never applied to another
graph. Inference tensors have no version counter: their state, and so the entry, is built at every call (their
plan is rebuilt per call anyway). A matrix met first inside a CUDA-graph capture gets an entry that is used once
and not kept (:func:`~gnn_inductor.kernels.runtime.cuda_graphs.kept_outside_graph_pool`).

Available when ``nvmath-python`` (``pip install nvmath-python``, plus ``cuda-bindings`` and
``cuda-pathfinder``) imports and finds the cuSPARSE library of the CUDA runtime torch uses;
:func:`available` says so, and ``gnn_io::spmm`` falls back to ``torch.sparse`` otherwise.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np
import torch
from gnn_inductor import config
from gnn_inductor.kernels.runtime.cuda_graphs import kept_outside_graph_pool
from torch import Tensor

_DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 14}  # cudaDataType_t
_R_32F, _R_64F = 0, 1
# Only CSR_ALG2 by default: on the H100 (cuSPARSE of CUDA 13) a small CSR whose hub row repeats column indices
# (duplicate edges, which real edge lists have) made CSR_ALG3 fault with an illegal memory access, which no
# status code reports and which poisons the CUDA context; ALG1 was correct but slower everywhere timed
# (20k-node power-law graph, 128 features: ALG2 0.09 ms, ALG1 0.23 ms, ALG3 1.1 ms). GNN_IO_CUSPARSE_ALG forces one.
CANDIDATE_ALGORITHMS = ("CSR_ALG2",)
KNOWN_ALGORITHMS = config.SETTINGS["cusparse_alg"].choices


@functools.lru_cache(maxsize=1)
def _bindings():
    from nvmath.bindings import cusparse

    return cusparse


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """True when nvmath-python's cuSPARSE bindings import and a handle can be created."""
    if not torch.cuda.is_available():
        return False
    try:
        _handle(torch.cuda.current_device())
    except Exception:  # noqa: BLE001  (not installed, or no cuSPARSE library for it: use torch.sparse)
        return False
    return True


@functools.lru_cache(maxsize=None)
def _handle(device_index: int) -> int:
    with torch.cuda.device(device_index):
        return _bindings().create()


class _Entry:
    """Descriptors, algorithm and workspace of one (matrix, feature width, dtype)."""

    def __init__(self, rowptr: Tensor, col: Tensor, values: Tensor, num_cols: int, features: int):
        cs = _bindings()
        self.dtype = values.dtype
        self.compute = _R_64F if values.dtype == torch.float64 else _R_32F
        scalar = np.float64 if self.compute == _R_64F else np.float32
        self.alpha, self.beta = np.ones(1, dtype=scalar), np.zeros(1, dtype=scalar)
        index_type = cs.IndexType.INDEX_32I if rowptr.dtype == torch.int32 else cs.IndexType.INDEX_64I
        value_type = _DTYPES[values.dtype]
        num_rows = rowptr.numel() - 1
        self.matrix = cs.create_csr(num_rows, num_cols, col.numel(), rowptr.data_ptr(), col.data_ptr(),
                                    values.data_ptr(), index_type, index_type, cs.IndexBase.ZERO, value_type)
        # placeholder pointers: every call re-points both dense descriptors before use
        self.x = cs.create_dn_mat(num_cols, features, features, values.data_ptr(), value_type, cs.Order.ROW)
        self.y = cs.create_dn_mat(num_rows, features, features, values.data_ptr(), value_type, cs.Order.ROW)
        self.algorithm = None
        self.workspace = None
        self.timings_ms = {}
        self.num_rows, self.features = num_rows, features
        weakref.finalize(self, _destroy, self.matrix, self.x, self.y)

    def point(self, x: Tensor, y: Tensor, values: Tensor, rowptr: Tensor, col: Tensor) -> None:
        cs = _bindings()
        cs.csr_set_pointers(self.matrix, rowptr.data_ptr(), col.data_ptr(), values.data_ptr())
        cs.dn_mat_set_values(self.x, x.data_ptr())
        cs.dn_mat_set_values(self.y, y.data_ptr())

    def _workspace_for(self, handle: int, algorithm, device) -> Tensor:
        cs = _bindings()
        size = cs.sp_mm_buffer_size(handle, cs.Operation.NON_TRANSPOSE, cs.Operation.NON_TRANSPOSE,
                                    self.alpha.ctypes.data, self.matrix, self.x, self.beta.ctypes.data, self.y,
                                    self.compute, algorithm)
        return torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)

    def run(self, handle: int, algorithm, workspace: Tensor) -> None:
        cs = _bindings()
        cs.sp_mm(handle, cs.Operation.NON_TRANSPOSE, cs.Operation.NON_TRANSPOSE, self.alpha.ctypes.data,
                 self.matrix, self.x, self.beta.ctypes.data, self.y, self.compute, algorithm, workspace.data_ptr())

    def _prepare(self, handle: int, algorithm, device) -> Tensor:
        workspace = self._workspace_for(handle, algorithm, device)
        self._preprocess(handle, algorithm, workspace)
        return workspace

    def _preprocess(self, handle: int, algorithm, workspace: Tensor) -> None:
        cs = _bindings()
        if algorithm == cs.SpMMAlg.CSR_ALG3:
            cs.sp_mm_preprocess(handle, cs.Operation.NON_TRANSPOSE, cs.Operation.NON_TRANSPOSE,
                                self.alpha.ctypes.data, self.matrix, self.x, self.beta.ctypes.data, self.y,
                                self.compute, algorithm, workspace.data_ptr())

    def choose(self, handle: int, device) -> None:
        """Time each candidate algorithm once (after one warm-up) and keep the fastest."""
        cs = _bindings()
        if torch.cuda.is_current_stream_capturing():
            self.algorithm = cs.SpMMAlg.CSR_ALG2
            self.workspace = self._prepare(handle, self.algorithm, device)
            return
        best = None
        forced = config.get("cusparse_alg")
        names = (forced,) if forced else CANDIDATE_ALGORITHMS
        if len(names) == 1:  # nothing to choose: no timing, no device sync
            self.algorithm = getattr(cs.SpMMAlg, names[0])
            self.workspace = self._prepare(handle, self.algorithm, device)
            return
        for name in names:
            algorithm = getattr(cs.SpMMAlg, name)
            try:
                workspace = self._prepare(handle, algorithm, device)
                self.run(handle, algorithm, workspace)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.run(handle, algorithm, workspace)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            except Exception:  # noqa: BLE001  (an algorithm this matrix or dtype does not support)
                continue
            self.timings_ms[name] = elapsed
            if best is None or elapsed < best[0]:
                best = (elapsed, algorithm, workspace)
        if best is None:
            raise RuntimeError("no cuSPARSE SpMM algorithm accepted this matrix")
        _, self.algorithm, self.workspace = best
        self._preprocess(handle, self.algorithm, self.workspace)  # the last timed one may have been another


def _destroy(matrix: int, x: int, y: int) -> None:
    try:
        cs = _bindings()
        cs.destroy_sp_mat(matrix)
        cs.destroy_dn_mat(x)
        cs.destroy_dn_mat(y)
    except Exception:  # noqa: BLE001,S110  (interpreter shutdown: the library may be gone already)
        pass


def cusparse_spmm(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, entries: dict) -> Tensor:
    """``A X`` with cached descriptors, algorithm and workspace (module docstring); ``x`` ``[num_cols, *F]``;
    ``entries`` the ``cusparse`` slot of the graph state of ``(rowptr, col)``."""
    features = x.reshape(x.shape[0], -1)
    if not features.is_contiguous():
        features = features.contiguous()
    values = values.to(x.dtype)
    num_rows, width = rowptr.numel() - 1, features.shape[1]
    out = torch.empty((num_rows, width), dtype=x.dtype, device=x.device)
    if col.numel() == 0 or width == 0:
        return out.zero_().view(num_rows, *x.shape[1:])
    handle = _handle(x.device.index)
    _bindings().set_stream(handle, torch.cuda.current_stream(x.device).cuda_stream)

    def build() -> _Entry:
        # inside a CUDA-graph capture: nothing timed (CSR_ALG2, no preprocess), nothing kept (a kept workspace
        # would sit in the graph's pool untracked): the workspace lives as the graph's own intermediate,
        # allocated and released in capture order at every replay; outside, the kept workspace is built outside
        # the graph pool
        entry = _Entry(rowptr, col, values, x.shape[0], width)
        entry.point(features, out, values, rowptr, col)
        entry.choose(handle, x.device)
        return entry

    entry = kept_outside_graph_pool(entries, (x.shape[0], width, x.dtype), build, x.device)
    entry.point(features, out, values, rowptr, col)
    entry.run(handle, entry.algorithm, entry.workspace)
    return out.view(num_rows, *x.shape[1:])


def chosen_algorithms(entries: dict) -> list:
    """``(rows, features, dtype, chosen algorithm, {algorithm: timed ms})`` of every entry of a graph's
    ``cusparse`` slot."""
    cs = _bindings()
    names = {getattr(cs.SpMMAlg, name): name for name in KNOWN_ALGORITHMS}
    return [(e.num_rows, e.features, str(e.dtype), names.get(e.algorithm, str(e.algorithm)), dict(e.timings_ms))
            for e in entries.values()]
