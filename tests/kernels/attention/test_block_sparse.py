"""The block format (kernels/attention/block_dot.py) exactly, and the block-sparse dot-product forward against the
CPU reference of gnn_io::attention.

Format tests run on CPU everywhere. The kernel runs on CUDA when there is a GPU, and on CPU tensors under
Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py).
"""

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.plan import block_format
import pytest
import torch
from gnn_inductor.kernels.attention import block_dot as block_sparse
from gnn_inductor.kernels.attention import csr_delta
from gnn_inductor.kernels.runtime import rng
from gnn_inductor.kernels.runtime.roles import ROLE_DST, ROLE_SRC
from gnn_inductor.kernels.attention.op import reference_with_lse, attention_reference
from gnn_inductor.plan.block_format import TILE, WINDOW, build_block_format, transpose_block_format
from gnn_inductor.kernels.attention.block_dot import BlockSparseDotAttention, dot_backward, dot_forward

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.testing import magnitude, random_graph, tolerance
from tests.tiers import INTERPRETED, KERNEL_DEVICE as DEVICE, covering, runs_kernel, tiered

HEADS, CHANNELS = 2, 4
EPS = 1e-16
DROPOUT = rng.Dropout(torch.tensor(1234567), 0.3)  # attention dropout: the mask regenerated from the seed
aten = torch.ops.aten



def graph(num_nodes, num_edges, *, seed=0, duplicates=0, hub_degree=0, num_isolated=3):
    """A random graph (hub, isolated nodes, self loops) whose (dst, src) pairs are distinct except for the first
    ``duplicates`` edges, repeated once each (random_graph's pairs may repeat by chance: those are removed)."""
    src, dst = random_graph(num_nodes, num_edges, seed=seed, hub_degree=hub_degree, num_isolated=num_isolated,
                            duplicates=0)
    keys = torch.unique(dst * num_nodes + src)
    keys = keys[torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(seed))]
    keys = torch.cat([keys, keys[:duplicates]])
    return keys % num_nodes, keys // num_nodes


def plan_and_blocks(src, dst, num_nodes, order=None):
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    return plan, build_block_format(plan[0], plan[1], plan[3], num_nodes, order)


def decoded_cells(blocks):
    """(window, dst, src, edge id) of every cell holding an edge."""
    tiles, slots, lanes = torch.nonzero(blocks.tile_edge >= 0, as_tuple=True)
    windows = blocks.tile_window[tiles].long()
    return (windows, blocks.window_rows[windows, slots].long(), blocks.tile_col[tiles, lanes].long(),
            blocks.tile_edge[tiles, slots, lanes].long())


def dense_rows_of(blocks, num_nodes):
    """Rows of the windows with dense_ok (those the block-sparse kernels compute)."""
    rows = blocks.window_rows[blocks.dense_ok].flatten()
    dense = torch.zeros(num_nodes, dtype=torch.bool)
    dense[rows[rows >= 0].long()] = True
    return dense


