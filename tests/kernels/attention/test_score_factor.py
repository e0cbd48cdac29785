"""The dot family's per-edge score factor (kernels/attention/forms.py): ``s = scale * f[e, h] * sum_c q k``, PyG's
HGTConv score with its relation prior, and HGTConv's message flattened to ``[E, H * C]``.

Recognition runs everywhere. Kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's
interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``): the op's output and the gradients
of the query, key, value and factor against the float64 reference of gnn_io::attention, on a graph with a
destination hub and a source hub split into several work items, isolated nodes, self loops and duplicate edges,
and on an empty edge set; the factor of each per-edge role and shape, both forward and both backward kernels.
"""
import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import csr_atomic_backward, csr_backward, csr_launch, dispatch
from gnn_inductor.kernels.attention import forms as attention_forms
from gnn_inductor.kernels.attention import layout as attention_layout
from gnn_inductor.kernels.attention import selector as attention_paths
from gnn_inductor.kernels.attention.op import attention_reference, kernel_name
from gnn_inductor.kernels.runtime import edge_functions, rng
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.testing import random_graph
from tests.kernels.attention.cases import CASES, EPS, assert_close, grads_of
from tests.tiers import KERNEL_DEVICE as DEVICE, runs_kernel, tiered

NUM_NODES, HEADS, CHANNELS = 24, 2, 4
MAX_EDGES = 8  # below both hubs' degrees: each spans several work items
SOURCE_HUB, SOURCE_HUB_DEGREE = 1, 20
aten = torch.ops.aten


def _register(f):
    return edge_functions.register(torch.fx.symbolic_trace(f))


# HGTConv's edge functions as the backend cuts them from PyG 2.8 (arguments: v_j src, q_i dst, k_j src, p_rel edge)
def _hgt_score(a0, a1, a2, a3):
    return aten.div.Tensor(aten.mul.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), a3), 2.0)


def _message(heads, channels, flat):
    def message(alpha, a0, a1, a2, a3):
        weighted = aten.mul.Tensor(a0, aten.view.default(alpha, [-1, heads, 1]))
        return aten.view.default(weighted, [-1, heads * channels]) if flat else weighted
    return message


# the factor first, a scale inside it, and a key with an edge term (TransformerConv's k_j + e_ij)
def _factor_first_score(a0, a1, a2, a3):
    return aten.mul.Tensor(a3, aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0))


def _edge_key_score(a0, a1, a2, a3, a4):
    keys = aten.add.Tensor(a2, a4)
    return aten.div.Tensor(aten.mul.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, keys), [-1]), a3), 2.0)


def _edge_key_message(heads):
    def message(alpha, a0, a1, a2, a3, a4):
        return aten.mul.Tensor(aten.add.Tensor(a0, a4), aten.view.default(alpha, [-1, heads, 1]))
    return message


# ---- recognition (everywhere) ----

def test_hgt_score_is_the_dot_family_with_a_factor():
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_EDGE]
    form = attention_forms.recognise(_register(_hgt_score), _register(_message(HEADS, CHANNELS, True)), roles)
    assert form == attention_forms.AttentionForm(
        family="dot", score_terms=(2,), query=1, negative_slope=0.0, score_scale=0.5, value_terms=(0,),
        message_scale=1.0, score_factor=3, message_width=HEADS * CHANNELS)
    unflattened = attention_forms.recognise(_register(_hgt_score), _register(_message(HEADS, CHANNELS, False)), roles)
    assert unflattened.score_factor == 3 and unflattened.message_width is None
    first = attention_forms.recognise(_register(_factor_first_score), _register(_message(HEADS, CHANNELS, False)),
                                      roles)
    assert (first.family, first.score_factor, first.query, first.score_terms, first.score_scale) == \
        ("dot", 3, 1, (2,), 0.5)


def test_a_factor_outside_the_dot_family_or_dense_is_not_recognised():
    message = _register(_message(HEADS, CHANNELS, False))
    gat = _register(lambda a0, a1, a2, a3: aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2), a3))
    reason = attention_forms.recognise(gat, message, [ROLE_SRC, ROLE_SRC, ROLE_DST, ROLE_EDGE])
    assert isinstance(reason, str) and "factor" in reason
    dense = attention_forms.recognise(_register(_hgt_score), message, [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_DENSE])
    assert dense == "score factor is dense"


