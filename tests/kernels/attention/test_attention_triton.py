"""The fused CSR attention kernels (kernels/attention/csr_*.py) against the CPU reference of gnn_io::attention.

Kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py). Under the
interpreter ``torch.ops.gnn_io.attention`` itself takes the fused path on CPU tensors, so these tests go
through the op, its autograd formula and the launchers. Family recognition runs everywhere, including on the
edge functions the backend cuts from real PyG layers.

Attention dropout (``*_dropout`` cases: the op given a seed and ``p``, kernels/runtime/rng.py): the kernels against the
reference with the same seed, the reference against PyG's own math with the mask drawn in the user's edge order,
and compiled PyG layers in training against eager PyG given the mask regenerated from the seed the op drew.
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
import torch.nn.functional as F
from gnn_inductor.kernels.attention import csr_backward
from gnn_inductor.kernels.attention import csr_delta
from gnn_inductor.kernels.attention import csr_forward
from gnn_inductor.kernels.attention import csr_launch
from gnn_inductor.kernels.attention import csr_split_backward
from gnn_inductor.kernels.attention import forms as attention_forms
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.runtime.launch import next_power_of_2
from gnn_inductor.kernels.attention.op import _reference_with_lse, attention_reference, kernel_name
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv
from torch_geometric.utils import softmax as pyg_softmax

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor import rewrite_report
from gnn_inductor.testing import check_rewrites, magnitude, random_graph, tolerance
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, runs_kernel, tiered, tiered_at

NUM_NODES, HEADS, CHANNELS = 24, 2, 4
MAX_EDGES = 8  # far below the hub's degree: the hub is split into several items and combined
EPS = 1e-16
DROPOUT_P, DROPOUT_SEED = 0.3, 1234567
aten = torch.ops.aten

# where the op's own tests run: the fused kernels (CUDA, the interpreter), else the CPU reference
OP_DEVICE = DEVICE if INTERPRETED or torch.cuda.is_available() else torch.device("cpu")


def _fn(f):
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
    score = _fn(score_fn)
    message = _fn(MESSAGE_FOR_HEADS[name](heads) if name in MESSAGE_FOR_HEADS and heads != HEADS else message_fn)
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

@runs_kernel
@pytest.mark.parametrize("name", tiered(list(CASES), ["gat", "gatv2_edge", "transformer_edge"]))
def test_fused_matches_reference(plan, name):
    check_case(name, plan)


@runs_kernel
@pytest.mark.parametrize("name", tiered(["gatv2_edge", "transformer_edge"], ["transformer_edge"]))
def test_half_precision_accumulates_in_float32(plan, name):
    check_case(name, plan, torch.bfloat16)


@runs_kernel
def test_saved_log_sum_exp_is_the_reference(plan):
    score_fn, message_fn, _, kinds = CASES["transformer_edge"]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    args = make_args(kinds, plan[1].numel())
    on_device = [t.to(DEVICE) for t in plan[:4]]
    out, lse = torch.ops.gnn_io.attention_forward([a.to(DEVICE) for a in args], roles, *on_device, score, message,
                                                  EPS, [], 0)
    ref, ref_lse = _reference_with_lse(args, roles, *plan[:4], score, message, EPS)
    assert_close(out, ref, torch.float32, "output")
    assert_close(lse, ref_lse, torch.float32, "lse")


@runs_kernel
def test_hub_slots_exact_or_bounded_give_the_same_result(plan):
    """The forward's hub slots: as many as the plan's items hold hub items (known for the op's own tensors) or the
    size-only bound (a copy of the items): the same output and log-sum-exp."""
    from gnn_inductor.plan.work_items import hub_item_count

    score_fn, message_fn, _, kinds = CASES["gatv2_edge"]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel())]
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    copies = [t.clone() for t in items]
    assert hub_item_count(items) == int((items[3] == 1).sum()) > 0 and hub_item_count(copies) is None
    exact = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, items, MAX_EDGES)
    bounded = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, copies, MAX_EDGES)
    for a, b in zip(exact, bounded):
        torch.testing.assert_close(a, b, **tolerance(a.dtype, "exact"))


@pytest.fixture
def poisoned_empty(monkeypatch):
    """``torch.empty`` returning NaN-filled floating tensors: a kernel that leaves an element unwritten shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out
    monkeypatch.setattr(torch, "empty", poisoned)


@runs_kernel
@pytest.mark.parametrize("name", ["gat_edge", "transformer_edge"])
def test_forward_writes_every_row_without_a_memset(plan, name, poisoned_empty):
    """The output and log-sum-exp start uninitialised: light rows are stored by their items, hub rows by the combine
    kernel, rows without edges zeroed (``zero_rows_without_entries``); nothing is left unwritten."""
    score_fn, message_fn, _, kinds = CASES[name]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel())]
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, items, MAX_EDGES)
    assert not out.isnan().any() and not lse.isnan().any()
    assert not out[-3:].any() and not lse[-3:].any(), "rows without edges are 0"
    ref, ref_lse = _reference_with_lse([a.cpu() for a in args], roles, *plan[:4], score, message, EPS)
    assert_close(out, ref, torch.float32, "output")


