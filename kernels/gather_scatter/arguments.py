"""Lines of the fused gather-scatter kernels' Triton source that depend on an edge function's argument layouts:
loading the arguments ``A{i}`` by their roles and layouts (``full``, ``scalar``, ``partial``, see
:class:`codegen.ArgLayout`) and adding into their gradients ``G{i}``. ``template.py`` puts them into its templates.
"""
from __future__ import annotations

from gnn_inductor.kernels.gather_scatter import codegen
from gnn_inductor.kernels.runtime.roles import ROLE_EDGE

DENSE_SLOTS = 64       # partial rows of a dense argument's gradient (programs add into item % DENSE_SLOTS)


class Arguments:
    """Lines loading the arguments ``A{i}`` of an edge function and adding into their gradients ``G{i}``."""

    def __init__(self, lowered: codegen.Lowered, accumulate: bool = False):
        """``accumulate``: a stored gradient element adds to what its buffer holds (``KernelSpec.accumulate``)."""
        self.lowered, self.accumulate = lowered, accumulate
        self.layouts = lowered.layouts
        self.kinds = [layout.kind(lowered.message_shape) for layout in self.layouts]
        self.needs_edge = any(layout.role == ROLE_EDGE for layout in self.layouts)

    def offsets(self) -> list:
        lines = []
        for i, layout in enumerate(self.layouts):
            offsets = codegen.layout_offsets(layout, self.lowered.message_shape, "f")
            if offsets is not None:
                lines.append(f"off{i} = {offsets}")
        return lines

    def off(self, i):
        return {"full": "f", "scalar": None, "partial": f"off{i}"}[self.kinds[i]]

    def load(self, i, index, emask) -> str:
        """Tile of argument i at node/edge ``index``: None for dense, a scalar (``emask`` None) or a
        [BLOCK_E] vector (one per tile row, ``emask`` its mask)."""
        layout, o = self.layouts[i], self.off(i)
        row = layout.numel

        def conv(expr):
            return f"({expr} != 0)" if layout.is_bool else f"{expr}.to(tl.float32)"
        if index is None:  # dense
            if o is None:
                return conv(f"tl.load(A{i})")
            return conv(f"tl.load(A{i} + {o}[None, :], mask=fmask[None, :], other=0)")
        if emask is None:  # one node for the whole item
            if o is None:
                return conv(f"tl.load(A{i} + {index} * {row})")
            return conv(f"tl.load(A{i} + {index} * {row} + {o}[None, :], mask=fmask[None, :], other=0)")
        if o is None:
            return conv(f"tl.load(A{i} + {index}, mask={emask}, other=0)") + "[:, None]"
        return conv(f"tl.load(A{i} + {index}[:, None] * {row} + {o}[None, :], mask=m2, other=0)")

    def contribution(self, i) -> str:
        """Argument i's contribution of the pairs in ``live`` (a [BLOCK_E, BLOCK_F] tile)."""
        return f"tl.where(live, {self.lowered.vjp_results[i]} + zero, 0.0)"

    def add_grad(self, i, index, emask, store=False) -> str:
        """The line adding the contributions ``c{i}`` into ``G{i}`` at node/edge ``index``, a [BLOCK_E]
        vector (one per tile row, ``emask`` its mask). ``store`` where the full-layout gradient element has
        no other writer (an edge's); else relaxed atomics issued for the live pairs, a scalar argument's
        summed over the features first."""
        row, o = self.layouts[i].numel, self.off(i)
        at = f"{index}[:, None]"
        if store and self.accumulate:  # no other writer: load, add, store
            target = f"G{i} + {at} * {row} + f[None, :]"
            return f"tl.store({target}, tl.load({target}, mask=live, other=0) + c{i}, mask=live)"
        if store:
            return f"tl.store(G{i} + {at} * {row} + f[None, :], c{i}, mask=live)"
        if o is None:
            return f"tl.atomic_add(G{i} + {index}, tl.sum(c{i}, axis=1), mask={emask}, sem='relaxed')"
        return f"tl.atomic_add(G{i} + {at} * {row} + {o}[None, :], c{i}, mask=live, sem='relaxed')"

    def dense_grad(self, i) -> list:
        """Lines adding ``r{i}`` (the program's sum over its rows) into one of the ``DENSE_SLOTS`` partial
        rows of a dense argument's gradient."""
        row = self.layouts[i].numel
        lines = [f"slot{i} = (item % {DENSE_SLOTS}) * {row}"]
        if self.kinds[i] == "scalar":
            lines.append(f"tl.atomic_add(G{i} + slot{i}, tl.sum(r{i}, axis=0), sem='relaxed')")
        else:
            lines.append(f"tl.atomic_add(G{i} + slot{i} + {self.off(i)}, r{i}, mask=fmask, sem='relaxed')")
        return lines
