"""GAT's attention-vector projections folded into its feature GEMM (gnn_inductor/passes/score_fold.py): which sums are
folded, the folded graph computes the same values (bias and padding included), compiled GAT layers stay correct
with their gradients packed, and the switch turns it off."""
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_geometric.nn import GATConv, GATv2Conv

import gnn_inductor
from gnn_inductor.passes import score_fold
from gnn_inductor.config import SettingError
from gnn_inductor.testing import check_rewrites, random_graph
from tests.kernels.interpreter import rerun_under_interpreter

aten = torch.ops.aten
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _scores(x, weight, att_src, att_dst, bias, other):
    h = torch.nn.functional.linear(x, weight).view(-1, 3, 4)
    hb = torch.nn.functional.linear(x, weight, bias).view(-1, 3, 4)
    return (h,
            (h * att_src).sum(-1),              # folded, with the next one, into h's GEMM
            (att_dst * h).sum(dim=-1),          # operands either way round
            (hb * att_src).sum(-1),             # a GEMM with a bias: its own fold
            (h * other).sum(-1),                # a computed vector (other * 1 below): not a member
            (h * att_src).sum(-1, keepdim=True))  # keepdim: left alone


def _inputs(dtype=torch.float64):
    torch.manual_seed(0)
    return [torch.randn(9, 5, dtype=dtype), torch.randn(12, 5, dtype=dtype), torch.randn(1, 3, 4, dtype=dtype),
            torch.randn(3, 4, dtype=dtype), torch.randn(12, dtype=dtype), torch.randn(1, 3, 4, dtype=dtype)]


def _traced(inputs):
    return make_fx(lambda x, w, a, b, bias, o: _scores(x, w, a, b, bias, o * 1), tracing_mode="fake")(*inputs)