def check_format(src, dst, num_nodes, blocks, order):
    num_windows = -(-num_nodes // WINDOW)
    order = torch.arange(num_nodes) if order is None else order
    assert blocks.window_rows.shape == (num_windows, WINDOW)
    assert torch.equal(blocks.window_rows.flatten()[:num_nodes].long(), order)
    assert (blocks.window_rows.flatten()[num_nodes:] == -1).all()
    window_of_row = torch.empty(num_nodes, dtype=torch.long)
    window_of_row[order] = torch.arange(num_nodes) // WINDOW

    # tiles: the window's distinct source columns, sorted, padding only at the end of its last tile
    assert blocks.tile_ptr[0] == 0 and (blocks.tile_ptr[1:] >= blocks.tile_ptr[:-1]).all()
    for w in range(num_windows):
        in_window = window_of_row[dst] == w
        expected = torch.unique(src[in_window])
        cols = blocks.tile_col[blocks.tile_ptr[w]:blocks.tile_ptr[w + 1]].flatten().long()
        assert torch.equal(cols[cols >= 0], expected), f"window {w}"
        assert cols.numel() == -(-expected.numel() // TILE) * TILE and (cols[expected.numel():] == -1).all()
        assert (blocks.tile_window[blocks.tile_ptr[w]:blocks.tile_ptr[w + 1]] == w).all()

    # cells: each holds a real edge of its row and column; each (dst, src) pair in exactly one cell
    windows, cell_dst, cell_src, cell_eid = decoded_cells(blocks)
    assert torch.equal(dst[cell_eid], cell_dst) and torch.equal(src[cell_eid], cell_src)
    assert torch.equal(window_of_row[cell_dst], windows)
    pairs = torch.unique(dst * num_nodes + src)
    assert torch.equal(torch.sort(cell_dst * num_nodes + cell_src).values, pairs)

    # dense_ok exactly where no pair repeats; there every edge sits in exactly one cell
    counts = torch.bincount(dst * num_nodes + src, minlength=num_nodes * num_nodes)
    duplicated_windows = set(window_of_row[torch.nonzero(counts > 1).flatten() // num_nodes].tolist())
    assert blocks.dense_ok.tolist() == [w not in duplicated_windows for w in range(num_windows)]
    assert torch.equal(blocks.dense_windows.long(), torch.nonzero(blocks.dense_ok).flatten())
    dense_edges = torch.nonzero(blocks.dense_ok[window_of_row[dst]]).flatten()
    dense_cells = cell_eid[blocks.dense_ok[windows]]
    assert torch.equal(torch.sort(dense_cells).values, dense_edges)

    tiles = int(blocks.tile_ptr[-1])
    assert blocks.stats["tiles"] == tiles == blocks.tile_col.shape[0] == blocks.tile_edge.shape[0]
    assert blocks.stats["mean_tile_fill"] == (round(src.numel() / (tiles * WINDOW * TILE), 4) if tiles else 0.0)
    assert blocks.stats["duplicate_window_fraction"] == \
        (round(len(duplicated_windows) / num_windows, 4) if num_windows else 0.0)


# ---- the block format (CPU) ----

@pytest.mark.parametrize("ordered", [False, True], ids=["identity", "order"])
@pytest.mark.parametrize("case", ["plain", "hub", "duplicates", "dense"])
def test_format_round_trip(case, ordered):
    # 50 nodes: a partial last window; hub 0 has more than one tile of columns; isolated nodes and self loops
    num_nodes = 50
    kwargs = {"plain": {"num_edges": 120}, "hub": {"num_edges": 120, "hub_degree": 40},
              "duplicates": {"num_edges": 120, "duplicates": 4}, "dense": {"num_edges": 1500}}[case]
    src, dst = graph(num_nodes, seed=1, **kwargs)
    order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(5)) if ordered else None
    _, blocks = plan_and_blocks(src, dst, num_nodes, order)
    check_format(src, dst, num_nodes, blocks, order)
    if case == "hub":
        assert int((blocks.tile_ptr[1:] - blocks.tile_ptr[:-1]).max()) > 1
    if case == "duplicates":
        assert not blocks.dense_ok.all() and blocks.stats["duplicate_window_fraction"] > 0
    else:
        assert blocks.dense_ok.all()


def test_format_of_self_loops_only():
    src = dst = torch.arange(20)
    _, blocks = plan_and_blocks(src, dst, 20)
    check_format(src, dst, 20, blocks, None)
    assert blocks.stats["tiles"] == 2  # one tile per window: its 16 (then 4) diagonal columns


@pytest.mark.parametrize("num_nodes", [0, 5])
def test_format_of_graph_without_edges(num_nodes):
    src = dst = torch.zeros(0, dtype=torch.long)
    _, blocks = plan_and_blocks(src, dst, num_nodes)
    check_format(src, dst, num_nodes, blocks, None)
    assert blocks.stats["tiles"] == 0 and blocks.tile_edge.shape == (0, WINDOW, TILE)


def test_which_formats_cover_every_row():
    # the kernels' outputs skip the zero fill only where every row is written: all windows dense_ok
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=2)
    _, blocks = plan_and_blocks(src, dst, num_nodes)
    assert blocks.dense_ok.all() and block_format.covers_every_row(blocks, num_nodes)
    chosen = blocks.dense_ok.clone()
    chosen[0] = False
    restricted = blocks._replace(dense_ok=chosen, dense_windows=torch.nonzero(chosen).flatten().to(torch.int32))
    assert not block_format.covers_every_row(restricted, num_nodes)
    assert block_format.covers_every_row(transpose_block_format(restricted, num_nodes), num_nodes)
    # a format of fewer rows whose padded windows would reach num_nodes: those rows are not written
    assert num_nodes % block_format.WINDOW and not block_format.covers_every_row(blocks, num_nodes + 1)
    src, dst = graph(num_nodes, 100, seed=2, duplicates=2)  # duplicate pairs: their windows go to CSR
    _, blocks = plan_and_blocks(src, dst, num_nodes)
    assert not block_format.covers_every_row(blocks, num_nodes)


def test_order_must_cover_the_rows():
    plan = torch.ops.gnn_io.csr_plan(torch.tensor([0, 1]), torch.tensor([1, 0]), 3, 3)
    with pytest.raises(ValueError, match="each of the 3 destination rows"):
        build_block_format(plan[0], plan[1], plan[3], 3, torch.tensor([0, 1]))


@pytest.mark.parametrize("ordered", [False, True], ids=["identity", "order"])
def test_transposed_format_holds_the_dense_edges(ordered):
    # windows of source nodes whose tiles' columns are destination rows: exactly the edges of dense_ok windows
    num_nodes = 50
    src, dst = graph(num_nodes, 150, seed=3, hub_degree=40, duplicates=3)
    _, blocks = plan_and_blocks(src, dst, num_nodes)
    assert not blocks.dense_ok.all()
    order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(7)) if ordered else None
    transposed = transpose_block_format(blocks, num_nodes, order)
    windows, _, _, cell_eid = decoded_cells(blocks)
    dense = blocks.dense_ok[windows]
    _, t_src, t_dst, t_eid = decoded_cells(transposed)
    assert torch.equal(torch.sort(t_eid).values, torch.sort(cell_eid[dense]).values)
    assert torch.equal(src[t_eid], t_src) and torch.equal(dst[t_eid], t_dst)
    assert transposed.dense_ok.all()
    # exactly the format of A^T over the kept edges, their ids renumbered to index the kept edge list
    kept = torch.sort(cell_eid[dense]).values
    position = torch.full((src.numel(),), -1, dtype=torch.long)
    position[kept] = torch.arange(kept.numel())
    renumbered = torch.where(transposed.tile_edge >= 0, position[transposed.tile_edge.long().clamp(min=0)], -1)
    check_format(dst[kept], src[kept], num_nodes, transposed._replace(tile_edge=renumbered), order)


# ---- the dot-product forward (CUDA, or the interpreter on CPU) ----

def _fn(f):
    return edge_functions.register(torch.fx.symbolic_trace(f))


# TransformerConv's edge functions as the backend cuts them (tests/kernels/attention/cases.py)
def _dot_score(a0, a1, a2):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0)


