"""The cuSPARSE binding's per-graph entries (kernels/spmm/cusparse.py), on CPU with stub bindings: descriptors made
once per graph, feature rows, width and dtype and kept in the graph's state; re-pointed at every call; made again
(with CSR_ALG3's analysis) when the CSR changes in place; used once and not kept inside a CUDA-graph capture; gone
with the graph. The products themselves need cuSPARSE (tests/models/test_cuda.py)."""
import gc
import itertools
from types import SimpleNamespace

import pytest
import torch

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.kernels.runtime import cuda_graphs
from gnn_inductor.kernels.spmm import cusparse as spmm_cusparse
from gnn_inductor.kernels.spmm.common import spmm_state
from gnn_inductor.plan import state as graph_state


class StubBindings:
    """nvmath's ``cusparse`` module as far as the binding uses it: records the calls, computes nothing."""
    IndexType = SimpleNamespace(INDEX_32I=2, INDEX_64I=3)
    IndexBase = SimpleNamespace(ZERO=0)
    Order = SimpleNamespace(ROW=1)
    Operation = SimpleNamespace(NON_TRANSPOSE=0)
    SpMMAlg = SimpleNamespace(CSR_ALG1=4, CSR_ALG2=5, CSR_ALG3=12)

    def __init__(self):
        self.calls, self.ids = [], itertools.count(1)

    def __getattr__(self, name):  # every other binding: record it
        def call(*args):
            self.calls.append(name)
            return next(self.ids) if name.startswith("create") else 0
        return call

    def count(self, name: str) -> int:
        return self.calls.count(name)


@pytest.fixture
def stub(monkeypatch):
    bindings = StubBindings()
    monkeypatch.setattr(spmm_cusparse, "_bindings", lambda: bindings)
    monkeypatch.setattr(spmm_cusparse, "_handle", lambda device_index: 7)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("GNN_IO_CUSPARSE_ALG", raising=False)
    graph_state.clear()
    yield bindings
    graph_state.clear()


def csr(num_rows=5, num_cols=6):
    rowptr = torch.tensor([0, 2, 3, 3, 5, 6][:num_rows + 1], dtype=torch.int32)
    col = torch.tensor([0, 5, 2, 1, 4, 3], dtype=torch.int32)
    return rowptr, col, torch.rand(col.numel())


def test_entries_are_kept_in_the_graph_state_per_width(stub):
    rowptr, col, values = csr()
    entries = spmm_state(rowptr, col).slot("cusparse")
    for _ in range(3):
        out = spmm_cusparse.cusparse_spmm(torch.randn(6, 4), values, rowptr, col, entries)
        assert out.shape == (5, 4)
    assert stub.count("create_csr") == 1 and stub.count("sp_mm") == 3
    assert stub.count("csr_set_pointers") == 4  # at the build and at every call: values and x move
    spmm_cusparse.cusparse_spmm(torch.randn(6, 2, 3), values, rowptr, col, entries)
    assert stub.count("create_csr") == 2 and set(entries) == {(6, 4, torch.float32), (6, 6, torch.float32)}
    assert spmm_state(rowptr, col).slot("cusparse") is entries
    assert spmm_cusparse.chosen_algorithms(entries) == [(5, 4, "torch.float32", "CSR_ALG2", {}),
                                                        (5, 6, "torch.float32", "CSR_ALG2", {})]


def test_a_changed_csr_gets_new_descriptors_and_analysis(stub, monkeypatch):
    monkeypatch.setenv("GNN_IO_CUSPARSE_ALG", "CSR_ALG3")
    rowptr, col, values = csr()
    x = torch.randn(6, 4)
    spmm_cusparse.cusparse_spmm(x, values, rowptr, col, spmm_state(rowptr, col).slot("cusparse"))
    spmm_cusparse.cusparse_spmm(x, values, rowptr, col, spmm_state(rowptr, col).slot("cusparse"))
    assert stub.count("create_csr") == 1 and stub.count("sp_mm_preprocess") == 1
    col[:2] = col[:2].flip(0)  # in place: a new version, another matrix at the same addresses
    entries = spmm_state(rowptr, col).slot("cusparse")
    assert not entries
    spmm_cusparse.cusparse_spmm(x, values, rowptr, col, entries)
    assert stub.count("create_csr") == 2 and stub.count("sp_mm_preprocess") == 2


def test_first_call_inside_a_capture_keeps_nothing(stub, monkeypatch):
    rowptr, col, values = csr()
    entries = spmm_state(rowptr, col).slot("cusparse")
    monkeypatch.setattr(cuda_graphs, "capturing", lambda device: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    spmm_cusparse.cusparse_spmm(torch.randn(6, 4), values, rowptr, col, entries)
    assert not entries and stub.count("sp_mm") == 1 and stub.count("sp_mm_buffer_size") == 1


def test_entries_die_with_the_graph(stub):
    rowptr, col, values = csr()
    spmm_cusparse.cusparse_spmm(torch.randn(6, 4), values, rowptr, col, spmm_state(rowptr, col).slot("cusparse"))
    del rowptr, col
    gc.collect()
    assert not graph_state.summary()
    assert stub.count("destroy_sp_mat") == 1 and stub.count("destroy_dn_mat") == 2


def test_empty_products_are_zeros_without_descriptors(stub):
    rowptr, col = torch.zeros(4, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    out = spmm_cusparse.cusparse_spmm(torch.randn(6, 4), torch.zeros(0), rowptr, col, {})
    assert bool((out == 0).all()) and out.shape == (3, 4) and not stub.calls