@pytest.mark.parametrize("name", list(CASES))
def test_existing_forms_have_no_factor_and_unflattened_messages(name):
    score_fn, message_fn, family, kinds = CASES[name]
    form = attention_forms.recognise(_register(score_fn), _register(message_fn), [role for role, _ in kinds])
    assert form.family == family and form.score_factor is None and form.message_width is None


def test_a_flattened_message_of_other_width_runs_the_reference():
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_EDGE]
    score, message = _register(_hgt_score), _register(_message(HEADS, CHANNELS + 1, True))
    args = [torch.randn(NUM_NODES, HEADS, CHANNELS) for _ in range(3)] + [torch.randn(5, HEADS)]
    reason = attention_layout.prepare(args, roles, torch.arange(5), score, message)
    assert isinstance(reason, str) and "flattened" in reason


def test_the_block_sparse_kernel_declines_a_factor():
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_SRC]
    score, message = _register(_hgt_score), _register(_message(HEADS, CHANNELS, False))
    args = [torch.randn(NUM_NODES, HEADS, CHANNELS) for _ in range(3)] + [torch.randn(NUM_NODES, HEADS)]
    layout = attention_layout.prepare(args, roles, torch.arange(5), score, message)
    assert "score factor" in attention_paths.block_sparse.dot_form_reason(layout)


def test_report_names_the_csr_kernels_for_a_factor():
    details = {"roles": ["src", "dst", "src", "edge"], "score": _register(_hgt_score),
               "message": _register(_message(HEADS, CHANNELS, True))}
    name = kernel_name("cuda", details)
    assert name.startswith(csr_launch.kernel_name("dot")) and "score factor" in name
    assert attention_paths.kernel_name() not in name


# ---- the kernels (CUDA, or the interpreter on CPU) ----

@pytest.fixture(scope="module")
def plan():
    """CSR plan of a graph with node 0 receiving 30 extra edges and node 1 sending 20, isolated nodes (the last 3),
    self loops and duplicate edges."""
    src, dst = random_graph(NUM_NODES, 50, seed=3, hub_degree=30, num_isolated=3)
    hub_targets = torch.randint(0, NUM_NODES - 3, (SOURCE_HUB_DEGREE,), generator=torch.Generator().manual_seed(5))
    src = torch.cat([src, torch.full((SOURCE_HUB_DEGREE,), SOURCE_HUB)])
    dst = torch.cat([dst, hub_targets])
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    assert plan[0].diff().max() > 3 * MAX_EDGES and plan[4].diff().max() > 2 * MAX_EDGES
    return plan


@pytest.fixture(scope="module")
def empty_plan():
    edges = torch.empty((2, 0), dtype=torch.int64)
    return torch.ops.gnn_io.csr_plan(edges[1], edges[0], NUM_NODES, NUM_NODES)


# per head, or one factor for every head (broadcast over the heads: its gradient summed over them)
FACTOR_SHAPES = {"EH": lambda rows: (rows, HEADS), "E1": lambda rows: (rows, 1)}


def _case_args(num_edges, factor_role, factor_shape, edge_key, dtype):
    generator = torch.Generator().manual_seed(0)
    vectors = [torch.randn(NUM_NODES, HEADS, CHANNELS, generator=generator) for _ in range(3)]  # v, q, k
    rows = num_edges if factor_role == ROLE_EDGE else NUM_NODES
    factor = torch.rand(FACTOR_SHAPES[factor_shape](rows), generator=generator) * 2 - 0.5  # both signs
    args = vectors + [factor]
    if edge_key:
        args.append(torch.randn(num_edges, HEADS, CHANNELS, generator=generator))
    return [a.to(dtype) for a in args]