def _dot_message_of(heads):
    def _dot_message(alpha, a0, a1, a2):
        return aten.mul.Tensor(a0, aten.view.default(alpha, [-1, heads, 1]))
    return _dot_message


def dot_inputs(num_nodes, dropout, dtype, seed=0, heads=HEADS):
    """``(args, roles, score, message, dropout)`` of TransformerConv without edge features; ``dropout`` is
    :data:`DROPOUT` (on CPU) or None."""
    generator = torch.Generator().manual_seed(seed)
    args = [torch.randn(num_nodes, heads, CHANNELS, generator=generator) for _ in range(3)]  # value, query, key
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC]
    return ([a.to(dtype) for a in args], roles, _fn(_dot_score), _fn(_dot_message_of(heads)),
            DROPOUT if dropout else None)


DOT_KERNELS = ("dot_forward", "dot_query", "dot_source")


@pytest.fixture(params=[1, "all"], ids=["head_per_program", "all_heads"])
def heads_per_program(request, monkeypatch):
    """Runs the dot kernels with one program per head and with every head in one program (batched dots)."""
    for name in DOT_KERNELS:
        for key in (name, f"{name}:fp32"):  # half and float32 inputs' entries
            entry = block_sparse.BLOCK_LAUNCH.get(key, block_sparse.BLOCK_LAUNCH[name])
            monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, key, {**entry, "heads": request.param})
    return request.param


