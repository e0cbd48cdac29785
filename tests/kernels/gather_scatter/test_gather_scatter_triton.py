"""The fused gather-scatter kernels of one reduction (kernels/gather_scatter: ``gnn_io::gather_scatter``) and their
expression compiler (codegen.py, template.py): the lowering of messages to Triton, the work items of the degree split,
the light and hub launches and their settings, and the kernels against the exact CPU reference of the op.

The codegen and settings tests run everywhere (no kernel runs). The kernel tests run through the op on CUDA when
there is a GPU, and on CPU tensors in the interpreter tier (``TRITON_INTERPRET=1 pytest -m triton``, with
``GNN_IO_TRITON_ON_CPU=1``: the op's switch that sends CPU tensors down the Triton path), at small sizes, on the
graph of tests/kernels/gather_scatter/cases.py (a hub split into several items).
"""

import pytest
import torch
import torch.nn.functional as F

from gnn_inductor.config import SettingError
from gnn_inductor.kernels.gather_scatter import codegen, fused, launches
from gnn_inductor.kernels.gather_scatter.op import gather_scatter_reference
from gnn_inductor.kernels.gather_scatter.split_tuning import MIN_MAX_EDGES
from gnn_inductor.plan.work_items import PADDING, hub_item_count
from gnn_inductor.testing import magnitude, tolerance
from tests.kernels.gather_scatter.cases import (
    DEVICE,
    MESSAGES,
    NUM_NODES,
    D,
    DN,
    E,
    S,
    assert_within,
    cotangent,
    inputs,
    message_key,
    valued_inputs,
)
from tests.tiers import covering, runs_kernel


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
    key = message_key(lambda x: x.sum(-1))
    x = torch.randn(4, 3)
    assert "not a pointwise op" in launches.unsupported_reason([x], [S], key)
    assert launches.unsupported_reason([x.double()], [S], message_key(lambda x: x)).startswith("float64")


def test_generated_source_is_cached_by_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_IO_KERNEL_CACHE", str(tmp_path))
    source = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef kernel(X):\n    pass\n# cache test\n"
    first = codegen.load_kernels(source)
    assert codegen.load_kernels(source) is first
    assert len(list(tmp_path.glob("gnn_io_gen_*.py"))) == 1


def test_split_threshold_follows_the_mean_degree(monkeypatch):
    monkeypatch.delenv("GNN_IO_GS_MAX_EDGES", raising=False)
    rowptr = torch.arange(0, 1001, 10)  # 100 rows of degree 10
    assert fused.split_threshold(rowptr) == 128
    no_edges = torch.zeros(5, dtype=torch.long)
    assert fused.split_threshold(no_edges) == MIN_MAX_EDGES
    monkeypatch.setenv("GNN_IO_GS_MAX_EDGES", "4")
    assert fused.split_threshold(rowptr) == MIN_MAX_EDGES


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


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_forward_writes_every_row_without_a_memset(plan, reduce, monkeypatch):
    """The output starts uninitialised (``torch.empty`` poisoned with NaN here): light rows are stored by their
    items, hub rows prefilled and combined, rows without edges zeroed; nothing is left unwritten."""
    key = message_key(lambda x_j: x_j)
    args = valued_inputs([(S, (6,))], "random", seed=9)
    grad_out = cotangent(key, args, [S], seed=9)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (lambda t: t.fill_(float("nan")) if t.is_floating_point()
                                                         else t)(empty(*a, **k)))
    out, grads = _run([a.float().to(DEVICE) for a in args], [S], plan, key, reduce, grad_out.to(DEVICE))
    monkeypatch.undo()
    ref, ref_grads = _reference(args, [S], plan, key, reduce, grad_out)
    assert_within(out, ref)
    assert_within(grads[0], ref_grads[0])


