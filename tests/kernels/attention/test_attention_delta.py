"""``gnn_io::attention_delta`` (kernels/attention/op.py): the attention backward's ``D = <dout, out - bias>`` and the
bias gradient, computed before ``gnn_io::attention_backward`` so that the kernels never read the forward's output.

- The op against a float64 formula: with and without a bias, bf16 inputs, shapes whose rows do not split into
  ``lse``'s heads (an empty ``D``), on the torch path and on the Triton kernel (CUDA, or CPU in the
  interpreter tier).
- In a compiled TransformerConv step (whose attention output is not the layer's output: the skip map's sum is),
  the saved attention output is read by ``attention_delta`` alone in the backward graph, so Inductor frees it
  before the gradients are allocated; the step's gradients still match eager PyG.
"""
import operator

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from torch_geometric.nn import TransformerConv

import gnn_inductor
from gnn_inductor.passes import packed_grads
from gnn_inductor.testing import check_rewrites, random_graph, tolerance
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, runs_kernel



def _expected(grad, out, bias):
    centred = out.double() - (0 if bias is None else bias.double().reshape(out.shape[1:]))
    return (grad.double() * centred).sum(-1)


def _inputs(dtype, device, rows=37, heads=3, channels=20):
    generator = torch.Generator().manual_seed(0)
    grad, out = (torch.randn(rows, heads, channels, generator=generator).to(device, dtype) for _ in range(2))
    bias = torch.randn(heads * channels, generator=generator).to(device, dtype)
    lse = torch.zeros(rows, heads, device=device)
    return grad, out, bias, lse


def _check(device, dtype):
    grad, out, bias, lse = _inputs(dtype, device)
    for b in (None, bias):
        delta, bias_grad = torch.ops.gnn_io.attention_delta(grad, out, lse, b)
        assert delta.dtype == torch.float32 and delta.shape == lse.shape  # bf16 inputs too: float32's tolerance
        torch.testing.assert_close(delta.double().cpu(), _expected(grad, out, b).cpu(),
                                   **tolerance(torch.float32))
        if b is None:
            assert bias_grad.numel() == 0
        else:
            assert bias_grad.shape == bias.shape and bias_grad.dtype == bias.dtype
            # summed in float32, then rounded to the bias's dtype (bf16: 8 bits of mantissa)
            torch.testing.assert_close(bias_grad.double().cpu(), grad.double().sum(0).reshape(-1).cpu(),
                                       **tolerance(dtype, "hub_sum"))


def test_delta_on_the_torch_path():
    if INTERPRETED:
        pytest.skip("the interpreter runs the kernel on CPU tensors: covered below")
    _check(torch.device("cpu"), torch.float32)
    _check(torch.device("cpu"), torch.bfloat16)  # bf16 inputs, products and sums in float32


@runs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_delta_kernel(dtype):
    _check(DEVICE, dtype)


@runs_kernel
@pytest.mark.parametrize("heads, channels", [(4, 32), (2, 20), (1, 8)])
def test_bias_gradient_summed_by_the_delta_kernel(heads, channels, monkeypatch):
    """With a power-of-two head count the D kernel also sums ``dout``'s columns (per-program sums, then their
    sum): no separate column sum runs, and the bias gradient is the float64 column sum (rows not a multiple of
    the kernel's block, so the last block is partly masked)."""
    from gnn_inductor.kernels.attention import op as attention_module

    def no_column_sum(t):
        raise AssertionError("a separate column sum ran")
    monkeypatch.setattr(attention_module, "column_sum", no_column_sum)
    grad, out, bias, lse = _inputs(torch.float32, DEVICE, rows=1037, heads=heads, channels=channels)
    delta, bias_grad = torch.ops.gnn_io.attention_delta(grad, out, lse, bias)
    torch.testing.assert_close(delta.double().cpu(), _expected(grad, out, bias).cpu(),
                               **tolerance(torch.float32))
    assert bias_grad.shape == bias.shape and bias_grad.dtype == bias.dtype
    torch.testing.assert_close(bias_grad.double().cpu(), grad.double().sum(0).reshape(-1).cpu(),
                               **tolerance(torch.float32, "hub_sum"))