def dropout_on(dropout, device):
    return None if dropout is None else dropout._replace(seed=dropout.seed.to(device))


@runs_kernel
@pytest.mark.parametrize("dtype", [
    torch.float32, torch.float16,
    # Triton 3.6's interpreter returns garbage for a bf16 tl.dot (fp16 is right): bf16 is checked on CUDA only
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(INTERPRETED, reason="interpreter's bf16 tl.dot"))],
    ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", ["hub", "duplicates", "order", "dropout"])
def test_dot_forward_matches_reference(case, dtype, heads_per_program):
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=2, hub_degree=30 if case == "hub" else 0,
                     duplicates=1 if case == "duplicates" else 0)
    order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(1)) if case == "order" else None
    plan, blocks = plan_and_blocks(src, dst, num_nodes, order)
    rowptr, col, row, perm = plan[:4]
    args, roles, score, message, dropout = dot_inputs(num_nodes, case == "dropout", dtype)
    blocks_on_device = block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t
                                                  for t in blocks])
    out, lse = dot_forward([a.to(DEVICE) for a in args], roles, perm.to(DEVICE), score, message, blocks_on_device,
                           num_nodes, EPS, dropout=dropout_on(dropout, DEVICE))
    wide = [a.double() for a in args]
    ref, ref_lse = reference_with_lse(wide, roles, rowptr, col, row, perm, score, message, EPS, dropout)

    dense_rows = dense_rows_of(blocks, num_nodes)
    assert dense_rows.any()
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double()[dense_rows], ref.to(dtype).double()[dense_rows],
                               **tolerance(dtype, "kernel", scale=magnitude(ref)))
    torch.testing.assert_close(lse.cpu().double()[dense_rows], ref_lse.double()[dense_rows],
                               **tolerance(dtype, "kernel", scale=magnitude(ref_lse)))
    assert not out.cpu()[~dense_rows].any() and not lse.cpu()[~dense_rows].any(), "rows left to the CSR kernel"
    if case == "duplicates":
        assert not dense_rows.all()
    degree = rowptr[1:] - rowptr[:-1]
    assert not out.cpu()[degree == 0].any() and not lse.cpu()[degree == 0].any(), "isolated rows: out 0, lse 0"


@runs_kernel
@pytest.mark.parametrize("case, dtype", covering(["hub", "duplicates", "order", "dropout"],
                                                  [torch.float32, torch.float16]))
def test_dot_backward_matches_reference(case, dtype, heads_per_program):
    # query, key and value gradients of BlockSparseDotAttention against autograd through the float64 reference,
    # whose output gradient is zero on rows of windows that are not dense_ok (those edges are the CSR path's)
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=4, hub_degree=30 if case == "hub" else 0,
                     duplicates=1 if case == "duplicates" else 0)
    order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(2)) if case == "order" else None
    plan, blocks = plan_and_blocks(src, dst, num_nodes, order)
    rowptr, col, row, perm = plan[:4]
    transposed = transpose_block_format(blocks, num_nodes, order)
    args, roles, score, message, dropout = dot_inputs(num_nodes, case == "dropout", dtype, seed=3)
    grad_out = torch.randn(num_nodes, HEADS, CHANNELS, generator=torch.Generator().manual_seed(9)).to(dtype)

    leaves = [a.to(DEVICE, copy=True).requires_grad_(a.is_floating_point()) for a in args]
    on_device = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                 for b in (blocks, transposed)]
    out, _ = BlockSparseDotAttention.apply(*on_device, perm.to(DEVICE), roles, score, message, num_nodes, EPS,
                                           False, dropout_on(dropout, DEVICE), *leaves)
    out.backward(grad_out.to(DEVICE))

    wide = [a.double().requires_grad_() for a in args]
    dense = dense_rows_of(blocks, num_nodes)
    ref = attention_reference(wide, roles, rowptr, col, row, perm, score, message, EPS, dropout)
    ref.backward(grad_out.double() * dense[:, None, None])
    for name, leaf, expected in zip(["value", "query", "key"], leaves, wide):
        assert leaf.grad.dtype == dtype
        torch.testing.assert_close(leaf.grad.cpu().double(), expected.grad,
                                   **tolerance(dtype, "kernel", scale=magnitude(expected.grad)),
                                   msg=lambda m, name=name: f"grad of {name}: {m}")
        assert expected.grad.abs().max() > 0.1, f"{name} gradient is not exercised"
    if case == "duplicates":
        assert not dense.all()
        assert not leaves[1].grad.cpu()[~dense].any(), "query rows left to the CSR backward"
    if case == "hub":  # a row window and a source window spanning several tiles
        assert int((blocks.tile_ptr[1:] - blocks.tile_ptr[:-1]).max()) > 1
        assert int((transposed.tile_ptr[1:] - transposed.tile_ptr[:-1]).max()) > 1
    isolated = (rowptr[1:] - rowptr[:-1]) == 0
    assert isolated.any() and not leaves[1].grad.cpu()[isolated].any()


