"""The fused linear map's gradients made from the attention's packed gradient by blocks of rows
(``gnn_io::attention_backward_projected``, kernels/attention/op.py; the graph pass in gnn_inductor/passes/packed_grads.py).

The op is checked against the packed op followed by the three products (every block count, float32 and bfloat16,
either product or the row sum left out), the compiled layers against eager PyG with the blocks forced small, and
the matcher on backward-like graphs where it must not apply."""
import operator

import pytest
import torch
from torch_geometric.nn import GATv2Conv, TransformerConv

import gnn_inductor
from gnn_inductor.passes import packed_grads
from gnn_inductor.kernels.attention import csr_chunked, dispatch
from gnn_inductor.testing import TOLERANCES, random_graph, tolerance
from tests.tiers import INTERPRETED, tiered

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


def _dot_score(q, k, v):
    return torch.ops.aten.div.Tensor(torch.ops.aten.sum.dim_IntList(torch.ops.aten.mul.Tensor(q, k), [-1]), 2.0)


def _dot_message(alpha, q, k, v):
    return torch.ops.aten.mul.Tensor(torch.ops.aten.unsqueeze.default(alpha, -1), v)


def _problem(num_nodes=50, heads=2, channels=4, dtype=torch.float32, seed=0):
    """TransformerConv's attention on a graph with a hub, isolated nodes, self loops and duplicates: the arguments
    (query dst-role, key and value src-role), the plan, the output gradient and ``D``."""
    from gnn_inductor.kernels.runtime import edge_functions

    torch.manual_seed(seed)
    edge_index = random_graph(num_nodes, 6 * num_nodes, seed=seed, hub_degree=3 * num_nodes).to(DEVICE)
    rowptr, col, row, perm = torch.ops.gnn_io.csr_plan(edge_index[1], edge_index[0], num_nodes, num_nodes)[:4]
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 8))  # hubs split into several items
    score = edge_functions.register(torch.fx.symbolic_trace(_dot_score))
    message = edge_functions.register(torch.fx.symbolic_trace(_dot_message))
    args = [torch.randn(num_nodes, heads, channels).to(DEVICE, dtype) for _ in range(3)]
    roles = [1, 0, 0]
    out, lse = torch.ops.gnn_io.attention_forward(args, roles, rowptr, col, row, perm, score, message, 1e-16, items,
                                                   8)
    grad_out = torch.randn_like(out)
    delta = torch.ops.gnn_io.attention_delta(grad_out, out, lse)[0]
    return (grad_out, args, roles, rowptr, col, row, perm, score, message, 1e-16, items, 8, None, 0.0, delta, lse,
            [True, True, True])


def _expected(common, offsets, width, x, weight, bias_dims):
    packed, *grads = torch.ops.gnn_io.attention_backward_packed(*common, offsets, width)
    packed = packed.float()
    grad_x = packed @ weight.float() if weight is not None else None
    grad_w = packed.t() @ x.float() if x is not None else None
    total = packed.sum(0) if bias_dims >= 0 else None
    if total is not None and bias_dims:
        total = total.reshape(1, -1)
    return [grad_x, grad_w, total, *grads]


def _compare(got, want, dtype):
    rtol, atol = TOLERANCES[dtype]  # the project's per-dtype tolerances (gnn_inductor/testing.py)
    tol = {"rtol": rtol, "atol": atol}
    for k, (g, w) in enumerate(zip(got, want)):
        if w is None or w.numel() == 0:
            assert g.numel() == 0, k
            continue
        assert g.dtype == (dtype if k < 3 else w.dtype), k
        assert not torch.isnan(g).any(), k
        scale = max(1.0, float(w.float().abs().max()))
        torch.testing.assert_close(g.float(), w.float(), rtol=tol["rtol"], atol=tol["atol"] * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_kb", ["1"] if INTERPRETED else ["0", "1", "2", "100"])
def test_op_matches_the_packed_gradient_times_the_weights(dtype, chunk_kb, monkeypatch):
    """Every block count (0: off; 1 KiB: one block per few rows; 100 KiB: one block), gaps between the spans, the
    query's gradient in the last columns: the three products of the packed gradient, and the unpacked entries
    empty. Off the kernels (CPU without the interpreter) the op makes the packed gradient whole, then multiplies;
    under the interpreter (slow) the blocks of 1 KiB run the kernels with two of the four input sets."""
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, chunk_kb)
    common = _problem(dtype=dtype)
    offsets, width = [20, 0, 10], 30  # key, gap, value, gap, query
    torch.manual_seed(1)
    x, weight = torch.randn(50, 7).to(DEVICE, dtype), torch.randn(width, 5).to(DEVICE, dtype)
    inputs_sets = [(x, weight, 1), (x, weight, 0), (None, weight, -1), (x, None, 1)]
    for inputs in inputs_sets[1:3] if INTERPRETED else inputs_sets:
        got = torch.ops.gnn_io.attention_backward_projected(*common, offsets, width, *inputs)
        _compare(got, _expected(common, offsets, width, *inputs), dtype)


