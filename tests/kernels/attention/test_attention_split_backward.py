"""The split backward of the fused CSR attention (kernels/attention/csr_backward.py, ``GNN_IO_ATTENTION_BACKWARD``):
a dst pass over the CSR and a src pass over the transposed CSR, against the atomic backward and the float64
reference of gnn_io::attention.

Kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py); there they also count the interpreter's atomic operations. The graph has a
destination hub and a source hub, both split into several work items (``MAX_EDGES = 8``), isolated nodes, self
loops and duplicate edges. The transposed CSR and its cache are plain torch and run everywhere.
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.plan import state as graph_state
import pytest
import torch
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.kernels.attention import csr_atomic_backward
from gnn_inductor.kernels.attention import csr_backward
from gnn_inductor.kernels.attention import csr_launch
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_SRC
from gnn_inductor.kernels.attention.op import attention_reference

from gnn_inductor.testing import random_graph
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, runs_kernel, tiered
from tests.kernels.attention.cases import (
    CASES,
    CHANNELS,
    EPS,
    HEADS,
    NUM_NODES,
    V,
    edge_fn,
    assert_close,
    dropout_args,
    dropout_for,
    grads_of,
    make_args,
)

MAX_EDGES = 8            # below both hubs' degrees: each spans several work items
NO_SPLIT_MAX_EDGES = 64  # above every degree: no hub item, so the split backward needs no atomic at all
SOURCE_HUB, SOURCE_HUB_DEGREE = 1, 20
aten = torch.ops.aten

def interpreter_only(test):
    """Counts the interpreter's atomic operations: the interpreter tier only."""
    return pytest.mark.triton(pytest.mark.skipif(not INTERPRETED, reason="counts the interpreter's atomics")(test))


@pytest.fixture(scope="module")
def plan():
    """The seven CSR plan tensors of a graph with node 0 receiving 30 extra edges and node 1 sending 20."""
    src, dst = random_graph(NUM_NODES, 50, seed=3, hub_degree=30, num_isolated=3)
    hub_targets = torch.randint(0, NUM_NODES - 3, (SOURCE_HUB_DEGREE,), generator=torch.Generator().manual_seed(5))
    src = torch.cat([src, torch.full((SOURCE_HUB_DEGREE,), SOURCE_HUB)])
    dst = torch.cat([dst, hub_targets])
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    in_degree, out_degree = plan[0].diff(), plan[4].diff()
    assert in_degree.max() > 3 * MAX_EDGES and out_degree.max() > 2 * MAX_EDGES
    assert max(in_degree.max(), out_degree.max()) <= NO_SPLIT_MAX_EDGES
    assert (in_degree[-3:] == 0).all() and (out_degree[-3:] == 0).all()
    return plan


def case_of(name):
    score_fn, message_fn, _, kinds = CASES[name]
    return edge_fn(score_fn), edge_fn(message_fn), [role for role, _ in kinds], kinds


def run_op(plan, name, mode, monkeypatch, dtype=torch.float32, max_edges=MAX_EDGES):
    """``(out, grads)`` of gnn_io::attention with the ``mode`` backward, on DEVICE."""
    score, message, roles, kinds = case_of(name)
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, mode)
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], max_edges))
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel(), dtype)]
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    dropout = dropout_args(dropout_for(name, DEVICE))
    return grads_of(lambda a: torch.ops.gnn_io.attention(a, roles, *on_device, score, message, EPS, items, max_edges,
                                                         *dropout), args, grad)


def reference_grads(plan, name, dtype=torch.float32):
    score, message, roles, kinds = case_of(name)
    wide = [a.double() if a.is_floating_point() else a for a in make_args(kinds, plan[1].numel(), dtype)]
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7)).double()
    return grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS, dropout_for(name)), wide,
                    grad)[1]


@pytest.fixture
def atomics(monkeypatch):
    """The interpreter's atomic read-modify-write operations (one per ``tl.atomic_add`` executed), counted."""
    from triton.runtime.interpreter import InterpreterBuilder

    calls = []
    original = InterpreterBuilder.create_atomic_rmw

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(InterpreterBuilder, "create_atomic_rmw", counting)
    return calls


def _no_atomic_kernels(monkeypatch):
    """Make launching either atomic backward kernel fail."""
    class NotLaunched:
        def __getitem__(self, grid):
            raise AssertionError("the split backward launched an atomic backward kernel")
    monkeypatch.setattr(csr_atomic_backward, "atomic_backward_kernel", NotLaunched())
    monkeypatch.setattr(csr_atomic_backward, "atomic_backward_all_heads_kernel", NotLaunched())


# ---- the kernels (CUDA, or the interpreter on CPU) ----