@runs_kernel
def test_dot_backward_only_what_is_needed():
    # needs_grad picks the gradients (value only here)
    num_nodes = 24
    src, dst = graph(num_nodes, 60, seed=5)
    plan, blocks = plan_and_blocks(src, dst, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    args, roles, score, message, dropout = dot_inputs(num_nodes, True, torch.float32)
    blocks, transposed = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                          for b in (blocks, transposed)]
    args, perm, dropout = [a.to(DEVICE) for a in args], plan[3].to(DEVICE), dropout_on(dropout, DEVICE)
    out, lse = dot_forward(args, roles, perm, score, message, blocks, num_nodes, EPS, dropout=dropout)
    grad_out = torch.ones_like(out)
    grads = dot_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm, score, message,
                         blocks, transposed,
                         [True, False, False], dropout=dropout)
    assert grads[1] is None and grads[2] is None and grads[0].shape == args[0].shape


@runs_kernel
@pytest.mark.parametrize("case", ["every_row", "duplicates"])
def test_dot_backward_stores_into_packed_columns(case):
    """With ``pack`` (column slices of one packed ``[N, F]`` gradient, as attention_backward_packed gives them,
    rows ``F`` elements apart) the kernels store the gradients there: each entry is its place itself and equals
    the unpacked run's gradient; the columns between the places are not touched (NaN stays NaN), and where the
    format does not cover every row (duplicate edges: a window left to the CSR path) the place is zeroed first."""
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=4, duplicates=1 if case == "duplicates" else 0)
    plan, blocks = plan_and_blocks(src, dst, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    assert block_format.covers_every_row(blocks, num_nodes) == (case == "every_row")
    args, roles, score, message, _ = dot_inputs(num_nodes, False, torch.float32, seed=3)
    blocks, transposed = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                          for b in (blocks, transposed)]
    args, perm = [a.to(DEVICE) for a in args], plan[3].to(DEVICE)
    grad_out = torch.randn(num_nodes, HEADS, CHANNELS, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out, lse = dot_forward(args, roles, perm, score, message, blocks, num_nodes, EPS)
    delta = csr_delta.delta(grad_out, out)
    expected = dot_backward(grad_out, delta, lse, args, roles, perm, score, message, blocks, transposed, [True] * 3)
    width = HEADS * CHANNELS
    packed = torch.full((num_nodes, 3 * width + 2), float("nan"), device=DEVICE)
    places = {i: packed[:, 1 + i * width:1 + (i + 1) * width].view(args[i].shape) for i in range(3)}
    grads = dot_backward(grad_out, delta, lse, args, roles, perm, score, message, blocks, transposed, [True] * 3,
                         pack=places)
    for i in range(3):
        assert grads[i] is places[i], f"gradient {i} was not stored in its place"
        torch.testing.assert_close(grads[i], expected[i], **tolerance(torch.float32, "exact"))
        assert expected[i].abs().max() > 0.1
    assert packed[:, 0].isnan().all() and packed[:, -1].isnan().all()
    # a place of another dtype cannot take the kernels' store: the gradient comes back on its own for the caller
    wrong = {0: torch.zeros(num_nodes, HEADS, CHANNELS, dtype=torch.float64, device=DEVICE)}
    grads = dot_backward(grad_out, delta, lse, args, roles, perm, score, message, blocks, transposed, [True] * 3,
                         pack=wrong)
    assert grads[0] is not wrong[0] and not wrong[0].any()
    torch.testing.assert_close(grads[0], expected[0], **tolerance(torch.float32, "exact"))


def _shared_key_score(a0, a1, a2):  # the value input a0 is the key too
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a0), [-1]), 2.0)


