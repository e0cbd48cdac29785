"""The attention cases the fused CSR attention tests share (tests/kernels/attention/test_attention_*.py): each layer
family's edge functions as the backend cuts them from PyG's layers, with and without edge features and attention
dropout, their arguments, the CSR plan of a graph with a hub, isolated nodes, self loops and duplicate edges, and the
check of the op (fused kernels on CUDA or under Triton's interpreter) against the CPU reference, forward and gradients.
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.kernels.attention.op import attention_reference
from gnn_inductor.kernels.runtime import edge_functions, rng
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.testing import magnitude, random_graph, tolerance
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE

NUM_NODES, HEADS, CHANNELS = 24, 2, 4
MAX_EDGES = 8  # far below the hub's degree: the hub is split into several items and combined
EPS = 1e-16
DROPOUT_P, DROPOUT_SEED = 0.3, 1234567
aten = torch.ops.aten

# where the op's own tests run: the fused kernels (CUDA, the interpreter), else the CPU reference
OP_DEVICE = DEVICE if INTERPRETED or torch.cuda.is_available() else torch.device("cpu")


def edge_fn(f):
    return edge_functions.register(torch.fx.symbolic_trace(f))


# The edge functions exactly as the backend cuts them from PyG 2.8 (aten ops, argument order and roles).
def _gat_score(a0, a1, a2):
    return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)


def _gat_score_edge(a0, a1, a2, a3):
    return aten.leaky_relu.default(aten.add.Tensor(aten.add.Tensor(a1, a2), a3), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gat_message_edge(alpha, a0, a1, a2, a3):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gatv2_score(a0, a1, a2):
    return aten.sum.dim_IntList(aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(a1, a0), 0.2), a2), [-1])


def _gatv2_score_edge(a0, a1, a2, a3):
    inner = aten.leaky_relu.default(aten.add.Tensor(aten.add.Tensor(a1, a0), a2), 0.2)
    return aten.sum.dim_IntList(aten.mul.Tensor(inner, a3), [-1])


def _gatv2_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(a0, aten.unsqueeze.default(alpha, -1))


def _gatv2_message_edge(alpha, a0, a1, a2, a3):
    return aten.mul.Tensor(a0, aten.unsqueeze.default(alpha, -1))


def _dot_score(a0, a1, a2):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0)


def _dot_score_edge(a0, a1, a2, a3):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a2, aten.add.Tensor(a3, a1)), [-1]), 2.0)


def _dot_message_for(heads):
    def message(alpha, a0, a1, a2):
        return aten.mul.Tensor(a0, aten.view.default(alpha, [-1, heads, 1]))
    return message


def _dot_message_edge_for(heads):
    def message(alpha, a0, a1, a2, a3):
        return aten.mul.Tensor(aten.add.Tensor(a0, a1), aten.view.default(alpha, [-1, heads, 1]))
    return message


_dot_message, _dot_message_edge = _dot_message_for(HEADS), _dot_message_edge_for(HEADS)
# TransformerConv views alpha with the head count baked in: other head counts need their own message
MESSAGE_FOR_HEADS = {"transformer": _dot_message_for, "transformer_edge": _dot_message_edge_for,
                     "transformer_dropout": _dot_message_edge_for}


S, D, E, V, P = "src", "dst", "edge", "vector", "per-head"
# name: (score, message, family, [(role, kind)] of the arguments)
CASES = {
    "gat": (_gat_score, _gat_message, "gat", [(ROLE_SRC, V), (ROLE_SRC, P), (ROLE_DST, P)]),
    "gat_edge": (_gat_score_edge, _gat_message_edge, "gat",
                 [(ROLE_SRC, V), (ROLE_SRC, P), (ROLE_DST, P), (ROLE_EDGE, P)]),
    "gatv2": (_gatv2_score, _gatv2_message, "gatv2", [(ROLE_SRC, V), (ROLE_DST, V), (ROLE_DENSE, "att")]),
    "gatv2_edge": (_gatv2_score_edge, _gatv2_message_edge, "gatv2",
                   [(ROLE_SRC, V), (ROLE_DST, V), (ROLE_EDGE, V), (ROLE_DENSE, "att")]),
    "transformer": (_dot_score, _dot_message, "dot", [(ROLE_SRC, V), (ROLE_DST, V), (ROLE_SRC, V)]),
    "transformer_edge": (_dot_score_edge, _dot_message_edge, "dot",
                         [(ROLE_SRC, V), (ROLE_EDGE, V), (ROLE_DST, V), (ROLE_SRC, V)]),
}
# With attention dropout: the same edge functions (the op applies dropout to alpha), and a seed and p
for _name in ("gat_edge", "gatv2_edge", "transformer_edge"):
    CASES[_name.replace("_edge", "_dropout")] = CASES[_name]


def dropout_for(name, device=torch.device("cpu"), seed=DROPOUT_SEED):
    """The :class:`rng.Dropout` of a ``*_dropout`` case (None for the others)."""
    if not name.endswith("_dropout"):
        return None
    return rng.Dropout(torch.tensor(seed, device=device), DROPOUT_P)


def dropout_args(dropout) -> tuple:
    """``(dropout_seed, dropout_p)`` of the op."""
    return (None, 0.0) if dropout is None else (dropout.seed, dropout.p)


@pytest.fixture(scope="module")
def plan():
    """CSR plan of a graph with a hub, isolated nodes, self loops and duplicate edges."""
    src, dst = random_graph(NUM_NODES, 50, seed=3, hub_degree=30, num_isolated=3)
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    degree = plan[0][1:] - plan[0][:-1]
    assert degree.max() > 3 * MAX_EDGES and (degree == 0).any()
    return plan


def make_args(kinds, num_edges, dtype=torch.float32, seed=0, heads=HEADS, channels=CHANNELS, num_nodes=NUM_NODES):
    generator = torch.Generator().manual_seed(seed)
    args = []
    for role, kind in kinds:
        rows = num_edges if role == ROLE_EDGE else num_nodes
        if kind == V:
            args.append(torch.randn(rows, heads, channels, generator=generator))
        elif kind == P:
            args.append(torch.randn(rows, heads, generator=generator))
        else:
            args.append(torch.randn(1, heads, channels, generator=generator))
    return [a.to(dtype) for a in args]


def grads_of(fn, args, grad):
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(leaves)
    out.backward(grad.to(out.dtype))
    return out.detach(), [leaf.grad for leaf in leaves]


def assert_close(actual, expected, dtype, name):
    expected = expected.to(dtype).double().cpu()
    torch.testing.assert_close(actual.double().cpu(), expected, **tolerance(dtype, "kernel", scale=magnitude(expected)),
                               msg=lambda m: f"{name}: {m}")


def check_case(name, plan, dtype=torch.float32, heads=HEADS, channels=CHANNELS):
    score_fn, message_fn, family, kinds = CASES[name]
    score = edge_fn(score_fn)
    message = edge_fn(MESSAGE_FOR_HEADS[name](heads) if name in MESSAGE_FOR_HEADS and heads != HEADS else message_fn)
    roles = [role for role, _ in kinds]
    rowptr, col, row, perm = plan[:4]
    args = make_args(kinds, col.numel(), dtype, heads=heads, channels=channels)
    layout = attention_layout.prepare(args, roles, perm, score, message)
    assert not isinstance(layout, str), layout
    assert layout.form.family == family
    grad = torch.randn(NUM_NODES, heads, channels, generator=torch.Generator().manual_seed(7))

    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    dropout = dropout_for(name, DEVICE)
    out, grads = grads_of(lambda a: torch.ops.gnn_io.attention(a, roles, *on_device, score, message, EPS, items,
                                                               MAX_EDGES, *dropout_args(dropout)),
                          [a.to(DEVICE) for a in args], grad.to(DEVICE))
    wide = [a.double() if a.is_floating_point() else a for a in args]
    ref, ref_grads = grads_of(lambda a: attention_reference(a, roles, rowptr, col, row, perm, score, message, EPS,
                                                            dropout_for(name)), wide, grad.double())
    assert out.dtype == dtype and out.device.type == DEVICE.type
    assert_close(out, ref, dtype, "output")
    assert not out[-3:].any(), "isolated nodes must get 0"
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None:
            assert g is None
            continue
        assert g is not None and g.dtype == dtype, f"grad of argument {i}"
        assert_close(g, r, dtype, f"grad of argument {i}")


# ---- the kernels (CUDA, or the interpreter on CPU) ----

