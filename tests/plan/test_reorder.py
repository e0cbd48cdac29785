"""Node reordering: each candidate order, the scores, the CSR round trip (outputs and gradients
back in the user's order) and the policy decision, on the CPU."""
import pytest
import torch

from gnn_inductor.plan import orders as reorder
from gnn_inductor.plan.csr import csr_plan
from gnn_inductor.testing import random_graph, tolerance


def csr_of(edge_index: torch.Tensor, num_nodes: int):
    rowptr, col, *_ = csr_plan(edge_index[1], edge_index[0], num_nodes, num_nodes)
    return rowptr, col


def aggregate(rowptr, col, x, weight):
    """Reference weighted sum aggregation ``out[i] = sum_{e: i <- j} w_e x_j`` by plain index_add."""
    rows = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr[1:] - rowptr[:-1])
    return torch.zeros(rowptr.numel() - 1, x.shape[1], dtype=x.dtype).index_add(
        0, rows, x.index_select(0, col) * weight[:, None])


def scrambled_grid(side: int, seed: int = 0):
    """A side x side 4-neighbour grid (both directions) with node ids shuffled."""
    ids = torch.arange(side * side).reshape(side, side)
    right = torch.stack([ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)])
    down = torch.stack([ids[:-1, :].reshape(-1), ids[1:, :].reshape(-1)])
    edges = torch.cat([right, down, right.flip(0), down.flip(0)], dim=1)
    shuffle = torch.randperm(side * side, generator=torch.Generator().manual_seed(seed))
    return shuffle[edges], side * side


