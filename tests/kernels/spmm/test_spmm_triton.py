"""The Triton SpMM (kernels/spmm/csr_triton.py) against the CPU reference ``csr_matmul``, and its work items.

The kernel tests run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter:
``TRITON_INTERPRET=1`` only takes effect for kernels defined after it is set, and setting it in the
pytest process would also turn every later Triton kernel (Inductor's included) into an interpreted
one, so the kernel tests (marker ``triton``) run in a pytest process of their own with it set (tests/run.py).
The operator's fake implementation and its decomposition into a kernel call (what Inductor inlines)
are checked without running the kernel, so on any machine.
"""

import pytest
import torch

import gnn_inductor.kernels  # noqa: F401  (registers gnn_io::csr_plan)
from gnn_inductor.kernels.spmm import csr_triton as spmm_triton
from gnn_inductor.kernels.spmm.csr_product import csr_matmul
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan import work_items as work_items_module
from gnn_inductor.plan.work_items import PADDING, WorkItems, padded_item_count, work_items
from gnn_inductor.kernels.spmm.csr_triton import triton_spmm
from gnn_inductor.testing import magnitude, random_graph, tolerance
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from tests.tiers import covering

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
NUM_NODES = 40
HUB_DEGREE = 40
MAX_EDGES = 8  # well below the hub's degree, so the hub is cut into several atomically summed items

runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier
compiled_only = pytest.mark.skipif(INTERPRETED, reason="wrap_triton needs a compiled (not interpreted) kernel")


@pytest.fixture(scope="module")
def plan():
    """CSR (rowptr, col, row) of a graph with a hub, isolated nodes, self loops and duplicates, on CPU."""
    src, dst = random_graph(NUM_NODES, 120, seed=4, hub_degree=HUB_DEGREE, num_isolated=3)
    rowptr, col, row = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:3]
    degree = rowptr[1:] - rowptr[:-1]
    assert degree.max() > 4 * MAX_EDGES and (degree == 0).any() and (degree == 1).any()
    return rowptr, col, row


def reference(x, values, rowptr, col, row, reduce):
    """csr_matmul in float64 on CPU, then the mean's row scale 1 / max(1, deg)."""
    out = csr_matmul(x.double().cpu(), values.double().cpu(), rowptr.cpu(), col.cpu(), row.cpu())
    if reduce == "mean":
        degree = (rowptr[1:] - rowptr[:-1]).clamp(min=1).cpu().double()
        out = out / degree.view(-1, *([1] * (x.dim() - 1)))
    return out


def assert_close(actual, expected, dtype):
    assert actual.dtype == dtype
    assert torch.isfinite(actual).all()
    expected = expected.to(dtype).float()
    torch.testing.assert_close(actual.float().cpu(), expected, **tolerance(dtype, scale=magnitude(expected)))


def inputs(plan, index_dtype, feature_shape, dtype=torch.float32, seed=0):
    rowptr, col, row = plan
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_NODES, *feature_shape, generator=generator).to(dtype)
    values = torch.rand(col.numel(), generator=generator) * 2 - 0.5
    return [t.to(DEVICE) for t in (x, values, rowptr.to(index_dtype), col.to(index_dtype), row)]


# ---- work items (pure torch, every machine) ----

