"""The fused gather-scatter kernels (kernels/gather_scatter_triton.py) and their expression compiler
(kernels/codegen.py) against the exact CPU reference of ``gnn_io::gather_scatter``.

The codegen tests run everywhere (no kernel runs). The kernel tests run through the op on CUDA when
there is a GPU, and on CPU tensors under Triton's interpreter: ``test_kernels_under_interpreter``
reruns this file in a subprocess with ``TRITON_INTERPRET=1`` and ``GNN_IO_TRITON_ON_CPU=1`` (the op's
switch that sends CPU tensors down the Triton path), at small sizes. The graph has isolated nodes,
self loops, duplicate edges and a hub above the split threshold (``GNN_IO_GS_MAX_EDGES=8``).
"""
import os

import pytest
import torch
import torch.nn.functional as F

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor import edge_functions
from gnn_inductor.kernels import codegen, gather_scatter_triton
from gnn_inductor.kernels._common import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.gather_scatter import gather_scatter_reference
from gnn_inductor.kernels.spmm_triton import PADDING
from gnn_inductor.testing import TOLERANCES, random_graph
from tests.kernels.interpreter import rerun_under_interpreter

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu")
NUM_NODES = 24
HUB_DEGREE = 40
MAX_EDGES = 8  # the split threshold of these tests: the hub is cut into several items

runs_kernel = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                 reason="no GPU: run by test_kernels_under_interpreter")
S, D, E, DN = ROLE_SRC, ROLE_DST, ROLE_EDGE, ROLE_DENSE


def _key(fn) -> str:
    return edge_functions.register(torch.fx.symbolic_trace(fn))


def _lower(fn, specs):
    return codegen.lower(torch.fx.symbolic_trace(fn), specs)


F32 = torch.float32

# ---- the expression compiler (every machine) ----


def test_layouts_of_full_scalar_partial_and_dense_arguments():
    lowered = _lower(lambda x_j, x_i, w, head, bias: F.leaky_relu(x_j - x_i, 0.2) * w.view(-1, 1, 1) * head + bias,
                     [(S, (2, 3), F32), (D, (2, 3), F32), (E, (), F32), (E, (2, 1), F32), (DN, (3,), F32)])
    assert lowered.message_shape == (2, 3)
    assert [lay.kind((2, 3)) for lay in lowered.layouts] == ["full", "full", "scalar", "partial", "partial"]
    assert codegen.layout_offsets(lowered.layouts[3], (2, 3), "f") == "((f // 3) % 2) * 1"
    assert codegen.layout_offsets(lowered.layouts[4], (2, 3), "f") == "((f // 1) % 3) * 1"
    assert all(r is not None for r in lowered.vjp_results)


def test_vjp_uses_the_aten_derivative_formulas():
    lowered = _lower(lambda x_j, e: torch.relu(x_j + e), [(S, (4,), F32), (E, (4,), F32)])
    assert any("tl.maximum" in line for line in lowered.forward)
    vjp = "\n".join(lowered.vjp)
    assert "tl.where" in vjp and "<= 0.0" in vjp, vjp  # threshold_backward
    assert lowered.vjp_results[0] == lowered.vjp_results[1]  # d(x + e) is the same for both


def test_boolean_mask_gets_no_gradient():
    lowered = _lower(lambda x_j, keep: torch.where(keep, x_j, 0.0), [(S, (4,), F32), (E, (4,), torch.bool)])
    assert lowered.layouts[1].is_bool and lowered.vjp_results[1] is None


@pytest.mark.parametrize("fn, specs, reason", [
    (lambda x: x.sum(-1, keepdim=True), [(S, (4,), F32)], "not a pointwise op"),
    (lambda x: x.transpose(1, 2), [(S, (2, 2), F32)], "moves features"),
    (lambda x: x ** 0.3, [(S, (4,), F32)], "exponent"),
    (lambda x: x.masked_fill(x > 0, float("-inf")), [(S, (4,), F32)], "non-finite"),
    (lambda x, t: x * t, [(S, (4,), F32), (E, (4,), torch.int64)], "dtype"),
    (lambda x, d: x + d, [(S, (4,), F32), (DN, (5, 4), F32)], "tracing the edge function failed"),
], ids=["feature-sum", "transpose", "pow", "inf", "int-arg", "dense-over-edges"])
def test_unsupported_messages_say_why(fn, specs, reason):
    with pytest.raises(codegen.Unsupported, match=reason):
        _lower(fn, specs)


def test_unsupported_message_runs_the_reference():
    key = _key(lambda x: x.sum(-1))
    x = torch.randn(4, 3)
    assert "not a pointwise op" in gather_scatter_triton.unsupported_reason([x], [S], key)
    assert gather_scatter_triton.unsupported_reason([x.double()], [S], _key(lambda x: x)).startswith("float64")


def test_generated_source_is_cached_by_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_IO_KERNEL_CACHE", str(tmp_path))
    source = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef kernel(X):\n    pass\n# cache test\n"
    first = codegen.load_kernels(source)
    assert codegen.load_kernels(source) is first
    assert len(list(tmp_path.glob("gnn_io_gen_*.py"))) == 1


