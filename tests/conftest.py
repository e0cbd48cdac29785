"""Shared fixtures: one small graph with every case kernels get wrong (isolated nodes, self
loops, duplicate edges, a heavy hub), and float32 node/edge features on it."""
import os
from dataclasses import dataclass

import pytest
import torch

from gnn_inductor.testing import random_graph

# On CPU the cost model leaves every aggregation to Inductor (faster there, gnn_inductor/cost.py); the tests are
# here to check the rewrites and their CPU semantics, so they take the rewrites (subprocesses inherit this).
# Tests of the CPU decline itself unset it.
os.environ.setdefault("GNN_IO_CPU_REWRITE", "1")
# AOTAutograd's cache would load a graph another test (or an earlier run) compiled without running the passes after
# the split, whose records many tests read; the warm-start tests turn it on for their processes.
os.environ.setdefault("GNN_IO_AOT_CACHE", "off")
# A graph compiled with dynamic shapes is also compiled up front as torch.compile's default would compile it, for the
# mini-batch switch (gnn_inductor/churn.py): that doubled the compile time of every test meeting a second graph size
# (GCNConv across the awkward graphs: 33 s, 14 s without it, on a 2-core machine) and, after eight new graphs, would
# check Inductor's code where the rewrites are under test. The tests of the switch set it (tests/plan/test_plan.py,
# the plan-cache churn test, DGL's sampled blocks).
os.environ.setdefault("GNN_IO_CHURN", "off")
# Inductor's multi-threaded CPU kernels add scattered values with atomic_add_vec, whose compiled code (GCC, AVX2) reads
# a by-value vector argument with an aligned load from the stack (vmovdqa 0x8(%rsp)): it segfaults when the stack
# at the call is not 32-byte aligned, which depends on the C call path from Python, so it comes and goes with
# unrelated changes (tests/test_backend.py then tests/plan/test_plan.py crashed in a GCNConv backward kernel after a
# change to the cost model's CUDA-only branches; gdb put the fault on that instruction). Single-threaded
# kernels accumulate without it. Torch's bug, not the backend's: plain torch.compile emits the same kernels.
torch._inductor.config.cpp.threads = 1
# Inductor's scalar C++ kernels instead of its vectorized ones (at::vec templates): the tests check the backend's
# rewrites and Inductor's code is the same graph either way, and the scalar kernels compile in less time. One test
# compiling HGTConv over changing graphs with a cold cache took 65 s of CPU instead of 94 on this 2-core machine.
# The environment variable reaches the tests' subprocesses (examples, warm starts); the config this process.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
torch._inductor.config.cpp.vec_isa_ok = os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "1"

NUM_NODES = 60
NUM_EDGES = 300
HUB_DEGREE = 80
IN_CHANNELS = 8
EDGE_DIM = 4


@dataclass(frozen=True)
class Graph:
    x: torch.Tensor            # [N, IN_CHANNELS] float32 node features
    edge_index: torch.Tensor   # [2, E] int64
    edge_weight: torch.Tensor  # [E] float32, strictly positive
    edge_attr: torch.Tensor    # [E, EDGE_DIM] float32
    edge_attr_x: torch.Tensor  # [E, IN_CHANNELS] float32 (GINE-style messages add it to x_j)

    @property
    def in_channels(self) -> int:
        return self.x.shape[1]

    @property
    def edge_dim(self) -> int:
        return self.edge_attr.shape[1]

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]


@pytest.fixture(scope="session")
def graph() -> Graph:
    edge_index = random_graph(NUM_NODES, NUM_EDGES, seed=0, hub_degree=HUB_DEGREE)
    num_edges = edge_index.shape[1]
    src, dst = edge_index
    # The awkward cases must really be there, or the tests below prove less than they claim.
    assert (src == dst).any(), "no self loops"
    assert torch.unique(edge_index, dim=1).shape[1] < num_edges, "no duplicate edges"
    touched = torch.zeros(NUM_NODES, dtype=torch.bool)
    touched[src] = touched[dst] = True
    assert not touched.all(), "no isolated nodes"
    assert torch.bincount(dst, minlength=NUM_NODES).max() >= HUB_DEGREE, "no hub"

    generator = torch.Generator().manual_seed(1)
    return Graph(
        x=torch.randn(NUM_NODES, IN_CHANNELS, generator=generator),
        edge_index=edge_index,
        edge_weight=torch.rand(num_edges, generator=generator) * 0.9 + 0.1,
        edge_attr=torch.randn(num_edges, EDGE_DIM, generator=generator),
        edge_attr_x=torch.randn(num_edges, IN_CHANNELS, generator=generator),
    )


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (the full grids)")


def pytest_collection_modifyitems(config, items):
    """The tiers (pyproject.toml's markers, tests/run.py): ``slow`` only with ``--slow``; ``cuda`` only with a GPU;
    ``triton`` with a GPU or under Triton's interpreter (``TRITON_INTERPRET=1``). What a tier leaves out is
    deselected, not skipped, so a skip in the report is a real one."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    cuda = torch.cuda.is_available()
    keep, drop = [], []
    for item in items:
        left_out = ((item.get_closest_marker("slow") and not config.getoption("--slow"))
                    or (item.get_closest_marker("cuda") and not cuda)
                    or (item.get_closest_marker("triton") and not (cuda or interpreted)))
        (drop if left_out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
