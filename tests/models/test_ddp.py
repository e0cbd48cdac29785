"""The compiled model under ``DistributedDataParallel``: two CPU processes (gloo), each training on its half of the
global batch, end with the losses and parameters of one process training on the whole batch. Dynamo's
DDPOptimizer splits the captured graph at gradient-bucket boundaries (the model's parameters fill more than one
bucket); the backend compiles each split graph, and the test checks the rewrites survive them.

``torch.compile`` outside the wrapper (``torch.compile(DDP(model))``) and inside it (``DDP(torch.compile(model))``),
as PyTorch documents both."""
import datetime
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GATConv, GCNConv

from gnn_inductor.testing import random_graph, tolerance

NODES, FEATURES, HIDDEN, CLASSES, STEPS = 60, 8, 512, 3, 3
BUCKET_MB = 1  # DDP's first bucket's size; the model's 1.1 MiB of parameters fill more than one


class Model(torch.nn.Module):
    """A GCN layer, a dense layer of 1 MiB (DDP's first gradient bucket: the graph splits after it) and a GAT layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(FEATURES, HIDDEN)
        self.mid = torch.nn.Linear(HIDDEN, HIDDEN)
        self.conv2 = GATConv(HIDDEN, CLASSES, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(self.mid(self.conv1(x, edge_index).relu()).relu(), edge_index)


def _data():
    torch.manual_seed(1)
    edge_index = random_graph(NODES, 240, hub_degree=20)
    x = torch.randn(NODES, FEATURES)
    labels = torch.randint(0, CLASSES, (NODES,))
    train = torch.randperm(NODES)[:40]
    return x, edge_index, labels, train


def _train(model, run, rows, steps=STEPS):
    """SGD steps of the mean cross-entropy over ``rows`` of the full-graph output; the losses."""
    x, edge_index, labels, _ = _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(run(x, edge_index)[rows], labels[rows])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _rank(rank: int, world: int, store: str, where: str, out: str):
    import gnn_inductor
    from gnn_inductor import config

    # a rank that dies leaves the other waiting in a collective: fail after two minutes instead of hanging
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.manual_seed(0)
        model = Model()
        _, _, _, train = _data()
        rows = train.chunk(world)[rank]
        with config.patch(cpu_rewrite=True, strict=True):
            if where == "outside":
                ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
                run = torch.compile(ddp, backend="gnn_io")
            else:
                run = DistributedDataParallel(torch.compile(model, backend="gnn_io"), bucket_cap_mb=BUCKET_MB)
            losses = _train(model, run, rows)
        # each rank's loss is over its half; the global loss is their mean
        total = torch.tensor(losses)
        dist.all_reduce(total)
        reports = gnn_inductor.rewrite_report.reports()
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"losses": (total / world).tolist(),
                           "params": {n: p.detach().tolist() for n, p in model.named_parameters()},
                           "graphs": len(reports), "rewrites": sum(len(r.rewrites) for r in reports),
                           "patterns": sorted({w.pattern for r in reports for w in r.rewrites})}, f)
    finally:
        dist.destroy_process_group()


# Inductor's compile workers (a subprocess pool per rank) can hang a distributed process at exit; PyTorch's own
# distributed Inductor tests run with one compile thread for that reason, and so do these. "outside" (DDPOptimizer's
# splits) runs in CI; "inside" in the slow tier, as two more processes on CI's two cores cost about a minute
@pytest.mark.parametrize("where", ["outside", pytest.param("inside", marks=pytest.mark.slow)])
def test_ddp_on_two_processes_trains_as_one_process_on_the_global_batch(tmp_path, where, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # read by the spawned ranks at import
    out = tmp_path / "rank0.json"
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), where, str(out)), nprocs=2, join=True,
                       start_method="spawn")
    result = json.loads(out.read_text())

    torch.manual_seed(0)
    model = Model()
    _, _, _, train = _data()
    expected = _train(model, model, train)
    # GCNConv's aggregation and GATConv's attention, each in its own split graph
    assert {"spmm", "attention"} <= set(result["patterns"]), result
    assert result["graphs"] > 1, "the bucket cap should have split the captured graph"
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(expected),
                               **tolerance(torch.float32, "layer"))
    for name, value in model.named_parameters():
        torch.testing.assert_close(torch.tensor(result["params"][name]), value.detach(),
                                   **tolerance(torch.float32, "layer"))


# the two-process test above checks the rewrites under DDP in the default tier; one process with --slow (and on the GPU)
@pytest.mark.slow
def test_ddp_world_size_one_keeps_the_rewrites(tmp_path):
    """One process, the gloo backend: the DDP-wrapped compiled model rewrites as the bare one does."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    _rank(0, 1, str(tmp_path / "store"), "outside", str(tmp_path / "rank0.json"))
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["rewrites"] > 0