def check_factor(plan, factor_role=ROLE_EDGE, factor_shape="EH", flat=True, edge_key=False, dtype=torch.float32,
                 needs=None, dropout=False, fused=True):
    """Output and every gradient asked (``needs``: per argument, default all) of gnn_io::attention on DEVICE
    against the float64 reference; ``fused``: the kernels' layout must accept the case."""
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, factor_role] + ([ROLE_EDGE] if edge_key else [])
    score = _register(_edge_key_score if edge_key else _hgt_score)
    message = _register(_edge_key_message(HEADS) if edge_key else _message(HEADS, CHANNELS, flat))
    rowptr, col, row, perm = plan[:4]
    args = _case_args(col.numel(), factor_role, factor_shape, edge_key, dtype)
    layout = attention_layout.prepare(args, roles, perm, score, message)
    assert isinstance(layout, str) != fused, layout
    needs = needs or [True] * len(args)
    width = (HEADS * CHANNELS,) if flat and not edge_key else (HEADS, CHANNELS)
    grad = torch.randn(NUM_NODES, *width, generator=torch.Generator().manual_seed(7))
    seed = torch.tensor(1234567)
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    extra = (seed.to(DEVICE), 0.3) if dropout else ()
    out, grads = _grads(lambda a: torch.ops.gnn_io.attention(a, roles, *on_device, score, message, EPS, items,
                                                             MAX_EDGES, *extra),
                        [a.to(DEVICE) for a in args], needs, grad.to(DEVICE))
    reference_dropout = rng.Dropout(seed, 0.3) if dropout else None
    ref, ref_grads = _grads(lambda a: attention_reference(a, roles, *plan[:4], score, message, EPS, reference_dropout),
                            [a.double() for a in args], needs, grad.double())
    assert out.shape == ref.shape and out.dtype == dtype
    assert_close(out, ref, dtype, "output")
    assert not out[-3:].any(), "isolated nodes must get 0"
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if not needs[i]:
            assert g is None, f"argument {i} got a gradient it did not ask for"
            continue
        assert g is not None and g.shape == args[i].shape and g.dtype == dtype, f"grad of argument {i}"
        assert_close(g, r, dtype, f"grad of argument {i}")


def _grads(fn, args, needs, grad):
    leaves = [a.detach().clone().requires_grad_(need) for a, need in zip(args, needs)]
    out = fn(leaves)
    out.backward(grad.to(out.dtype))
    return out.detach(), [leaf.grad for leaf in leaves]


def _recording_atomic_backward(monkeypatch) -> list:
    """A list that gets an entry at each launch of the atomic backward."""
    launched = []
    real = csr_atomic_backward.atomic_backward

    def recording(*args, **kwargs):
        launched.append(True)
        return real(*args, **kwargs)
    monkeypatch.setattr(csr_backward, "atomic_backward", recording)
    return launched


@runs_kernel
@pytest.mark.parametrize("factor_shape, flat", tiered([(shape, flat) for shape in FACTOR_SHAPES for flat in (True, False)],
                                                      keep=[("EH", True)]))
def test_edge_factor_matches_reference(plan, factor_shape, flat, monkeypatch):
    """The default kernels (all-heads forward, split backward: the edge-role factor's gradient stored by edge id in
    the dst pass, no atomic backward)."""
    launched = _recording_atomic_backward(monkeypatch)
    check_factor(plan, factor_shape=factor_shape, flat=flat)
    assert not launched


@runs_kernel
@pytest.mark.parametrize("factor_role", tiered([pytest.param(ROLE_SRC, id="src"), pytest.param(ROLE_DST, id="dst")],
                                                keep=[(ROLE_SRC,)]))
def test_node_factor_runs_the_atomic_backward(plan, factor_role, monkeypatch):
    """A src- or dst-role factor's gradient is summed by atomics (the split backward stores edge-role ones only):
    the atomic backward runs, and a gradient of the other arguments alone takes the split one."""
    launched = _recording_atomic_backward(monkeypatch)
    check_factor(plan, factor_role=factor_role)
    assert launched
    launched.clear()
    check_factor(plan, factor_role=factor_role, needs=[True, True, True, False])
    assert not launched


@runs_kernel
@pytest.mark.parametrize("backward, heads_variant", tiered([(b, h) for b in ("split", "atomic") for h in ("all", "per_head")],
                                                          keep=[("split", "per_head")]))
