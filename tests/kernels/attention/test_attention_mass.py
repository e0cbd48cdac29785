"""GAT's dst score terms from the forward's mass (kernels/attention/op.py, ``gnn_io::attention_forward_mass``): the
forward also makes ``M_i = sum_j alpha_ij s'_ij (w_ij v_j - out_i)`` and the backward's D kernel returns
``<dout_i, M_i>``, the gradient of a dst-role score term, instead of the src pass storing a term per edge that is
then summed per destination.

Kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py), on the split-backward tests' graph: a destination hub and a source hub split
into several work items (so the hub combine merges the mass's partial sums), isolated nodes, self loops and
duplicate edges. The rule of where the op runs is checked everywhere.
"""
import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import (
    csr_backward,
    csr_forward,
    csr_launch,
    dispatch,
    selector as attention_paths,
)
from gnn_inductor.kernels.runtime.roles import ROLE_SRC

from tests.kernels.attention.test_attention_split_backward import (
    DEVICE,
    INTERPRETED,
    NUM_NODES,
    case_of,
    check_grads,
    plan,  # noqa: F401  (fixture)
    reference_grads,
    run_op,
)
from tests.kernels.attention.cases import assert_close, make_args
from tests.tiers import tiered

runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier
GAT_CASES = ["gat", "gat_edge", "gat_dropout"]


def _spy_forward(monkeypatch) -> list:
    """The ``mass`` flag of every csr_forward.forward call."""
    calls = []
    original = csr_forward.forward

    def spy(*args, **kwargs):
        calls.append(kwargs.get("mass", False))
        return original(*args, **kwargs)
    monkeypatch.setattr(csr_forward, "forward", spy)
    return calls


@runs_kernel
@pytest.mark.parametrize("name", tiered(GAT_CASES, ["gat_edge"]))
def test_mass_gradients_match_the_reference_and_the_segment_form(plan, name, monkeypatch):  # noqa: F811
    """GAT, with an edge term, with attention dropout: every gradient in float32 against the float64 reference
    and against the segment form; the mass form makes the mass in the forward and never sums per-edge terms."""
    out_segment, segment = run_op(plan, name, "one_pass_segment", monkeypatch)
    calls = _spy_forward(monkeypatch)

    def no_sum(*args, **kwargs):
        raise AssertionError("the mass form summed per-edge dst terms")
    monkeypatch.setattr(csr_backward, "_sum_by_destination", no_sum)
    out, grads = run_op(plan, name, "mass", monkeypatch)
    assert calls == [True], calls
    assert_close(out, out_segment.double().cpu(), torch.float32, "output")
    check_grads(grads, segment, reference_grads(plan, name), "mass", "segment")


@runs_kernel
def test_mass_is_the_row_sum_of_the_edge_terms(plan, monkeypatch):  # noqa: F811
    """The forward's mass itself, hub rows (merged by the combine kernel) included, against its definition
    computed edge by edge in float64; rows without edges hold zeros."""
    score, message, roles, kinds = case_of("gat")
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], 8))
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel())]
    out, lse, mass = torch.ops.gnn_io.attention_forward_mass(args, roles, *on_device, score, message, 1e-16, items, 8)
    rowptr, col, row, perm = plan[:4]
    x, s_src, s_dst = (a.double().cpu() for a in args)
    pre = s_src[col] + s_dst[row]
    slope = torch.where(pre > 0, 1.0, 0.2)
    alpha = torch.exp(torch.where(pre > 0, pre, 0.2 * pre) - lse.double().cpu()[row])
    centred = x[col] - out.double().cpu()[row]
    expected = torch.zeros(NUM_NODES, *x.shape[1:], dtype=torch.float64)
    expected.index_add_(0, row, (alpha * slope)[..., None] * centred)
    assert_close(mass, expected, torch.float32, "mass")
    assert not mass.cpu()[-3:].any()