@pytest.mark.parametrize("max_edges", [1, MAX_EDGES, 1000])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_work_items_cover_every_entry_once(plan, max_edges, index_dtype):
    rowptr = plan[0].to(index_dtype)
    items = work_items(rowptr, max_edges)
    assert [t.dtype for t in items] == [torch.int32, torch.int32, torch.int32, torch.int8]
    row, start, end, shared = (t.long() for t in items)
    sizes = end - start
    assert (sizes >= 1).all() and (sizes <= max_edges).all()
    assert (rowptr[row] <= start).all() and (end <= rowptr[row + 1]).all()
    assert (row[1:] >= row[:-1]).all(), "items must come in row order"
    covered = torch.zeros(int(rowptr[-1]), dtype=torch.long)
    for s, e in zip(start.tolist(), end.tolist()):
        covered[s:e] += 1
    assert (covered == 1).all()
    degree = (rowptr[1:] - rowptr[:-1]).long()
    items_per_row = torch.bincount(row, minlength=degree.numel())
    assert torch.equal(items_per_row, (degree + max_edges - 1) // max_edges)
    assert torch.equal(shared.bool(), items_per_row[row] > 1)


def test_work_items_split_only_heavy_rows(plan):
    rowptr = plan[0]
    items = work_items(rowptr, MAX_EDGES)
    degree = rowptr[1:] - rowptr[:-1]
    heavy = (degree > MAX_EDGES).nonzero().flatten()
    assert heavy.numel() > 0
    shared_rows = items.row[items.shared.bool()].long().unique()
    assert torch.equal(shared_rows, heavy)


def test_work_items_of_a_graph_without_edges():
    items = work_items(torch.zeros(6, dtype=torch.long), MAX_EDGES)
    assert all(t.numel() == 0 for t in items)


def test_work_items_rejects_bad_max_edges(plan):
    with pytest.raises(ValueError, match="max_edges must be at least 1"):
        work_items(plan[0], 0)


# ---- the kernel (CUDA, or the interpreter on CPU) ----

@runs_kernel
# the default tier: each value of each axis once (two cases of the sixteen)
@pytest.mark.parametrize("index_dtype, reduce, feature_shape, tiles", covering(
    [torch.int32, torch.int64], ["sum", "mean"], [(20,), (3, 5)], [dict(block_e=4, block_f=16), dict()]))
def test_matches_csr_matmul(plan, index_dtype, reduce, feature_shape, tiles):
    # multi-block: two blocks of entries per full item; F=20 with BLOCK_F=16 a full and a masked feature block
    x, values, rowptr, col, row = inputs(plan, index_dtype, feature_shape)
    out = triton_spmm(x, values, rowptr, col, work_items(rowptr, MAX_EDGES), reduce, **tiles)
    assert out.shape == (NUM_NODES, *feature_shape) and out.device == x.device
    assert_close(out, reference(x, values, rowptr, col, row, reduce), torch.float32)


def test_padded_plan_items_cover_every_entry_once(plan):
    """The op form pads to a size-only bound with skipped items; the real items are work_items'."""
    rowptr, col, _ = plan
    row, start, end, shared = torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES)
    assert row.numel() == padded_item_count(rowptr.numel() - 1, col.numel(), MAX_EDGES)
    real = shared != PADDING
    unpadded = work_items(rowptr, MAX_EDGES)
    assert torch.equal(row[real], unpadded.row) and torch.equal(start[real], unpadded.start)
    assert torch.equal(end[real], unpadded.end) and torch.equal(shared[real], unpadded.shared)
    assert bool((start[~real] == end[~real]).all())


@runs_kernel
def test_padding_items_write_nothing(plan):
    x, values, rowptr, col, row = inputs(plan, torch.int32, (20,))
    items = WorkItems(*torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES))
    assert bool((items.shared == PADDING).any())
    assert_close(triton_spmm(x, values, rowptr, col, items, "sum"),
                 reference(x, values, rowptr, col, row, "sum"), torch.float32)


@runs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_precision_accumulates_in_float32(plan, dtype):
    x, values, rowptr, col, row = inputs(plan, torch.int32, (12,), dtype)
    out = triton_spmm(x, values.to(dtype), rowptr, col, work_items(rowptr, MAX_EDGES), "mean", block_e=4)
    assert_close(out, reference(x, values.to(dtype), rowptr, col, row, "mean"), dtype)