# a compiled layer through the interpreted kernels takes about a minute of CPU: --slow, and the GPU (the kernels' own
# tests stay in the default tier)
@pytest.mark.slow
@needs_kernels
def test_blocks_run_the_split_passes_per_block(monkeypatch):
    """With 1 KiB blocks the chunked backward runs (it does not decline), once per call, over several blocks whose
    rows cover every node once, in order."""
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "1")
    seen, real = [], csr_chunked.backward_chunked

    def recording(*args, **kwargs):
        seen.append(list(args[15]))
        return real(*args, **kwargs)
    monkeypatch.setattr(csr_chunked, "backward_chunked", recording)
    common = _problem()
    offsets, width = [20, 0, 10], 30
    x, weight = torch.randn(50, 7, device=DEVICE), torch.randn(width, 5, device=DEVICE)
    got = torch.ops.gnn_io.attention_backward_projected(*common, offsets, width, x, weight, 1)
    assert len(seen) == 1 and len(seen[0]) > 3 and seen[0][0] == 0 and seen[0][-1] == 50, seen
    assert seen[0] == sorted(seen[0])
    _compare(got, _expected(common, offsets, width, x, weight, 1), torch.float32)


def test_bad_projection_inputs_are_errors():
    """A weight or input that does not fit the packed gradient is an error naming the op, not a wrong product."""
    common = _problem(num_nodes=20)
    with pytest.raises(ValueError, match="attention_backward_projected: weight"):
        torch.ops.gnn_io.attention_backward_projected(*common, [16, 0, 8], 24, None, torch.randn(23, 5), -1)
    with pytest.raises(ValueError, match="attention_backward_projected: input"):
        torch.ops.gnn_io.attention_backward_projected(*common, [16, 0, 8], 24, torch.randn(19, 5), None, -1)
    with pytest.raises(ValueError, match="bias_dims"):
        torch.ops.gnn_io.attention_backward_projected(*common, [16, 0, 8], 24, None, None, 2)


def _layer_check(model, x, edge_index, edge_attr=None):
    """Outputs and every gradient of the compiled layer against eager PyG; returns the report's projected count."""
    extra = () if edge_attr is None else (edge_attr,)
    grad = torch.randn_like(model(x, edge_index, *extra))
    x.grad = None
    model.zero_grad(set_to_none=True)
    model(x, edge_index, *extra).backward(grad)
    want = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    torch.compile(model, backend="gnn_io")(x, edge_index, *extra).backward(grad)
    for got, expected in zip([x.grad] + [p.grad for p in model.parameters()], want):
        assert got is not None and not torch.isnan(got).any()
        torch.testing.assert_close(got, expected, **tolerance(torch.float32, "layer"))
    return sum(r.projected_grads for r in gnn_inductor.rewrite_report.reports(model))


# the blocks' split passes run compiled in test_blocks_run_the_split_passes_per_block; these whole layers with --slow
@needs_kernels
@pytest.mark.parametrize("layer", tiered(["transformer_edge", "gatv2"], []))
def test_compiled_layers_with_the_kernels_by_blocks(layer, monkeypatch):
    """The compiled layer under Triton's interpreter with 1 KiB blocks: the backward graph calls the projected op,
    the chunked split backward runs, and the input gradient and every parameter's match eager PyG. With edge
    features the edge-feature map's gradient (edge-role, not packed) is summed over the blocks."""
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "1")
    ran, real = [], csr_chunked.backward_chunked

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        ran.append(result is not None)
        return result
    monkeypatch.setattr(csr_chunked, "backward_chunked", recording)
    torch.manual_seed(0)
    edge_attr = None
    if layer == "gatv2":
        model = GATv2Conv(12, 8, heads=2)
    else:
        model = TransformerConv(12, 8, heads=2, edge_dim=3 if layer == "transformer_edge" else None)
    model = model.to(DEVICE)
    edge_index = random_graph(60, 400, seed=1, hub_degree=40).to(DEVICE)
    if layer == "transformer_edge":
        edge_attr = torch.randn(edge_index.shape[1], 3, device=DEVICE, requires_grad=True)
    x = torch.randn(60, 12, device=DEVICE, requires_grad=True)
    assert _layer_check(model, x, edge_index, edge_attr) == 1
    assert ran == [True], ran
    assert "attention_backward_projected" in gnn_inductor.rewrite_report.format_text(model)


