import torch

from benchmarks.sampler import hetero_neighbor_sample, neighbor_sample, to_csc


def _graph(n_src, n_dst, m, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n_src, (m,), generator=g), torch.randint(0, n_dst, (m,), generator=g)])


def test_one_node_and_edge_type_samples_as_the_homogeneous_sampler():
    edge_index = _graph(60, 60, 400, 0)
    seeds = torch.tensor([3, 17, 42, 5])
    homo = neighbor_sample(to_csc(edge_index, 60), seeds, [4, 3], torch.Generator().manual_seed(1))
    hetero = hetero_neighbor_sample({("v", "to", "v"): to_csc(edge_index, 60)}, {"v": 60}, "v", seeds, [4, 3],
                                    torch.Generator().manual_seed(1))
    assert torch.equal(hetero.n_id["v"], homo.n_id)
    assert torch.equal(hetero.edge_index["v", "to", "v"], homo.edge_index)
    assert torch.equal(hetero.e_id["v", "to", "v"], homo.e_id) and hetero.batch_size == 4


def test_every_sampled_edge_is_a_graph_edge_between_frontier_nodes_within_the_fanout():
    num_nodes = {"user": 50, "item": 30}
    graph = {("user", "rates", "item"): _graph(50, 30, 300, 2)}
    graph["item", "rated_by", "user"] = graph["user", "rates", "item"].flip(0)
    cscs = {(s, r, d): to_csc(e, num_nodes[d], num_src=num_nodes[s]) for (s, r, d), e in graph.items()}
    seeds = torch.tensor([4, 9, 11])
    batch = hetero_neighbor_sample(cscs, num_nodes, "item", seeds, [3, 2], torch.Generator().manual_seed(0))
    assert torch.equal(batch.n_id["item"][:3], seeds)
    for t, ids in batch.n_id.items():
        assert ids.unique().numel() == ids.numel()
    for (src, rel, dst), local in batch.edge_index.items():
        original = graph[src, rel, dst][:, batch.e_id[src, rel, dst]]
        assert torch.equal(batch.n_id[src][local[0]], original[0])
        assert torch.equal(batch.n_id[dst][local[1]], original[1])
        # at most 3 in-edges per destination and hop (each destination is in one hop's frontier)
        assert local.shape[1] == 0 or torch.bincount(local[1]).max() <= 3
    # hop 1 reaches users from the seed items only; hop 2 samples items from those users
    assert set(batch.edge_index["user", "rates", "item"][1].tolist()) <= set(range(3))
    assert batch.edge_index["item", "rated_by", "user"].shape[1] > 0
