"""GEMMs adding into a fresh buffer in place (gnn_inductor/passes/gemm_accumulate.py): which adds are folded, the folded
graph computes the same values, and the layers where it applies stay correct, gradients included."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_geometric.nn import GraphConv, SAGEConv

import gnn_inductor
from gnn_inductor import config
from gnn_inductor.passes import gemm_accumulate
from gnn_inductor.testing import check_rewrites, random_graph, tolerance

aten = torch.ops.aten


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_folds_a_gemm_added_to_a_fresh_single_use_tensor():
    def fn(a, b, c, d):
        fresh = torch.mm(c, d)          # made here, read only by the add
        return torch.mm(a, b) + fresh

    inputs = [torch.randn(6, 4), torch.randn(4, 5), torch.randn(6, 3), torch.randn(3, 5)]
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    assert gemm_accumulate.fold(gm) == 1
    targets = _targets(gm)
    assert gemm_accumulate.ADDMM_INTO in targets and aten.add.Tensor not in targets
    torch.testing.assert_close(gm(*inputs), fn(*inputs), **tolerance(torch.float32, "reassociated"))


@pytest.mark.parametrize("case", ["input", "two_users", "broadcast", "dtype"])
def test_leaves_adds_it_cannot_do_in_place(case):
    """An input (the user's memory), a tensor read again later, a broadcast bias and a promotion stay adds."""
    def fn(a, b, c, d):
        product = torch.mm(a, b)
        if case == "input":
            return product + c
        fresh = torch.mm(c, d)
        if case == "two_users":
            return product + fresh, fresh * 2
        if case == "broadcast":
            return product + fresh[0]
        return product + fresh.double()

    inputs = [torch.randn(6, 4), torch.randn(4, 5), torch.randn(6, 3) if case != "input" else torch.randn(6, 5),
              torch.randn(3, 5)]
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    assert gemm_accumulate.fold(gm) == 0
    assert gemm_accumulate.ADDMM_INTO not in _targets(gm)


@pytest.mark.parametrize("make", [
    lambda: SAGEConv(12, 8, aggr="max"),
    lambda: SAGEConv(12, 8, aggr="mean"),
    lambda: GraphConv(12, 8, aggr="max"),
], ids=["sage_max", "sage_mean", "graphconv_max"])
def test_layers_with_a_root_map_add_in_place_and_stay_correct(make, monkeypatch):
    """``lin_l(aggr) + lin_r(x)`` in the forward and ``dY W_r + (the aggregation's gradient)`` in the backward are
    each one in-place GEMM; outputs and every gradient match eager, on a graph with a hub, self loops, duplicate
    edges and isolated nodes. Strict: a graph Inductor failed to compile would otherwise run op by op, unfolded."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = make()
    x = torch.randn(40, 12)
    check_rewrites(model, x, random_graph(40, 200, hub_degree=30), expect={})
    reports = gnn_inductor.rewrite_report.reports(model)
    assert any(r.gemm_accumulates.get("forward") == 1 and r.gemm_accumulates.get("backward") == 1 for r in reports)
    assert "GEMMs adding into a fresh buffer in place" in gnn_inductor.rewrite_report.format_text(model)


def test_switch_off_keeps_the_adds(monkeypatch):
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(gemm_accumulate.ENV, "0")
    torch.manual_seed(0)
    model = SAGEConv(12, 8, aggr="max")
    check_rewrites(model, torch.randn(40, 12), random_graph(40, 200, hub_degree=30), expect={})
    assert not any(any(r.gemm_accumulates.values()) for r in gnn_inductor.rewrite_report.reports(model))
    monkeypatch.setenv(gemm_accumulate.ENV, "2")
    with pytest.raises(ValueError, match=gemm_accumulate.ENV):
        config.snapshot()  # what each compile takes first


def test_backward_mm_op_is_well_formed_and_adds_the_product():
    """``gnn_io::gather_scatter_backward_mm``: schema and fake implementation (opcheck), and its gradient is the
    backward op's plus ``a @ b`` (CPU: the reference path adds them)."""
    from gnn_inductor.kernels.runtime import edge_functions

    torch.manual_seed(0)
    edge_index = random_graph(20, 80, hub_degree=12)
    rowptr, col, row, perm, *t_plan = torch.ops.gnn_io.csr_plan(edge_index[1], edge_index[0], 20, 20)
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    x = torch.randn(20, 6)
    grad_out = torch.randn(20, 6)
    a, b = torch.randn(20, 5), torch.randn(5, 6)
    args = (grad_out, [x], [0], rowptr, col, row, perm, key, "max", [True], None, list(t_plan[:3]))
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter_backward_mm.default, (a, b, 0, *args),
                          test_utils=("test_schema", "test_faketensor"))
    (plain,) = torch.ops.gnn_io.gather_scatter_backward(*args)
    (with_mm,) = torch.ops.gnn_io.gather_scatter_backward_mm(a, b, 0, *args)
    torch.testing.assert_close(with_mm, plain + a @ b, **tolerance(torch.float32, "reassociated"))