def test_switch_off_keeps_the_products_in_the_graph(monkeypatch):
    """``GNN_IO_PROJECTED_GRADS=0``: the packed gradient stays, its products are Inductor's; the same values. A bad
    value is an error naming the switch."""
    monkeypatch.setenv("GNN_IO_STRICT", "1")
    monkeypatch.setenv(packed_grads.PROJECT_ENV, "0")
    torch.manual_seed(0)
    model = TransformerConv(12, 8, heads=2)
    x = torch.randn(40, 12, requires_grad=True)
    assert _layer_check(model, x, random_graph(40, 200, hub_degree=30)) == 0
    assert sum(r.packed_grads for r in gnn_inductor.rewrite_report.reports(model)) == 1
    monkeypatch.setenv(packed_grads.PROJECT_ENV, "on")
    with pytest.raises(ValueError, match=packed_grads.PROJECT_ENV):
        gnn_inductor.config.snapshot()


def _gat_score(a0, a1, a2):
    return torch.ops.aten.leaky_relu.default(torch.ops.aten.add.Tensor(a1, a2), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return torch.ops.aten.mul.Tensor(torch.ops.aten.unsqueeze.default(alpha, -1), a0)


def _packed_like(readers: str, family: str = "dot", symbolic: bool = False):
    """A backward-like FX graph: a packed attention backward (TransformerConv's edge functions, or GAT's) whose
    packed gradient feeds ``readers``: ``x`` (the input product), ``w`` (the weight product), ``b`` (the row sum),
    ``o`` (something else)."""
    from gnn_inductor.kernels.runtime import edge_functions

    score, message = (_dot_score, _dot_message) if family == "dot" else (_gat_score, _gat_message)
    keys = [edge_functions.register(torch.fx.symbolic_trace(f)) for f in (score, message)]
    graph = torch.fx.Graph()
    grad, inp, weight = graph.placeholder("grad"), graph.placeholder("x"), graph.placeholder("weight")
    args = [graph.placeholder(f"a{i}") for i in range(3)]
    roles = [1, 0, 0] if family == "dot" else [0, 0, 1]
    op = graph.call_function(torch.ops.gnn_io.attention_backward_packed.default,
                             (grad, args, roles, *[None] * 4, *keys, 1e-16, [], 0, None, 0.0, grad, grad,
                              [True] * 3, [0, 8, 16], 24))
    total = graph.call_function(operator.getitem, (op, 0))
    total.meta["val"] = torch.empty(1000, 24)
    if symbolic:  # a graph compiled for sizes that change from call to call
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        total.meta["val"] = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.empty(1000, 24),
                                                                            static_shapes=False)
    weight.meta["val"], inp.meta["val"] = torch.empty(24, 5), torch.empty(1000, 7)
    outputs = []
    if "x" in readers:
        outputs.append(graph.call_function(torch.ops.aten.mm.default, (total, weight)))
        outputs[-1].meta["val"] = torch.empty(1000, 5)
    if "w" in readers:
        t = graph.call_function(torch.ops.aten.permute.default, (total, [1, 0]))
        outputs.append(graph.call_function(torch.ops.aten.mm.default, (t, inp)))
        outputs[-1].meta["val"] = torch.empty(24, 7)
    if "b" in readers:
        outputs.append(graph.call_function(torch.ops.aten.sum.dim_IntList, (total, [0], True)))
        outputs[-1].meta["val"] = torch.empty(1, 24)
    if "o" in readers:
        outputs.append(graph.call_function(torch.ops.aten.neg.default, (total,)))
    graph.output(tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_blocks_default_whole_for_mid_size_graphs(monkeypatch):
    """With the block size left at its default, a packed gradient under GRAD_WHOLE_KB of a graph under
    GRAD_WHOLE_MAX_ROWS nodes is one block (measured: tu-batch's 672 MiB in 3 blocks cost a host-bound step
    0.8 ms); the graphs of 2^20 nodes keep blocks of GRAD_CHUNK_KB at every width and precision (their
    peaks); a block size set alone cuts at that size at any total; GNN_IO_GRAD_WHOLE_KB moves the size line."""
    monkeypatch.delenv(dispatch.GRAD_CHUNK_ENV, raising=False)
    monkeypatch.delenv(dispatch.GRAD_WHOLE_ENV, raising=False)
    f32, bf16 = torch.float32, torch.bfloat16
    assert dispatch.projection_blocks(458_590, 384, f32) == [0, 458_590]           # tu-batch: 672 MiB
    assert dispatch.projection_blocks(458_590, 384, bf16) == [0, 458_590]          # 336 MiB
    big = dispatch.projection_blocks(1 << 20, 384, f32)                            # RMAT 2^20: 1.5 GiB
    assert len(big) == 7 and big[0] == 0 and big[-1] == 1 << 20                     # 6 blocks of 256 MiB
    assert len(dispatch.projection_blocks(1 << 20, 256, f32)) == 5                 # GATv2Conv: 1 GiB, 4 blocks
    assert len(dispatch.projection_blocks(1 << 20, 384, bf16)) == 4                # 768 MiB
    assert len(dispatch.projection_blocks(1 << 20, 256, bf16)) == 3                # 512 MiB, 2^20 rows: blocks
    rows = dispatch.GRAD_WHOLE_MAX_ROWS - 1
    width = (dispatch.GRAD_WHOLE_KB << 10) // (rows * 4)                          # just under the size line
    assert dispatch.projection_blocks(rows, width, f32) == [0, rows]
    assert len(dispatch.projection_blocks(rows, width + 1, f32)) > 2               # over it
    exact = (dispatch.GRAD_WHOLE_KB << 10) // (1536 * 4)                           # exactly GRAD_WHOLE_KB
    assert len(dispatch.projection_blocks(exact, 1536, f32)) > 2
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, str(dispatch.GRAD_CHUNK_KB))     # set alone: cut at that size
    assert len(dispatch.projection_blocks(458_590, 384, f32)) == 4
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "")                                # empty: unset
    assert dispatch.projection_blocks(458_590, 384, f32) == [0, 458_590]
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "0")
    assert dispatch.projection_blocks(1 << 20, 384, f32) == [0, 1 << 20]
    monkeypatch.delenv(dispatch.GRAD_CHUNK_ENV)
    monkeypatch.setenv(dispatch.GRAD_WHOLE_ENV, "0")
    assert len(dispatch.projection_blocks(458_590, 384, f32)) == 4
    monkeypatch.setenv(dispatch.GRAD_WHOLE_ENV, str(4 << 20))
    assert len(dispatch.projection_blocks(1 << 20, 384, f32)) == 7                 # 2^20 rows: blocks still


