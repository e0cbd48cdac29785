"""The mini-batch benchmark's sampler follows pyg-lib's rules for ``NeighborLoader``, its graphs have the sizes they
claim, and the benchmark runs end to end (tiny graph, CPU): a check of the workload, not a benchmark."""
import json
import math

import pytest
import torch

from benchmarks import minibatch, step_profile
from benchmarks.graphs import graph_suite, rmat_like
from benchmarks.sampler import floyd_sample, neighbor_sample, to_csc


def known_degrees(num_nodes=60, seed=0):
    """Node ``v`` has in-degree ``v % 9`` (distinct sources, no self loops); edges in coalesced order."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for v in range(num_nodes):
        others = torch.tensor([u for u in range(num_nodes) if u != v])
        pairs += [(int(u), v) for u in others[torch.randperm(len(others), generator=generator)[:v % 9]]]
    edge_index = torch.tensor(sorted(pairs)).t().contiguous()
    return edge_index, num_nodes


def reference(edge_index, num_nodes, seeds, num_neighbors):
    """pyg-lib's loop, node by node, for fanouts that take every in-neighbour (no random draws)."""
    incoming = {v: [] for v in range(num_nodes)}
    for u, v in sorted(edge_index.t().tolist(), key=lambda e: (e[1], e[0])):
        incoming[v].append(u)
    nodes, local, rows, cols = list(seeds), {s: i for i, s in enumerate(seeds)}, [], []
    begin, end = 0, len(nodes)
    for _ in num_neighbors:
        for i in range(begin, end):
            for u in incoming[nodes[i]]:
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                rows.append(local[u])
                cols.append(i)
        begin, end = end, len(nodes)
    return nodes, [rows, cols]


def check_batch(batch, edge_index, num_nodes, seeds, fanouts):
    """The rules every sampled batch keeps; returns the in-degrees."""
    degree = torch.bincount(edge_index[1], minlength=num_nodes)
    n_id, (row, col) = batch.n_id, batch.edge_index
    real = {tuple(e) for e in edge_index.t().tolist()}
    assert torch.equal(n_id[:batch.batch_size], seeds) and n_id.unique().numel() == n_id.numel()
    assert batch.batch_size == len(seeds) and sum(batch.num_sampled_nodes) == n_id.numel()
    assert batch.num_sampled_nodes[0] == len(seeds) and len(batch.num_sampled_edges) == len(fanouts)
    assert sum(batch.num_sampled_edges) == row.numel()
    assert all((int(n_id[s]), int(n_id[d])) in real for s, d in zip(row.tolist(), col.tolist()))
    assert torch.equal(edge_index[:, batch.e_id], n_id[batch.edge_index])
    # grouped by destination in sampled order: the destinations' local ids never decrease
    assert bool((col[1:] >= col[:-1]).all())
    # new nodes numbered in the order the edges meet them
    seen, expected = set(range(batch.batch_size)), []
    for s in row.tolist():
        if s not in seen:
            seen.add(s)
            expected.append(s)
    assert expected == list(range(batch.batch_size, n_id.numel()))
    # hop by hop: each frontier node has exactly min(fanout, deg) distinct sampled in-neighbours
    frontier_start, edge_start = 0, 0
    for hop, fanout in enumerate(fanouts):
        frontier = range(frontier_start, frontier_start + batch.num_sampled_nodes[hop])
        hop_edges = slice(edge_start, edge_start + batch.num_sampled_edges[hop])
        for d in frontier:
            sources = row[hop_edges][col[hop_edges] == d]
            want = int(degree[n_id[d]]) if fanout < 0 else min(fanout, int(degree[n_id[d]]))
            assert sources.numel() == want == sources.unique().numel()
        assert set(col[hop_edges].tolist()) <= set(frontier)
        frontier_start += batch.num_sampled_nodes[hop]
        edge_start += batch.num_sampled_edges[hop]
    return degree