def test_split_threshold_follows_the_mean_degree(monkeypatch):
    monkeypatch.delenv("GNN_IO_GS_MAX_EDGES", raising=False)
    rowptr = torch.arange(0, 1001, 10)  # 100 rows of degree 10
    assert gather_scatter_triton.split_threshold(rowptr) == 128
    no_edges = torch.zeros(5, dtype=torch.long)
    assert gather_scatter_triton.split_threshold(no_edges) == gather_scatter_triton.MIN_MAX_EDGES
    monkeypatch.setenv("GNN_IO_GS_MAX_EDGES", "4")
    assert gather_scatter_triton.split_threshold(rowptr) == gather_scatter_triton.MIN_MAX_EDGES


def test_plan_items_are_padded_to_a_size_only_bound(plan):
    rowptr, col = plan[0], plan[1]
    _, start, end, shared = torch.ops.gnn_io.gather_scatter_items(rowptr, col)
    real = shared != PADDING
    assert bool((start[~real] == end[~real]).all())
    covered = torch.zeros(col.numel(), dtype=torch.long)
    for s, e in zip(start[real].tolist(), end[real].tolist()):
        covered[s:e] += 1
    assert (covered == 1).all()
    assert bool((shared[real] == 1).any()), "the hub must be split"


class _Messages(torch.nn.Module):
    """``max_j phi(x_j, x_i)`` written with PyG's scatter; ``lowerable=False`` reduces over features."""

    def __init__(self, lowerable: bool):
        super().__init__()
        self.lowerable = lowerable

    def forward(self, x, edge_index):
        from torch_geometric.utils import scatter

        src, dst = edge_index
        msg = torch.relu(x[src] + x[dst]) if self.lowerable else (x[src] * x[dst]).sum(-1, keepdim=True)
        return scatter(msg, dst, dim=0, dim_size=x.shape[0], reduce="max")


@pytest.mark.skipif(INTERPRETED, reason="compiles with Inductor")
@pytest.mark.parametrize("lowerable", [True, False], ids=["pointwise", "feature-sum"])
def test_report_says_which_kernel_runs(lowerable, monkeypatch):
    from gnn_inductor import kernels
    from gnn_inductor.testing import check_rewrites

    monkeypatch.setenv("GNN_IO_STRICT", "1")
    edge_index = random_graph(NUM_NODES, 50, seed=3, hub_degree=HUB_DEGREE, num_isolated=3)
    result = check_rewrites(_Messages(lowerable), torch.randn(NUM_NODES, 4), edge_index,
                            expect={"gather_scatter": 1, "near_miss": 0})
    (rewrite,) = [w for g in result.report["graphs"] for w in g["rewrites"]]
    cuda_kernel = kernels.kernel_for("gnn_io.gather_scatter", "cuda", rewrite["details"])
    if lowerable:
        assert rewrite["details"]["lowering"] == "triton"
        assert cuda_kernel.startswith("fused degree-split Triton")
    else:
        assert rewrite["details"]["lowering"].startswith("reference: aten.sum")
        assert cuda_kernel.startswith("segment reference: aten.sum")


# ---- the kernels through the op (CUDA, or the interpreter on CPU) ----

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


MESSAGES = {
    "identity": (lambda x_j: x_j, [(S, (6,))]),
    "relu_edge": (lambda x_j, e: torch.relu(x_j + e), [(S, (6,)), (E, (6,))]),
    "edge_weight": (lambda x_j, w: x_j * w.view(-1, 1), [(S, (6,)), (E, ())]),
    "leaky_dst": (lambda x_j, x_i, w: F.leaky_relu(x_j - x_i, 0.2) * w, [(S, (2, 3)), (D, (2, 3)), (E, (2, 1))]),
    "dense_param": (lambda x_j, p: torch.tanh(x_j) * p + 0.5, [(S, (6,)), (DN, (6,))]),
}


def _inputs(specs, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_edges = random_graph(NUM_NODES, 50, seed=3, hub_degree=HUB_DEGREE, num_isolated=3).shape[1]
    shapes = [shape if role == DN else ((NUM_NODES if role in (S, D) else num_edges), *shape) for role, shape in specs]
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]


def _run(args, roles, plan, key, reduce, grad_out):
    leaves = [a.detach().requires_grad_(True) for a in args]
    rowptr, col, row, perm, *t_plan = plan
    out = torch.ops.gnn_io.gather_scatter(leaves, roles, rowptr, col, row, perm, key, reduce, t_plan)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return out, grads


def _reference(args, roles, plan, key, reduce, grad_out):
    leaves = [a.detach().cpu().double().requires_grad_(True) for a in args]
    out = gather_scatter_reference(leaves, roles, *(p.cpu() for p in plan[:4]), key, reduce)
    return out, torch.autograd.grad(out, leaves, grad_out.double())