def test_hub_items_lead_and_their_count_is_known(plan):
    """Hub items come first, a row's items adjacent and in CSR order, the light rows in row order after them;
    the count is known for the plan's own tensor only (a copy: None, and the count kernel covers every item)."""
    rowptr, col = plan[0], plan[1]
    items = torch.ops.gnn_io.gather_scatter_items(rowptr, col)
    row, start, _, shared = items
    hubs = hub_item_count(items)
    assert hubs == int((shared == 1).sum()) > 1
    assert bool((shared[:hubs] == 1).all()) and not bool((shared[hubs:] == 1).any())
    assert bool((start[1:hubs] > start[:hubs - 1]).all())  # the hub row's items in CSR order
    light = row[hubs:][shared[hubs:] == 0]
    assert bool((light[1:] > light[:-1]).all())
    assert hub_item_count([t.clone() for t in items]) is None


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_forward_launches_hub_and_light_items_apart(plan, reduce, monkeypatch):
    """``GNN_IO_GS_LIGHT_LAUNCH=forward``: with the plan's own items the forward launches over the hub items with
    ``LAUNCH`` and over the light items with ``LIGHT_LAUNCH``, each grid as long as its items; the result is the
    reference's, and the same as one launch over every item (a launch asked for by the caller)."""
    monkeypatch.setenv(launches.LIGHT_LAUNCH_ENV, "forward")
    monkeypatch.delenv(launches.LIGHT_ROWS_ENV, raising=False)
    calls, real = [], launches.launch
    monkeypatch.setattr(launches, "launch", lambda kernel, n, tensors, f, launch: (
        calls.append((n, tensors[-4].numel(), launch)), real(kernel, n, tensors, f, launch))[1])
    key = message_key(lambda x_j: x_j)
    (x,) = valued_inputs([(S, (6,))], "random", seed=4)
    rowptr, col, row, perm, *t_plan = plan
    items = torch.ops.gnn_io.gather_scatter_items(rowptr, col)
    hubs = hub_item_count(items)
    p = fused.make_plan(rowptr, col, row, perm, NUM_NODES, *t_plan[:3], items=items)
    split = fused.forward([x.to(DEVICE)], [S], p, key, reduce)
    forward_calls = [c for c in calls if c[2] in (launches.LAUNCH, launches.LIGHT_LAUNCH)]
    assert forward_calls == [(hubs, hubs, launches.LAUNCH),
                             (items[0].numel() - hubs, items[0].numel() - hubs, launches.LIGHT_LAUNCH)]
    calls.clear()
    one = fused.forward([x.to(DEVICE)], [S], p, key, reduce, launch=dict(launches.LAUNCH))
    assert [c[0] for c in calls] == [items[0].numel()]
    ref, _ = _reference([x], [S], plan, key, reduce, torch.zeros(NUM_NODES, 6))
    assert_within(split, ref)
    if reduce == "max":  # exact: the same values whatever the launch
        assert torch.equal(split, one)


@runs_kernel
@pytest.mark.parametrize("block_r", [2, 4])
@pytest.mark.parametrize("message", ["identity", "relu_edge", "leaky_dst"])
def test_rows_kernel_takes_the_light_items(plan, message, block_r, monkeypatch):
    """``GNN_IO_GS_LIGHT_ROWS=1``: the light items run the rows kernel (several rows per program, ``block_r`` of
    them), the hub items the item kernel; every member
    (sum, mean, max, min of one walk) equals the reference.
    The light items of this graph are not a multiple of 4 rows: the last program's rows are partly past them."""
    monkeypatch.setenv(launches.LIGHT_LAUNCH_ENV, "forward")
    monkeypatch.setenv(launches.LIGHT_ROWS_ENV, "1")
    monkeypatch.setitem(launches.ROWS_LAUNCH, "block_e", block_r)
    kinds, real = [], launches.kernel
    monkeypatch.setattr(launches, "kernel", lambda lowered, spec: kinds.append(spec.kind) or
                        real(lowered, spec))
    fn, specs = MESSAGES[message]
    key, roles = message_key(fn), [role for role, _ in specs]
    args = valued_inputs(specs, "integer", seed=7)
    reduces = ["sum", "mean", "max", "min"]
    rowptr, col, row, perm, *t_plan = plan
    outs = torch.ops.gnn_io.gather_scatter_multi([a.float().to(DEVICE) for a in args], roles, rowptr, col, row, perm,
                                                 [key] * 4, reduces, t_plan)
    assert "rows" in kinds
    for out, reduce in zip(outs, reduces):
        ref, _ = _reference(args, roles, plan, key, reduce, torch.zeros(NUM_NODES, *out.shape[1:]))
        assert_within(out, ref)


