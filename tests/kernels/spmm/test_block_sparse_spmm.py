"""The block-sparse SpMM (kernels/spmm/block_sparse.py) against the float64 CPU reference of gnn_io::spmm: the
output, the features' gradient and the values' gradient, in fp32 (IEEE), TF32 and bf16.

The kernels run on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py). Triton 3.6's
interpreter multiplies bf16 ``tl.dot`` operands as their raw 16-bit patterns and ignores
``input_precision="tf32"``, so under it ``tl.dot`` is patched to round its operands as Tensor Cores do (bf16
widened exactly, fp32 rounded to TF32's 10 mantissa bits when asked) before the float32 product: the bf16 and
TF32 cases then check the kernels' precision contract on CPU too, and the IEEE case that no TF32 slips in.
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import numpy as np
import pytest
import torch
from gnn_inductor.kernels.spmm import block_sparse as block_sparse_spmm
from gnn_inductor.plan.block_format import BlockFormat, build_block_format, transpose_block_format
from gnn_inductor.kernels.spmm.block_sparse import (
    MAX_BLOCK_F,
    BlockSparseSpmm,
    block_spmm_backward,
    block_spmm_forward,
    dense_rows,
    values_by_edge_id,
)

from gnn_inductor.testing import magnitude, tolerance
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from tests.kernels.attention.test_block_sparse import dense_rows_of, graph

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
NUM_NODES = 40

# (dtype, kind) of gnn_inductor.testing.TOLERANCE_TABLE against float64, by dot precision (atol per unit of
# max |reference|)
TOLERANCE = {"fp32": (torch.float32, "default"), "tf32": (torch.float32, "tf32"),
             "bf16": (torch.bfloat16, "default")}

runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


@pytest.fixture(autouse=True, scope="module")
def tensor_core_rounding():
    """Under the interpreter, ``tl.dot`` rounds its operands as on the GPU (module docstring)."""
    if not INTERPRETED:
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot
    tf32 = interpreter._ir.INPUT_PRECISION.TF32

    def as_float32(handle, round_to_tf32):
        if handle.dtype.scalar == tl.bfloat16:  # held as uint16 bit patterns: the high half of a float32
            return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        if handle.dtype.scalar == tl.float32 and round_to_tf32:  # to nearest, ties away, as cvt.rna.tf32.f32
            bits = (handle.data.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (as_float32(h, input_precision == tf32) for h in (a, b))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
        yield


def assert_matches(actual, expected, precision, what):
    """``actual`` within ``TOLERANCE[precision]`` of the float64 ``expected``; a NaN or inf never passes."""
    dtype, kind = TOLERANCE[precision]
    actual = actual.detach().cpu().double()
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    torch.testing.assert_close(actual, expected.double(), **tolerance(dtype, kind, scale=magnitude(expected)),
                               msg=lambda m: f"{what} ({precision}): {m}")


def on_device(blocks):
    return BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in blocks])


def gcn_values(src, dst, num_nodes):
    """GCN's ``1 / sqrt(deg_i deg_j)`` per edge id (in-degree, at least 1)."""
    degree = torch.bincount(dst, minlength=num_nodes).clamp(min=1).float()
    return (degree[dst] * degree[src]).rsqrt()


# name -> graph and layer: a hub row (a window over several tiles), duplicate edges (windows left to the caller),
# node orders for both formats, extra sources (num_src != num_dst), feature shapes over one, two and several dims
CASES = {
    "hub": {"hub_degree": 30, "reduce": "sum", "values": "random", "features": (24,)},
    "duplicates": {"duplicates": 2, "reduce": "mean", "values": "gcn", "features": (24,)},
    "order": {"ordered": True, "reduce": "sum", "values": "gcn", "features": (3, 8)},
    "wide": {"extra_sources": 9, "reduce": "mean", "values": "random", "features": (MAX_BLOCK_F + 8,)},
}