def test_sampler_draws_min_fanout_degree_distinct_real_in_neighbours():
    edge_index, n = known_degrees()
    csc = to_csc(edge_index, n)
    seeds = torch.tensor([8, 17, 3, 26, 0, 44])
    for fanouts in ([4, 3], [5, 2, 6], [0, 3]):
        batch = neighbor_sample(csc, seeds, fanouts, torch.Generator().manual_seed(1))
        check_batch(batch, edge_index, n, seeds, fanouts)
    batch = neighbor_sample(csc, seeds, [4, 3], torch.Generator().manual_seed(1))
    assert batch.num_sampled_edges[0] == sum(min(4, int(s) % 9) for s in seeds)


def test_sampler_takes_every_in_neighbour_in_pyg_libs_order():
    """Fanout -1, or one at least the in-degree, takes every in-neighbour in CSC order: the whole output (node
    numbering and edge order) is then pyg-lib's own, with no random draw involved."""
    edge_index, n = known_degrees(seed=2)
    csc = to_csc(edge_index, n)
    seeds = [35, 7, 52]
    for fanouts in ([-1, -1], [8, 9], [-1, 20]):
        batch = neighbor_sample(csc, torch.tensor(seeds), fanouts, torch.Generator().manual_seed(0))
        nodes, edges = reference(edge_index, n, seeds, fanouts)
        assert batch.n_id.tolist() == nodes and batch.edge_index.tolist() == edges
        check_batch(batch, edge_index, n, torch.tensor(seeds), fanouts)


def test_floyd_draws_uniform_subsets_without_replacement():
    picks = floyd_sample(torch.full((24_000,), 6), 3, torch.Generator().manual_seed(0))
    assert ((picks >= 0) & (picks < 6)).all()
    assert (picks.sort(1).values.diff(dim=1) > 0).all()  # distinct within a row
    subsets = torch.bincount((1 << picks).sum(1), minlength=64)[[m for m in range(64) if bin(m).count("1") == 3]]
    assert subsets.numel() == 20 and (subsets - 1200).abs().max() < 200  # each 3-subset of 6: 1/20


def test_minibatch_sampler_draws_real_edges_seeds_first():
    from gnn_inductor.testing import random_graph

    edge_index = random_graph(200, 1500, seed=3, hub_degree=60)
    csc = to_csc(edge_index, 200)
    seeds = torch.tensor([5, 17, 99, 150])
    batch = neighbor_sample(csc, seeds, [4, 3], torch.Generator().manual_seed(0))
    degree = check_batch(batch, edge_index, 200, seeds, [4, 3])
    sub = batch.edge_index
    assert sub.min() >= 0 and sub.max() < batch.n_id.numel() and sub.shape[1] > 0
    assert set(sub[1].tolist()) >= {i for i, s in enumerate(seeds.tolist()) if degree[s] > 0}


def test_rmat_like_has_the_sizes_it_claims():
    directed = rmat_like(1000, 7000, undirected=False, seed=4)
    assert directed.edge_index.equal(rmat_like(1000, 7000, undirected=False, seed=4).edge_index)
    undirected = rmat_like(1000, 8000, undirected=True, seed=4)
    for g, edges in ((directed, 7000), (undirected, 8000)):
        src, dst = g.edge_index
        assert g.num_nodes == 1000 and g.num_edges == edges and int(g.edge_index.max()) < 1000
        assert (src * 1000 + dst).unique().numel() == edges and not (src == dst).any()
    key = undirected.edge_index[0] * 1000 + undirected.edge_index[1]
    assert torch.equal(key.sort().values, (undirected.edge_index[1] * 1000 + undirected.edge_index[0]).sort().values)
    assert graph_suite(["rmat-small"], ".", "cpu")[0].num_nodes == 1024


