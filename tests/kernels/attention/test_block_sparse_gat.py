"""The block-sparse GAT and GATv2 kernels (kernels/attention/block_gat.py) against the float64 CPU reference of
gnn_io::attention: output, lse and every gradient.

The kernels run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py).
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import (
    block_dot as block_sparse,
    block_gat as block_sparse_gat,
)
from gnn_inductor.kernels.attention import csr_delta
from gnn_inductor.kernels.attention import forms as attention_forms
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.attention.op import reference_with_lse
from gnn_inductor.plan.block_format import BlockFormat, transpose_block_format
from gnn_inductor.kernels.attention.block_gat import (
    BlockSparseGatAttention,
    gat_backward,
    gat_form_reason,
    gat_forward,
)

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.testing import magnitude, tolerance
from tests.kernels.attention.cases import make_args as attention_args
from tests.kernels.attention.test_block_sparse import dense_rows_of, graph, plan_and_blocks
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, runs_kernel, tiered

NUM_NODES, HEADS, CHANNELS = 40, 2, 4
EPS = 1e-16
aten = torch.ops.aten



def _fn(f):
    return edge_functions.register(torch.fx.symbolic_trace(f))


# GATConv / GATv2Conv edge functions as the backend cuts them (tests/kernels/attention/cases.py)
def _gat_score(a0, a1, a2):
    return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gat_score_edge(a0, a1, a2, a3):
    return aten.leaky_relu.default(aten.add.Tensor(aten.add.Tensor(a1, a2), a3), 0.2)


def _gat_message_edge(alpha, a0, a1, a2, a3):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gat_two_src_score(a0, a1, a2, a3):
    # two source-row terms (summed before the launch), another slope and a score scale
    return aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(aten.add.Tensor(a1, a2), a3), 0.1), 0.5)


def _gatv2_score(a0, a1, a2):
    return aten.sum.dim_IntList(aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(a1, a0), 0.2), a2), [-1])


def _gatv2_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(a0, aten.unsqueeze.default(alpha, -1))


def _gatv2_score_edge(a0, a1, a2, a3):
    inner = aten.leaky_relu.default(aten.add.Tensor(aten.add.Tensor(a1, a0), a2), 0.2)
    return aten.sum.dim_IntList(aten.mul.Tensor(inner, a3), [-1])


def _gatv2_message_edge(alpha, a0, a1, a2, a3):
    return aten.mul.Tensor(a0, aten.unsqueeze.default(alpha, -1))


V, P, ATT = "vector", "per-head", "att"
# name: (score, message, family, [(role, kind)] of the arguments)
CASES = {
    "gat": (_gat_score, _gat_message, "gat", [(ROLE_SRC, V), (ROLE_SRC, P), (ROLE_DST, P)]),
    "gat_edge": (_gat_score_edge, _gat_message_edge, "gat",
                 [(ROLE_SRC, V), (ROLE_SRC, P), (ROLE_DST, P), (ROLE_EDGE, P)]),
    "gat_two_src": (_gat_two_src_score, _gat_message_edge, "gat",
                    [(ROLE_SRC, V), (ROLE_SRC, P), (ROLE_DST, P), (ROLE_SRC, P)]),
    "gatv2": (_gatv2_score, _gatv2_message, "gatv2", [(ROLE_SRC, V), (ROLE_DST, V), (ROLE_DENSE, ATT)]),
    "gatv2_edge": (_gatv2_score_edge, _gatv2_message_edge, "gatv2",
                   [(ROLE_SRC, V), (ROLE_DST, V), (ROLE_EDGE, V), (ROLE_DENSE, ATT)]),
}
# With attention dropout (the op applies it to alpha: same edge functions, a seed and p)
CASES["gat_dropout"], CASES["gatv2_dropout"] = CASES["gat_edge"], CASES["gatv2"]


def dropout_of(name, device=torch.device("cpu")):
    """The attention dropout of a ``*_dropout`` case (None for the others)."""
    return rng.Dropout(torch.tensor(7654321, device=device), 0.3) if name.endswith("_dropout") else None


def make_args(kinds, num_edges, dtype, seed=0, heads=HEADS):
    return attention_args(kinds, num_edges, dtype, seed, heads, CHANNELS, num_nodes=NUM_NODES)


GAT_KERNELS = [f"{family}_{kernel}" for family in ("gat", "gatv2") for kernel in ("forward", "row", "source")]


def set_heads_per_program(monkeypatch, per_program):
    """Every GAT and GATv2 block kernel (half and float32 entries) with ``per_program`` heads per program."""
    for name in GAT_KERNELS:
        for key in (name, f"{name}:fp32"):
            entry = block_sparse.BLOCK_LAUNCH.get(key, block_sparse.BLOCK_LAUNCH[name])
            monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, key, {**entry, "heads": per_program})


@pytest.fixture(params=[1, "all"], ids=["head_per_program", "all_heads"])
def heads_per_program(request, monkeypatch):
    set_heads_per_program(monkeypatch, request.param)
    return request.param


def case_inputs(name, graph_case, dtype, seed=0, heads=HEADS):
    """(plan, blocks, transposed, args, roles, score key, message key) of a family case on a graph case."""
    score_fn, message_fn, _, kinds = CASES[name]
    src, dst = graph(NUM_NODES, 100, seed=seed + 2, hub_degree=30 if graph_case == "hub" else 0,
                     duplicates=1 if graph_case == "duplicates" else 0)
    order = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(seed + 1)) \
        if graph_case == "order" else None
    plan, blocks = plan_and_blocks(src, dst, NUM_NODES, order)
    transposed = transpose_block_format(blocks, NUM_NODES, order)
    args = make_args(kinds, src.numel(), dtype, seed=seed + 3, heads=heads)
    return plan, blocks, transposed, args, [role for role, _ in kinds], _fn(score_fn), _fn(message_fn)


def on_device(blocks):
    return BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in blocks])


def assert_close(actual, expected, dtype, name):
    torch.testing.assert_close(actual.cpu().double(), expected.cpu().double(),
                               **tolerance(dtype, "kernel", scale=magnitude(expected)),
                               msg=lambda m: f"{name}: {m}")


# ---- the kernels (CUDA, or the interpreter on CPU) ----

@runs_kernel
@pytest.mark.parametrize("dtype", [
    torch.float32, torch.float16,
    # Triton 3.6's interpreter returns garbage for a bf16 tl.dot (fp16 is right): bf16 is checked on CUDA only
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(INTERPRETED, reason="interpreter's bf16 tl.dot"))],
    ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("graph_case", tiered(["hub", "duplicates", "order"], ["hub"]))
@pytest.mark.parametrize("name", tiered(list(CASES), ["gat_two_src", "gatv2_edge", "gat_dropout"]))
def test_gat_matches_reference(name, graph_case, dtype, heads_per_program):
    # out and lse of the dense windows' rows (others 0), and every gradient against autograd through the float64
    # reference whose output gradient is zero on rows of windows that are not dense_ok (the CSR path's edges)
    plan, blocks, transposed, args, roles, score, message = case_inputs(name, graph_case, dtype)
    rowptr, col, row, perm = plan[:4]
    grad_out = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(9)).to(dtype)

    leaves = [a.to(DEVICE, copy=True).requires_grad_() for a in args]
    out, lse = BlockSparseGatAttention.apply(on_device(blocks), on_device(transposed), perm.to(DEVICE), roles,
                                             score, message, NUM_NODES, EPS, False, dropout_of(name, DEVICE), *leaves)
    out.backward(grad_out.to(DEVICE))

    wide = [a.double().requires_grad_() for a in args]
    ref, ref_lse = reference_with_lse(wide, roles, rowptr, col, row, perm, score, message, EPS, dropout_of(name))
    dense = dense_rows_of(blocks, NUM_NODES)
    ref.backward(grad_out.double() * dense[:, None, None])

    assert dense.any()
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close(out.detach()[dense.to(DEVICE)], ref.detach().to(dtype)[dense], dtype, "output")
    assert_close(lse[dense.to(DEVICE)], ref_lse[dense], dtype, "lse")
    assert not out.detach().cpu()[~dense].any() and not lse.cpu()[~dense].any(), "rows left to the CSR kernel"
    isolated = (rowptr[1:] - rowptr[:-1]) == 0
    assert isolated.any() and not out.detach().cpu()[isolated].any() and not lse.cpu()[isolated].any()
    if graph_case == "duplicates":
        assert not dense.all()
    if graph_case == "hub":  # a row window and a source window spanning several tiles
        assert int((blocks.tile_ptr[1:] - blocks.tile_ptr[:-1]).max()) > 1
        assert int((transposed.tile_ptr[1:] - transposed.tile_ptr[:-1]).max()) > 1

    for i, (leaf, expected, role) in enumerate(zip(leaves, wide, roles)):
        assert leaf.grad is not None and leaf.grad.dtype == dtype, f"grad of argument {i}"
        assert_close(leaf.grad, expected.grad, dtype, f"grad of argument {i} (role {role})")
        assert expected.grad.abs().max() > 0.05, f"grad of argument {i} is not exercised"
        if role == ROLE_DST and graph_case == "duplicates":
            assert not leaf.grad.cpu()[~dense].any(), "destination rows left to the CSR backward"


@runs_kernel
@pytest.mark.parametrize("name", ["gat_edge", "gatv2_edge", "gat_dropout"])
def test_gat_backward_only_what_is_needed(name):
    # needs_grad picks the gradients
    plan, blocks, transposed, args, roles, score, message = case_inputs(name, "hub", torch.float32)
    blocks, transposed = on_device(blocks), on_device(transposed)
    args, perm, dropout = [a.to(DEVICE) for a in args], plan[3].to(DEVICE), dropout_of(name, DEVICE)
    out, lse = gat_forward(args, roles, perm, score, message, blocks, NUM_NODES, EPS, dropout=dropout)
    grad_out = torch.ones_like(out)
    for picked in range(len(args)):
        needs = [i == picked for i in range(len(args))]
        grads = gat_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm, score, message,
                             blocks, transposed, needs,
                             dropout=dropout)
        assert all((g is not None) == need for g, need in zip(grads, needs))
        assert grads[picked].shape == args[picked].shape and grads[picked].abs().max() > 0


@runs_kernel
@pytest.mark.parametrize("name", ["gat_edge", "gatv2_edge"])
def test_launch_options_change_no_result(name, monkeypatch):
    """Every kernel at a launch other than its own (``block_sparse.BLOCK_LAUNCH``, merged over the warps a GAT
    kernel picks itself: passing both once raised "multiple values for keyword argument 'num_warps'") gives the
    same output, log-sum-exp and gradients."""
    plan, blocks, transposed, args, roles, score, message = case_inputs(name, "hub", torch.float32)
    blocks, transposed = on_device(blocks), on_device(transposed)
    args, perm = [a.to(DEVICE) for a in args], plan[3].to(DEVICE)
    grad_out = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def run():
        out, lse = gat_forward(args, roles, perm, score, message, blocks, NUM_NODES, EPS)
        return [out, lse] + gat_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm,
                                         score, message, blocks, transposed,
                                         [True] * len(args))
    expected = run()
    for key in block_sparse.BLOCK_LAUNCH:
        monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, key, {"num_warps": 1, "num_stages": 1})
    for i, (actual, wanted) in enumerate(zip(run(), expected)):
        assert_close(actual, wanted.cpu(), torch.float32, f"result {i}")


@runs_kernel
@pytest.mark.parametrize("name, max_channels", tiered(
    [pytest.param(name, channels, id=f"{name}-{'one_block' if channels == 128 else 'blocks_of_2'}")
     for channels in (128, 32) for name in ("gat_edge", "gatv2_edge", "gat_dropout")],
    [("gat_edge", 32)]))
def test_all_heads_program_masks_the_padded_heads(name, max_channels, monkeypatch):
    """Three heads in one program of four (``BLOCK_H`` the next power of two), or in blocks of two when
    MAX_PROGRAM_CHANNELS allows only two (the second block half padded): the padded head reads and writes
    nothing; output, log-sum-exp and every gradient equal the launch with a program per head."""
    monkeypatch.setattr(block_sparse, "MAX_PROGRAM_CHANNELS", max_channels)
    heads = 3
    plan, blocks, transposed, args, roles, score, message = case_inputs(name, "hub", torch.float32, heads=heads)
    blocks, transposed = on_device(blocks), on_device(transposed)
    args, perm = [a.to(DEVICE) for a in args], plan[3].to(DEVICE)
    dropout = dropout_of(name, DEVICE)
    grad_out = torch.randn(NUM_NODES, heads, CHANNELS, generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def run(per_program):
        set_heads_per_program(monkeypatch, per_program)
        out, lse = gat_forward(args, roles, perm, score, message, blocks, NUM_NODES, EPS, dropout=dropout)
        return [out, lse] + gat_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm,
                                         score, message, blocks, transposed,
                                         [True] * len(args), dropout=dropout)
    expected = run(1)
    assert all(t.abs().max() > 0.01 for t in expected[2:]), "every gradient exercised"
    for i, (actual, wanted) in enumerate(zip(run("all"), expected)):
        torch.testing.assert_close(actual, wanted, **tolerance(torch.float32, "relaunch"),
                                   msg=lambda m: f"result {i}: {m}")


# ---- recognition and refusals (every machine) ----

@pytest.mark.parametrize("name", list(CASES))
def test_cases_are_gat_families(name):
    score_fn, message_fn, family, kinds = CASES[name]
    roles = [role for role, _ in kinds]
    form = attention_forms.recognise(_fn(score_fn), _fn(message_fn), roles)
    assert not isinstance(form, str), form
    assert form.family == family
    layout = attention_layout.prepare(make_args(kinds, 7, torch.float32), roles, torch.arange(7), _fn(score_fn),
                                      _fn(message_fn))
    assert gat_form_reason(layout) is None


def test_unsupported_forms_are_refused():
    src, dst = graph(20, 30)
    plan, blocks = plan_and_blocks(src, dst, 20)
    perm = plan[3]
    # an edge-role value term: per cell, not a TILE x C operand of P V
    message = _fn(lambda alpha, a0, a1, a2, a3: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1),
                                                                aten.add.Tensor(a0, a3)))
    args = [torch.randn(20, HEADS, CHANNELS), torch.randn(20, HEADS), torch.randn(20, HEADS),
            torch.randn(src.numel(), HEADS, CHANNELS)]
    roles = [ROLE_SRC, ROLE_SRC, ROLE_DST, ROLE_EDGE]
    score = _fn(lambda a0, a1, a2, a3: aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2))
    with pytest.raises(ValueError, match="value term is not a source-row input"):
        gat_forward(args, roles, perm, score, message, blocks, 20, EPS)
    # the dot-product family is block_sparse.py's
    dot_score = _fn(lambda a0, a1, a2: aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0))
    dot_message = _fn(lambda alpha, a0, a1, a2: aten.mul.Tensor(a0, aten.view.default(alpha, [-1, HEADS, 1])))
    args = [torch.randn(20, HEADS, CHANNELS) for _ in range(3)]
    with pytest.raises(ValueError, match="dot family"):
        gat_forward(args, [ROLE_SRC, ROLE_DST, ROLE_SRC], perm, dot_score, dot_message, blocks, 20, EPS)


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(block_sparse_gat._gat_forward_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.attention.block_gat is imported"