def layer_inputs(case, dtype, seed=0):
    """Graph, formats and inputs of a case: ``(spec, plan, blocks, transposed, x, csr_values, row_scale,
    grad_y)``, ``csr_values`` float32 in CSR order."""
    spec = CASES[case]
    src, dst = graph(NUM_NODES, 100, seed=seed, hub_degree=spec.get("hub_degree", 0),
                     duplicates=spec.get("duplicates", 0))
    num_src = NUM_NODES + spec.get("extra_sources", 0)
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, num_src)
    rowptr, col, perm = plan[0], plan[1], plan[3]
    generator = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(NUM_NODES, generator=generator) if spec.get("ordered") else None
    source_order = torch.randperm(num_src, generator=generator) if spec.get("ordered") else None
    blocks = build_block_format(rowptr, col, perm, num_src, order)
    transposed = transpose_block_format(blocks, num_src, source_order)

    x = torch.randn(num_src, *spec["features"], generator=generator).to(dtype)
    by_edge_id = gcn_values(src, dst, NUM_NODES) if spec["values"] == "gcn" else \
        torch.randn(src.numel(), generator=generator)
    degree = (rowptr[1:] - rowptr[:-1]).clamp(min=1).float()
    row_scale = 1 / degree if spec["reduce"] == "mean" else None
    grad_y = torch.randn(NUM_NODES, *spec["features"], generator=generator).to(dtype)
    return spec, plan, blocks, transposed, x, by_edge_id[perm.long()], row_scale, grad_y


def reference(x, csr_values, plan, reduce, grad_y):
    """float64 ``gnn_io::spmm`` on CPU: ``(Y, dX, da in CSR order)`` for the output gradient ``grad_y``."""
    rowptr, col, row, _, t_rowptr, t_col, t_perm = plan
    x = x.detach().double().requires_grad_()
    values = csr_values.detach().double().requires_grad_()
    out = torch.ops.gnn_io.spmm(x, values, values.detach()[t_perm], rowptr, col, row, t_rowptr, t_col, [], [],
                                reduce)
    out.backward(grad_y.double())
    return out.detach(), x.grad, values.grad


@runs_kernel
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_reference(case, precision):
    # Y on the rows of dense_ok windows (0 on the others, left to the caller), dX and da against the float64
    # reference whose output gradient is zero on the rows left to the caller (those edges are the CSR path's)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    spec, plan, blocks, transposed, x, csr_values, row_scale, grad_y = layer_inputs(case, dtype)
    rowptr, perm = plan[0], plan[3]
    dense = dense_rows(blocks, NUM_NODES)

    x_leaf = x.to(DEVICE, copy=True).requires_grad_()
    values_leaf = csr_values.to(DEVICE, copy=True).requires_grad_()
    out = BlockSparseSpmm.apply(x_leaf, values_by_edge_id(values_leaf, perm.to(DEVICE)), on_device(blocks),
                                on_device(transposed), NUM_NODES, precision == "tf32",
                                None if row_scale is None else row_scale.to(DEVICE))
    out.backward(grad_y.to(DEVICE))
    wide_dense = dense.view(-1, *([1] * len(spec["features"])))
    ref_out, ref_grad_x, ref_grad_values = reference(x, csr_values, plan, spec["reduce"], grad_y * wide_dense)

    assert out.dtype == x_leaf.grad.dtype == dtype and values_leaf.grad.dtype == torch.float32
    assert out.shape == ref_out.shape and x_leaf.grad.shape == x.shape
    assert_matches(out[dense.to(DEVICE)], ref_out[dense], precision, "Y")
    assert not out.cpu()[~dense].any(), "rows of windows that are not dense_ok are the caller's"
    assert_matches(x_leaf.grad, ref_grad_x, precision, "dX")
    assert_matches(values_leaf.grad, ref_grad_values, precision, "da")

    # what each case is there for
    degree = rowptr[1:] - rowptr[:-1]
    assert (degree == 0).any() and not out.cpu()[degree == 0].any(), "isolated rows are 0"
    assert ref_grad_values.abs().max() > 0.1 and ref_grad_x.abs().max() > 0.1
    if case == "duplicates":
        assert not dense.all() and dense.any()
    else:
        assert dense.all()
    if case == "hub":
        assert int((blocks.tile_ptr[1:] - blocks.tile_ptr[:-1]).max()) > 1
        assert int((transposed.tile_ptr[1:] - transposed.tile_ptr[:-1]).max()) > 1


@runs_kernel
def test_non_finite_features_spread_within_windows():
    # a NaN feature of source j reaches every row of each dense window whose tiles hold column j (0 * NaN in the
    # dot), its true neighbours included; every other row is exact
    _, plan, blocks, _, x, csr_values, _, _ = layer_inputs("duplicates", torch.float32)
    source = int(plan[1][0])
    x[source, 0] = float("nan")
    out = block_spmm_forward(x.to(DEVICE), values_by_edge_id(csr_values, plan[3]).to(DEVICE), on_device(blocks),
                             NUM_NODES, False).cpu()
    ref_out = reference(x, csr_values, plan, "sum", torch.zeros(NUM_NODES, 24))[0]

    windows = blocks.tile_window[(blocks.tile_col == source).any(1)].long()
    holding = torch.zeros(NUM_NODES, dtype=torch.bool)
    rows = blocks.window_rows[windows[blocks.dense_ok[windows]]].flatten().long()
    holding[rows[rows >= 0]] = True
    dense = dense_rows(blocks, NUM_NODES)
    assert torch.equal(out[:, 0].isnan(), holding)
    neighbours = ref_out[:, 0].isnan() & dense
    assert not (neighbours & ~holding).any() and (holding & ~neighbours).any()
    assert_matches(out[:, 1:][dense], ref_out[:, 1:][dense], "fp32", "Y off the NaN column")
    assert_matches(out[:, 0][dense & ~holding], ref_out[:, 0][dense & ~holding], "fp32", "Y of other windows")