@runs_kernel
def test_dot_backward_of_an_input_that_is_key_and_value():
    """An input that is both the key and the value gets the sum of its two gradients: with ``pack`` given, the
    kernels must not store both into its one place (the second store would overwrite the first)."""
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=4)
    plan, blocks = plan_and_blocks(src, dst, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    args, roles, _, message, _ = dot_inputs(num_nodes, False, torch.float32, seed=3)
    score = _fn(_shared_key_score)
    blocks, transposed = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                          for b in (blocks, transposed)]
    args, perm = [a.to(DEVICE) for a in args], plan[3].to(DEVICE)
    needs = [True, True, False]
    grad_out = torch.randn(num_nodes, HEADS, CHANNELS, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out, lse = dot_forward(args, roles, perm, score, message, blocks, num_nodes, EPS)
    delta = csr_delta.delta(grad_out, out)
    expected = dot_backward(grad_out, delta, lse, args, roles, perm, score, message, blocks, transposed, needs)
    places = {0: torch.zeros(num_nodes, HEADS, CHANNELS, device=DEVICE)}
    grads = dot_backward(grad_out, delta, lse, args, roles, perm, score, message, blocks, transposed, needs,
                         pack=places)
    torch.testing.assert_close(grads[0], expected[0], **tolerance(torch.float32, "reassociated"))
    torch.testing.assert_close(grads[1], expected[1], **tolerance(torch.float32, "exact"))


@runs_kernel
def test_launch_options_change_no_result(monkeypatch):
    """The dot kernels at launches other than ``block_sparse.BLOCK_LAUNCH``'s give the same output, log-sum-exp and
    gradients (a hub: windows of several tiles)."""
    num_nodes = 24
    src, dst = graph(num_nodes, 80, seed=5, hub_degree=20)
    plan, blocks = plan_and_blocks(src, dst, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    args, roles, score, message, _ = dot_inputs(num_nodes, False, torch.float32)
    blocks, transposed = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                          for b in (blocks, transposed)]
    args, perm = [a.to(DEVICE) for a in args], plan[3].to(DEVICE)
    grad_out = torch.randn(num_nodes, *args[0].shape[1:], generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def run():
        out, lse = dot_forward(args, roles, perm, score, message, blocks, num_nodes, EPS)
        return [out, lse] + dot_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm,
                                         score, message, blocks, transposed,
                                         [True] * len(args))
    expected = run()
    for launch in ({"num_warps": 4, "num_stages": 3}, {"num_warps": 1, "num_stages": 1}):
        for key in block_sparse.BLOCK_LAUNCH:
            monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, key, launch)
        for i, (actual, wanted) in enumerate(zip(run(), expected)):
            torch.testing.assert_close(actual, wanted, **tolerance(torch.float32), msg=lambda m: f"result {i}: {m}")


@runs_kernel
@pytest.mark.parametrize("heads, max_channels", tiered([(3, 128), (5, 128), (5, 32)], [(5, 32)]),
                         ids=["3_heads", "5_heads", "5_heads_in_blocks_of_2"])