@runs_kernel
@pytest.mark.parametrize("name, backward_variant", tiered(
    [(name, variant) for variant in ("split", "one_pass_segment") for name in ("gat_edge", "gatv2_edge",
                                                                               "transformer_edge")],
    [("transformer_edge", "one_pass_segment")]))
def test_backward_stores_row_gradients_without_a_memset(plan, name, backward_variant, poisoned_empty, monkeypatch):
    """The split backward's row gradients start uninitialised (the plan's own items and the transposed CSR's
    cover every row with edges): rows without edges and hub rows (several items add) are zeroed, light rows
    stored; nothing is left unwritten, and the gradients are the reference's. ``D`` starts uninitialised too."""
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, backward_variant)
    score_fn, message_fn, _, kinds = CASES[name]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7))
    args = make_args(kinds, plan[1].numel())
    _, grads = grads_of(lambda a: torch.ops.gnn_io.attention(a, roles, *on_device, score, message, EPS, items,
                                                             MAX_EDGES), [a.to(DEVICE) for a in args], grad.to(DEVICE))
    wide = [a.double() for a in args]
    _, ref_grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS), wide,
                            grad.double())
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert not g.isnan().any(), f"argument {i}: an element was left unwritten"
        assert_close(g, r, torch.float32, f"grad of argument {i}")


@runs_kernel
def test_unrecognised_functions_run_the_reference(plan):
    score = _fn(lambda a0, a1: aten.tanh.default(aten.sum.dim_IntList(aten.mul.Tensor(a0, a1), [-1])))
    message = _fn(lambda alpha, a0, a1: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0))
    x = torch.randn(NUM_NODES, HEADS, CHANNELS)
    a = torch.randn(NUM_NODES, HEADS, CHANNELS)
    roles = [ROLE_SRC, ROLE_DST]
    assert isinstance(attention_layout.prepare([x, a], roles, plan[3], score, message), str)
    on_device = [t.to(DEVICE) for t in plan[:4]]
    out = torch.ops.gnn_io.attention([x.to(DEVICE), a.to(DEVICE)], roles, *on_device, score, message, EPS)
    ref = attention_reference([x, a], roles, *plan[:4], score, message, EPS)
    assert_close(out, ref, torch.float32, "output")


@runs_kernel
def test_opcheck_fused(plan):
    score_fn, message_fn, _, kinds = CASES["gat_edge"]
    score, message = _fn(score_fn), _fn(message_fn)
    args = [a.to(DEVICE).requires_grad_(True) for a in make_args(kinds, plan[1].numel())]
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    torch.library.opcheck(torch.ops.gnn_io.attention_forward.default,
                          (args, [r for r, _ in kinds], *on_device, score, message, EPS, items, MAX_EDGES),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


# ---- the all-heads forward (GNN_IO_ATTENTION_HEADS=all) ----

@runs_kernel
@pytest.mark.parametrize("heads, channels", tiered([pytest.param(1, 4, id="1x4"), pytest.param(4, 4, id="4x4"),
                                                    pytest.param(3, 5, id="3x5_padded")], [(3, 5)]))
# the default tier: an edge role and dropout (the other seven with --slow)
@pytest.mark.parametrize("name", tiered(list(CASES), ["gat_edge", "transformer_dropout"]))
def test_all_heads_matches_reference(plan, name, heads, channels, monkeypatch):
    """Output, lse and gradients of the one-program-per-item kernels, forward and split backward (hub split and
    combined, isolated nodes 0); 2 heads: the half-precision and mixing tests below."""
    monkeypatch.setenv(csr_launch.HEADS_ENV, "all")
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "split")
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    assert (items[3] == 1).sum() > 2, "the hub must span several items"
    check_case(name, plan, heads=heads, channels=channels)

    score_fn, message_fn, _, kinds = CASES[name]
    score = _fn(score_fn)
    message = _fn(MESSAGE_FOR_HEADS[name](heads) if name in MESSAGE_FOR_HEADS else message_fn)
    roles = [role for role, _ in kinds]
    args = make_args(kinds, plan[1].numel(), heads=heads, channels=channels)
    _, lse = torch.ops.gnn_io.attention_forward([a.to(DEVICE) for a in args], roles, *on_device, score, message,
                                                EPS, items, MAX_EDGES, *dropout_args(dropout_for(name, DEVICE)))
    wide = [a.double() if a.is_floating_point() else a for a in args]
    _, ref_lse = _reference_with_lse(wide, roles, *plan[:4], score, message, EPS, dropout_for(name))
    assert lse.shape == (NUM_NODES, heads)
    assert_close(lse, ref_lse, torch.float32, "lse")
    assert not lse[-3:].any(), "isolated nodes must get lse 0"


@runs_kernel
def test_all_heads_half_precision(plan, monkeypatch):
    monkeypatch.setenv(csr_launch.HEADS_ENV, "all")
    check_case("transformer_edge", plan, torch.bfloat16)


