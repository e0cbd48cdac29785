"""The block format (kernels/block_sparse.py) exactly, and the block-sparse dot-product forward against the
CPU reference of gnn_io::attention.

Format tests run on CPU everywhere. The kernel runs on CUDA when there is a GPU, and on CPU tensors under
Triton's interpreter in a subprocess (``test_kernels_under_interpreter``; tests/kernels/test_spmm_triton.py
says why a subprocess).
"""
import os
import subprocess
import sys
from pathlib import Path

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels import block_sparse
from gnn_inductor.kernels._common import ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.attention import _reference_with_lse
from gnn_inductor.kernels.block_sparse import (
    TILE,
    WINDOW,
    build_block_format,
    dot_forward,
)

from gnn_inductor import edge_functions
from gnn_inductor.testing import TOLERANCES, random_graph

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
HEADS, CHANNELS = 2, 4
EPS = 1e-16
aten = torch.ops.aten

runs_kernel = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                 reason="no GPU: run by test_kernels_under_interpreter")


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


def test_order_must_cover_the_rows():
    plan = torch.ops.gnn_io.csr_plan(torch.tensor([0, 1]), torch.tensor([1, 0]), 3, 3)
    with pytest.raises(ValueError, match="each of the 3 destination rows"):
        build_block_format(plan[0], plan[1], plan[3], 3, torch.tensor([0, 1]))


# ---- the dot-product forward (CUDA, or the interpreter on CPU) ----

def _fn(f):
    return edge_functions.register(torch.fx.symbolic_trace(f))


# TransformerConv's edge functions as the backend cuts them (tests/kernels/test_attention_triton.py)
def _dot_score(a0, a1, a2):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0)


def _dot_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(a0, aten.view.default(alpha, [-1, HEADS, 1]))


def _dot_dropout_score(a0, a1, a2, a3):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), 2.0)


def _dot_dropout_message(alpha, a0, a1, a2, a3):
    scaled = aten.mul.Tensor(aten.mul.Tensor(alpha, a3), 2.0)
    return aten.mul.Tensor(a0, aten.view.default(scaled, [-1, HEADS, 1]))


def dot_inputs(num_nodes, num_edges, dropout, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    args = [torch.randn(num_nodes, HEADS, CHANNELS, generator=generator) for _ in range(3)]  # value, query, key
    roles = [ROLE_SRC, ROLE_DST, ROLE_SRC]
    if dropout:
        args.append(torch.rand(num_edges, HEADS, generator=generator) > 0.3)
        roles.append(ROLE_EDGE)
        score, message = _fn(_dot_dropout_score), _fn(_dot_dropout_message)
    else:
        score, message = _fn(_dot_score), _fn(_dot_message)
    return [a.to(dtype) if a.is_floating_point() else a for a in args], roles, score, message


@runs_kernel
@pytest.mark.parametrize("dtype", [
    torch.float32, torch.float16,
    # Triton 3.6's interpreter returns garbage for a bf16 tl.dot (fp16 is right): bf16 is checked on CUDA only
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(INTERPRETED, reason="interpreter's bf16 tl.dot"))],
    ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", ["hub", "duplicates", "order", "dropout"])
def test_dot_forward_matches_reference(case, dtype):
    num_nodes = 40
    src, dst = graph(num_nodes, 100, seed=2, hub_degree=30 if case == "hub" else 0,
                     duplicates=1 if case == "duplicates" else 0)
    order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(1)) if case == "order" else None
    plan, blocks = plan_and_blocks(src, dst, num_nodes, order)
    rowptr, col, row, perm = plan[:4]
    args, roles, score, message = dot_inputs(num_nodes, src.numel(), case == "dropout", dtype)
    blocks_on_device = block_sparse.BlockFormat(*[t.to(DEVICE) if isinstance(t, torch.Tensor) else t
                                                  for t in blocks])
    out, lse = dot_forward([a.to(DEVICE) for a in args], roles, perm.to(DEVICE), score, message, blocks_on_device,
                           num_nodes, EPS)
    wide = [a.double() if a.is_floating_point() else a for a in args]
    ref, ref_lse = _reference_with_lse(wide, roles, rowptr, col, row, perm, score, message, EPS)

    dense_rows = torch.zeros(num_nodes, dtype=torch.bool)
    dense_rows[blocks.window_rows[blocks.dense_ok].flatten()[blocks.window_rows[blocks.dense_ok].flatten() >= 0]
               .long()] = True
    assert dense_rows.any()
    assert out.dtype == dtype and lse.dtype == torch.float32
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out.cpu().double()[dense_rows], ref.to(dtype).double()[dense_rows],
                               rtol=4 * rtol, atol=4 * atol * max(1.0, float(ref.abs().max())))
    torch.testing.assert_close(lse.cpu().double()[dense_rows], ref_lse.double()[dense_rows], rtol=4 * rtol,
                               atol=4 * atol * max(1.0, float(ref_lse.abs().max())))
    assert not out.cpu()[~dense_rows].any() and not lse.cpu()[~dense_rows].any(), "rows left to the CSR kernel"
    if case == "duplicates":
        assert not dense_rows.all()
    degree = rowptr[1:] - rowptr[:-1]
    assert not out.cpu()[degree == 0].any() and not lse.cpu()[degree == 0].any(), "isolated rows: out 0, lse 0"


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


# ---- the interpreter run ----

@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter run")
def test_kernel_is_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(block_sparse._dot_forward_kernel, InterpretedFunction), \
        "TRITON_INTERPRET=1 must be set before gnn_inductor.kernels.block_sparse is imported"


@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="the kernels run directly")
def test_kernels_under_interpreter():
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "dot_forward or interpreted",
         str(Path(__file__).resolve())],
        check=False, cwd=root, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600)
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout, report