@runs_kernel
def test_rectangular_strided_and_empty():
    # 5 rows reading a 9-row x through a feature stride of 2; rows 0 and 3 are empty
    rowptr = torch.tensor([0, 0, 3, 12, 12, 14], device=DEVICE)
    col = torch.tensor([8, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, 8, 0, 0], device=DEVICE)
    row = torch.repeat_interleave(torch.arange(5, device=DEVICE), rowptr[1:] - rowptr[:-1])
    x = torch.randn(9, 14, device=DEVICE)[:, ::2]
    values = torch.rand(14, device=DEVICE)
    out = triton_spmm(x, values, rowptr, col, work_items(rowptr, 4), "sum", block_e=2, block_f=4)
    assert_close(out, reference(x, values, rowptr, col, row, "sum"), torch.float32)

    no_edges = torch.zeros(4, dtype=torch.long, device=DEVICE)
    empty_index = torch.zeros(0, dtype=torch.long, device=DEVICE)
    out = triton_spmm(x, values[:0], no_edges, empty_index, work_items(no_edges, 4), "mean")
    assert out.shape == (3, 7) and not out.any()


@runs_kernel
def test_rejects_unsupported_inputs(plan):
    x, values, rowptr, col, _ = inputs(plan, torch.int64, (4,))
    items = work_items(rowptr, MAX_EDGES)
    with pytest.raises(ValueError, match="spmm supports reduce"):
        triton_spmm(x, values, rowptr, col, items, "max")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        triton_spmm(x.double(), values, rowptr, col, items)
    with pytest.raises(ValueError, match="one per CSR entry"):
        triton_spmm(x, values[1:], rowptr, col, items)


@runs_kernel
@compiled_only
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_operator_matches_launcher_and_opcheck(plan, reduce):
    x, values, rowptr, col, _ = inputs(plan, torch.int32, (3, 5))
    items = work_items(rowptr, MAX_EDGES)
    args = (x, values, rowptr, col, *items, reduce)
    torch.testing.assert_close(torch.ops.gnn_io.spmm_csr_triton(*args), triton_spmm(x, values, rowptr, col, items,
                                                                                     reduce))
    torch.library.opcheck(torch.ops.gnn_io.spmm_csr_triton, args)


# ---- the operator's fake implementation and decomposition (no kernel runs) ----

@compiled_only
def test_operator_fake_shapes(plan):
    from torch._subclasses.fake_tensor import FakeTensorMode

    rowptr, col, _ = plan
    items = work_items(rowptr, MAX_EDGES)
    x = torch.randn(NUM_NODES, 3, 5, dtype=torch.bfloat16)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (x, torch.rand(col.numel()), rowptr, col, *items)]
        out = torch.ops.gnn_io.spmm_csr_triton(*fake, "mean")
    assert out.shape == (NUM_NODES, 3, 5) and out.dtype == torch.bfloat16