@runs_kernel
@pytest.mark.parametrize("forward_variant, backward_variant", tiered([("all", "per_head"), ("per_head", "all")],
                                                                     [("all", "per_head")]))
def test_variants_mix(plan, forward_variant, backward_variant):
    """Either backward reads either forward's out and lse: the same gradients."""
    score_fn, message_fn, _, kinds = CASES["gatv2_edge"]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    rowptr, col, row, perm = [t.to(DEVICE) for t in plan[:4]]
    args = [a.to(DEVICE) for a in make_args(kinds, col.numel())]
    layout = attention_layout.prepare(args, roles, perm, score, message)
    items = list(torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES))
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    needs = [True] * len(args)
    out, lse = csr_forward.forward(layout, rowptr, col, perm, EPS, items, MAX_EDGES, variant=forward_variant)
    mixed = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr, col, perm,
                                      needs, items, MAX_EDGES, variant=backward_variant)
    out, lse = csr_forward.forward(layout, rowptr, col, perm, EPS, items, MAX_EDGES, variant="per_head")
    default = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr, col, perm,
                                        needs, items, MAX_EDGES, variant="per_head")
    for i, (g, r) in enumerate(zip(mixed, default)):
        assert_close(g, r.double().cpu(), torch.float32, f"grad of argument {i}")


def split_backward_case(name, plan, dropout=None) -> tuple:
    """``(layout, rowptr, col, perm, items, by_src, grad, needs, out, lse)``: a case's forward on ``plan``, with
    what its split backward takes (the source CSR, an output gradient, every argument needing one)."""
    score_fn, message_fn, _, kinds = CASES[name]
    rowptr, col, row, perm = [t.to(DEVICE) for t in plan[:4]]
    args = [a.to(DEVICE) for a in make_args(kinds, col.numel())]
    layout = attention_layout.prepare(args, [role for role, _ in kinds], perm, _fn(score_fn), _fn(message_fn),
                                      dropout)
    items = list(torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES))
    by_src = csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES)
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    out, lse = csr_forward.forward(layout, rowptr, col, perm, EPS, items, MAX_EDGES)
    return layout, rowptr, col, perm, items, by_src, grad, [True] * len(args), out, lse


@runs_kernel
@pytest.mark.parametrize("name", tiered(["gat", "gatv2_edge", "transformer_edge"], ["gatv2_edge"]))
def test_split_passes_launch_apart(plan, name, monkeypatch):
    """Each split pass takes its own launch (the measured pair, or one pass overridden down to one edge per block):
    the launches change no gradient, and each pass ran with the launch asked of it. Both passes: ``split`` (GAT's
    default is the segment form, a src pass alone)."""
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "split")
    family = CASES[name][2]
    layout, rowptr, col, perm, items, by_src, grad, needs, out, lse = split_backward_case(name, plan)
    launches = []
    split_pass = csr_backward.split_pass
    monkeypatch.setattr(csr_backward, "split_pass", lambda layout, major, *a: (launches.append(
        (major, next(x["block_e"] for x in a if isinstance(x, dict) and "block_e" in x))), split_pass(layout, major, *a)))

    def run(config=None):
        launches.clear()
        grads = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr, col, perm, needs, items,
                                      MAX_EDGES, by_src=by_src, config=config)
        return grads, dict(launches)
    measured, blocks = run()
    width = next_power_of_2(HEADS) * max(16, next_power_of_2(CHANNELS))  # BLOCK_H * BLOCK_C of this case
    (dst_tile, _), (src_tile, _) = csr_launch.SPLIT_BACKWARD_LAUNCH[family]
    assert blocks == {ROLE_DST: max(1, dst_tile // width), ROLE_SRC: max(1, src_tile // width)}, blocks
    single, blocks1 = run({"src": {"block_e": 1}, "dst": {"block_e": 1, "num_warps": 1}})
    assert blocks1 == {ROLE_DST: 1, ROLE_SRC: 1}
    for i, (a, c) in enumerate(zip(measured, single)):
        if a is not None:
            assert_close(c, a.double().cpu(), torch.float32, f"grad of argument {i}, one edge per block")


@runs_kernel
@pytest.mark.parametrize("name", tiered(["gat", "gat_edge", "gat_dropout", "gatv2_edge", "transformer_edge"],
                                        ["gat_edge"]))
def test_one_pass_backward_skips_gat_dst_pass(plan, name, monkeypatch):
    """With ``one_pass_segment``, GAT's split backward is one src pass (dst score terms stored per edge and summed
    over each destination's CSR row by the SpMM), the other families keep the dst pass; either way the gradients
    equal the two-pass backward's (``split``) and the reference's (a hub split over several items, self loops,
    duplicates, isolated nodes)."""
    score_fn, message_fn, family, kinds = CASES[name]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    dropout = dropout_for(name, DEVICE)
    layout, rowptr, col, perm, items, by_src, grad, needs, out, lse = split_backward_case(name, plan, dropout)
    passes = []
    launch = csr_backward.split_pass
    monkeypatch.setattr(csr_backward, "split_pass", lambda layout, major, *a: (passes.append(major),
                                                                                    launch(layout, major, *a)))
    summed = []
    sum_by_destination = csr_backward._sum_by_destination
    monkeypatch.setattr(csr_backward, "_sum_by_destination", lambda *a: (summed.append(1),
                                                                             sum_by_destination(*a))[1])
    grads = {}
    for segment in (True, False):
        monkeypatch.setenv(csr_launch.BACKWARD_ENV, "one_pass_segment" if segment else "split")
        passes.clear()
        summed.clear()
        grads[segment] = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr,
                                                  col, perm, needs, items, MAX_EDGES, by_src=by_src)
        expected = [ROLE_SRC] if segment and family == "gat" else [ROLE_DST, ROLE_SRC]
        assert passes == expected, (segment, passes)
        # GAT's one dst-role score term: summed per destination by the SpMM in the segment variant only
        assert len(summed) == int(segment and family == "gat"), summed
    wide = [a.double() if a.is_floating_point() else a for a in make_args(kinds, col.numel())]
    _, ref_grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS,
                                                          dropout_for(name)), wide, grad.double().cpu())
    for i, (g1, g2, r) in enumerate(zip(grads[True], grads[False], ref_grads)):
        assert torch.isfinite(g1).all(), f"argument {i}"
        assert_close(g1, g2.double().cpu(), torch.float32, f"one pass against two, argument {i}")
        assert_close(g1, r, torch.float32, f"one pass against the reference, argument {i}")