def test_light_rows_setting(monkeypatch):
    """Unset: the rows kernel from LIGHT_LAUNCH_MIN_ITEMS work items, the item kernel below; ``1`` / ``0`` force it at
    any size; anything else is refused by name."""
    least = launches.LIGHT_LAUNCH_MIN_ITEMS
    monkeypatch.delenv(launches.LIGHT_ROWS_ENV, raising=False)
    assert launches.light_rows(least) and not launches.light_rows(least - 1)
    monkeypatch.setenv(launches.LIGHT_ROWS_ENV, "1")
    assert launches.light_rows(1)
    monkeypatch.setenv(launches.LIGHT_ROWS_ENV, "0")
    assert not launches.light_rows(least)
    monkeypatch.setenv(launches.LIGHT_ROWS_ENV, "on")
    with pytest.raises(SettingError, match="0 or 1"):
        launches.light_rows(least)


@runs_kernel
@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_backward_light_launch_matches_the_reference(plan, reduce, monkeypatch):
    """``GNN_IO_GS_LIGHT_LAUNCH=both``: the gradient walks launch their light items apart too (a hub item's tie-count
    row is its index within the plan's items, kept since the hub items lead); the gradients are the reference's."""
    monkeypatch.setenv(launches.LIGHT_LAUNCH_ENV, "both")
    monkeypatch.delenv(launches.LIGHT_ROWS_ENV, raising=False)
    used, real = [], launches.launch
    monkeypatch.setattr(launches, "launch", lambda kernel, n, tensors, f, launch: (
        used.append(launch), real(kernel, n, tensors, f, launch))[1])
    fn, specs = MESSAGES["leaky_dst"]
    key, roles = message_key(fn), [role for role, _ in specs]
    args = valued_inputs(specs, "integer", seed=5)
    grad_out = cotangent(key, args, roles, seed=5)
    out, grads = _run([a.float().to(DEVICE) for a in args], roles, plan, key, reduce, grad_out.to(DEVICE))
    ref, ref_grads = _reference(args, roles, plan, key, reduce, grad_out)
    assert_within(out, ref)
    for g, r in zip(grads, ref_grads):
        assert_within(g, r)
    assert used.count(launches.LIGHT_LAUNCH) >= 2  # the forward's and a gradient walk's


def test_light_launch_setting(monkeypatch):
    """Which walks launch their light items apart. By default (``auto``) the forward from ``LIGHT_LAUNCH_MIN_ITEMS``
    work items, or at any size under CUDA graphs, never the gradient walks; ``forward``, ``both`` and ``off`` at any
    size; anything else is an error that names the values."""
    large, small = launches.LIGHT_LAUNCH_MIN_ITEMS, launches.LIGHT_LAUNCH_MIN_ITEMS - 1
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    for value, forward, backward in [(None, True, False), ("auto", True, False), ("forward", True, False),
                                     ("both", True, True), ("off", False, False)]:
        if value is None:
            monkeypatch.delenv(launches.LIGHT_LAUNCH_ENV, raising=False)
        else:
            monkeypatch.setenv(launches.LIGHT_LAUNCH_ENV, value)
        assert launches.light_launch("forward", large) is forward
        assert launches.light_launch("backward", large) is backward
        automatic = value in (None, "auto")
        assert launches.light_launch("forward", small) is (forward and not automatic)
    monkeypatch.delenv(launches.LIGHT_LAUNCH_ENV)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert launches.light_launch("forward", 1) and not launches.light_launch("backward", 1)
    monkeypatch.setenv(launches.LIGHT_LAUNCH_ENV, "yes")
    with pytest.raises(SettingError, match="auto, forward, both or off"):
        launches.light_launch("forward", large)