@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
# the mass form's gradients against the reference stay in the default tier; the compiled layer with --slow
@pytest.mark.parametrize("edge_dim", tiered([None, 3], []))
def test_compiled_gatconv_takes_the_mass_form_and_matches_eager(edge_dim, monkeypatch):
    """PyG's GATConv (2 heads, its bias, with and without edge features) compiled with ``gnn_io``: the attention
    forward makes the mass, and the output and every gradient (input, weights, attention vectors, bias) are eager
    PyG's within 1e-5; the segment form compiled the same way makes none and agrees."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.testing import random_graph, tolerance

    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    edge_index = random_graph(30, 90, seed=2, hub_degree=15, num_isolated=2)
    edge_attr = None if edge_dim is None else torch.randn(edge_index.shape[1], edge_dim)
    results, original = {}, csr_forward.forward
    for variant in ("auto", "one_pass_segment"):
        monkeypatch.setenv(csr_launch.BACKWARD_ENV, variant)
        torch.manual_seed(0)
        model = GATConv(8, 4, heads=2, edge_dim=edge_dim)
        x = torch.randn(30, 8, requires_grad=True)
        grad = torch.randn(30, 8)
        inputs = (x, edge_index) if edge_attr is None else (x, edge_index, edge_attr)
        calls = _spy_forward(monkeypatch)
        torch._dynamo.reset()
        out = torch.compile(model, backend="gnn_io")(*inputs)
        out.backward(grad)
        monkeypatch.setattr(csr_forward, "forward", original)
        compiled = [out.detach(), x.grad] + [p.grad for p in model.parameters()]
        x.grad = None
        model.zero_grad()
        expected = model(*inputs)
        expected.backward(grad)
        eager = [expected.detach(), x.grad] + [p.grad for p in model.parameters()]
        for i, (got, want) in enumerate(zip(compiled, eager)):
            torch.testing.assert_close(got, want, **tolerance(torch.float32),
                                       msg=lambda m, i=i: f"{variant}, {i}: {m}")
        results[variant] = (calls, compiled)
    assert results["auto"][0] and all(results["auto"][0]), results["auto"][0]
    assert results["one_pass_segment"][0] and not any(results["one_pass_segment"][0])


@runs_kernel
def test_src_register_cap_reaches_the_src_pass(plan, monkeypatch):  # noqa: F811
    """``GNN_IO_SRC_MAXNREG``: the src pass launches with that cap (and without one when unset), the gradients
    unchanged; a bad value is a clear error."""
    caps, original = [], csr_backward.split_pass

    def spy(layout, major, *args):
        if major == ROLE_SRC:
            caps.append(args[9].get("maxnreg"))  # its launch config
        return original(layout, major, *args)
    monkeypatch.setattr(csr_backward, "split_pass", spy)
    monkeypatch.delenv(csr_launch.SRC_MAXNREG_ENV, raising=False)
    _, uncapped = run_op(plan, "gat", "mass", monkeypatch)
    monkeypatch.setenv(csr_launch.SRC_MAXNREG_ENV, "56")
    _, capped = run_op(plan, "gat", "mass", monkeypatch)
    assert caps == [None, 56], caps
    check_grads(capped, uncapped, reference_grads(plan, "gat"), "capped", "uncapped")
    monkeypatch.setenv(csr_launch.SRC_MAXNREG_ENV, "many")
    with pytest.raises(ValueError, match="GNN_IO_SRC_MAXNREG"):
        run_op(plan, "gat", "mass", monkeypatch)


@runs_kernel
def test_delta_mass_op_matches_its_definition(plan, monkeypatch):  # noqa: F811
    """``attention_delta_mass``: D as attention_delta's, the dst-term gradient ``scale * <dout, M>``, the bias
    gradient as attention_delta's."""
    generator = torch.Generator().manual_seed(11)
    out, mass, grad = (torch.randn(NUM_NODES, 2, 4, generator=generator).to(DEVICE) for _ in range(3))
    lse, bias = torch.zeros(NUM_NODES, 2, device=DEVICE), torch.randn(8, generator=generator).to(DEVICE)
    delta, mass_grad, bias_grad = torch.ops.gnn_io.attention_delta_mass(grad, out, mass, lse, bias, 0.5)
    plain_delta, plain_bias_grad = torch.ops.gnn_io.attention_delta(grad, out, lse, bias)
    torch.testing.assert_close(delta, plain_delta)
    torch.testing.assert_close(bias_grad, plain_bias_grad)
    torch.testing.assert_close(mass_grad, 0.5 * (grad * mass).sum(-1))
    with pytest.raises(ValueError, match="do not fit"):
        torch.ops.gnn_io.attention_delta_mass(grad, out, mass[:, :1], lse, None, 1.0)


@runs_kernel
def test_mass_op_passes_opcheck(plan):  # noqa: F811
    score, message, roles, kinds = case_of("gat")
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], 8))
    args = [a.to(DEVICE).requires_grad_() for a in make_args(kinds, plan[1].numel())]
    torch.library.opcheck(torch.ops.gnn_io.attention_forward_mass.default,
                          (args, roles, *on_device, score, message, 1e-16, items, 8),
                          test_utils=("test_schema", "test_faketensor"))


# ---- where the op runs (shapes and settings only: everywhere) ----

def _rule(plan, name="gat", dtype=torch.float32, requires_grad=True, device=DEVICE):  # noqa: F811
    score, message, roles, kinds = case_of(name)
    args = [a.to(device).requires_grad_(requires_grad and a.is_floating_point())
            for a in make_args(kinds, plan[1].numel(), dtype)]
    on_device = [t.to(device) for t in plan[:4]]
    return dispatch.mass_terms(args, roles, on_device[0], on_device[3], score, message)


@pytest.mark.triton
def test_rule_picks_gat_dst_terms_in_float32_only(plan, monkeypatch):  # noqa: F811
    monkeypatch.delenv(csr_launch.BACKWARD_ENV, raising=False)
    monkeypatch.delenv(attention_paths.PATH_ENV, raising=False)
    allowed = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        _check_rule(plan, monkeypatch)
        monkeypatch.setenv(attention_paths.PATH_ENV, "auto")
        torch.backends.cuda.matmul.allow_tf32 = True
        assert _rule(plan) == []  # the chooser may pick the block kernel under TF32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def _check_rule(plan, monkeypatch):  # noqa: F811
    assert _rule(plan) == [2] and _rule(plan, "gat_edge") == [2] and _rule(plan, "gat_dropout") == [2]
    assert _rule(plan, "gatv2") == [] and _rule(plan, "transformer") == []
    assert _rule(plan, dtype=torch.bfloat16) == []
    assert _rule(plan, requires_grad=False) == []
    for variant in ("split", "one_pass_segment", "atomic"):
        monkeypatch.setenv(csr_launch.BACKWARD_ENV, variant)
        assert _rule(plan) == [], variant
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "mass")
    assert _rule(plan) == [2]
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    assert _rule(plan) == []  # a forced block path makes no mass


def test_rule_is_off_where_the_fused_kernels_do_not_run(plan):  # noqa: F811
    if INTERPRETED:
        pytest.skip("CPU tensors run the fused kernels under the interpreter")
    assert _rule(plan, device=torch.device("cpu")) == []

