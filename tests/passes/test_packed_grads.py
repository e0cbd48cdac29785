"""Attention gradients written into a fused linear map's packed gradient (gnn_inductor/passes/packed_grads.py): where the
pass applies, the compiled layer stays correct (outputs and every gradient against eager PyG), the report says so,
and the switch turns it off. The pattern matcher is also checked on a traced backward-like graph."""
import operator

import pytest
import torch
from torch_geometric.nn import GATConv, TransformerConv

import gnn_inductor
from gnn_inductor.passes import packed_grads
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import INTERPRETED, tiered



@pytest.mark.parametrize("heads", tiered([1, 4], [4]))
def test_transformer_conv_packs_query_key_value_gradients(heads, monkeypatch):
    """TransformerConv's query, key and value maps run as one GEMM (gnn_inductor/passes/linear_fusion.py); its backward's
    three attention gradients become the packed gradient the op returns, with no concatenation left. Strict: a
    graph Inductor failed to compile would run op by op, unpacked."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=heads)
    check_rewrites(model, torch.randn(40, 12), random_graph(40, 200, hub_degree=30), expect={})
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1
    assert "packed gradient" in gnn_inductor.rewrite_report.format_text(model)


def test_switch_off_and_layers_without_the_pattern(monkeypatch):
    """``GNN_IO_PACKED_GRADS=0`` keeps the concatenation (same values); GATConv without its score fold
    (gnn_inductor/passes/score_fold.py), whose one linear map then feeds the attention once, has nothing to pack; a bad
    value of the switch is an error."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(packed_grads.ENV, "0")
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=2)
    check_rewrites(model, torch.randn(40, 12), random_graph(40, 200, hub_degree=30), expect={})
    assert not any(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model))
    monkeypatch.setenv(packed_grads.ENV, "1")
    monkeypatch.setenv("GNN_IO_SCORE_FOLD", "0")
    gat = GATConv(12, 8, heads=2)
    check_rewrites(gat, torch.randn(40, 12), random_graph(40, 200, hub_degree=30), expect={})
    assert not any(r.packed_grads for r in gnn_inductor.rewrite_report.reports(gat))
    monkeypatch.setenv(packed_grads.ENV, "yes")
    with pytest.raises(ValueError, match=packed_grads.ENV):
        gnn_inductor.config.snapshot()