def _assert_close(actual, expected, dtype):
    rtol, atol_scale = TOLERANCES[dtype]
    assert actual.dtype == dtype and torch.isfinite(actual).all()
    expected = expected.detach().to(dtype).double()
    torch.testing.assert_close(actual.detach().double().cpu(), expected, rtol=rtol * 4,
                               atol=atol_scale * 4 * max(1.0, float(expected.abs().max())))


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("message", list(MESSAGES))
def test_forward_and_backward_match_the_reference(plan, message, reduce):
    fn, specs = MESSAGES[message]
    key, roles = _key(fn), [role for role, _ in specs]
    args = _inputs(specs, torch.float32)
    assert gather_scatter_triton.unsupported_reason([a.float() for a in args], roles, key) is None
    grad_out = torch.randn(NUM_NODES, *gather_scatter_triton.lowering(
        key, gather_scatter_triton._specs([a.float() for a in args], roles)).message_shape, dtype=torch.float64)
    out, grads = _run([a.float().to(DEVICE) for a in args], roles, plan, key, reduce, grad_out.to(DEVICE))
    ref, ref_grads = _reference(args, roles, plan, key, reduce, grad_out)
    _assert_close(out, ref, torch.float32)
    for g, r in zip(grads, ref_grads):
        _assert_close(g, r, torch.float32)


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_bfloat16_accumulates_in_float32(plan, reduce):
    fn, specs = MESSAGES["relu_edge"]
    key, roles = _key(fn), [role for role, _ in specs]
    args = [a.to(torch.bfloat16) for a in _inputs(specs, torch.bfloat16, seed=1)]
    grad_out = torch.randn(NUM_NODES, 6, dtype=torch.float64).to(torch.bfloat16)
    out, grads = _run([a.to(DEVICE) for a in args], roles, plan, key, reduce, grad_out.to(DEVICE))
    ref, ref_grads = _reference(args, roles, plan, key, reduce, grad_out.double())
    _assert_close(out, ref, torch.bfloat16)
    for g, r in zip(grads, ref_grads):
        _assert_close(g, r, torch.bfloat16)


@runs_kernel
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_share_the_gradient_equally(plan, reduce):
    """Integer-valued features tie often, in the hub too; scatter_reduce splits the gradient equally."""
    key = _key(lambda x_j: x_j)
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(-2, 3, (NUM_NODES, 5), generator=generator).double()
    grad_out = torch.randn(NUM_NODES, 5, generator=generator, dtype=torch.float64)
    out, (gx,) = _run([x.float().to(DEVICE)], [S], plan, key, reduce, grad_out.to(DEVICE))
    ref, (rx,) = _reference([x], [S], plan, key, reduce, grad_out)
    _assert_close(out, ref, torch.float32)
    _assert_close(gx, rx, torch.float32)


@runs_kernel
def test_only_the_requested_gradients(plan):
    fn, specs = MESSAGES["leaky_dst"]
    key, roles = _key(fn), [role for role, _ in specs]
    x, x_i, w = [a.float().to(DEVICE) for a in _inputs(specs, torch.float32)]
    x.requires_grad_(True)
    rowptr, col, row, perm, *t_plan = plan
    out = torch.ops.gnn_io.gather_scatter([x, x_i, w], roles, rowptr, col, row, perm, key, "max", t_plan)
    (gx,) = torch.autograd.grad(out.sum(), [x])
    ref_x = x.detach().cpu().double().requires_grad_(True)
    ref = gather_scatter_reference([ref_x, x_i.cpu().double(), w.cpu().double()], roles,
                                   *(p.cpu() for p in plan[:4]), key, "max")
    (rx,) = torch.autograd.grad(ref.sum(), [ref_x])
    _assert_close(gx, rx, torch.float32)


@runs_kernel
def test_op_takes_the_fused_path(plan, monkeypatch):
    calls = []
    monkeypatch.setattr(gather_scatter_triton, "forward",
                        lambda *a, **k: calls.append(1) or torch.zeros(NUM_NODES, 6, device=DEVICE))
    x = torch.randn(NUM_NODES, 6, device=DEVICE)
    key = _key(lambda x_j: x_j + 1.0)
    torch.ops.gnn_io.gather_scatter([x], [S], *plan[:4], key, "sum")
    assert calls == [1]


@runs_kernel
def test_opcheck_with_plan_items(plan):
    fn, specs = MESSAGES["edge_weight"]
    key, roles = _key(fn), [role for role, _ in specs]
    args = [a.float().to(DEVICE).requires_grad_(True) for a in _inputs(specs, torch.float32)]
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    items = list(torch.ops.gnn_io.gather_scatter_items(rowptr, col))
    t_items = list(torch.ops.gnn_io.gather_scatter_items(t_rowptr, t_col))
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter.default,
                          (args, roles, rowptr, col, row, perm, key, "mean", [t_rowptr, t_col, t_perm], items, t_items),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


# ---- the interpreter run ----

@pytest.mark.skipif(INTERPRETED, reason="this is the interpreter run")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels ran on the GPU")
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__, env={"GNN_IO_TRITON_ON_CPU": "1"})