@runs_kernel
@pytest.mark.parametrize("name", tiered(CASES, ["gat_edge", "transformer"]))
def test_split_matches_atomic_and_reference(plan, name, monkeypatch):
    """Every family (GAT with and without an edge term, GATv2, TransformerConv with ``v_j + e_ij``, each with edge
    terms also with attention dropout: the dst and src passes regenerate the forward's mask from the seed and the
    edge ids): fp32 gradients of both backwards against the float64 reference, and of each other."""
    _, atomic = run_op(plan, name, "atomic", monkeypatch)
    _no_atomic_kernels(monkeypatch)
    _, split = run_op(plan, name, "split", monkeypatch)
    check_grads(split, atomic, reference_grads(plan, name), "split", "atomic")


def check_grads(grads, others, reference, name, other_name):
    """float32 gradients ``grads`` (None where ``reference`` is) against the float64 ``reference`` and against
    another backward's ``others``; the isolated nodes' rows zero."""
    for i, (g, o, r) in enumerate(zip(grads, others, reference)):
        if r is None:
            assert g is None and o is None
            continue
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), f"grad of argument {i}"
        assert_close(g, r, torch.float32, f"{name} grad of argument {i}")
        assert_close(g, o.double().cpu(), torch.float32, f"{name} against {other_name}, argument {i}")
        if g.shape[0] == NUM_NODES:
            assert not g[-3:].any(), f"isolated nodes get no gradient (argument {i})"


@runs_kernel
@pytest.mark.parametrize("name", tiered(["gat_edge", "gatv2_edge", "transformer_edge"], ["gatv2_edge"]))
def test_split_half_precision(plan, name, monkeypatch):
    """bf16 inputs, float32 accumulation: within 4x the bf16 tolerance of gnn_inductor.testing.TOLERANCES
    (rtol 6.4e-2, atol 6.4e-2 times the largest reference gradient) of the reference given the bf16 inputs."""
    _, split = run_op(plan, name, "split", monkeypatch, torch.bfloat16)
    for i, (s, r) in enumerate(zip(split, reference_grads(plan, name, torch.bfloat16))):
        if r is not None:
            assert s.dtype == torch.bfloat16 and torch.isfinite(s).all(), f"grad of argument {i}"
            assert_close(s, r, torch.bfloat16, f"bf16 split grad of argument {i}")


@interpreter_only
@pytest.mark.parametrize("name", tiered(["gat_edge", "transformer_edge"], ["transformer_edge"]))
def test_split_needs_no_atomics_without_hubs(plan, name, atomics, monkeypatch):
    """No row spans two work items: the split backward runs no atomic at all (GATv2's ``att`` slots aside,
    hence these two families), the atomic one some."""
    run_op(plan, name, "atomic", monkeypatch, max_edges=NO_SPLIT_MAX_EDGES)
    assert atomics, "the atomic backward must count atomics (else this test cannot fail)"
    atomics.clear()
    _no_atomic_kernels(monkeypatch)
    run_op(plan, name, "split", monkeypatch, max_edges=NO_SPLIT_MAX_EDGES)
    assert not atomics, f"{len(atomics)} atomics in the split backward of a graph without hub items"


@interpreter_only
def test_split_atomics_only_for_hub_items(plan, atomics, monkeypatch):
    """With hubs split into several items: one atomic per (hub item, row-role argument), every head's row in
    one, nothing else (TransformerConv with edge features: the query in the dst pass, key and value in the
    src pass)."""
    score, message, roles, kinds = case_of("transformer_edge")
    args = make_args(kinds, plan[1].numel())
    layout = attention_layout.prepare(args, roles, plan[3], score, message)
    by_src = csr_backward.source_csr(layout, plan[0], plan[1], plan[3], MAX_EDGES)
    dst_hub_items = int((torch.ops.gnn_io.work_items(plan[0], plan[1], MAX_EDGES)[3] == 1).sum())
    src_hub_items = int((by_src.items.shared == 1).sum())
    assert dst_hub_items >= 4 and src_hub_items >= 3
    run_op(plan, "transformer_edge", "split", monkeypatch)
    assert len(atomics) == dst_hub_items * 1 + src_hub_items * 2


# Five distinct source-role arguments need gradients: more than one pass of the split backward writes.
def _many_sources_score(a0, a1, a2, a3, a4):
    return aten.sum.dim_IntList(aten.mul.Tensor(a0, aten.add.Tensor(aten.add.Tensor(a1, a2), a3)), [-1])


def _many_sources_message(alpha, a0, a1, a2, a3, a4):
    return aten.mul.Tensor(a4, aten.view.default(alpha, [-1, HEADS, 1]))