@pytest.mark.parametrize("setting, columns", [("auto", [3]), ("1", [32, 3]), ("tight", [18, 3])])
def test_folds_the_matched_sums_and_keeps_the_values(setting, columns, monkeypatch):
    """``hb`` is read by one product alone: its GEMM keeps only the 3 score columns (every setting). ``h`` is
    returned too: its GEMM gains the two projections' 6 columns (padded to 32 under ``1``), not under ``auto``."""
    monkeypatch.setenv(score_fold.ENV, setting)
    inputs = _inputs()
    gm = _traced(inputs)
    expected = _scores(*inputs[:5], inputs[5] * 1)
    folded = score_fold.fold_score_projections(gm, gnn_inductor.config.snapshot())
    assert sorted(f["columns"] for f in folded) == sorted(columns)
    assert sorted(len(f["vectors"]) for f in folded) == ([1] if setting == "auto" else [1, 2])
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList and n.args[0].target is aten.mul.Tensor
            and tuple(n.meta["val"].shape) in ((9, 3), (9, 3, 1))]
    assert len(sums) == (4 if setting == "auto" else 2)  # the computed vector's and the keepdim one stay
    matmuls = [n for n in gm.graph.nodes if n.target in (aten.mm.default, aten.addmm.default)]
    assert len(matmuls) == 2 and any(tuple(n.meta["val"].shape) == (9, 3) for n in matmuls)
    for got, want in zip(gm(*inputs), expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_switched_off_not_for_half_precision_and_a_bad_setting(monkeypatch):
    monkeypatch.delenv(score_fold.ENV, raising=False)
    assert gnn_inductor.config.snapshot()["score_fold"] == "epilogue"  # the default: gnn_io::linear_scores where its kernel runs
    # ... which on the CPU without the interpreter is nowhere: the graph keeps its reductions
    assert score_fold.fold_score_projections(_traced(_inputs()), gnn_inductor.config.snapshot()) == []
    monkeypatch.setenv(score_fold.ENV, "0")
    assert score_fold.fold_score_projections(_traced(_inputs()), gnn_inductor.config.snapshot()) == []
    monkeypatch.setenv(score_fold.ENV, "1")
    assert score_fold.fold_score_projections(_traced(_inputs(torch.bfloat16)), gnn_inductor.config.snapshot()) == []
    monkeypatch.setenv(score_fold.ENV, "yes")
    with pytest.raises(SettingError, match=score_fold.ENV):
        gnn_inductor.config.snapshot()


@pytest.mark.parametrize("heads, channels, concat", [(1, 8, True), (4, 8, True), (3, 5, False)])
def test_gat_conv_folds_its_scores_and_packs_their_gradients(heads, channels, concat, monkeypatch):
    """Compiled GATConv: both projections are columns of the feature GEMM, its backward's attention gradients are
    one packed gradient (the zero columns included), and outputs and every gradient match eager PyG."""
    monkeypatch.setenv(score_fold.ENV, "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    model = GATConv(12, channels, heads=heads, concat=concat)
    result = check_rewrites(model, torch.randn(40, 12), random_graph(40, 200, hub_degree=30),
                            expect={"attention": 1, "score_projection": 1})
    fold = next(r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "score_projection")
    assert fold["details"]["vectors"] == ["att_src", "att_dst"]
    assert fold["details"]["columns"] % score_fold.COLUMN_MULTIPLE == 0
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1


@pytest.mark.parametrize("setting", ["auto", "0"])
def test_gat_conv_edge_features_make_only_their_scores(setting, monkeypatch):
    """GATConv's edge features are projected only to be reduced against ``att_edge``: under ``auto`` their GEMM
    makes the ``[E, H]`` scores alone (no ``[E, H C]`` tensor), and the node features' GEMM is left as it is;
    outputs and every gradient (``lin_edge``'s and ``att_edge``'s included) match eager PyG."""
    monkeypatch.setenv(score_fold.ENV, setting)
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    edge_attr = torch.randn(edge_index.shape[1], 6)
    model = GATConv(12, 8, heads=4, edge_dim=6)
    result = check_rewrites(model, torch.randn(40, 12), edge_index, edge_attr,
                            expect={"attention": 1, "score_projection": int(setting == "auto")})
    folds = [r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "score_projection"]
    assert [(f["details"]["weight"], f["details"]["columns"], f["details"]["scores_only"]) for f in folds] == \
        ([("lin_edge.weight", 4, True)] if setting == "auto" else [])


def test_gat_conv_with_the_fold_off_and_gatv2_without_projections(monkeypatch):
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    monkeypatch.setenv(score_fold.ENV, "auto")  # the node features are read by the message: not folded
    gat = GATConv(12, 8, heads=2)
    check_rewrites(gat, torch.randn(40, 12), edge_index, expect={"attention": 1, "score_projection": 0})
    assert not any(r.packed_grads for r in gnn_inductor.rewrite_report.reports(gat))
    monkeypatch.setenv(score_fold.ENV, "1")
    check_rewrites(GATv2Conv(12, 8, heads=2), torch.randn(40, 12), edge_index,
                   expect={"attention": 1, "score_projection": 0})


@pytest.mark.skipif(not INTERPRETED, reason="the kernel path on CPU: run by test_kernels_under_interpreter")
@pytest.mark.parametrize("setting, edge_dim", [("1", None), ("tight", None), ("auto", 6)])
def test_compiled_gat_reads_strided_scores_with_the_kernels(setting, edge_dim, monkeypatch):
    """Under Triton's interpreter the fused kernels read the features and both score columns from the folded
    GEMM's output (row stride 48 or 40, not 32) and write the packed gradient, or (``auto``, edge features) read
    the edge scores the edge GEMM makes alone; outputs and every gradient match eager PyG."""
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(score_fold.ENV, setting)
    torch.manual_seed(0)
    model = GATConv(12, 8, heads=4, edge_dim=edge_dim)
    edge_index = random_graph(60, 400, seed=1, hub_degree=40)
    x, grad = torch.randn(60, 12, requires_grad=True), torch.randn(60, 32)
    extra = (torch.randn(edge_index.shape[1], edge_dim),) if edge_dim else ()
    model(x, edge_index, *extra).backward(grad)
    want = [model(x, edge_index, *extra).detach(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        out = torch.compile(model, backend="gnn_io")(x, edge_index, *extra)
        out.backward(grad)
    reports = gnn_inductor.rewrite_report.reports(model)
    folds = [w for r in reports for w in r.rewrites if w.pattern == "score_projection"]
    assert len(folds) == 1 and sum(r.packed_grads for r in reports) == int(setting != "auto")
    for got, expected in zip([out, x.grad] + [p.grad for p in model.parameters()], want):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not INTERPRETED, reason="the kernel path on CPU: run by test_kernels_under_interpreter")
@pytest.mark.parametrize("setting", ["1", "tight"])
def test_compiled_gat_with_edge_features_needing_grads_with_the_kernels(setting, monkeypatch):
    """tests/gpu/test_attention_cuda.py's fold test, interpreted: GATConv with edge features that need a gradient
    (``check_rewrites`` makes them leaves), both score projections folded, against eager PyG. Its edge features
    are masked apart from the edge index (two unbacked sizes at tracing); it was found failing to compile
    on CUDA alone."""
    from gnn_inductor.testing import check_rewrites

    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(score_fold.ENV, setting)
    torch.manual_seed(0)
    model = GATConv(12, 8, heads=4, edge_dim=5)
    edge_index = random_graph(60, 400, seed=1, hub_degree=40)
    check_rewrites(model, torch.randn(60, 12), edge_index, torch.randn(edge_index.shape[1], 5), calls=1,
                   expect={"attention": 1, "score_projection": 2, "near_miss": 0})
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1


@pytest.mark.skipif(INTERPRETED, reason="the interpreter run itself")
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__, select="with_the_kernels")