def test_forward_and_backward_variants(plan, backward, heads_variant, monkeypatch):
    monkeypatch.setenv(csr_launch.BACKWARD_ENV, backward)
    monkeypatch.setenv(csr_launch.HEADS_ENV, heads_variant)
    check_factor(plan)


@runs_kernel
@pytest.mark.parametrize("needs", tiered([pytest.param([False, False, False, True], id="factor_only"),
                                          pytest.param([True, True, True, False], id="no_factor"),
                                          pytest.param([False, True, False, True], id="query_and_factor")],
                                         keep=[([False, False, False, True],)]))
def test_gradients_asked_in_part(plan, needs):
    """Only the factor (the dst pass runs for it alone), everything but the factor, the query and the factor."""
    check_factor(plan, needs=needs)


@runs_kernel
@pytest.mark.slow
def test_factor_with_an_edge_key_term(plan):
    check_factor(plan, edge_key=True)


@runs_kernel
@pytest.mark.slow
def test_factor_with_attention_dropout(plan):
    check_factor(plan, dropout=True)


@runs_kernel
def test_factor_in_half_precision(plan):
    check_factor(plan, dtype=torch.bfloat16)


@runs_kernel
def test_empty_edge_set(empty_plan):
    """No edges: zeros out, zero gradients of the node arguments, an empty factor gradient."""
    check_factor(empty_plan)


@runs_kernel
def test_opcheck_with_a_factor_and_a_flattened_message(plan):
    """The fake implementation's shapes (the output in the message's ``[N, H * C]``) are the kernels'."""
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_EDGE]
    score, message = _register(_hgt_score), _register(_message(HEADS, CHANNELS, True))
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    args = [a.to(DEVICE).requires_grad_(True)
            for a in _case_args(plan[1].numel(), ROLE_EDGE, "EH", False, torch.float32)]
    torch.library.opcheck(torch.ops.gnn_io.attention_forward.default,
                          (args, roles, *on_device, score, message, EPS, items, MAX_EDGES),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@runs_kernel
def test_factor_through_the_projected_backward_by_blocks(plan, monkeypatch):
    """The chunked split backward (gnn_io::attention_backward_projected, 1 KiB blocks): the edge-role factor's
    gradient, not packed, summed over the blocks' dst passes, as the whole backward gives it."""
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "1")
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC, ROLE_EDGE]
    score, message = _register(_hgt_score), _register(_message(HEADS, CHANNELS, True))
    on_device = [t.to(DEVICE) for t in plan[:4]]
    items = list(torch.ops.gnn_io.work_items(on_device[0], on_device[1], MAX_EDGES))
    args = [a.to(DEVICE) for a in _case_args(plan[1].numel(), ROLE_EDGE, "EH", False, torch.float32)]
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, *on_device, score, message, EPS, items, MAX_EDGES)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    delta = torch.ops.gnn_io.attention_delta(grad_out, out, lse)[0]
    common = (grad_out, args, roles, *on_device, score, message, EPS, items, MAX_EDGES, None, 0.0, delta, lse,
              [True] * 4)
    offsets, width = [0, 2 * HEADS * CHANNELS, HEADS * CHANNELS, -1], 3 * HEADS * CHANNELS
    assert len(dispatch.projection_blocks(NUM_NODES, width, torch.float32)) > 2
    ran = []
    real = dispatch.csr_chunked.backward_chunked

    def recording(*a, **kwargs):
        result = real(*a, **kwargs)
        ran.append(result is not None)
        return result
    monkeypatch.setattr(dispatch.csr_chunked, "backward_chunked", recording)
    weight = torch.randn(width, 5, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    projected = torch.ops.gnn_io.attention_backward_projected(*common, offsets, width, None, weight, -1)
    assert ran == [True]
    packed, *grads = torch.ops.gnn_io.attention_backward_packed(*common, offsets, width)
    assert_close(projected[0], (packed.double() @ weight.double()).cpu(), torch.float32, "input gradient")
    assert_close(projected[3 + 3], grads[3].double().cpu(), torch.float32, "factor gradient")