def test_all_heads_program_masks_the_padded_heads(heads, max_channels, monkeypatch):
    """With every head in one program, ``BLOCK_H`` is the next power of two (capped by MAX_PROGRAM_CHANNELS: then
    several head blocks per window, the last one partial): the padded heads read nothing and write nothing;
    output, log-sum-exp and gradients equal the launch with one program per head."""
    monkeypatch.setattr(block_sparse, "MAX_PROGRAM_CHANNELS", max_channels)
    num_nodes = 30
    src, dst = graph(num_nodes, 90, seed=6, hub_degree=22)
    plan, blocks = plan_and_blocks(src, dst, num_nodes)
    transposed = transpose_block_format(blocks, num_nodes)
    args, roles, score, message, dropout = dot_inputs(num_nodes, True, torch.float32, seed=4, heads=heads)
    blocks, transposed = [block_format.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in b])
                          for b in (blocks, transposed)]
    args, perm, dropout = [a.to(DEVICE) for a in args], plan[3].to(DEVICE), dropout_on(dropout, DEVICE)
    grad_out = torch.randn(num_nodes, heads, CHANNELS, generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def run(per_program):
        for name in DOT_KERNELS:
            for key in (name, f"{name}:fp32"):
                monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, key, {"heads": per_program})
        out, lse = dot_forward(args, roles, perm, score, message, blocks, num_nodes, EPS, dropout=dropout)
        return [out, lse] + dot_backward(grad_out, csr_delta.delta(grad_out, out), lse, args, roles, perm,
                                         score, message, blocks, transposed,
                                         [True] * len(args), dropout=dropout)
    expected = run(1)
    assert expected[0].abs().max() > 0.1 and all(g.abs().max() > 0.01 for g in expected[2:])
    for i, (actual, wanted) in enumerate(zip(run("all"), expected)):
        torch.testing.assert_close(actual, wanted, **tolerance(torch.float32, "relaunch"),
                                   msg=lambda m: f"result {i}: {m}")


def test_float32_inputs_take_their_own_launch_entry(monkeypatch):
    monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, "dot_query", {"heads": "all", "num_warps": 2})
    monkeypatch.delitem(block_sparse.BLOCK_LAUNCH, "dot_query:fp32", raising=False)
    assert block_sparse.launch_entry("dot_query", torch.float32) == {"heads": "all", "num_warps": 2}
    monkeypatch.setitem(block_sparse.BLOCK_LAUNCH, "dot_query:fp32", {"heads": 1, "num_warps": 4})
    assert block_sparse.launch_entry("dot_query", torch.bfloat16) == {"heads": "all", "num_warps": 2}
    assert block_sparse.head_launch("dot_query", 4, torch.float32, 32) == (4, 1, {"num_warps": 4})
    assert block_sparse.head_launch("dot_query", 4, torch.float16, 32) == (1, 4, {"num_warps": 2})


def test_head_launch_setting():
    assert block_sparse.head_launch("dot_forward", 4, None, 32)[0] in (1, 4)
    block_sparse.BLOCK_LAUNCH["dot_test"] = {"heads": "all", "num_warps": 4}
    block_sparse.BLOCK_LAUNCH["dot_bad"] = {"heads": 2}
    try:
        assert block_sparse.head_launch("dot_test", 3, None, 32) == (1, 4, {"num_warps": 4})
        assert block_sparse.head_launch("dot_test", 8, None, 16) == (1, 8, {"num_warps": 4})
        # at most MAX_PROGRAM_CHANNELS per program: wider heads split over the grid
        assert block_sparse.head_launch("dot_test", 8, None, 32) == (2, 4, {"num_warps": 4})
        assert block_sparse.head_launch("dot_test", 4, None, 64) == (2, 2, {"num_warps": 4})
        assert block_sparse.head_launch("dot_test", 3, None, 128) == (3, 1, {"num_warps": 4})
        assert block_sparse.head_launch("dot_test", 3, None, 256) == (3, 1, {"num_warps": 4})
        with pytest.raises(ValueError, match="must be 1 or 'all'"):
            block_sparse.head_launch("dot_bad", 4, None, 32)
    finally:
        del block_sparse.BLOCK_LAUNCH["dot_test"], block_sparse.BLOCK_LAUNCH["dot_bad"]


def test_other_families_are_refused():
    def gat_score(a0, a1, a2):
        return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)

    def gat_message(alpha, a0, a1, a2):
        return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)

    src, dst = graph(20, 30)
    plan, blocks = plan_and_blocks(src, dst, 20)
    args = [torch.randn(20, HEADS, CHANNELS), torch.randn(20, HEADS), torch.randn(20, HEADS)]
    with pytest.raises(ValueError, match="gat family"):
        dot_forward(args, [ROLE_SRC, ROLE_SRC, ROLE_DST], plan[3], _fn(gat_score), _fn(gat_message), blocks, 20, EPS)


# ---- the interpreter tier ----

@pytest.mark.triton
@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter tier")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(block_sparse._dot_forward_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.attention.block_dot is imported"