@runs_kernel
@pytest.mark.parametrize("name, by_position", tiered(
    [(name, by_position) for by_position in (True, False) for name in ("gat", "gat_edge", "gat_dropout")],
    [("gat_edge", True)]))
def test_segment_backward_stores_dst_terms_by_source_position(plan, name, by_position, poisoned_empty, monkeypatch):
    """The segment backward's src pass stores each edge's dst-role score term at the edge's position in the
    transposed CSR (contiguous stores, into an uninitialised buffer: every position is walked once), and the sum
    per destination reads it through :func:`source_positions`; without that map (``by_position=False``: a source
    CSR that leaves edges out) it stores at edge ids, as before. Either way the gradients are the two-pass
    backward's and the reference's."""
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "one_pass_segment")
    score_fn, message_fn, _, kinds = CASES[name]
    roles = [role for role, _ in kinds]
    dropout = dropout_for(name, DEVICE)
    layout, rowptr, col, perm, items, by_src, grad, needs, out, lse = split_backward_case(name, plan, dropout)
    positions = plan_source_csr.source_positions(rowptr, col, perm, by_src)
    # the map is the inverse of the source CSR's order: the same edge on both sides
    assert positions is not None and torch.equal(by_src.eid.long()[positions.long()], perm.long())
    if not by_position:
        monkeypatch.setattr(csr_backward, "source_positions", lambda *a: None)
    store_roles = []
    launch = csr_backward.split_pass
    monkeypatch.setattr(csr_backward, "split_pass", lambda layout, major, outputs, *a: (
        store_roles.extend(o[1] for o in outputs if layout.roles[o[0]] == ROLE_DST),
        launch(layout, major, outputs, *a)))
    got = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr, col, perm, needs,
                                    items, MAX_EDGES, by_src=by_src)
    assert store_roles == [csr_split_backward.BY_SOURCE_POSITION if by_position else ROLE_EDGE], store_roles
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "split")
    two_pass = csr_backward.backward(layout, grad, csr_delta.delta(grad, out), lse, rowptr, col, perm,
                                         needs, items, MAX_EDGES, by_src=by_src)
    wide = [a.double() if a.is_floating_point() else a for a in make_args(kinds, col.numel())]
    _, ref_grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], _fn(score_fn), _fn(message_fn), EPS,
                                                          dropout_for(name)), wide, grad.double().cpu())
    for i, (g, g2, r) in enumerate(zip(got, two_pass, ref_grads)):
        assert torch.isfinite(g).all(), f"argument {i}"
        assert_close(g, g2.double().cpu(), torch.float32, f"segment against two passes, argument {i}")
        assert_close(g, r, torch.float32, f"segment against the reference, argument {i}")


def test_source_positions_only_where_every_edge_has_a_source_row(plan):
    """A source CSR of fewer rows than the sources in ``col`` leaves those edges unwalked: no position map then."""
    rowptr, col, _, perm = plan[:4]
    short = plan_source_csr.build_source_csr(rowptr, col, perm, int(col.max()), MAX_EDGES)
    assert plan_source_csr.source_positions(rowptr, col, perm, short) is None
    full = plan_source_csr.build_source_csr(rowptr, col, perm, int(col.max()) + 1, MAX_EDGES)
    positions = plan_source_csr.source_positions(rowptr, col, perm, full)
    assert positions.dtype == col.dtype and torch.equal(full.eid.long()[positions.long()], perm.long())