def _backward_like(spans, base_width, extra_term=False, second_reader=False):
    """An FX graph shaped like AOTAutograd's TransformerConv backward: gnn_io::attention_backward's gradients
    viewed to 2-D and slice-scattered into one zero [N, base_width] tensor, summed, then read by a GEMM."""
    graph = torch.fx.Graph()
    grad = graph.placeholder("grad")
    args = [graph.placeholder(f"a{i}") for i in range(len(spans))]
    op = graph.call_function(torch.ops.gnn_io.attention_backward.default,
                             (grad, args, [0] * len(args), *[None] * 4, "s", "m", 1e-16, [], 0, None, 0.0, grad, grad,
                              [True] * len(args)))
    full = graph.call_function(torch.ops.aten.full.default, ([10, base_width], 0))
    total = None
    for k, (start, end) in enumerate(spans):
        item = graph.call_function(operator.getitem, (op, k))
        item.meta["val"] = torch.empty(10, 2, (end - start) // 2)
        flat = graph.call_function(torch.ops.aten.view.default, (item, [10, end - start]))
        scatter = graph.call_function(torch.ops.aten.slice_scatter.default, (full, flat, 1, start, end))
        total = scatter if total is None else graph.call_function(torch.ops.aten.add.Tensor, (total, scatter))
        if second_reader and k == 0:
            graph.call_function(torch.ops.aten.neg.default, (item,))
    if extra_term:
        total = graph.call_function(torch.ops.aten.add.Tensor, (total, full))
    full.meta["val"] = torch.empty(10, base_width)
    total.meta["val"] = torch.empty(10, base_width)
    graph.output(graph.call_function(torch.ops.aten.mm.default, (total, grad)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_matcher_packs_only_disjoint_spans():
    """The rewrite needs slice-scatters whose spans do not overlap (columns between them stay the zero base's),
    summed with nothing else, each gradient read by its scatter alone; then the concatenation is gone and the GEMM
    reads the packed output."""
    gm = _backward_like([(8, 12), (0, 4), (4, 8)], 12)
    assert packed_grads.pack(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.gnn_io.attention_backward_packed.default in targets
    assert torch.ops.aten.slice_scatter.default not in targets and torch.ops.aten.add.Tensor not in targets
    assert torch.ops.gnn_io.attention_backward.default not in targets
    call = next(n for n in gm.graph.nodes if n.target is torch.ops.gnn_io.attention_backward_packed.default)
    assert call.args[-2:] == ([8, 0, 4], 12)  # argument k at the start of its span
    gapped = _backward_like([(0, 4), (8, 12)], 16)  # columns 4..8 and 12..16: only the zero base's
    assert packed_grads.pack(gapped) == 1
    call = next(n for n in gapped.graph.nodes if n.target is torch.ops.gnn_io.attention_backward_packed.default)
    assert call.args[-2:] == ([0, 8], 16)
    for spans, width, extra, second in [([(0, 4), (2, 6)], 8, False, False),    # overlapping spans
                                        ([(0, 4), (4, 8)], 8, True, False),     # another term in the sum
                                        ([(0, 4), (4, 8)], 8, False, True)]:    # a gradient read elsewhere too
        assert packed_grads.pack(_backward_like(spans, width, extra, second)) == 0


@pytest.fixture
def output_shape_ops():
    """Dynamo captures data-dependent output shapes, as the backend sets it. ``config.patch``, not
    ``monkeypatch.setattr``: that one reads the attribute of Dynamo's config module as unset, deletes it at its undo,
    and the next test of the process then fails on the missing setting."""
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        yield


# a minute under the interpreter: --slow (the packed backward kernel's own test stays in the default tier)
@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
def test_compiled_layer_writes_packed_gradients_with_the_kernels(monkeypatch, output_shape_ops):
    """Under Triton's interpreter the compiled TransformerConv runs the fused kernels end to end, and the split
    passes write the query, key and value gradients into the packed gradient themselves; outputs and every
    gradient match eager PyG (the key map's bias gets a gradient of zero up to rounding: a constant added to every
    key of a destination leaves its softmax unchanged, hence the absolute tolerance)."""
    from gnn_inductor.kernels.attention import csr_backward

    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    written, real = [], csr_backward.grad_buffers

    def recording(layout, wanted, stored, device, targets=None):
        written.append(sorted(targets or {}))
        return real(layout, wanted, stored, device, targets)
    monkeypatch.setattr(csr_backward, "grad_buffers", recording)
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=4)
    _compiled_matches_eager(model, random_graph(60, 400, seed=1, hub_degree=40))
    assert written == [[0, 1, 2]], written


def _compiled_matches_eager(model, edge_index, tf32: bool = False) -> None:
    """One forward+backward of ``model`` eager, then compiled with gnn_io (TF32 allowed during it with ``tf32``):
    the input's and every parameter's gradient agree."""
    num_nodes = int(edge_index.max()) + 1
    x, grad = torch.randn(num_nodes, 12, requires_grad=True), torch.randn(num_nodes, 32)
    model(x, edge_index).backward(grad)
    want = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32 or before
    try:
        torch.compile(model, backend="gnn_io")(x, edge_index).backward(grad)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    for got, expected in zip([x.grad] + [p.grad for p in model.parameters()], want):
        torch.testing.assert_close(got, expected, **tolerance(torch.float32, "layer"))


@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
def test_compiled_layer_writes_packed_gradients_with_the_kernels_on_the_block_path(monkeypatch, output_shape_ops):
    """The same on the block-sparse path (TF32 allowed, the path forced, a graph of dense communities whose every
    row window goes to Tensor Cores): the block kernels store the query, key and value gradients into the packed
    gradient (no copy after them; three such copies measured at 1.1 ms of a 10 ms step), and outputs
    and gradients match eager PyG."""
    from gnn_inductor.kernels.attention import block_dot as block_sparse

    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv("GNN_IO_ATTENTION_PATH", "block")
    stored, real = [], block_sparse._packed_place

    def recording(layout, indices, shape, full, pack):
        place = real(layout, indices, shape, full, pack)
        stored.append(bool(pack) and place is pack.get(indices[0]))
        return place
    monkeypatch.setattr(block_sparse, "_packed_place", recording)
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=4)
    community = torch.arange(16)
    pairs = torch.cartesian_prod(community, community)
    edge_index = torch.cat([(pairs + 16 * c).t() for c in range(3)], 1)  # three complete graphs of 16, loops too
    _compiled_matches_eager(model, edge_index, tf32=True)
    assert stored == [True, True, True], stored
    assert "attention path (dot, tf32): block," in gnn_inductor.rewrite_report.format_text(model)


def _gat_score(a0, a1, a2):
    return torch.ops.aten.leaky_relu.default(torch.ops.aten.add.Tensor(a1, a2), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return torch.ops.aten.mul.Tensor(torch.ops.aten.unsqueeze.default(alpha, -1), a0)


def test_packed_op_zeroes_the_columns_between_spans(monkeypatch):
    """The packed gradient is allocated uninitialised; the columns no argument's gradient fills (the score fold's
    zero columns) must come back 0, not what the allocation held (poisoned with NaN here), and the packed
    columns equal the unpacked backward's gradients."""
    from gnn_inductor.kernels.runtime import edge_functions

    torch.manual_seed(0)
    edge_index = random_graph(20, 80, hub_degree=10)
    rowptr, col, row, perm = torch.ops.gnn_io.csr_plan(edge_index[1], edge_index[0], 20, 20)[:4]
    score = edge_functions.register(torch.fx.symbolic_trace(_gat_score))
    message = edge_functions.register(torch.fx.symbolic_trace(_gat_message))
    args, roles = [torch.randn(20, 2, 3), torch.randn(20, 2), torch.randn(20, 2)], [0, 0, 1]
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, rowptr, col, row, perm, score, message, 1e-16, [], 0)
    grad_out = torch.randn_like(out)
    delta = torch.ops.gnn_io.attention_delta(grad_out, out, lse)[0]
    common = (grad_out, args, roles, rowptr, col, row, perm, score, message, 1e-16, [], 0, None, 0.0, delta, lse,
              [True, True, True])
    want = torch.ops.gnn_io.attention_backward(*common)
    real_empty = torch.empty

    def poisoned(*size, **kwargs):
        return real_empty(*size, **kwargs).fill_(float("nan"))
    monkeypatch.setattr(torch, "empty", poisoned)
    packed = torch.ops.gnn_io.attention_backward_packed(*common, [0, 8, 16], 24)[0]
    monkeypatch.setattr(torch, "empty", real_empty)
    assert torch.equal(packed[:, 6:8], torch.zeros(20, 2)) and torch.equal(packed[:, 10:16], torch.zeros(20, 6))
    assert torch.equal(packed[:, 18:], torch.zeros(20, 6))
    torch.testing.assert_close(packed[:, :6], want[0].reshape(20, 6))
    torch.testing.assert_close(packed[:, 8:10], want[1])
    torch.testing.assert_close(packed[:, 16:18], want[2])
    with pytest.raises(ValueError, match="overlap"):
        torch.ops.gnn_io.attention_backward_packed(*common, [0, 4, 16], 24)
