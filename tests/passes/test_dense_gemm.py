"""The graph pass that sends large float32 GEMMs to the 3xTF32 kernel (gnn_inductor/passes/dense_gemm.py): which
calls it takes, that the rewritten graph computes the same values, and compiled layers against eager PyG with the
kernel running (under Triton's interpreter, thresholds lowered to the test's sizes)."""
import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_geometric.nn import GATConv, SAGEConv

import gnn_inductor
from gnn_inductor.passes import dense_gemm
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.dense import ops as dense_ops
from gnn_inductor.testing import random_graph, tolerance
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from tests.tiers import tiered

aten = torch.ops.aten


@pytest.fixture
def low_thresholds(monkeypatch):
    """Every float32 product of the tests' sizes qualifies."""
    monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1)
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 16)


@pytest.fixture
def cpu_kernels(monkeypatch):
    """CPU tensors count as the kernels' device (as under the interpreter; nothing here launches a kernel)."""
    monkeypatch.setattr(dense_triton, "INTERPRETED", True)
    monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")


def _linear_graph(dtype=torch.float32, bias_2d=False, tracing_mode="fake"):
    def fn(x, w, b, g):
        y = torch.addmm(b, x, w.t())        # forward of a linear map with a bias
        dx = torch.mm(g, w)                 # its input gradient
        dw = torch.mm(g.t(), x)             # its weight gradient (inner size: the rows)
        return y, dx, dw

    inputs = [torch.randn(40, 8, dtype=dtype), torch.randn(12, 8, dtype=dtype),
              torch.randn(40, 12, dtype=dtype) if bias_2d else torch.randn(12, dtype=dtype),
              torch.randn(40, 12, dtype=dtype)]
    return make_fx(fn, tracing_mode=tracing_mode)(*inputs), fn, inputs


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_rewrites_forward_and_both_gradients(low_thresholds, cpu_kernels, monkeypatch):
    gm, fn, inputs = _linear_graph()
    assert dense_gemm.rewrite(gm) == 3
    targets = _targets(gm)
    assert targets.count(dense_ops.MM) == 3
    assert aten.mm.default not in targets and aten.addmm.default not in targets
    # the same values (run by cuBLAS's counterpart here: the kernel itself is checked in tests/kernels)
    monkeypatch.delenv("GNN_IO_TRITON_ON_CPU")
    for got, want in zip(gm(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want, **tolerance(torch.float32, "reassociated"))


@pytest.mark.parametrize("case", ["bfloat16", "bias_2d", "symbolic", "small", "tf32", "cublas"])
def test_leaves_gemms_it_does_not_take(case, low_thresholds, cpu_kernels, monkeypatch):
    """Other dtypes, a 2-D bias, symbolic sizes, products under the thresholds, TF32 allowed by the user and the
    setting off all keep ATen's GEMMs."""
    if case == "small":
        monkeypatch.setattr(dense_triton, "TALL_MIN_WORK", 1 << 40)
        monkeypatch.setattr(dense_triton, "WIDE_MIN_WORK", 1 << 40)
    if case == "cublas":
        monkeypatch.setenv("GNN_IO_FP32_GEMM", "cublas")
    gm, _, _ = _linear_graph(dtype=torch.bfloat16 if case == "bfloat16" else torch.float32,
                             bias_2d=case == "bias_2d", tracing_mode="symbolic" if case == "symbolic" else "fake")
    expected = {"bias_2d": 2}.get(case, 0)  # the 2-D bias leaves only the addmm
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = case == "tf32" or before
    try:
        assert dense_gemm.rewrite(gm) == expected
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert _targets(gm).count(dense_ops.MM) == expected


def test_op_without_the_kernel_is_cublas_with_bias():
    a, b, bias = torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(torch.ops.gnn_io.mm(a, b, bias), torch.addmm(bias, a, b))
    torch.testing.assert_close(torch.ops.gnn_io.mm(a, b), a @ b)
    fake = torch.ops.gnn_io.mm(a.to("meta"), b.to("meta"))
    assert fake.shape == (5, 4) and fake.device.type == "meta"


# a compiled layer through the interpreted kernels takes about a minute of CPU: --slow, and the GPU (the kernels' own
# tests stay in the default tier)
@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize("layer", tiered(["gat", "sage_max"], ["gat"]))
def test_compiled_layers_with_the_split_gemms(layer, low_thresholds, monkeypatch):
    """The compiled layer with every linear map's GEMMs (forward, input and weight gradients) in the kernel:
    output, input gradient and every parameter's gradient match eager PyG, and the report counts them."""
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    # GATConv's GEMM as a plain linear map (by default it and its scores are one gnn_io::linear_scores call,
    # tests/kernels/attention/test_head_scores.py)
    monkeypatch.setenv("GNN_IO_SCORE_FOLD", "0")
    if INTERPRETED:
        monkeypatch.setenv("GNN_IO_TRITON_ON_CPU", "1")
    monkeypatch.setattr(dense_triton, "SMALL_SIDE", 32)
    ran = []

    def recording(real):
        def record(*args, **kwargs):
            ran.append(tuple(args[0].shape))
            return real(*args, **kwargs)
        return record
    # the tile kernel (weight gradients, wide inner sizes) and the weight-stationary kernel (tall products)
    monkeypatch.setattr(dense_triton, "mm", recording(dense_triton.mm))
    monkeypatch.setattr(dense_triton, "_launch_stationary", recording(dense_triton._launch_stationary))
    torch.manual_seed(0)
    device = "cpu" if INTERPRETED else "cuda"
    model = (GATConv(12, 8, heads=2) if layer == "gat" else SAGEConv(12, 16, aggr="max")).to(device)
    edge_index = random_graph(60, 400, seed=1, hub_degree=40).to(device)
    x = torch.randn(60, 12, device=device, requires_grad=True)
    eager = copy.deepcopy(model)
    x_ref = x.detach().clone().requires_grad_()
    eager(x_ref, edge_index).square().sum().backward()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gnn_io")
    out = compiled(x, edge_index)
    torch.testing.assert_close(out, eager(x_ref.detach(), edge_index), **tolerance(torch.float32, "layer"))
    out.square().sum().backward()
    for got, want in zip([x.grad] + [p.grad for p in model.parameters()],
                         [x_ref.grad] + [p.grad for p in eager.parameters()]):
        assert got is not None and not torch.isnan(got).any()
        torch.testing.assert_close(got, want, **tolerance(torch.float32, "layer"))
    made = sum(sum(r.dense_gemms.values()) for r in gnn_inductor.rewrite_report.reports(model))
    assert made >= 3 and len(ran) >= 3, (made, ran)
    assert "gnn_io::mm" in gnn_inductor.rewrite_report.format_text(model)