def _check_bias(plan, name, device, dtype=torch.float32):
    """The op with a bias against the reference plus the bias: output, every argument's gradient and the bias's."""
    score_fn, message_fn, _, kinds = CASES[name]
    score, message = _fn(score_fn), _fn(message_fn)
    roles = [role for role, _ in kinds]
    on_device = [t.to(device) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    # seeded: drawn from the global generator, the bias (and the verdict of the bf16 case, see docs/attention.md,
    # "Precision") depended on the tests that ran before
    bias = torch.randn(HEADS * CHANNELS, generator=torch.Generator().manual_seed(0))
    args = make_args(kinds, plan[1].numel(), dtype) + [bias.to(dtype)]
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7))
    dropout = dropout_for(name, device)
    out, grads = grads_of(lambda a: torch.ops.gnn_io.attention(a[:-1], roles, *on_device, score, message, EPS, items,
                                                               MAX_EDGES, *dropout_args(dropout), bias=a[-1]),
                          [a.to(device) for a in args], grad.to(device))
    wide = [a.double() if a.is_floating_point() else a for a in args]
    ref, ref_grads = grads_of(lambda a: attention_reference(a[:-1], roles, *plan[:4], score, message, EPS,
                                                            dropout_for(name)) + a[-1].view(HEADS, CHANNELS),
                              wide, grad.double())
    assert_close(out, ref, dtype, "output")
    assert_close(out[-3:], args[-1].view(HEADS, CHANNELS).expand(3, -1, -1).double(), dtype, "rows without edges")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert g is not None and torch.isfinite(g).all(), f"grad of argument {i}"
        assert_close(g, r, dtype, f"grad of argument {i}")


@runs_kernel
@pytest.mark.parametrize("name, heads, backward_variant", tiered(
    [(name, heads, variant)
     for heads, variant in [("all", "split"), ("all", "one_pass_segment"), ("per_head", "atomic")]
     for name in ["gat", "gat_dropout", "gatv2_edge", "transformer_edge"]],
    [("gatv2_edge", "all", "one_pass_segment"), ("transformer_edge", "per_head", "atomic")]))
def test_bias_is_added_in_the_output_and_taken_out_of_d(plan, name, heads, backward_variant, poisoned_empty,
                                                        monkeypatch):
    """``attention(..., bias=b)`` is the attention output plus ``b`` in one tensor: added by the all-heads kernel and
    the hub combine as they store a row, written into the rows without edges (outputs start uninitialised), added
    afterwards behind the per-head kernel. Every backward variant reads ``D = <dout, out - b>`` (``attention_delta``
    subtracts ``b`` in its kernel), and ``b``'s gradient is ``dout`` summed over the rows."""
    monkeypatch.setenv(csr_launch.HEADS_ENV, heads)
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, backward_variant)
    _check_bias(plan, name, DEVICE)


@runs_kernel
def test_bias_in_half_precision(plan):
    _check_bias(plan, "gatv2_edge", DEVICE, torch.bfloat16)


def test_bias_on_the_reference_path(plan):
    """The CPU reference (no interpreter): the same contract."""
    if INTERPRETED:
        pytest.skip("the interpreter runs the fused kernels on CPU tensors: covered above")
    _check_bias(plan, "gatv2_edge", torch.device("cpu"))


def test_bias_need_not_be_contiguous(plan):
    """A bias of the row's elements in any layout (here the transpose of a ``[C, H]`` tensor) is read in its logical
    order, on whichever path the op takes on this machine."""
    score_fn, message_fn, _, kinds = CASES["gat"]
    roles = [r for r, _ in kinds]
    args = [a.to(OP_DEVICE) for a in make_args(kinds, plan[1].numel())]
    on_device = [t.to(OP_DEVICE) for t in plan[:4]]
    bias = torch.randn(CHANNELS, HEADS).to(OP_DEVICE).t()
    assert not bias.is_contiguous()
    score, message = _fn(score_fn), _fn(message_fn)
    out = torch.ops.gnn_io.attention(args, roles, *on_device, score, message, EPS, bias=bias)
    plain = torch.ops.gnn_io.attention(args, roles, *on_device, score, message, EPS)
    torch.testing.assert_close(out, plain + bias)


def test_bias_of_the_wrong_size_is_an_error(plan):
    score_fn, message_fn, _, kinds = CASES["gat"]
    args = make_args(kinds, plan[1].numel())
    with pytest.raises(ValueError, match="attention bias of shape"):
        torch.ops.gnn_io.attention(args, [r for r, _ in kinds], *plan[:4], _fn(score_fn), _fn(message_fn), EPS,
                                   bias=torch.randn(HEADS * CHANNELS + 1))


def test_heads_variant_defaults_to_all_heads_forward(monkeypatch):
    monkeypatch.delenv(csr_launch.HEADS_ENV, raising=False)
    assert csr_launch.heads_variant() == "all"
    assert csr_launch.heads_variant(default="per_head") == "per_head"  # the atomic backward's default
    assert "all heads per program (forward)" in csr_launch.kernel_name("gat")
    monkeypatch.setenv(csr_launch.HEADS_ENV, "per_head")
    assert csr_launch.heads_variant() == "per_head"
    assert "all heads per program (forward)" not in csr_launch.kernel_name("gat")
    monkeypatch.setenv(csr_launch.HEADS_ENV, "every")
    with pytest.raises(ValueError, match="per_head, all"):
        csr_launch.heads_variant()