def test_matcher_projects_only_products_of_the_packed_gradient(monkeypatch):
    """The pass applies where the packed gradient's readers are the input product, the weight product and the
    row sum (any of them, one product at least), and not where anything else reads it, nor where the packed
    gradient fits one block, has sizes that change from call to call (mini-batches: small, host-bound steps) or
    comes from the GAT family's backward (its products are then left to Inductor)."""
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "100")
    assert packed_grads.project_all(_packed_like("xwb")) == 0  # 1000 x 24 float32: one block of 100 KiB
    monkeypatch.setenv(dispatch.GRAD_CHUNK_ENV, "1")
    assert packed_grads.project_all(_packed_like("xwb", "gat")) == 0  # GAT's backward makes its gradient whole
    assert packed_grads.project_all(_packed_like("xwb", symbolic=True)) == 0  # sizes that change (mini-batches)
    for readers, expected in [("xwb", 1), ("xw", 1), ("wb", 1), ("x", 1), ("b", 0), ("xwbo", 0), ("xo", 0)]:
        gm = _packed_like(readers)
        assert packed_grads.project_all(gm) == expected, readers
        ops = [n for n in gm.graph.nodes if n.op == "call_function" and "attention_backward" in str(n.target)]
        assert len(ops) == 1
        assert ("projected" in str(ops[0].target)) == bool(expected), readers
        if expected:
            assert not any(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes), readers
