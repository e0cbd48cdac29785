"""Compiled graphs call the gnn_io ops' direct twins (gnn_inductor/passes/direct_ops.py): same results, same shapes,
none of custom_op's per-call Python, only inside compiled graphs."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch_geometric.nn import SAGEConv

import gnn_inductor  # noqa: F401  (the backend and the ops)
from gnn_inductor.passes import direct_ops
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.testing import random_graph, tolerance


def _op_call():
    src, dst = random_graph(40, 160, seed=3, hub_degree=12)
    rowptr, col, row, perm, *t_plan = torch.ops.gnn_io.csr_plan(dst, src, 40, 40)
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: torch.relu(x_j) * 2))
    x = torch.randn(40, 6)
    return ([x], [0], rowptr, col, row, perm, key, "max", t_plan)


def test_twin_computes_what_the_op_computes():
    op = torch.ops.gnn_io.gather_scatter_forward.default
    twin = direct_ops.twin(op)
    assert twin is not None and twin._opname == "gather_scatter_forward_direct"
    assert [a.name for a in twin._schema.arguments] == [a.name for a in op._schema.arguments]
    args = _op_call()
    assert torch.equal(twin(*args), op(*args))
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = twin(*args)
    assert fake.shape == (40, 6)


def test_ops_outside_gnn_io_have_no_twin():
    assert direct_ops.twin(torch.ops.aten.add.Tensor) is None
    assert direct_ops.twin(torch.ops.gnn_io.gather_scatter.default) is None  # no custom_op: decomposed at trace
    assert direct_ops.twin(torch.ops.gnn_io.check_index.default) is None  # kept for its side effect


def _compiled_op_names(monkeypatch, direct: str) -> set:
    monkeypatch.setenv("GNN_IO_DIRECT_OPS", direct)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = SAGEConv(8, 8, aggr="max")
    x = torch.randn(30, 8, requires_grad=True)
    edge_index = random_graph(30, 120, seed=4, hub_degree=10)
    compiled = torch.compile(model, backend="gnn_io")
    compiled(x, edge_index).sum().backward()  # compiles forward and backward
    compiled_grad = x.grad.clone()
    x.grad = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled(x, edge_index).sum().backward()
    x.grad = None
    model(x, edge_index).sum().backward()
    torch.testing.assert_close(compiled_grad, x.grad, **tolerance(torch.float32))
    return {e.name for e in prof.events() if e.name.startswith("gnn_io::")}


def test_compiled_graphs_call_the_twins(monkeypatch):
    """The forward's and the backward's ops go through their twins, the backward's also after the GEMM-accumulate
    pass moved SAGEConv's root GEMM into it (``gather_scatter_backward_mm``), and without that pass."""
    names = _compiled_op_names(monkeypatch, "1")
    assert {"gnn_io::gather_scatter_forward_direct", "gnn_io::gather_scatter_backward_mm_direct"} <= names, names
    assert not any(n.startswith("gnn_io::gather_scatter") and not n.endswith("_direct") for n in names), names
    monkeypatch.setenv("GNN_IO_GEMM_ACCUMULATE", "0")
    names = _compiled_op_names(monkeypatch, "1")
    assert {"gnn_io::gather_scatter_forward_direct", "gnn_io::gather_scatter_backward_direct"} <= names, names


def test_switch_keeps_the_custom_op_calls(monkeypatch):
    names = _compiled_op_names(monkeypatch, "0")
    assert "gnn_io::gather_scatter_forward" in names and not any(n.endswith("_direct") for n in names), names


@pytest.mark.parametrize("name", ["spmm", "spmm_backward", "gather_scatter_backward_mm", "gather_scatter_multi_forward",
                                  "gather_scatter_multi_backward", "attention_forward", "attention_backward",
                                  "attention_forward_mass", "attention_delta_mass",
                                  "edge_softmax", "edge_softmax_backward"])
def test_twins_of_the_hot_ops_exist(name):
    assert direct_ops.twin(getattr(torch.ops.gnn_io, name).default) is not None