@compiled_only
def test_operator_decomposes_into_the_kernel_launch(plan):
    """Under functionalization (what AOTAutograd does before Inductor) the op becomes a call of
    the Triton kernel, which Inductor can schedule and inline."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.functional_tensor import dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    rowptr, col, _ = plan
    items = work_items(rowptr, MAX_EDGES)

    def spmm(x, values, rowptr, col, *items):
        return torch.ops.gnn_io.spmm_csr_triton(x, values, rowptr, col, *items, "sum")

    graph = make_fx(dispatch_functionalize(spmm), tracing_mode="fake")(
        torch.randn(NUM_NODES, 8), torch.rand(col.numel()), rowptr, col, *items)
    launches = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    assert len(launches) == 1
    kernel = kernel_side_table.get_kernel(launches[0].kwargs["kernel_idx"])
    # a launch with num_warps is recorded as a one-config autotuner around the kernel
    assert getattr(kernel, "fn", None) is spmm_triton._spmm_kernel or kernel is spmm_triton._spmm_kernel
    assert not any(n.target is torch.ops.gnn_io.spmm_csr_triton.default for n in graph.graph.nodes)


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(spmm_triton._spmm_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.spmm.csr_triton is imported"


@pytest.mark.triton
@pytest.mark.parametrize("listed", [False, True], ids=["scanned", "listed"])
@pytest.mark.parametrize("above", [0, 2])
def test_zero_rows_without_entries_writes_those_rows_only(above, listed):
    """0 in the rows whose CSR row is empty (first, middle, last), and with ``above`` those of more entries, every
    other element untouched; rows of several features and of several blocks of them; the rows scanned by the
    kernel or listed once (``rows_to_fill``)."""
    from gnn_inductor.plan.work_items import rows_to_fill
    from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries

    if not INTERPRETED and not torch.cuda.is_available():
        pytest.skip("no GPU: the interpreter tier runs it")
    rowptr = torch.tensor([0, 0, 2, 2, 5, 5], device=DEVICE)
    wanted = torch.tensor([True, False, True, above == 2, True], device=DEVICE)
    rows = rows_to_fill(rowptr, above) if listed else None
    if listed:
        assert rows.dtype == torch.int32 and torch.equal(rows, torch.nonzero(wanted).flatten().int())
    for shape in ((5, 3), (5, 4, 70)):
        out = torch.full(shape, float("nan"), device=DEVICE)
        zero_rows_without_entries(out, rowptr, above, rows=rows)
        assert not out[wanted].isnan().any() and not out[wanted].any()
        assert out[~wanted].isnan().all()


def test_zero_rows_without_entries_launches_nothing_for_an_empty_list():
    """A plan whose every row has entries (self loops) lists no row: nothing runs, nothing is written (no kernel
    is needed to check it: the output is on the CPU, where a launch would fail)."""
    from gnn_inductor.plan.work_items import rows_to_fill
    from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries

    rowptr = torch.tensor([0, 1, 3, 4])
    rows = rows_to_fill(rowptr)
    assert rows.numel() == 0
    out = torch.full((3, 4), float("nan"))
    zero_rows_without_entries(out, rowptr, rows=rows)
    assert out.isnan().all()


def test_the_item_op_lists_the_rows_to_fill(plan):
    """``gnn_io::work_items`` remembers, for its items, the rows without entries (``above`` 0) and those plus
    the hub rows (``above`` = its split); items made elsewhere list nothing."""
    rowptr, col, _ = plan
    items = list(torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES))
    degree = rowptr.diff()
    assert int((degree > MAX_EDGES).sum()) > 0 and int((degree == 0).sum()) > 0  # both kinds of row are listed
    expected = {0: degree == 0, MAX_EDGES: (degree == 0) | (degree > MAX_EDGES)}
    for above, wanted in expected.items():
        listed = work_items_module.listed_fill_rows(items, above)
        assert listed.dtype == torch.int32 and torch.equal(listed, torch.nonzero(wanted).flatten().int())
    assert work_items_module.listed_fill_rows(items, 1 + MAX_EDGES) is None
    assert work_items_module.listed_fill_rows([t.clone() for t in items]) is None


def test_items_memo_builds_once_per_plan_items_and_goes_with_them(plan):
    import gc

    rowptr, col, _ = plan
    items = list(torch.ops.gnn_io.work_items(rowptr, col, MAX_EDGES))  # the plan's: hub count remembered
    built = []

    def build():
        built.append(1)
        return torch.arange(len(built))

    first = work_items_module.items_memo(items, "slots", build)
    assert work_items_module.items_memo(items, "slots", build) is first and len(built) == 1
    work_items_module.items_memo(items, ("slots", 2), build)  # another key: built again
    assert len(built) == 2
    copy = [t.clone() for t in items]  # items made elsewhere: no known hub count, built at every call
    work_items_module.items_memo(copy, "slots", build)
    work_items_module.items_memo(copy, "slots", build)
    assert len(built) == 4
    key = graph_state.key_of([items[3]])
    del items
    gc.collect()
    assert key not in graph_state._STATES  # the memo went with the items