@runs_kernel
def test_more_outputs_than_slots_run_the_atomic_backward(plan, monkeypatch):
    score, message = edge_fn(_many_sources_score), edge_fn(_many_sources_message)
    roles = [ROLE_SRC] * 5
    args = make_args([(ROLE_SRC, V)] * 5, plan[1].numel())
    on_device = [t.to(DEVICE) for t in plan[:4]]
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "split")
    grad = torch.randn(NUM_NODES, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7))
    _, grads = grads_of(lambda a: torch.ops.gnn_io.attention(a, roles, *on_device, score, message, EPS),
                        [a.to(DEVICE) for a in args], grad.to(DEVICE))
    wide = [a.double() for a in args]
    _, ref = grads_of(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS), wide, grad.double())
    for i, (g, r) in enumerate(zip(grads, ref)):
        assert_close(g, r, torch.float32, f"grad of argument {i}")


# ---- the transposed CSR, its cache and the switch (every machine) ----

def test_source_csr_is_the_transposed_plan(plan):
    """Rows are sources, edges in CSR order within a row: exactly csr_plan's own transposed arrays; the source
    hub spans several items covering its row."""
    rowptr, col, _, perm, t_rowptr, t_col, t_perm = plan
    by_src = plan_source_csr.build_source_csr(rowptr, col, perm, NUM_NODES, MAX_EDGES)
    assert torch.equal(by_src.rowptr, t_rowptr.long())
    assert torch.equal(by_src.dst, t_col)
    assert torch.equal(by_src.eid, perm[t_perm])
    row, start, end, shared = by_src.items
    hub = row == SOURCE_HUB
    assert int(hub.sum()) > 2 and torch.equal(shared == 1, t_rowptr.diff()[row.long()] > MAX_EDGES)
    assert int(start[hub].min()) == int(t_rowptr[SOURCE_HUB]) and int(end[hub].max()) == int(t_rowptr[SOURCE_HUB + 1])
    assert bool((end - start <= MAX_EDGES).all()) and int((end - start).sum()) == col.numel()
    # the rows its gradient buffers need zeroed first: no entries, or a hub's several items adding
    degree = t_rowptr.diff()
    assert torch.equal(by_src.fill_rows, torch.nonzero((degree == 0) | (degree > MAX_EDGES)).flatten().int())


def test_source_csr_is_cached_with_the_plan(plan):
    score, message, roles, kinds = case_of("transformer")
    layout = attention_layout.prepare(make_args(kinds, plan[1].numel()), roles, plan[3], score, message)
    rowptr, col, _, perm = [t.clone() for t in plan[:4]]
    first = csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES)
    assert csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES) is first
    assert csr_backward.source_csr(layout, rowptr, col, perm, 2 * MAX_EDGES) is not first
    col.add_(0)  # an in-place change invalidates the plan entry, and the transposed CSR with it
    assert csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES) is not first
    cached = csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES)
    graph_state.clear()
    assert csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES) is not cached


def test_source_csr_is_not_built_inside_a_cuda_graph_capture(plan, monkeypatch):
    """Building the source CSR counts its hubs on the host, which a CUDA-graph capture refuses: during a capture a
    plan without one gets None (the op's backward then runs the atomic variant); one built before is still read."""
    score, message, roles, kinds = case_of("transformer")
    layout = attention_layout.prepare(make_args(kinds, plan[1].numel()), roles, plan[3], score, message)
    rowptr, col, _, perm = [t.clone() for t in plan[:4]]
    monkeypatch.setattr(plan_source_csr, "capturing", lambda device: True)
    assert csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES) is None
    monkeypatch.setattr(plan_source_csr, "capturing", lambda device: False)
    built = csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES)
    monkeypatch.setattr(plan_source_csr, "capturing", lambda device: True)
    assert csr_backward.source_csr(layout, rowptr, col, perm, MAX_EDGES) is built


def test_backward_variant_defaults_to_auto(monkeypatch):
    """Unset: ``auto``, the split backward for GATv2 and the dot family, the segment form for GAT (measured
    1.09x the split backward's step on RMAT 2^20, 1.17x on a uniform graph of 16M edges, H100)."""
    monkeypatch.delenv(csr_launch.BACKWARD_ENV, raising=False)
    assert csr_launch.backward_variant() == "auto"
    for family in ("dot", "gatv2"):
        assert "split backward (dst pass, src pass over the transposed CSR, all heads per program)" in \
            csr_launch.kernel_name(family)
    assert "summed per destination" in csr_launch.kernel_name("gat")
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "split")
    assert "split backward (dst pass" in csr_launch.kernel_name("gat")
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, "atomic")
    assert csr_launch.backward_variant() == "atomic"
    assert "atomic backward" in csr_launch.kernel_name("dot")


