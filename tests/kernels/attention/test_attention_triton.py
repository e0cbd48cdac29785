"""The fused CSR attention kernels (kernels/attention/csr_*.py) against the CPU reference of gnn_io::attention, on the
cases of tests/kernels/attention/cases.py.

Kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier
(``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py). Under the interpreter ``torch.ops.gnn_io.attention``
itself takes the fused path on CPU tensors, so these tests go through the op, its autograd formula and the launchers.
Attention dropout (``*_dropout`` cases: the op given a seed and ``p``, kernels/runtime/rng.py): the kernels against
the reference with the same seed. Recognition of PyG's layers and dropout against PyG's own math:
tests/kernels/attention/test_attention_pyg.py.
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import csr_backward
from gnn_inductor.kernels.attention import csr_delta
from gnn_inductor.kernels.attention import csr_forward
from gnn_inductor.kernels.attention import csr_launch
from gnn_inductor.kernels.attention import csr_split_backward
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.runtime.launch import next_power_of_2
from gnn_inductor.kernels.attention.op import reference_with_lse, attention_reference
from gnn_inductor.testing import tolerance
from tests.kernels.attention.cases import (
    CASES,
    CHANNELS,
    EPS,
    HEADS,
    MAX_EDGES,
    MESSAGE_FOR_HEADS,
    NUM_NODES,
    OP_DEVICE,
    assert_close,
    check_case,
    dropout_args,
    dropout_for,
    edge_fn,
    grads_of,
    make_args,
    plan,  # noqa: F401  (fixture)
)
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, runs_kernel, tiered

aten = torch.ops.aten


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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
    roles = [role for role, _ in kinds]
    args = make_args(kinds, plan[1].numel())
    on_device = [t.to(DEVICE) for t in plan[:4]]
    out, lse = torch.ops.gnn_io.attention_forward([a.to(DEVICE) for a in args], roles, *on_device, score, message,
                                                  EPS, [], 0)
    ref, ref_lse = reference_with_lse(args, roles, *plan[:4], score, message, EPS)
    assert_close(out, ref, torch.float32, "output")
    assert_close(lse, ref_lse, torch.float32, "lse")


@runs_kernel
def test_hub_slots_exact_or_bounded_give_the_same_result(plan):
    """The forward's hub slots: as many as the plan's items hold hub items (known for the op's own tensors) or the
    size-only bound (a copy of the items): the same output and log-sum-exp."""
    from gnn_inductor.plan.work_items import hub_item_count

    score_fn, message_fn, _, kinds = CASES["gatv2_edge"]
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
    roles = [role for role, _ in kinds]
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel())]
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, items, MAX_EDGES)
    assert not out.isnan().any() and not lse.isnan().any()
    assert not out[-3:].any() and not lse[-3:].any(), "rows without edges are 0"
    ref, ref_lse = reference_with_lse([a.cpu() for a in args], roles, *plan[:4], score, message, EPS)
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    score = edge_fn(lambda a0, a1: aten.tanh.default(aten.sum.dim_IntList(aten.mul.Tensor(a0, a1), [-1])))
    message = edge_fn(lambda alpha, a0, a1: aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0))
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    score = edge_fn(score_fn)
    message = edge_fn(MESSAGE_FOR_HEADS[name](heads) if name in MESSAGE_FOR_HEADS else message_fn)
    roles = [role for role, _ in kinds]
    args = make_args(kinds, plan[1].numel(), heads=heads, channels=channels)
    _, lse = torch.ops.gnn_io.attention_forward([a.to(DEVICE) for a in args], roles, *on_device, score, message,
                                                EPS, items, MAX_EDGES, *dropout_args(dropout_for(name, DEVICE)))
    wide = [a.double() if a.is_floating_point() else a for a in args]
    _, ref_lse = reference_with_lse(wide, roles, *plan[:4], score, message, EPS, dropout_for(name))
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    layout = attention_layout.prepare(args, [role for role, _ in kinds], perm, edge_fn(score_fn), edge_fn(message_fn),
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
    _, ref_grads = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS, dropout_for(name)),
                            wide, grad.double().cpu())
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
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
    score, message = edge_fn(score_fn), edge_fn(message_fn)
    out = torch.ops.gnn_io.attention(args, roles, *on_device, score, message, EPS, bias=bias)
    plain = torch.ops.gnn_io.attention(args, roles, *on_device, score, message, EPS)
    torch.testing.assert_close(out, plain + bias)


def test_bias_of_the_wrong_size_is_an_error(plan):
    score_fn, message_fn, _, kinds = CASES["gat"]
    args = make_args(kinds, plan[1].numel())
    with pytest.raises(ValueError, match="attention bias of shape"):
        torch.ops.gnn_io.attention(args, [r for r, _ in kinds], *plan[:4], edge_fn(score_fn), edge_fn(message_fn), EPS,
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
                          (args, [r for r, _ in kinds], *plan[:4], edge_fn(score_fn), edge_fn(message_fn), EPS, [], 0))

