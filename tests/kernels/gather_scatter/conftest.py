"""The gather-scatter tests' fixtures: under Triton's interpreter the op's Triton path for CPU tensors (every test
here), the CSR plan of the test graph on the kernels' device, and the kernels the op launches
(tests/kernels/gather_scatter/cases.py has the graph and the messages)."""

import pytest
import torch

from gnn_inductor.kernels.gather_scatter import launches
from gnn_inductor.testing import random_graph
from tests.kernels.gather_scatter.cases import DEVICE, HUB_DEGREE, MAX_EDGES, NUM_NODES
from tests.tiers import INTERPRETED


@pytest.fixture(autouse=True)
def triton_path_for_cpu_tensors(monkeypatch):
    """Under the interpreter the op sends CPU tensors down the Triton path (``GNN_IO_TRITON_ON_CPU``)."""
    if INTERPRETED:
        monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")


@pytest.fixture(scope="module")
def plan():
    """The CSR plan on the kernels' device; the split threshold stays MAX_EDGES while the module runs
    (the op builds its work items from it when none are passed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNN_IO_GS_MAX_EDGES", str(MAX_EDGES))
        src, dst = random_graph(NUM_NODES, 50, seed=3, hub_degree=HUB_DEGREE, num_isolated=3)
        plan = torch.ops.gnn_io.csr_plan(dst.to(DEVICE), src.to(DEVICE), NUM_NODES, NUM_NODES)
        degree = plan[0][1:] - plan[0][:-1]
        assert degree.max() > 4 * MAX_EDGES and (degree == 0).any()
        assert bool((src == dst).any())
        yield plan


@pytest.fixture
def launched(monkeypatch):
    """The ``KernelSpec`` of every kernel the op launches while the test runs."""
    specs, kernel = [], launches.kernel
    monkeypatch.setattr(launches, "kernel",
                        lambda lowered, spec: specs.append(spec) or kernel(lowered, spec))
    return specs
