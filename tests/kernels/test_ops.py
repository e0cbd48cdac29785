"""The gnn_io ops on CPU against plain PyTorch scatter code (what PyG eager runs), forward and
backward, float32 and float64, on graphs with isolated nodes, self loops, duplicates and a hub;
plus torch.library.opcheck for the fake implementations and autograd registrations."""
import pytest
import torch

import gnn_inductor.kernels  # noqa: F401
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.testing import HUB_TERMS, magnitude, random_graph, tolerance

ops = torch.ops.gnn_io
NUM_NODES = 40


def scatter_eager(msg, index, num, reduce):
    """PyG's eager scatter: zeros base, include_self=False."""
    idx = index.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
    base = msg.new_zeros((num, *msg.shape[1:]))
    if reduce == "sum":
        return base.scatter_add(0, idx, msg)
    return base.scatter_reduce(0, idx, msg, {"max": "amax", "min": "amin", "mean": "mean"}[reduce],
                               include_self=False)


def softmax_eager(s, index, num, eps=1e-16):
    m = scatter_eager(s.detach(), index, num, "max")
    e = (s - m.index_select(0, index)).exp()
    return e / (scatter_eager(e, index, num, "sum") + eps).index_select(0, index)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture
def graph():
    edge_index = random_graph(NUM_NODES, 200, seed=3, hub_degree=60)
    src, dst = edge_index
    plan = ops.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    return src, dst, plan


def close(actual, expected):
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, **tolerance(expected.dtype, scale=magnitude(expected)))


def grads_of(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype).to(out.device)
    (out * weight).sum().backward()
    return out.detach(), [leaf.grad for leaf in leaves]


def test_csr_plan_layout(graph):
    src, dst, (rowptr, col, row, perm, t_rowptr, t_col, t_perm) = graph
    assert torch.equal(t_rowptr[1:] - t_rowptr[:-1], torch.bincount(src, minlength=NUM_NODES))
    assert torch.equal(col[t_perm], torch.sort(src).values) and torch.equal(t_col, row[t_perm])
    assert rowptr[0] == 0 and rowptr[-1] == dst.numel()
    assert torch.equal(rowptr[1:] - rowptr[:-1], torch.bincount(dst, minlength=NUM_NODES))
    assert torch.equal(row, dst[perm]) and torch.equal(col, src[perm])
    assert torch.all(row[1:] >= row[:-1])
    # stable: duplicates keep their order
    for i in range(NUM_NODES):
        seg = perm[rowptr[i]:rowptr[i + 1]]
        assert torch.all(seg[1:] > seg[:-1])


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm(graph, dtype, reduce, weighted):
    src, dst, plan = graph
    x = torch.randn(NUM_NODES, 6, dtype=dtype)
    w = torch.rand(src.numel(), dtype=dtype) + 0.1

    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan

    def ours(x, w):
        values = w.index_select(0, perm) if weighted else torch.ones_like(w)
        return ops.spmm(x, values, values.index_select(0, t_perm), rowptr, col, row, t_rowptr, t_col, [], [], reduce)

    def eager(x, w):
        msg = x.index_select(0, src) * (w.view(-1, 1) if weighted else 1)
        return scatter_eager(msg, dst, NUM_NODES, reduce)

    out, (gx, gw) = grads_of(ours, x, w)
    ref, (rx, rw) = grads_of(eager, x, w)
    close(out, ref)
    close(gx, rx)
    if weighted:
        close(gw, rw)