@runs_kernel
def test_backward_computes_only_what_is_needed():
    _, plan, blocks, transposed, x, csr_values, _, grad_y = layer_inputs("hub", torch.float32)
    args = [t.to(DEVICE) for t in (grad_y, x, values_by_edge_id(csr_values, plan[3]))]
    formats = on_device(blocks), on_device(transposed)
    grad_x, grad_values = block_spmm_backward(*args, *formats, x.shape[0], False)
    assert grad_x.shape == x.shape and grad_values is None
    grad_x, grad_values = block_spmm_backward(*args, *formats, x.shape[0], False, need_values_grad=True,
                                              need_x_grad=False)
    assert grad_x is None and grad_values.shape == csr_values.shape

    # through autograd: features that need no gradient get none
    values_leaf = args[2].clone().requires_grad_()
    BlockSparseSpmm.apply(args[1], values_leaf, *formats, NUM_NODES, False, None).backward(args[0])
    torch.testing.assert_close(values_leaf.grad, grad_values)


@runs_kernel
@pytest.mark.parametrize("num_nodes", [0, 5])
def test_graph_without_edges(num_nodes):
    empty = torch.zeros(0, dtype=torch.long)
    rowptr, col, _, perm = torch.ops.gnn_io.csr_plan(empty, empty, num_nodes, num_nodes)[:4]
    blocks = build_block_format(rowptr, col, perm, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    x = torch.randn(num_nodes, 20, device=DEVICE, requires_grad=True)
    values = torch.zeros(0, device=DEVICE, requires_grad=True)
    out = BlockSparseSpmm.apply(x, values, on_device(blocks), on_device(transposed), num_nodes, False, None)
    out.backward(torch.ones_like(out))
    assert out.shape == (num_nodes, 20) and not out.any() and not x.grad.any() and values.grad.shape == (0,)


# ---- indexing helpers and the check itself (CPU) ----

def test_values_by_edge_id_follows_the_format():
    # each cell reads the value of its own edge: tile_edge holds original edge ids, the mapped values follow them
    src, dst = graph(NUM_NODES, 100, seed=3, hub_degree=20)
    rowptr, col, _, perm = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:4]
    blocks = build_block_format(rowptr, col, perm, NUM_NODES)
    by_edge_id = (dst * NUM_NODES + src).float()  # (dst, src) pairs are distinct here
    csr_values = by_edge_id[perm]
    mapped = values_by_edge_id(csr_values, perm)
    assert torch.equal(mapped, by_edge_id) and torch.equal(mapped[perm], csr_values)
    tiles, slots, lanes = torch.nonzero(blocks.tile_edge >= 0, as_tuple=True)
    cell_dst = blocks.window_rows[blocks.tile_window[tiles].long(), slots].long()
    cell_src = blocks.tile_col[tiles, lanes].long()
    assert torch.equal(mapped[blocks.tile_edge[tiles, slots, lanes].long()], (cell_dst * NUM_NODES + cell_src).float())


@pytest.mark.parametrize("ordered", [False, True], ids=["identity", "order"])
def test_dense_rows(ordered):
    src, dst = graph(NUM_NODES, 100, seed=6, duplicates=3)
    rowptr, col, _, perm = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)[:4]
    order = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(2)) if ordered else None
    blocks = build_block_format(rowptr, col, perm, NUM_NODES, order)
    mask = dense_rows(blocks, NUM_NODES)
    assert torch.equal(mask, dense_rows_of(blocks, NUM_NODES)) and mask.any() and not mask.all()


def test_check_rejects_non_finite():
    expected = torch.ones(4, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        actual = expected.clone()
        actual[2] = bad
        with pytest.raises(AssertionError, match="non-finite"):
            assert_matches(actual, expected, "bf16", "Y")
    with pytest.raises(AssertionError):
        assert_matches(expected + 0.1, expected, "bf16", "Y")


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(block_sparse_spmm._block_spmm_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.spmm.block_sparse is imported"

