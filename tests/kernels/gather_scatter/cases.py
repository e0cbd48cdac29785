"""The cases the fused gather-scatter tests share (tests/kernels/gather_scatter/test_gather_scatter_*.py; their fixtures
are in conftest.py here): the graph's sizes, the kernels' device, the message functions and their argument roles,
inputs with and without ties, cotangents, and the float32 check against the CPU reference.

The graph has isolated nodes, self loops, duplicate edges and a hub above the split threshold
(``GNN_IO_GS_MAX_EDGES=8``). The kernels run through the op on CUDA when there is a GPU, and on CPU tensors in the
interpreter tier (``TRITON_INTERPRET=1 pytest -m triton``, with ``GNN_IO_TRITON_ON_CPU=1``).
"""

import torch
import torch.nn.functional as F

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.kernels.gather_scatter import launches
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.testing import magnitude, random_graph, tolerance
from tests.tiers import INTERPRETED

DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu")
NUM_NODES = 24
HUB_DEGREE = 40
MAX_EDGES = 8  # the split threshold of these tests: the hub is cut into several items
S, D, E, DN = ROLE_SRC, ROLE_DST, ROLE_EDGE, ROLE_DENSE


def message_key(fn) -> str:
    """The op's key of the message function ``fn`` (traced and registered)."""
    return edge_functions.register(torch.fx.symbolic_trace(fn))


MESSAGES = {
    "identity": (lambda x_j: x_j, [(S, (6,))]),
    "relu_edge": (lambda x_j, e: torch.relu(x_j + e), [(S, (6,)), (E, (6,))]),
    "edge_weight": (lambda x_j, w: x_j * w.view(-1, 1), [(S, (6,)), (E, ())]),
    "leaky_dst": (lambda x_j, x_i, w: F.leaky_relu(x_j - x_i, 0.2) * w, [(S, (2, 3)), (D, (2, 3)), (E, (2, 1))]),
    "dense_param": (lambda x_j, p: torch.tanh(x_j) * p + 0.5, [(S, (6,)), (DN, (6,))]),
    # CGConv's gate; beta and threshold put some entries on each side of the threshold, others far below 0
    "softplus_gate": (lambda x_j, e: torch.sigmoid(x_j) * (F.softplus(8.0 * e) + F.softplus(e, 2.0, 1.0)),
                      [(S, (6,)), (E, (6,))]),
}


def inputs(specs, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_edges = random_graph(NUM_NODES, 50, seed=3, hub_degree=HUB_DEGREE, num_isolated=3).shape[1]
    shapes = [shape if role == DN else ((NUM_NODES if role in (S, D) else num_edges), *shape) for role, shape in specs]
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]


def valued_inputs(specs, values, seed=0):
    """Inputs of ``specs``: ``random`` (ties only from the graph's duplicate edges) or ``integer`` (in
    [-2, 2]: ties everywhere)."""
    args = inputs(specs, torch.float32, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    if values == "integer":
        return [torch.randint(-2, 3, a.shape, generator=generator).double() for a in args]
    return args


def cotangent(key, args, roles, seed=0):
    """A random float64 cotangent of the op's output for message ``key`` over ``args``."""
    lowered = launches.lowering(key, launches.argument_specs([a.float() for a in args], roles))
    return torch.randn(NUM_NODES, *lowered.message_shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def assert_within(actual, expected):
    """float32 within 1e-5, relative to the largest expected element."""
    expected = expected.detach().double().cpu()
    torch.testing.assert_close(actual.detach().double().cpu(), expected,
                               **tolerance(torch.float32, scale=magnitude(expected)))
