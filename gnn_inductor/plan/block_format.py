r"""The block format of a graph: its edges as dense ``WINDOW x TILE`` tiles, for the block-sparse Tensor-Core kernels.

Destination rows are taken in windows of ``WINDOW`` consecutive entries of a node order (``order``, a permutation
of the destination rows; the identity when none is given). In window ``w`` the distinct source columns of its
edges are sorted, condensed and cut into tiles of ``TILE`` columns. A tile ``t`` holds

- ``tile_col[t, j]``: the source node of its ``j``-th column (int32, ``-1`` past the window's last column);
- ``tile_edge[t, r, j]``: the original edge id (the index edge features are read with, and the counter the
  attention dropout mask is regenerated from) of the edge ``tile_col[t, j] -> window_rows[w, r]``, ``-1`` where
  there is none: the cell mask.

``tile_ptr[w] : tile_ptr[w + 1]`` are the tiles of window ``w``. One edge id per cell cannot hold two parallel
edges, so a window whose rows have a duplicate ``(dst, src)`` pair is marked ``dense_ok[w] = False`` (its cells
then hold one of the duplicates, unspecified which); a hybrid sends those windows to the CSR kernel. The build is
torch ops only, on the inputs' device, with no Python loop over rows or edges (it syncs for sizes: the number of
distinct (window, column) pairs and of tiles). Built once per graph and node order, kept in the graph's state.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import Tensor

from gnn_inductor.kernels.runtime.launch import cdiv
from gnn_inductor.kernels.runtime.progress import timed

log = logging.getLogger(__name__)


WINDOW = 16  # destination rows per window: the M side of the tl.dot tiles


TILE = 16    # source columns per tile: the N side of S = Q K^T and the K side of P V


class BlockFormat(NamedTuple):
    """Block format of a graph (module docstring); ``W`` windows, ``T`` tiles."""
    window_rows: Tensor   # [W, WINDOW] int32: destination row of each window slot, -1 past the last row
    tile_ptr: Tensor      # [W + 1] int64: tiles of window w are tile_ptr[w]:tile_ptr[w + 1]
    tile_window: Tensor   # [T] int32: the window of each tile
    tile_col: Tensor      # [T, TILE] int32: source node of each tile column, -1 padding
    tile_edge: Tensor     # [T, WINDOW, TILE] int32: original edge id per cell, -1 where no edge
    dense_ok: Tensor      # [W] bool: no duplicate (dst, src) pair among the window's rows
    dense_windows: Tensor  # [W'] int32: the windows with dense_ok, the forward kernel's grid
    stats: dict           # rows, windows, tiles, mean tile fill, fraction of windows with duplicate edges


def build_block_format(rowptr: Tensor, col: Tensor, perm: Tensor, num_src: int,
                       order: Tensor | None = None) -> BlockFormat:
    """The block format of the CSR plan ``(rowptr, col, perm)`` (``gnn_inductor/plan/csr.py``) whose sources are
    ``< num_src``, with row windows cut from ``order`` (a permutation of the ``N`` destination rows)."""
    num_dst, num_edges = rowptr.shape[0] - 1, col.shape[0]
    with timed(log, f"block format ({num_edges:,} edges, {'reordered' if order is not None else 'identity'} rows)"):
        degree = (rowptr[1:] - rowptr[:-1]).long()
        row = torch.repeat_interleave(torch.arange(num_dst, device=rowptr.device), degree, output_size=num_edges)
        return _block_format(row, col.long(), perm.long(), num_dst, num_src, order, "destination rows")


SAMPLED_WINDOWS = 4096  # of :func:`sampled_tiles`: its standard error is the spread of tiles per window over sqrt(4096)


def sampled_tiles(rowptr: Tensor, col: Tensor, num_cols: int, samples: int = SAMPLED_WINDOWS,
                  seed: int = 0) -> float:
    """The identity order's tile count (:func:`build_block_format` with ``order=None``) estimated from ``samples``
    windows drawn uniformly with replacement: their distinct columns counted exactly, the mean of their tiles times
    the window count. Reads only the sampled windows' edges (the mean degree times ``WINDOW * samples``, plus any
    hub a sample hits), where the build holds about 60 bytes per edge and a kilobyte per tile: on a billion-edge
    R-MAT graph (H200) the build alone did not fit beside the plan."""
    num_rows = rowptr.shape[0] - 1
    num_windows = cdiv(num_rows, WINDOW)
    if num_windows == 0 or col.numel() == 0:
        return 0.0
    device = rowptr.device
    generator = torch.Generator(device=device).manual_seed(seed)
    window = torch.randint(0, num_windows, (samples,), generator=generator, device=device)
    rowptr = rowptr.long()
    begin = rowptr[window * WINDOW]
    end = rowptr[torch.clamp(window * WINDOW + WINDOW, max=num_rows)]
    counts = end - begin
    total = int(counts.sum())  # one sync: the sampled edges' count sizes what follows
    sample = torch.repeat_interleave(torch.arange(samples, device=device), counts, output_size=total)
    offset = torch.arange(total, device=device) - (torch.cumsum(counts, 0) - counts)[sample]
    columns = col[begin[sample] + offset].long()
    pairs = torch.unique(sample * max(num_cols, 1) + columns)  # distinct (sampled window, column) pairs
    distinct = torch.bincount(pairs // max(num_cols, 1), minlength=samples)
    return float(((distinct + TILE - 1) // TILE).float().mean()) * num_windows


def transpose_block_format(blocks: BlockFormat, num_src: int, order: Tensor | None = None) -> BlockFormat:
    """The block format of ``A^T`` restricted to the edges of ``blocks``' ``dense_ok`` windows: windows of
    source nodes (cut from ``order``, a permutation of the ``num_src`` sources; identity by default), their
    tiles' columns the destination rows, ``tile_edge`` the same original edge ids. The backward's dK and dV
    run over it, one program per source window, without atomics; edges of windows that are not ``dense_ok``
    are left out, as the forward leaves them to the CSR kernel. Every window of the result is ``dense_ok``."""
    dense_cells = (blocks.tile_edge >= 0) & blocks.dense_ok[blocks.tile_window.long()][:, None, None]
    tiles, slots, lanes = torch.nonzero(dense_cells, as_tuple=True)
    dst = blocks.window_rows[blocks.tile_window[tiles].long(), slots].long()
    src = blocks.tile_col[tiles, lanes].long()
    edge_id = blocks.tile_edge[tiles, slots, lanes].long()
    # window_rows.numel() bounds the destination ids without a sync
    with timed(log, f"transposed block format ({edge_id.numel():,} edges)"):
        return _block_format(src, dst, edge_id, num_src, blocks.window_rows.numel(), order, "source nodes")


def _block_format(row: Tensor, col: Tensor, edge_id: Tensor, num_rows: int, num_cols: int, order: Tensor | None,
                  rows_name: str) -> BlockFormat:
    """The block format of the edges ``col[e] -> row[e]`` (ids ``edge_id[e]``), ``row < num_rows`` cut into
    windows along ``order``, ``col < num_cols`` condensed into tiles."""
    device = row.device
    num_edges = row.shape[0]
    if order is None:
        order = torch.arange(num_rows, device=device)
    order = order.to(device=device, dtype=torch.long)
    if order.shape != (num_rows,):
        raise ValueError(f"order must hold each of the {num_rows} {rows_name} once, got shape {tuple(order.shape)}")
    num_windows = cdiv(num_rows, WINDOW)
    window_rows = torch.full((num_windows * WINDOW,), -1, dtype=torch.int32, device=device)
    window_rows[:num_rows] = order.to(torch.int32)
    position = torch.empty_like(order)
    position[order] = torch.arange(num_rows, device=device)

    edge_window = position[row] // WINDOW
    edge_slot = position[row] % WINDOW

    # distinct (window, column) pairs, sorted by window then column; their rank inside the window
    pairs, pair_of_edge = torch.unique(edge_window * max(num_cols, 1) + col, return_inverse=True)
    pair_window = pairs // max(num_cols, 1)
    pairs_per_window = torch.bincount(pair_window, minlength=num_windows)
    first_pair = torch.cumsum(pairs_per_window, 0) - pairs_per_window
    rank = torch.arange(pairs.shape[0], device=device) - first_pair[pair_window]

    tiles_per_window = (pairs_per_window + TILE - 1) // TILE
    tile_ptr = torch.zeros(num_windows + 1, dtype=torch.long, device=device)
    torch.cumsum(tiles_per_window, 0, out=tile_ptr[1:])
    num_tiles = int(tile_ptr[-1]) if num_windows else 0
    pair_tile = tile_ptr[:-1][pair_window] + rank // TILE
    pair_lane = rank % TILE
    tile_window = torch.repeat_interleave(torch.arange(num_windows, device=device), tiles_per_window,
                                          output_size=num_tiles).to(torch.int32)
    tile_col = torch.full((num_tiles * TILE,), -1, dtype=torch.int32, device=device)
    tile_col[pair_tile * TILE + pair_lane] = (pairs % max(num_cols, 1)).to(torch.int32)

    cell = (pair_tile[pair_of_edge] * WINDOW + edge_slot) * TILE + pair_lane[pair_of_edge]
    tile_edge = torch.full((num_tiles * WINDOW * TILE,), -1, dtype=torch.int32, device=device)
    tile_edge[cell] = edge_id.to(torch.int32)
    edges_per_cell = torch.bincount(cell, minlength=num_tiles * WINDOW * TILE)
    duplicate_tiles = (edges_per_cell.view(num_tiles, WINDOW * TILE) > 1).any(1)
    dense_ok = torch.ones(num_windows, dtype=torch.bool, device=device)
    dense_ok[tile_window[duplicate_tiles].long()] = False

    cells = num_tiles * WINDOW * TILE
    stats = {
        "rows": num_rows,
        "windows": num_windows,
        "tiles": num_tiles,
        "mean_tile_fill": round(num_edges / cells, 4) if cells else 0.0,
        "duplicate_window_fraction": round(float((~dense_ok).float().mean()), 4) if num_windows else 0.0,
    }
    return BlockFormat(window_rows.view(num_windows, WINDOW), tile_ptr, tile_window, tile_col.view(num_tiles, TILE),
                       tile_edge.view(num_tiles, WINDOW, TILE), dense_ok,
                       torch.nonzero(dense_ok).flatten().to(torch.int32), stats)


def covers_every_row(blocks: BlockFormat, num_rows: int) -> bool:
    """Whether the kernels over ``blocks`` write every one of ``num_rows`` rows: a format of exactly those rows
    (each row of its order sits in a window; a format of fewer rows whose padded windows reach ``num_rows``
    would leave the rest unwritten) with every window ``dense_ok``. Their outputs then need no zero fill."""
    return blocks.stats.get("rows") == num_rows and blocks.dense_windows.shape[0] == blocks.window_rows.shape[0]