# ---- recognition and the CPU op (every machine) ----

def test_opcheck_reference(plan):
    score_fn, message_fn, _, kinds = CASES["transformer_edge"]
    args = [a.double().requires_grad_(True) for a in make_args(kinds, plan[1].numel())]
    torch.library.opcheck(torch.ops.gnn_io.attention_forward.default,
                          (args, [r for r, _ in kinds], *plan[:4], _fn(score_fn), _fn(message_fn), EPS, [], 0))


@pytest.mark.parametrize("name", list(CASES))
def test_recognise_families(name):
    score_fn, message_fn, family, kinds = CASES[name]
    form = attention_forms.recognise(_fn(score_fn), _fn(message_fn), [r for r, _ in kinds])
    assert not isinstance(form, str), form
    assert form.family == family
    if family == "dot":
        assert form.score_scale == 0.5 and form.query is not None


def test_recognise_rejects_other_math():
    roles = [ROLE_SRC, ROLE_DST]
    message = _fn(lambda alpha, a0, a1: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0))
    tanh = _fn(lambda a0, a1: aten.tanh.default(aten.add.Tensor(a0, a1)))
    assert "neither" in attention_forms.recognise(tanh, message, roles)
    score = _fn(_gat_score)
    squared = _fn(lambda alpha, a0, a1, a2: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1),
                                                            aten.mul.Tensor(a0, a0)))
    assert isinstance(attention_forms.recognise(score, squared, [ROLE_SRC, ROLE_SRC, ROLE_DST]), str)
    # alpha times a tensor (an attention weight, or a keep-mask the rewrite did not fold): the reference runs it
    weighted = _fn(lambda alpha, a0, a1, a2, a3: aten.mul.Tensor(aten.unsqueeze.default(aten.mul.Tensor(alpha, a3), -1),
                                                                 a0))
    assert "alpha (times constants)" in attention_forms.recognise(
        _fn(lambda a0, a1, a2, a3: aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)), weighted,
        [ROLE_SRC, ROLE_SRC, ROLE_DST, ROLE_EDGE])


LAYERS = [
    ("gat", lambda edge_dim: GATConv(8, 4, heads=2, edge_dim=edge_dim), "gat"),
    ("gatv2", lambda edge_dim: GATv2Conv(8, 4, heads=2, edge_dim=edge_dim), "gatv2"),
    ("transformer", lambda edge_dim: TransformerConv(8, 4, heads=2, edge_dim=edge_dim), "dot"),
    ("gat_dropout", lambda edge_dim: GATConv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "gat"),
    ("gatv2_dropout", lambda edge_dim: GATv2Conv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "gatv2"),
    ("transformer_dropout", lambda edge_dim: TransformerConv(8, 4, heads=2, dropout=0.5, edge_dim=edge_dim), "dot"),
]


@pytest.mark.parametrize("name, make, family, with_edge_attr", tiered(
    [pytest.param(name, make, family, edge, id=f"{name}-{'edge_attr' if edge else 'no_edge_attr'}")
     for name, make, family in LAYERS for edge in (False, True)],
    [(LAYERS[0] + (True,)), (LAYERS[2] + (False,))]))
def test_pyg_layers_are_recognised(name, make, family, with_edge_attr, monkeypatch):
    """The edge functions cut from the real layers are fused families (what the report says on CUDA)."""
    if INTERPRETED:
        pytest.skip("compiles on CPU: run by the main process")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(20, 60, seed=1, hub_degree=10)
    model = make(3 if with_edge_attr else None).train()
    inputs = (torch.randn(20, 8), edge_index) + ((torch.randn(edge_index.shape[1], 3),) if with_edge_attr else ())
    torch._dynamo.reset()
    first = len(rewrite_report.reports())
    torch.compile(model, backend="gnn_io")(*inputs)
    (rewrite,) = [w for r in rewrite_report.reports()[first:] for w in r.rewrites if w.pattern == "attention"]
    # the dot family also names the per-graph path choice (CSR, block-sparse or hybrid)
    assert kernel_name("cuda", rewrite.details).startswith(csr_launch.kernel_name(family)), \
        kernel_name("cuda", rewrite.details)
    if name.endswith("_dropout"):
        assert rewrite.details["dropout_p"] == 0.5 and "mask regenerated" in kernel_name("cuda", rewrite.details)
    else:
        assert "dropout_p" not in rewrite.details


@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
# the default tier: each layer once, with and without edge features between them (the other three with --slow)
@pytest.mark.parametrize("name, make, family, with_edge_attr", tiered(
    [pytest.param(name, make, family, edge, id=f"{name}-{'edge_attr' if edge else 'no_edge_attr'}")
     for name, make, family in LAYERS[:3] for edge in (False, True)],
    [("gat", LAYERS[0][1], "gat", True)]))
