"""The Inductor fixes the backend applies (gnn_inductor/passes/inductor_fixes.py): each fails on the torch it fixes."""
import pytest
import torch

import gnn_inductor  # noqa: F401  (applies the fixes)
from gnn_inductor.testing import assert_close_to_reference

heuristics = pytest.importorskip("torch._inductor.runtime.triton_heuristics")


def _split_grid(xnumel: int, ynumel: int, xblock: int, yblock: int) -> tuple:
    """Inductor's y/z split, computed here: z blocks carry what the y grid cannot, at least one of them."""
    y_blocks = -(-ynumel // yblock)
    z = max(-(-y_blocks // heuristics.get_max_y_grid()), 1)
    return -(-xnumel // xblock), -(-y_blocks // z), z


@pytest.mark.parametrize("ynumel", [0, 1, 15, 16, 17, 65535 * 16, 65535 * 16 + 1, 3 * 65535 * 16 + 5])
@pytest.mark.parametrize("yblock", [1, 16])
def test_split_grid_is_defined_for_an_empty_y_dimension(ynumel, yblock):
    grid = heuristics.Grid2DWithYZOverflow(inductor_meta={}, mode="python")
    grid.generate({"XBLOCK": 8, "YBLOCK": yblock})
    assert grid.eval_slow({"xnumel": 20, "ynumel": ynumel}) == _split_grid(20, ynumel, 8, yblock)


def test_split_grid_in_the_cpp_wrapper_keeps_one_integer_type():
    grid = heuristics.Grid2DWithYZOverflow(inductor_meta={}, mode="cpp")
    grid.generate({"XBLOCK": 8, "YBLOCK": 16})
    assert any("y_grid_div_ = std::max<uint32_t>(" in line and line.endswith(", 1U);") for line in grid.prefix)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
@pytest.mark.parametrize("layer", ["gat", "gatv2"])
def test_self_loop_fill_of_edge_features_on_a_graph_of_self_loops_only(layer):
    """PyG's GATConv and GATv2Conv with ``edge_dim`` scatter the non-loop edges' features for the self-loop fill;
    with only self loops that is a 0-row scatter of a run-time size. The awkward-graph sweep crashed there on the
    H100; whether this shorter sequence crashes without the fix was not checked."""
    from torch_geometric.nn import GATConv, GATv2Conv

    torch.manual_seed(0)
    make = GATConv if layer == "gat" else GATv2Conv
    model = make(8, 3, heads=2, edge_dim=4).cuda()
    compiled = torch.compile(model, backend="gnn_io")
    for edge_index in (torch.randint(0, 6, (2, 20)), torch.arange(6).repeat(2, 1)):
        edge_index = edge_index.cuda()
        x = torch.randn(6, 8, device="cuda", requires_grad=True)
        edge_attr = torch.randn(edge_index.shape[1], 4, device="cuda", requires_grad=True)
        expected = model(x, edge_index, edge_attr)
        grads = torch.autograd.grad(expected.square().sum(), [x, edge_attr])
        actual = compiled(x, edge_index, edge_attr)
        actual_grads = torch.autograd.grad(actual.square().sum(), [x, edge_attr])
        assert_close_to_reference("output", actual, expected)
        for name, got, want in zip(["x", "edge_attr"], actual_grads, grads):
            assert_close_to_reference(name, got, want)