def hidden_communities(num_blocks: int, size: int, seed: int = 0):
    """Dense communities (each node linked to most of its block, both ways) in a random node order."""
    generator = torch.Generator().manual_seed(seed)
    nodes = torch.arange(num_blocks * size)
    src = nodes.repeat_interleave(size)
    dst = (nodes // size * size).repeat_interleave(size) + torch.arange(size).repeat(num_blocks * size)
    keep = torch.rand(src.numel(), generator=generator) < 0.8
    shuffle = torch.randperm(num_blocks * size, generator=generator)
    return shuffle[torch.stack([src[keep], dst[keep]])], num_blocks * size


GRAPHS = {
    "random_hub": lambda: (random_graph(60, 300, seed=1, hub_degree=80), 60),
    "random_sparse": lambda: (random_graph(200, 500, seed=2, hub_degree=30, num_isolated=7, duplicates=9), 200),
    "grid": lambda: scrambled_grid(12),
    # 300 copies of one edge (a count that wraps a byte) plus a path.
    "repeated_edge": lambda: (torch.cat([torch.tensor([[1], [0]]).repeat(1, 300),
                                         torch.stack([torch.arange(29), torch.arange(1, 30)])], dim=1), 32),
}


def is_permutation(order: torch.Tensor, n: int) -> bool:
    return order.dtype == torch.int64 and torch.equal(torch.sort(order).values, torch.arange(n))


@pytest.fixture(autouse=True)
def auto_policy(monkeypatch):
    monkeypatch.delenv(reorder.ENV_VAR, raising=False)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("name", reorder.available_candidates())
def test_each_candidate_is_a_permutation(graph, name):
    edge_index, n = GRAPHS[graph]()
    rowptr, col = csr_of(edge_index, n)
    order = reorder.CANDIDATES[name](rowptr, col)
    assert is_permutation(order, n)
    inverse = reorder.inverse_order(order)
    assert torch.equal(inverse[order], torch.arange(n))


def test_degree_order_is_descending_and_stable():
    edge_index, n = GRAPHS["random_sparse"]()
    rowptr, col = csr_of(edge_index, n)
    order = reorder.degree_order(rowptr, col)
    degree = (rowptr[1:] - rowptr[:-1])[order]
    assert bool((degree[:-1] >= degree[1:]).all())
    ties = degree[:-1] == degree[1:]
    assert bool((order[:-1][ties] < order[1:][ties]).all())
    assert order[0] == 0  # the hub


def test_rcm_reduces_bandwidth_of_a_scrambled_grid():
    edge_index, n = scrambled_grid(20)
    rowptr, col = csr_of(edge_index, n)
    order = reorder.rcm_order(rowptr, col)
    new_rowptr, new_col, _ = reorder.permute_csr(rowptr, col, order)
    before, after = reorder.bandwidth(rowptr, col), reorder.bandwidth(new_rowptr, new_col)
    assert after <= 2 * 20 and after * 4 < before


def test_partition_is_skipped_without_pymetis():
    if reorder._pymetis() is not None:
        pytest.skip("pymetis is installed")
    assert "partition" not in reorder.available_candidates()


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("name", reorder.available_candidates())
def test_permute_csr_is_the_relabelled_graph(graph, name):
    edge_index, n = GRAPHS[graph]()
    rowptr, col = csr_of(edge_index, n)
    order = reorder.CANDIDATES[name](rowptr, col)
    inverse = reorder.inverse_order(order)
    new_rowptr, new_col, edge_perm = reorder.permute_csr(rowptr, col, order, inverse)
    rows = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    new_rows = torch.repeat_interleave(torch.arange(n), new_rowptr[1:] - new_rowptr[:-1])
    # Each output edge is the input edge edge_perm points to, relabelled; rows stay sorted.
    assert torch.equal(new_rows, inverse[rows[edge_perm]])
    assert torch.equal(new_col, inverse[col[edge_perm]])
    assert is_permutation(edge_perm, col.numel())
    # Edges of one row keep their input order (duplicates included).
    same_row = new_rows[:-1] == new_rows[1:]
    assert bool((edge_perm[:-1][same_row] < edge_perm[1:][same_row]).all())


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("name", reorder.available_candidates())
def test_reordered_aggregation_is_exact_in_the_original_order(graph, name):
    """Integer-valued float32 data: every sum is exact, so outputs and gradients must be equal bit
    for bit whatever order the additions run in."""
    edge_index, n = GRAPHS[graph]()
    rowptr, col = csr_of(edge_index, n)
    generator = torch.Generator().manual_seed(3)
    x_data = torch.randint(-4, 5, (n, 5), generator=generator).float()
    w_data = torch.randint(1, 4, (col.numel(),), generator=generator).float()
    grad = torch.randint(-3, 4, (n, 5), generator=generator).float()

    x, w = x_data.clone().requires_grad_(), w_data.clone().requires_grad_()
    expected = aggregate(rowptr, col, x, w)
    expected.backward(grad)

    order = reorder.CANDIDATES[name](rowptr, col)
    inverse = reorder.inverse_order(order)
    new_rowptr, new_col, edge_perm = reorder.permute_csr(rowptr, col, order, inverse)
    x2, w2 = x_data.clone().requires_grad_(), w_data.clone().requires_grad_()
    out = reorder.from_order(aggregate(new_rowptr, new_col, reorder.to_order(x2, order), w2[edge_perm]), inverse)
    out.backward(grad)

    assert torch.equal(out, expected)
    assert torch.equal(x2.grad, x.grad)
    assert torch.equal(w2.grad, w.grad)
    isolated = (rowptr[1:] == rowptr[:-1])
    assert bool((out[isolated] == 0).all())


@pytest.mark.parametrize("name", reorder.available_candidates())
def test_reordered_aggregation_float64_random(name):
    edge_index, n = GRAPHS["random_hub"]()
    rowptr, col = csr_of(edge_index, n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(col.numel(), dtype=torch.float64, requires_grad=True)
    expected = aggregate(rowptr, col, x, w)
    gx, gw = torch.autograd.grad(expected.square().sum(), (x, w))

    order = reorder.CANDIDATES[name](rowptr, col)
    inverse = reorder.inverse_order(order)
    new_rowptr, new_col, edge_perm = reorder.permute_csr(rowptr, col, order, inverse)
    out = reorder.from_order(aggregate(new_rowptr, new_col, reorder.to_order(x, order), w[edge_perm]), inverse)
    gx2, gw2 = torch.autograd.grad(out.square().sum(), (x, w))
    # Each row sums its edges in the same order as before: the forward is bit for bit equal.
    assert torch.equal(out, expected)
    torch.testing.assert_close(gx2, gx, **tolerance(torch.float64, "reassociated"))
    torch.testing.assert_close(gw2, gw, **tolerance(torch.float64, "reassociated"))


def test_tile_stats_by_hand():
    # 16 rows each reading columns 0..15: one full tile; a duplicate edge adds no cell.
    rows = torch.arange(16).repeat_interleave(16)
    cols = torch.arange(16).repeat(16)
    edge_index = torch.stack([torch.cat([cols, cols[:1]]), torch.cat([rows, rows[:1]])])
    rowptr, col = csr_of(edge_index, 40)
    assert reorder.tile_stats(rowptr, col) == {"tiles": 1, "nonzeros": 256, "tile_fill": 1.0}
    # Row 16 (the next window) reads 17 distinct columns far apart: condensed into 2 tiles.
    extra = torch.stack([torch.arange(17) * 2 + 5, torch.full((17,), 16)])
    rowptr, col = csr_of(torch.cat([edge_index, extra], dim=1), 40)
    stats = reorder.tile_stats(rowptr, col)
    assert stats["tiles"] == 3
    assert stats["tile_fill"] == pytest.approx((256 + 17) / (3 * 256))


def test_locality_stats_by_hand():
    # Rows 0..31 (one window) all read source 0, and row 0 also reads sources 32 and 33.
    edge_index = torch.stack([torch.cat([torch.zeros(32, dtype=torch.long), torch.tensor([32, 33])]),
                              torch.cat([torch.arange(32), torch.tensor([0, 0])])])
    rowptr, col = csr_of(edge_index, 64)
    stats = reorder.locality_stats(rowptr, col)
    assert stats["neighbour_blocks"] == 2
    assert stats["block_ratio"] == pytest.approx(2 / 34)
    assert stats["source_reuse"] == pytest.approx(3 / 34)


def test_rcm_improves_both_scores_on_hidden_communities():
    edge_index, n = hidden_communities(16, 16)
    rowptr, col = csr_of(edge_index, n)
    new_rowptr, new_col, _ = reorder.permute_csr(rowptr, col, reorder.rcm_order(rowptr, col))
    assert reorder.tile_stats(new_rowptr, new_col)["tile_fill"] > 2 * reorder.tile_stats(rowptr, col)["tile_fill"]
    assert (reorder.locality_stats(new_rowptr, new_col)["block_ratio"]
            < reorder.locality_stats(rowptr, col)["block_ratio"])


@pytest.mark.parametrize("kernel", ["block_sparse", "csr"])
def test_policy_is_off_for_a_single_call(kernel):
    rowptr, col = csr_of(*hidden_communities(16, 16))
    decision = reorder.choose_order(rowptr, col, kernel, expected_calls=1, build_cost_ms=0.0)
    assert not decision.applied and decision.name == "none" and decision.order is None
    assert "expected_calls=1" in decision.reason


@pytest.mark.parametrize("kernel", ["block_sparse", "csr"])
def test_policy_applies_an_order_that_repays_its_build(kernel):
    rowptr, col = csr_of(*hidden_communities(16, 16))
    decision = reorder.choose_order(rowptr, col, kernel, expected_calls=10**9, build_cost_ms=1.0)
    assert decision.applied and decision.name == decision.candidate != "none"
    assert decision.scores[decision.name] < decision.scores["none"]
    assert decision.predicted_gain_ms > 1.0
    assert set(decision.scores) == set(reorder.available_candidates())
    assert is_permutation(decision.order, rowptr.numel() - 1)
    assert torch.equal(decision.inverse[decision.order], torch.arange(rowptr.numel() - 1))
    summary = decision.as_dict()
    assert summary["applied"] and "order" not in summary


def test_policy_declines_when_the_build_costs_more_than_the_gain():
    rowptr, col = csr_of(*hidden_communities(16, 16))
    decision = reorder.choose_order(rowptr, col, "block_sparse", expected_calls=10, build_cost_ms=1e6)
    assert not decision.applied and decision.name == "none" and decision.order is None
    assert "does not repay" in decision.reason
    assert decision.candidate != "none" and decision.predicted_gain_ms > 0


def test_policy_declines_when_no_order_helps():
    # Already banded and dense: every row window reads its own 16 columns.
    rows = torch.arange(64).repeat_interleave(16)
    cols = (rows // 16) * 16 + torch.arange(16).repeat(64)
    rowptr, col = csr_of(torch.stack([cols, rows]), 64)
    decision = reorder.choose_order(rowptr, col, "block_sparse", expected_calls=10**9, build_cost_ms=0.0)
    assert not decision.applied and "less than" in decision.reason


@pytest.mark.parametrize("forced", ["degree", "rcm", "none"])
def test_forced_order_is_honoured(monkeypatch, forced):
    monkeypatch.setenv(reorder.ENV_VAR, forced)
    rowptr, col = csr_of(*GRAPHS["random_hub"]())
    decision = reorder.choose_order(rowptr, col, "csr", expected_calls=1)
    assert decision.name == forced and decision.applied == (forced != "none")
    assert reorder.ENV_VAR in decision.reason
    if forced != "none":
        assert torch.equal(decision.order, reorder.CANDIDATES[forced](rowptr, col))


def test_forced_off_never_reorders(monkeypatch):
    monkeypatch.setenv(reorder.ENV_VAR, "off")
    rowptr, col = csr_of(*hidden_communities(16, 16))
    decision = reorder.choose_order(rowptr, col, "block_sparse", expected_calls=10**9, build_cost_ms=0.0)
    assert not decision.applied and decision.order is None and "off" in decision.reason


def test_bad_settings_name_the_fix(monkeypatch):
    rowptr, col = csr_of(*GRAPHS["random_hub"]())
    with pytest.raises(ValueError, match="unknown kernel family"):
        reorder.choose_order(rowptr, col, "dense", expected_calls=5)
    monkeypatch.setenv(reorder.ENV_VAR, "metis-ish")
    with pytest.raises(ValueError, match="GNN_IO_REORDER"):
        reorder.choose_order(rowptr, col, "csr", expected_calls=5)
    if reorder._pymetis() is None:
        monkeypatch.setenv(reorder.ENV_VAR, "partition")
        with pytest.raises(ValueError, match="pip install pymetis"):
            reorder.choose_order(rowptr, col, "csr", expected_calls=5)