def test_other_backward_values_raise(monkeypatch):
    for value in ("split_all", "fast"):
        monkeypatch.setenv(csr_launch.BACKWARD_ENV, value)
        with pytest.raises(ValueError, match="auto, split, atomic"):
            csr_launch.backward_variant()


@runs_kernel
@pytest.mark.parametrize("name, variant", tiered(
    [("transformer", "auto"), ("transformer_dropout", "auto"), ("gatv2", "auto"), ("gat", "auto"), ("gat", "split")],
    [("gat", "split")]))
def test_packed_backward_writes_the_split_gradients_in_place(plan, name, variant, monkeypatch):
    """gnn_io::attention_backward_packed (gnn_inductor/passes/packed_grads.py): the node-row gradients land in their
    column spans of one [N, width] tensor, written there by the split passes themselves (their buffers are those
    spans: a row stride of ``width``), equal to attention_backward's; the others (GATv2's dense ``att``, GAT's
    per-head scalar terms, edge terms) are unchanged entries of the list."""
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, variant)
    score, message, roles, kinds = case_of(name)
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel(), torch.float32)]
    dropout = dropout_args(dropout_for(name, DEVICE))
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, items, MAX_EDGES,
                                                  *dropout)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    needs = [a.is_floating_point() for a in args]
    delta = torch.ops.gnn_io.attention_delta(grad, out, lse)[0]
    common = (grad, args, roles, *on_device, score, message, EPS, items, MAX_EDGES, *dropout, delta, lse, needs)
    want = torch.ops.gnn_io.attention_backward(*common)
    rows = [i for i, a in enumerate(args) if a.dim() >= 2 and a.shape[0] == NUM_NODES and needs[i]]
    offsets, width = [-1] * len(args), 0
    for i in reversed(rows):  # packed in the reverse order: offsets need not follow the arguments'
        offsets[i], width = width, width + args[i][0].numel()
    targets, real = [], csr_backward.grad_buffers

    def recording(layout, wanted, stored, device, given=None):
        targets.append(given or {})
        return real(layout, wanted, stored, device, given)
    monkeypatch.setattr(csr_backward, "grad_buffers", recording)
    packed, *got = torch.ops.gnn_io.attention_backward_packed(*common, offsets, width)
    assert packed.shape == (NUM_NODES, width) and torch.isfinite(packed).all()
    # GAT's default segment backward sums its dst-role score term per destination after the src pass (a new
    # [N, H] tensor, copied into its span); every other row gradient is written into its span by the passes
    summed = {i for i in rows if roles[i] == ROLE_DST} if name.startswith("gat") and not name.startswith("gatv2") \
        and csr_launch.backward_variant() in ("auto", "one_pass_segment") else set()
    assert targets and set(targets[0]) == set(rows) - summed, "the split passes wrote the packed spans themselves"
    for i, (g, w) in enumerate(zip(got, want)):
        if offsets[i] >= 0:
            assert g.numel() == 0
            assert_close(packed[:, offsets[i]:offsets[i] + w[0].numel()].reshape(w.shape), w, torch.float32,
                         f"packed grad of argument {i}")
        else:
            assert_close(g, w, torch.float32, f"grad of argument {i}")


def test_packed_backward_checks_its_layout(plan):
    """Offsets that overlap, run past the width, or pack an argument without a gradient are refused before any
    work (a gap between spans is allowed: tests/passes/test_packed_grads.py checks that it comes back zero)."""
    score, message, roles, kinds = case_of("transformer")
    args = make_args(kinds, plan[1].numel(), torch.float32)
    out, lse = torch.zeros(NUM_NODES, HEADS, CHANNELS), torch.zeros(NUM_NODES, HEADS)
    width = HEADS * CHANNELS

    def call(offsets, total, needs=(True, True, True)):
        return torch.ops.gnn_io.attention_backward_packed(out, args, roles, *plan[:4], score, message, EPS, [], 0,
                                                          None, 0.0, lse, lse, list(needs), offsets, total)
    with pytest.raises(ValueError, match="overlap or leave"):
        call([0, 2 * width, -1], 2 * width)
    with pytest.raises(ValueError, match="overlap or leave"):
        call([0, width - 1, -1], 2 * width)
    with pytest.raises(ValueError, match="cannot share"):
        call([0, width, -1], 2 * width, needs=(True, False, True))
    with pytest.raises(ValueError, match="pack offsets"):
        call([0, width], 2 * width)


# ---- the interpreter tier ----