@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_keeps_x_for_the_backward_only_where_the_weights_need_it(graph, weighted):
    """The backward reads x's values only for the weights' gradient: without it, what autograd saves holds no
    storage of x's size (x, GCNConv's ``x @ W``, is freed after the forward), and the gradient of x is unchanged."""
    src, dst, (rowptr, col, row, perm, t_rowptr, t_col, t_perm) = graph
    x = torch.randn(NUM_NODES, 64, dtype=torch.float64, requires_grad=True)  # larger than any structure tensor
    w = (torch.rand(src.numel(), dtype=torch.float64) + 0.1).requires_grad_(weighted)  # in CSR order
    saved = []

    def pack(t):
        saved.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ops.spmm(x, w, w.detach()[t_perm], rowptr, col, row, t_rowptr, t_col, [], [], "mean")
    holds_x = any(ptr == x.untyped_storage().data_ptr() for ptr, _ in saved)
    assert holds_x == weighted
    assert weighted or max(size for _, size in saved) < x.untyped_storage().nbytes()
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    (out * weight).sum().backward()
    scale = 1 / torch.bincount(row, minlength=NUM_NODES).clamp_min(1).to(x.dtype)
    expected = scatter_eager(weight.index_select(0, row) * (scale.index_select(0, row) * w.detach()).view(-1, 1), col,
                             NUM_NODES, "sum")
    close(x.grad, expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU"))])
def test_spmm_with_more_edges_than_matrix_entries(device):
    """20 copies of one edge among 4 nodes: 24 stored entries in a 4 x 4 matrix, which cuSPARSE refuses
    (``cusparseCreateCsr``: "dimension mismatch", found on the H100); the op still answers as eager does,
    forward and the gradients of the features and of the edge weights (the SDDMM)."""
    src = torch.tensor([1] * 20 + [0, 1, 2, 3])
    dst = torch.tensor([2] * 20 + [0, 1, 2, 3])
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = (t.to(device) for t in ops.csr_plan(dst, src, 4, 4))
    x = torch.randn(4, 6, device=device)
    w = torch.rand(src.numel(), device=device) + 0.1

    def ours(x, w):
        values = w.index_select(0, perm)
        return ops.spmm(x, values, values.index_select(0, t_perm), rowptr, col, row, t_rowptr, t_col, [], [], "sum")

    def eager(x, w):
        return scatter_eager(x.index_select(0, src.to(device)) * w.view(-1, 1), dst.to(device), 4, "sum")

    out, (gx, gw) = grads_of(ours, x, w)
    ref, (rx, rw) = grads_of(eager, x, w)
    for actual, expected in ((out, ref), (gx, rx), (gw, rw)):
        close(actual, expected)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_with_self_loop_csr(graph, dtype, reduce):
    """``A X + s X`` through ``self_loop_csr`` (GIN's folded self term): outputs and gradients as eager,
    on a graph that already has self loops (the added diagonal must not merge with them)."""
    src, dst, plan = graph
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    assert bool((src == dst).any())
    x = torch.randn(NUM_NODES, 5, dtype=dtype)
    w = torch.rand(src.numel(), dtype=dtype) + 0.1
    scale = 1.7
    values = w.index_select(0, perm)
    if reduce == "mean":
        values = values / (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(dtype).index_select(0, row)
    parts = ops.self_loop_csr(rowptr, col, values, t_rowptr, t_col, values.index_select(0, t_perm))
    rowptr2, col2, row2, diag, base, t_rowptr2, t_col2, t_row2, t_diag, t_base = parts
    assert rowptr2.numel() == NUM_NODES + 1 and col2.numel() == src.numel() + NUM_NODES
    assert torch.equal(col2[diag], torch.arange(NUM_NODES)) and torch.equal(row2[diag], torch.arange(NUM_NODES))
    assert torch.equal(t_col2[t_diag], torch.arange(NUM_NODES)) and torch.equal(t_row2, torch.sort(t_row2).values)
    assert torch.equal(base[~diag], values) and not base[diag].any()

    def ours(x):
        v, t_v = torch.where(diag, scale, base), torch.where(t_diag, scale, t_base)
        return ops.spmm(x, v, t_v, rowptr2, col2, row2, t_rowptr2, t_col2, [], [], "sum")

    def eager(x):
        return scatter_eager(x.index_select(0, src) * w.view(-1, 1), dst, NUM_NODES, reduce) + scale * x

    assert_same_function(ours, eager, x)


def test_self_loop_csr_needs_square_plan():
    plan = ops.csr_plan(torch.tensor([0, 1]), torch.tensor([2, 0]), 2, 3)
    values = torch.ones(2)
    with pytest.raises(ValueError, match="square"):
        ops.self_loop_csr(plan[0], plan[1], values, plan[4], plan[5], values)


def assert_same_function(ours, eager, *tensors):
    """Same outputs and same gradients for every input."""
    out, grads = grads_of(ours, *tensors)
    ref, ref_grads = grads_of(eager, *tensors)
    close(out, ref)
    for g, r in zip(grads, ref_grads):
        close(g, r)


def _register(fn):
    return edge_functions.register(torch.fx.symbolic_trace(fn))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_gather_scatter(graph, dtype, reduce):
    src, dst, plan = graph
    key = _register(lambda x_j, x_i, e, b: torch.relu(x_j + e) * x_i + b)
    x = torch.randn(NUM_NODES, 5, dtype=dtype)
    e = torch.randn(src.numel(), 5, dtype=dtype)
    b = torch.randn(5, dtype=dtype)
    roles = [ROLE_SRC, ROLE_DST, ROLE_EDGE, ROLE_DENSE]

    def ours(x, e, b):
        return ops.gather_scatter([x, x, e, b], roles, *plan[:4], key, reduce)

    def eager(x, e, b):
        msg = torch.relu(x.index_select(0, src) + e) * x.index_select(0, dst) + b
        return scatter_eager(msg, dst, NUM_NODES, reduce)

    assert_same_function(ours, eager, x, e, b)


def test_max_ties_share_gradient(dtype):
    """Equal messages into one node split the gradient equally, as scatter_reduce does."""
    src = torch.tensor([0, 1, 2, 3])
    dst = torch.tensor([4, 4, 4, 5])
    plan = ops.csr_plan(dst, src, 6, 6)
    key = _register(lambda x_j: x_j)
    x = torch.tensor([[1.0], [3.0], [3.0], [2.0], [0.0], [0.0]], dtype=dtype)
    out, (gx,) = grads_of(lambda x: ops.gather_scatter([x], [ROLE_SRC], *plan[:4], key, "max"), x)
    ref, (rx,) = grads_of(lambda x: scatter_eager(x.index_select(0, src), dst, 6, "max"), x)
    close(out, ref)
    close(gx, rx)
    assert gx[1] == gx[2] and gx[1] != 0 and gx[0] == 0


def test_edge_softmax(graph, dtype):
    src, dst, (rowptr, col, row, perm, *_) = graph
    s = torch.randn(src.numel(), 3, dtype=dtype) * 4
    out, (gs,) = grads_of(lambda s: ops.edge_softmax(s, rowptr, row, perm, 1e-16), s)
    ref, (rs,) = grads_of(lambda s: softmax_eager(s, dst, NUM_NODES), s)
    close(out, ref)
    close(gs, rs)


def test_attention_gatv2_form(graph, dtype):
    src, dst, plan = graph
    heads, channels = 2, 4
    score = _register(lambda xl, xr, att: (torch.nn.functional.leaky_relu(xl + xr, 0.2) * att).sum(-1))
    message = _register(lambda alpha, xl, xr, att: alpha.unsqueeze(-1) * xl)
    xl = torch.randn(NUM_NODES, heads, channels, dtype=dtype)
    xr = torch.randn(NUM_NODES, heads, channels, dtype=dtype)
    att = torch.randn(1, heads, channels, dtype=dtype)

    def ours(xl, xr, att):
        return ops.attention([xl, xr, att], [ROLE_SRC, ROLE_DST, ROLE_DENSE], *plan[:4], score, message, 1e-16)

    def eager(xl, xr, att):
        xj, xi = xl.index_select(0, src), xr.index_select(0, dst)
        alpha = softmax_eager((torch.nn.functional.leaky_relu(xj + xi, 0.2) * att).sum(-1), dst, NUM_NODES)
        return scatter_eager(alpha.unsqueeze(-1) * xj, dst, NUM_NODES, "sum")

    assert_same_function(ours, eager, xl, xr, att)


def test_opcheck(graph):
    src, dst, plan = graph
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(src.numel(), dtype=torch.float64, requires_grad=True)
    t_w = w.detach()[t_perm]
    key = _register(lambda x_j, x_i: torch.tanh(x_j - x_i))
    torch.library.opcheck(ops.csr_plan.default, (dst, src, NUM_NODES, NUM_NODES))
    torch.library.opcheck(ops.self_loop_csr.default, (rowptr, col, w.detach(), t_rowptr, t_col, t_w))
    torch.library.opcheck(ops.spmm.default, (x, w, t_w, rowptr, col, row, t_rowptr, t_col, [], [], "mean"))
    torch.library.opcheck(ops.gather_scatter.default, ([x, x], [ROLE_SRC, ROLE_DST], *plan[:4], key, "max"))
    s = torch.randn(src.numel(), 2, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(ops.edge_softmax.default, (s, rowptr, row, perm, 1e-16))


@pytest.mark.parametrize("bad, error, match", [
    (lambda s, d: (s, d.clone().fill_(NUM_NODES)), IndexError, "values >= num_nodes"),
    (lambda s, d: (s.clone().fill_(-1), d), IndexError, "negative"),
    (lambda s, d: (s.float(), d), TypeError, "int64 or int32"),
    (lambda s, d: (s[:-1], d), ValueError, "differ in length"),
])
def test_csr_plan_rejects_bad_indices(graph, bad, error, match):
    src, dst, _ = graph
    s, d = bad(src, dst)
    with pytest.raises(error, match=match):
        ops.csr_plan(d, s, NUM_NODES, NUM_NODES)


def test_spmm_rejects_wrong_weight_shape(graph):
    src, dst, (rowptr, col, row, perm, t_rowptr, t_col, t_perm) = graph
    with pytest.raises(ValueError, match="values must have shape"):
        ops.spmm(torch.randn(NUM_NODES, 2), torch.rand(3), torch.rand(3), rowptr, col, row, t_rowptr, t_col, [], [],
                 "sum")


def test_csr_offsets_without_a_sync_match_bincount():
    from gnn_inductor.plan.csr import _offsets

    g = torch.Generator().manual_seed(0)
    for num, edges in ((1, 0), (5, 0), (7, 30), (64, 1000)):
        index = torch.sort(torch.randint(0, num, (edges,), generator=g)).values
        expected = torch.zeros(num + 1, dtype=torch.long)
        expected[1:] = torch.cumsum(torch.bincount(index, minlength=num), 0)
        torch.testing.assert_close(_offsets(index, num), expected)


def test_index_checks_name_each_bad_index_in_one_pass():
    from gnn_inductor.plan.csr import _check_indices

    good, empty = torch.tensor([0, 3, 2]), torch.tensor([], dtype=torch.long)
    _check_indices([("a", good, 4, "n"), ("b", empty, 1, "n")])
    with pytest.raises(IndexError, match=r"b has values >= n \(max 3, n 3\)"):
        _check_indices([("a", good, 4, "n"), ("e", empty, 1, "n"), ("b", good.int(), 3, "n")])
    with pytest.raises(IndexError, match=r"a has negative values \(min -1\)"):
        _check_indices([("a", torch.tensor([-1, 0]), 4, "n"), ("b", good, 3, "n")])
    with pytest.raises(TypeError, match="int64 or int32"):
        _check_indices([("a", good.float(), 4, "n")])


@pytest.mark.parametrize("rows", [0, 3, 511, 512, 513, 100_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_sum_matches_a_float64_sum(rows, dtype):
    """The two-stage bias-gradient sum: every row counted once (remainders past the last full slab included),
    float32 accumulation, [rows, H, C] shapes kept."""
    from gnn_inductor.kernels.runtime.reference import column_sum

    t = torch.randn(rows, 4, 3, generator=torch.Generator().manual_seed(rows)).to(dtype)
    t[rows // 2:rows // 2 + 1] += 1000.0  # one large row: a dropped or doubled row shows
    got = column_sum(t)
    assert got.dtype == torch.float32 and got.shape == (4, 3)
    torch.testing.assert_close(got.double(), t.double().sum(0),
                               **tolerance(torch.float32, "hub_sum", scale=max(1.0, (rows / HUB_TERMS) ** 0.5)))