def test_compiled_pyg_layers_on_the_fused_kernels_match_eager(name, make, family, with_edge_attr, monkeypatch):
    """The CUDA tests' matrix (tests/kernels/attention/test_attention_cuda.py) on the fused kernels, interpreted: GATConv,
    GATv2Conv and TransformerConv compiled with ``gnn_io``, with and without edge features, against eager PyG,
    forward and the gradients of every input (edge features included, as ``check_rewrites`` makes them leaves
    that need one) and parameter. Here the trace-time rules that only look at arguments the fused kernels take
    run on CPU too: GATConv and GATv2Conv mask the edge index and the edge features by two nonzero calls, two
    unbacked sizes at tracing that the rules must not guard on (a rule that did made the CUDA tests fail to
    compile with "Could not guard on data-dependent expression", which no CPU test saw)."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    torch.manual_seed(0)
    edge_index = random_graph(30, 90, seed=2, hub_degree=15, num_isolated=2)
    model = make(3 if with_edge_attr else None).train()
    inputs = (torch.randn(30, 8), edge_index) + ((torch.randn(edge_index.shape[1], 3),) if with_edge_attr else ())
    result = check_rewrites(model, *inputs, expect={"attention": 1, "near_miss": 0}, calls=1)
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"] if w["pattern"] == "attention"]
    # the report names the CPU reference on CPU; the CUDA name from the same details is the fused family's
    assert kernel_name("cuda", rewrite["details"]).startswith(csr_launch.kernel_name(family)), rewrite


# ---- attention dropout ----

def pyg_attention(args, roles, plan, score, message, dropout):
    """What PyG computes, in the user's edge order: scores, softmax by destination (``torch_geometric.utils``),
    ``F.dropout`` of the ``[E, H]`` alpha with the mask of kernels/runtime/rng.py (counter ``e * H + h``), messages summed
    by destination."""
    rowptr, col, row, perm = plan[:4]
    src = torch.empty_like(col).scatter_(0, perm.long(), col)
    dst = torch.empty_like(row).scatter_(0, perm.long(), row).long()
    values = [a.index_select(0, src) if r == ROLE_SRC else a.index_select(0, dst) if r == ROLE_DST else a
              for a, r in zip(args, roles)]
    scores = edge_functions.lookup(score)(*values)
    alpha = pyg_softmax(scores, dst, num_nodes=rowptr.numel() - 1)
    if dropout is not None:
        alpha = alpha * rng.dropout_keep(dropout.seed, list(alpha.shape), dropout.p) * (1.0 / (1.0 - dropout.p))
    messages = edge_functions.lookup(message)(alpha, *values)
    return messages.new_zeros((rowptr.numel() - 1, *messages.shape[1:])).index_add_(0, dst, messages)


@pytest.mark.parametrize("name", ["gat_dropout", "gatv2_dropout", "transformer_dropout"])
def test_reference_dropout_is_pyg_dropout(plan, name):
    """The op's reference with a seed is PyG's layer math with the mask of that seed drawn in the user's edge
    order: output and every gradient (float64)."""
    score_fn, message_fn, _, kinds = CASES[name]
    score, message, roles = _fn(score_fn), _fn(message_fn), [role for role, _ in kinds]
    args = [a.double() for a in make_args(kinds, plan[1].numel())]
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).double()
    dropout = dropout_for(name)
    out, grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS, dropout), args, grad)
    expected, expected_grads = grads_of(lambda a: pyg_attention(a, roles, plan, score, message, dropout), args, grad)
    no_dropout = attention_reference(args, roles, *plan[:4], score, message, EPS)
    assert (out - no_dropout).abs().max() > 0.1, "dropout must change the output"
    torch.testing.assert_close(out, expected)
    for i, (g, e) in enumerate(zip(grads, expected_grads)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"grad of argument {i}: {m}")


def _op_output(plan, name, dropout_seed, dropout_p, device=OP_DEVICE):
    score_fn, message_fn, _, kinds = CASES[name]
    args = [a.to(device) for a in make_args(kinds, plan[1].numel())]
    seed = None if dropout_seed is None else torch.tensor(dropout_seed, device=device)
    return torch.ops.gnn_io.attention(args, [r for r, _ in kinds], *[t.to(device) for t in plan[:4]], _fn(score_fn),
                                      _fn(message_fn), EPS, None, 0, seed, dropout_p)


@pytest.mark.parametrize("name", ["gat_dropout", "gatv2_dropout", "transformer_dropout"])
def test_same_seed_same_mask(plan, name):
    """The mask is a function of the seed: the same seed gives the same output bit for bit, another seed
    another output; no seed, or p = 0, is no dropout."""
    first = _op_output(plan, name, 11, DROPOUT_P)
    assert torch.equal(first, _op_output(plan, name, 11, DROPOUT_P))
    assert (first - _op_output(plan, name, 12, DROPOUT_P)).abs().max() > 0.1
    plain = _op_output(plan, name, None, 0.0)
    assert (first - plain).abs().max() > 0.1
    assert torch.equal(_op_output(plan, name, 11, 0.0), plain)


def test_dropout_arguments_are_checked(plan):
    with pytest.raises(ValueError, match="dropout_p must be in"):
        _op_output(plan, "gat_dropout", 11, 1.0, torch.device("cpu"))
    with pytest.raises(ValueError, match="dropout_seed must be one int64"):
        rng.dropout_of(torch.tensor(1.5), 0.3)


def test_dropout_keep_rate():
    """Uniform alpha (zero scores) over values of 1: ``out[i, h] * deg_i * (1 - p)`` counts the kept edges of
    node ``i`` and head ``h``. Exactly the counts of the mask regenerated for the user's edge order, and the kept
    fraction within 5 sigma of ``1 - p``."""
    num_nodes, heads, p = 200, 4, 0.3
    src, dst = random_graph(num_nodes, 3000, seed=5, hub_degree=60)
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    zeros = torch.zeros(num_nodes, heads)
    args = [torch.ones(num_nodes, heads, 1), zeros, zeros]
    seed = torch.tensor(99, device=OP_DEVICE)
    out = torch.ops.gnn_io.attention([a.to(OP_DEVICE) for a in args], [ROLE_SRC, ROLE_SRC, ROLE_DST],
                                     *[t.to(OP_DEVICE) for t in plan[:4]], _fn(_gat_score), _fn(_gat_message), EPS,
                                     None, 0, seed, p).cpu()
    degree = (plan[0][1:] - plan[0][:-1]).double()
    counts = (out[:, :, 0].double() * degree[:, None] * (1 - p)).round().long()
    keep = rng.dropout_keep(seed.cpu(), [src.numel(), heads], p)
    expected = torch.zeros(num_nodes, heads, dtype=torch.long).index_add_(0, dst, keep.long())
    assert torch.equal(counts, expected)
    rate, sigma = float(keep.double().mean()), (p * (1 - p) / keep.numel()) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma, f"kept {rate:.4f}, expected {1 - p} +- {5 * sigma:.4f}"


DROPOUT_LAYERS = [
    ("gat", lambda: GATConv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
    ("gatv2", lambda: GATv2Conv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
    ("transformer", lambda: TransformerConv(8, 4, heads=2, dropout=0.3, edge_dim=3)),
]


def compiled_and_regenerated_eager(model, inputs: list, grad, monkeypatch, leaf: int = 0) -> tuple:
    """``model`` (in training, with attention dropout) compiled with ``gnn_io`` and run forward and backward on
    ``inputs`` (``inputs[leaf]`` requires grad), then eagerly with ``F.dropout`` given the mask regenerated from
    the seed the op read: ``(compiled, eager)``, each ``[out, inputs[leaf].grad, *parameter grads]``. Asserts
    that forward and backward read one seed."""
    seeds = []
    dropout_of = rng.dropout_of

    def recording(seed, p):
        if seed is not None:
            seeds.append(int(seed))
        return dropout_of(seed, p)
    monkeypatch.setattr(rng, "dropout_of", recording)
    torch._dynamo.reset()
    out = torch.compile(model, backend="gnn_io")(*inputs)
    out.backward(grad)
    compiled = [out, inputs[leaf].grad] + [p.grad for p in model.parameters()]
    assert len(seeds) == 2 and seeds[0] == seeds[1], f"forward and backward must read one seed, got {seeds}"

    def regenerated(input, p=0.5, training=True, inplace=False):
        mask = rng.dropout_keep(torch.tensor(seeds[0], device=input.device), list(input.shape), p)
        return input * mask * (1.0 / (1.0 - p)) if training else input
    monkeypatch.setattr(F, "dropout", regenerated)
    inputs[leaf].grad = None
    model.zero_grad()
    expected = model(*inputs)
    expected.backward(grad)
    return compiled, [expected, inputs[leaf].grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("name, make", tiered_at(DROPOUT_LAYERS, [0]), ids=[name for name, _ in DROPOUT_LAYERS])
def test_compiled_layer_dropout_is_eager_with_the_regenerated_mask(name, make, monkeypatch):
    """A compiled PyG layer with attention dropout in training (the fused kernels under the interpreter, the
    reference in the main process): forward and backward read the seed drawn once per call, and the output and
    every gradient are eager PyG's with its ``F.dropout`` given the mask regenerated from that seed."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = make().train()
    edge_index = random_graph(20, 60, seed=1, hub_degree=10)
    x = torch.randn(20, 8, requires_grad=True)
    edge_attr = torch.randn(edge_index.shape[1], 3)
    compiled, eager = compiled_and_regenerated_eager(model, [x, edge_index, edge_attr], torch.randn(20, 8),
                                                     monkeypatch)
    for i, (got, want) in enumerate(zip(compiled, eager)):
        torch.testing.assert_close(got, want, **tolerance(torch.float32),
                                   msg=lambda m, i=i: f"{'out' if i == 0 else f'gradient {i - 1}'}: {m}")


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(csr_forward.forward_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.attention.csr_forward is imported"

