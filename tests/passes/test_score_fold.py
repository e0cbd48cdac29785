"""GAT's attention-vector projections made with their feature GEMM (gnn_inductor/passes/score_fold.py): which sums
are matched, the rewritten graph computes the same values, a compiled GAT layer with edge features stays correct,
and the switch turns it off. tests/kernels/attention/test_head_scores.py checks the op itself and GATConv compiled with it."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_geometric.nn import GATConv, GATv2Conv

import gnn_inductor
from gnn_inductor.kernels.attention import head_scores
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.passes import score_fold
from gnn_inductor.config import SettingError
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import INTERPRETED

aten = torch.ops.aten


def _scores(x, weight, att_src, att_dst, bias, other):
    h = torch.nn.functional.linear(x, weight).view(-1, 3, 4)
    hb = torch.nn.functional.linear(x, weight, bias).view(-1, 3, 4)
    return (h,
            (h * att_src).sum(-1),              # folded, with the next one, into h's GEMM
            (att_dst * h).sum(dim=-1),          # operands either way round
            (hb * att_src).sum(-1),             # a GEMM read by this sum alone: left as it is
            (h * other).sum(-1),                # a computed vector (other * 1 below): not a member
            (h * att_src).sum(-1, keepdim=True))  # keepdim: left alone


def _inputs(dtype=torch.float64):
    torch.manual_seed(0)
    return [torch.randn(9, 5, dtype=dtype), torch.randn(12, 5, dtype=dtype), torch.randn(1, 3, 4, dtype=dtype),
            torch.randn(3, 4, dtype=dtype), torch.randn(12, dtype=dtype), torch.randn(1, 3, 4, dtype=dtype)]


def _traced(inputs):
    return make_fx(lambda x, w, a, b, bias, o: _scores(x, w, a, b, bias, o * 1), tracing_mode="fake")(*inputs)


def test_makes_the_matched_sums_with_their_gemm_and_keeps_the_values(monkeypatch):
    """``h`` is returned too: its GEMM and the two projections become one ``linear_scores`` call. ``hb`` is read by
    one product alone: its GEMM is left as it is, as are the computed vector's and the keepdim sums. The kernel's
    sizes are stood in for (its ATen path computes the float64 values)."""
    monkeypatch.setenv(score_fold.ENV, "1")
    monkeypatch.setattr(score_fold, "_epilogue_takes", lambda matrix, sums: True)
    inputs = _inputs()
    gm = _traced(inputs)
    expected = _scores(*inputs[:5], inputs[5] * 1)
    folded = score_fold.fold_score_projections(gm, gnn_inductor.config.snapshot())
    assert [(f["columns"], len(f["vectors"])) for f in folded] == [(12, 2)]
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList and n.args[0].target is aten.mul.Tensor
            and tuple(n.meta["val"].shape) in ((9, 3), (9, 3, 1))]
    assert len(sums) == 3  # hb's, the computed vector's and the keepdim one stay
    assert sum(n.target is head_scores.linear_scores._opoverload for n in gm.graph.nodes) == 1
    for got, want in zip(gm(*inputs), expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, **tolerance(torch.float64, "reassociated"))


def test_switched_off_not_for_half_precision_and_a_bad_setting(monkeypatch):
    monkeypatch.delenv(score_fold.ENV, raising=False)
    assert gnn_inductor.config.snapshot()["score_fold"] is True  # gnn_io::linear_scores where its kernel runs
    # ... which on the CPU without the interpreter is nowhere: the graph keeps its reductions
    assert score_fold.fold_score_projections(_traced(_inputs()), gnn_inductor.config.snapshot()) == []
    monkeypatch.setenv(score_fold.ENV, "0")
    assert score_fold.fold_score_projections(_traced(_inputs()), gnn_inductor.config.snapshot()) == []
    monkeypatch.setenv(score_fold.ENV, "1")
    assert score_fold.fold_score_projections(_traced(_inputs(torch.bfloat16)), gnn_inductor.config.snapshot()) == []
    for bad in ("yes", "epilogue"):
        monkeypatch.setenv(score_fold.ENV, bad)
        with pytest.raises(SettingError, match=score_fold.ENV):
            gnn_inductor.config.snapshot()


def test_gat_conv_with_the_fold_off_and_gatv2_without_projections(monkeypatch):
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    torch.manual_seed(0)
    edge_index = random_graph(40, 200, hub_degree=30)
    monkeypatch.setenv(score_fold.ENV, "0")
    gat = GATConv(12, 8, heads=2)
    check_rewrites(gat, torch.randn(40, 12), edge_index, expect={"attention": 1, "score_projection": 0})
    assert not any(r.packed_grads for r in gnn_inductor.rewrite_report.reports(gat))
    monkeypatch.setenv(score_fold.ENV, "1")
    check_rewrites(GATv2Conv(12, 8, heads=2), torch.randn(40, 12), edge_index,
                   expect={"attention": 1, "score_projection": 0})


# a compiled layer through the interpreted kernels takes about a minute of CPU: --slow, and the GPU (the kernels' own
# tests stay in the default tier)
@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="the kernels on CPU tensors, under the interpreter")
def test_compiled_gat_with_edge_features_needing_grads_with_the_kernels(monkeypatch):
    """GATConv with edge features that need a gradient (``check_rewrites`` makes them leaves), compiled with the
    3xTF32 kernels at the test's sizes: the node features' GEMM and both projections are one ``linear_scores``
    call, the edge GEMM (read by its projection alone) keeps its reduction, and the output and every gradient match
    eager PyG. Its edge features are masked apart from the edge index (two unbacked sizes at tracing)."""
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 48)
    monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(score_fold.ENV, "1")
    torch.manual_seed(0)
    model = GATConv(12, 8, heads=4, edge_dim=5)
    edge_index = random_graph(60, 400, seed=1, hub_degree=40)
    result = check_rewrites(model, torch.randn(60, 12), edge_index, torch.randn(edge_index.shape[1], 5), calls=1,
                            expect={"attention": 1, "score_projection": 1, "near_miss": 0})
    fold = next(r for g in result.report["graphs"] for r in g["rewrites"] if r["pattern"] == "score_projection")
    assert fold["details"]["vectors"] == ["att_src", "att_dst"] and fold["details"]["columns"] == 32
    assert "linear_scores" in gnn_inductor.rewrite_report.format_text(model)