@runs_kernel
def test_delta_of_strided_gradients():
    """``dout`` as autograd may hand it over: an expanded (stride 0) tensor, or a transposed view."""
    grad, out, _, lse = _inputs(torch.float32, DEVICE)
    ones = torch.ones(1, 1, 1, device=DEVICE).expand_as(out)
    torch.testing.assert_close(torch.ops.gnn_io.attention_delta(ones, out, lse)[0], out.sum(-1))
    grad_t = grad.transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(torch.ops.gnn_io.attention_delta(grad_t, out, lse)[0],
                               _expected(grad, out, None).float())


def test_rows_that_do_not_split_into_heads_give_an_empty_delta():
    """Only the fused kernels read ``D``; for shapes they never get (the reference backward's), the op returns an
    empty tensor rather than a wrong-shaped one. A single head (``lse`` of shape ``[N]``) is a shape they do get."""
    grad, out = torch.randn(5, 7), torch.randn(5, 7)
    assert torch.ops.gnn_io.attention_delta(grad, out, torch.zeros(5, 2))[0].numel() == 0
    assert torch.ops.gnn_io.attention_delta(grad, out, torch.zeros(4))[0].numel() == 0
    torch.testing.assert_close(torch.ops.gnn_io.attention_delta(grad, out, torch.zeros(5))[0], (grad * out).sum(-1))


@runs_kernel
def test_backward_op_refuses_a_delta_of_another_shape():
    """The fused backward checks ``D`` against ``lse`` before any kernel reads it."""
    from tests.kernels.attention.cases import CASES, NUM_NODES, edge_fn, make_args

    score_fn, message_fn, _, kinds = CASES["transformer"]
    score, message, roles = edge_fn(score_fn), edge_fn(message_fn), [role for role, _ in kinds]
    src, dst = random_graph(NUM_NODES, 60, seed=1)
    plan = [t.to(DEVICE) for t in torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:4]]
    args = [a.to(DEVICE) for a in make_args(kinds, plan[1].numel())]
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, *plan, score, message, 1e-16, [], 0)
    with pytest.raises(ValueError, match="statistics of shape"):
        torch.ops.gnn_io.attention_backward(out, args, roles, *plan, score, message, 1e-16, [], 0, None, 0.0,
                                            lse[:, :1], lse, [True] * len(args))


def test_compiled_backward_reads_the_attention_output_only_for_delta(monkeypatch):
    """The backward graph Inductor compiles for TransformerConv: the saved attention output feeds
    ``attention_delta`` and nothing else (no backward op takes it), the backward op reads that op's ``D``, and the
    step's output and gradients are eager PyG's (``check_rewrites``)."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    graphs = []
    real_pack = packed_grads.pack

    def recording(gm):
        graphs.append(gm)
        return real_pack(gm)
    monkeypatch.setattr(packed_grads, "pack", recording)
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=2)
    check_rewrites(model, torch.randn(40, 12), random_graph(40, 200, hub_degree=30), expect={})
    deltas = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"
              and getattr(n.target, "_opname", "").startswith("attention_delta")]
    backwards = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"
                 and getattr(n.target, "_opname", "").startswith("attention_backward")]
    assert len(deltas) == 1 and len(backwards) == 1, (deltas, backwards)
    out = deltas[0].args[1]
    assert set(out.users) == {deltas[0]}, f"the attention output is read by {list(out.users)} too"
    flat = [a for arg in backwards[0].args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
    assert out not in flat
    assert any(isinstance(a, torch.fx.Node) and a.target is operator.getitem and a.args[0] is deltas[0]
               for a in flat), "the backward op reads attention_delta's D"
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1