# ---- the kernels through the op (CUDA, or the interpreter on CPU) ----

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
    assert actual.dtype == dtype and torch.isfinite(actual).all()
    expected = expected.detach().to(dtype).double()
    torch.testing.assert_close(actual.detach().double().cpu(), expected,
                               **tolerance(dtype, "kernel", scale=magnitude(expected)))


@runs_kernel
@pytest.mark.parametrize("message, reduce", covering(list(MESSAGES), ["sum", "mean", "max", "min"]))
def test_forward_and_backward_match_the_reference(plan, message, reduce):
    fn, specs = MESSAGES[message]
    key, roles = message_key(fn), [role for role, _ in specs]
    args = inputs(specs, torch.float32)
    assert launches.unsupported_reason([a.float() for a in args], roles, key) is None
    grad_out = torch.randn(NUM_NODES, *launches.lowering(
        key, launches.argument_specs([a.float() for a in args], roles)).message_shape, dtype=torch.float64)
    out, grads = _run([a.float().to(DEVICE) for a in args], roles, plan, key, reduce, grad_out.to(DEVICE))
    ref, ref_grads = _reference(args, roles, plan, key, reduce, grad_out)
    _assert_close(out, ref, torch.float32)
    for g, r in zip(grads, ref_grads):
        _assert_close(g, r, torch.float32)


@runs_kernel
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_bfloat16_accumulates_in_float32(plan, reduce):
    fn, specs = MESSAGES["relu_edge"]
    key, roles = message_key(fn), [role for role, _ in specs]
    args = [a.to(torch.bfloat16) for a in inputs(specs, torch.bfloat16, seed=1)]
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
    key = message_key(lambda x_j: x_j)
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
    key, roles = message_key(fn), [role for role, _ in specs]
    x, x_i, w = [a.float().to(DEVICE) for a in inputs(specs, torch.float32)]
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
    monkeypatch.setattr(fused, "forward",
                        lambda *a, **k: calls.append(1) or torch.zeros(NUM_NODES, 6, device=DEVICE))
    x = torch.randn(NUM_NODES, 6, device=DEVICE)
    key = message_key(lambda x_j: x_j + 1.0)
    torch.ops.gnn_io.gather_scatter([x], [S], *plan[:4], key, "sum")
    assert calls == [1]


@runs_kernel
def test_opcheck_with_plan_items(plan):
    fn, specs = MESSAGES["edge_weight"]
    key, roles = message_key(fn), [role for role, _ in specs]
    args = [a.float().to(DEVICE).requires_grad_(True) for a in inputs(specs, torch.float32)]
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    items = list(torch.ops.gnn_io.gather_scatter_items(rowptr, col))
    t_items = list(torch.ops.gnn_io.gather_scatter_items(t_rowptr, t_col))
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter.default,
                          (args, roles, rowptr, col, row, perm, key, "mean", [t_rowptr, t_col, t_perm], items, t_items),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@runs_kernel
def test_opcheck_forward(plan):
    key = message_key(lambda x_j, x_i: F.leaky_relu(x_j - x_i, 0.2))
    x = torch.randn(NUM_NODES, 6, device=DEVICE, requires_grad=True)
    rowptr, col, row, perm, *t_plan = plan
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter_forward.default,
                          ([x, x], [S, D], rowptr, col, row, perm, key, "max", t_plan),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
