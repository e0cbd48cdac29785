"""Fixes for Inductor bugs that the graphs this backend hands to Inductor run into.

Each fix is small, applied once when the backend is imported, and only where the installed torch still has the
bug; the test of each fix fails on an unpatched torch.

- **A zero-sized y dimension in a tiled pointwise kernel** (torch 2.11, fixed upstream by pytorch/pytorch#179222).
  Inductor splits a large y grid into y and z (``Grid2DWithYZOverflow``): ``z = ceil(y_blocks / max_y_grid)``,
  ``y = ceil(y_blocks / z)``. With ``ynumel == 0``, ``z`` is 0 and the launch raises ``ZeroDivisionError``.
  PyG's GATConv and GATv2Conv with ``edge_dim`` meet it on CUDA: their self-loop fill (``fill_value="mean"``)
  scatters the edge features of the graph's non-loop edges, a count known only at run time, and a graph whose
  edges are all self loops (or that has none) makes it 0, in the graph this backend leaves to Inductor (seen on
  the H100; ``torch.compile`` default ran the same layer and graphs, its scatter presumably tiled otherwise). The fix
  keeps ``z`` at least 1, so such a launch has an empty y grid and does no work.
"""
from __future__ import annotations


def _patch_empty_y_grid() -> bool:
    """Keep the y/z split of Inductor's 2D grid defined for ``ynumel == 0``. True when the patch was applied."""
    try:
        from torch._inductor.runtime import triton_heuristics as heuristics
    except ImportError:  # a torch without Inductor's Triton runtime: nothing to fix
        return False
    grid = getattr(heuristics, "Grid2DWithYZOverflow", None)
    max_y_grid = getattr(heuristics, "get_max_y_grid", None)
    if grid is None or max_y_grid is None or getattr(grid, "_gnn_io_empty_y", False):
        return False
    if not _divides_by_zero(grid):
        return False

    def generate(self, meta: dict) -> None:
        self.x_grid = self.ceildiv("xnumel", meta.get("XBLOCK"))
        y_blocks = self.ceildiv("ynumel", meta.get("YBLOCK"))
        z_blocks = self.ceildiv("y_grid_raw_", max_y_grid())
        # at least one z block; the C++ wrapper's grid values are uint32_t, and std::max needs one type
        z_blocks = f"max({z_blocks}, 1)" if self.mode == "python" else f"std::max<uint32_t>({z_blocks}, 1U)"
        self.prefix.extend([self.assign_tmp("y_grid_raw_", y_blocks), self.assign_tmp("y_grid_div_", z_blocks)])
        self.y_grid = self.ceildiv("y_grid_raw_", "y_grid_div_")
        self.z_grid = "y_grid_div_"

    grid.generate = generate
    grid._gnn_io_empty_y = True
    return True


def _divides_by_zero(grid) -> bool:
    """Whether this torch's y/z grid split fails for ``ynumel == 0`` (decided by running it, not by version)."""
    try:
        expr = grid(inductor_meta={}, mode="python")
        expr.generate({"XBLOCK": 16, "YBLOCK": 16})
        expr.eval_slow({"xnumel": 16, "ynumel": 0})
    except ZeroDivisionError:
        return True
    except Exception:  # noqa: BLE001  (an API this fix does not know: leave Inductor as it is)
        return False
    return False


def apply() -> None:
    """Apply every fix this torch needs (idempotent)."""
    _patch_empty_y_grid()