def test_minibatch_runs_end_to_end(tmp_path):
    out = tmp_path / "minibatch.json"
    minibatch.main(["--graph", "rmat-small", "--model", "sage_mean", "--layers", "2", "--hidden", "16",
                    "--features", "8", "--classes", "4", "--batch", "16", "--fanout", "4,3", "--pool", "3",
                    "--steps", "2", "--warmup", "2", "--epoch", "--train-fraction", "0.05", "--device", "cpu",
                    "--modes", "eager,gnn_io", "--same-process", "--profile", "2", "--phases", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    records = {r["mode"]: r for r in data["records"]}
    assert set(records) == {"eager", "gnn_io"} and data["args"]["fanout"] == "4,3"
    assert data["meta"]["command"].startswith("python -m benchmarks.minibatch ") and data["meta"]["torch"]
    for r in records.values():
        assert "error" not in r, r
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("alone_ms", "loop_ms", "sampled_ms", "epoch_s"))
        assert r["epoch_steps"] == math.ceil(int(0.05 * 1024) / 16) and r["recompiles"] >= 0 <= r["aot_compiles"]
    assert records["eager"]["rel_err"] == 0 and records["gnn_io"]["rel_err"] < 1e-4
    for r in records.values():  # every phase timed, the forward and backward never free
        assert list(r["phases_ms"]) == list(minibatch.PHASES), r["phases_ms"]
        assert all(ms >= 0 for ms in r["phases_ms"].values()) and r["phases_ms"]["forward"] > 0 < \
            r["phases_ms"]["backward"]
    for r in records.values():  # on the CPU the profile has no GPU ops, and its wall time per step
        assert r["gpu_ops"] == 0 == r["gpu_busy_ms"] and r["profiled_ms"] > 0 and r["top_gpu"] == []
        # the host's ranges and ops, the longest first, each at most the profiled step's time
        times = [ms for _, ms, _ in r["top_host"]]
        assert times and times == sorted(times, reverse=True), r["top_host"]
        assert all(0 < ms <= r["profiled_ms"] and count > 0 for _, ms, count in r["top_host"])


def test_pool_zero_takes_a_new_batch_every_step():
    """``--pool 0``: one pre-sampled batch per step (the warm-up, both timed loops, the phases and the profiled steps),
    so that no step meets a batch twice, as in training."""
    args = minibatch.parse(["--pool", "0", "--warmup", "3", "--steps", "4", "--phases", "5", "--profile", "2",
                            "--host-profile", "6"])
    assert args.pool == 3 + 2 * 4 + 5 + 2 + 6
    assert minibatch.parse(["--pool", "7"]).pool == 7


def test_host_functions_rank_the_python_a_step_runs():
    def inner():
        return sum(i * i for i in range(2000))

    def step():
        return inner() + inner()

    found = step_profile.host_functions(step, 3, top=50)
    by_self = {where.split(":")[-1]: (ms, calls) for where, ms, calls in found["host_self"]}
    by_inclusive = {where.split(":")[-1]: (ms, calls) for where, ms, calls in found["host_inclusive"]}
    assert by_inclusive[next(k for k in by_inclusive if k.endswith("(step)"))][1] == 1  # calls per step
    assert by_inclusive[next(k for k in by_inclusive if k.endswith("(inner)"))][1] == 2
    assert [ms for _, ms, _ in found["host_self"]] == sorted((ms for _, ms, _ in found["host_self"]), reverse=True)
    assert any(k.endswith("(<genexpr>)") for k in by_self)


def test_busy_time_is_the_union_of_intervals():
    assert step_profile.busy_ns([]) == 0
    assert step_profile.busy_ns([(5, 7), (0, 2), (1, 3), (10, 11), (6, 6)]) == 3 + 2 + 1
    assert step_profile.busy_ns([(0, 10), (2, 3)]) == 10


@pytest.mark.parametrize("name,kind", [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize64x64x8_stage3", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nt_align1>", "gemm"),
    ("_stationary_kernel", "gemm"),
    ("_segment_mm_kernel", "gemm"),
    ("_segment_weight_grad_kernel", "gemm"),
    ("void cusparse::csrmm_alg2_kernel<false, false, false, int, int, int, int, float>", "message passing"),
    ("triton_poi_fused_expand_index_select_scatter_add_select_view_9", "message passing"),
    ("forward_all_heads_kernel", "message passing"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float>", "loss"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>", "optimizer"),
    ("Memset (Device)", "copy or fill"),
    ("triton_poi_fused_add_addmm_relu_11", "other"),
])
def test_gpu_ops_fall_in_one_kind_by_name(name, kind):
    assert step_profile.kind_of(name) == kind
