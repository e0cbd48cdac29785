"""An attention op's arguments laid out for the fused kernels: strided ``[rows, H]`` / ``[rows, H, C]`` views, the
pointer and stride slots and constexprs of each kernel argument, the call's dropout mask, and the reverse (a slot's
gradient back in the argument's shape). Shared by the CSR and the block-sparse kernels.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from gnn_inductor.kernels.attention.csr_launch import MAX_EDGES
from gnn_inductor.kernels.attention.forms import FAMILIES, MAX_SCORE_TERMS, MAX_VALUE_TERMS, AttentionForm, recognise
from gnn_inductor.kernels.runtime.rng import Dropout, as_float32, keep_bits_by_triton
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_EDGE
from gnn_inductor.plan.work_items import work_items_op

NO_ROLE = -1               # role of an unused argument slot
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class Layout:
    """The op's arguments as strided ``[rows, H]`` / ``[rows, H, C]`` views for the kernels' slots, and the
    call's attention dropout (:class:`kernels.runtime.rng.Dropout` or None), or the reason they do not fit (then the
    reference runs)."""

    def __init__(self, form: AttentionForm, args, roles, num_edges: int, dropout: Dropout | None = None):
        self.form, self.args, self.roles, self.dropout = form, list(args), list(roles), dropout
        self.reason = None
        self._keep_bits = None
        value = args[form.value_terms[0]]
        if value.dim() != 3:
            self.reason = f"message values have shape {tuple(value.shape)}, expected [rows, heads, channels]"
            return
        self.heads, self.channels = value.shape[1], value.shape[2]
        self.num_edges = num_edges
        vector = form.family != "gat"
        self.views = {}
        for i in form.score_terms:
            self._view(i, vector)
        for i in form.value_terms:
            self._view(i, True)
        if form.query is not None:
            self._view(form.query, True)
        if form.score_factor is not None:
            self._view(form.score_factor, False)
        if self.reason is None and form.message_width not in (None, self.heads * self.channels):
            self.reason = (f"message flattened to {form.message_width} columns for {self.heads} heads x "
                           f"{self.channels} channels")
        if self.reason is None and any(a.dtype not in _FLOATS for i, a in enumerate(args) if i in self.views):
            self.reason = "an input is not float32, float16 or bfloat16"
        # the kernels draw one mask entry per (edge, head): alpha must have one score per head, not one broadcast
        # over the heads (whose dropout the reference draws once per edge)
        per_edge_scores = form.score_terms + ((form.query,) if form.family == "dot" else ())
        if self.reason is None and dropout is not None and any(
                args[i].shape[1] != self.heads for i in per_edge_scores if roles[i] != ROLE_DENSE):
            self.reason = "attention dropout on scores broadcast over the heads"

    def _view(self, i: int, vector: bool):
        if self.reason is not None:
            return
        if i in self.views:
            if self.views[i].dim() != (3 if vector else 2):
                self.reason = f"argument {i} is used both per head and per channel"
            return
        arg, role = self.args[i], self.roles[i]
        shape = (self.heads, self.channels) if vector else (self.heads,)
        if role == ROLE_DENSE:
            arg = arg.reshape(arg.shape[-len(shape) - 1:]) if arg.dim() > len(shape) else arg.unsqueeze(0)
            if arg.shape[0] != 1:
                self.reason = f"dense argument {i} has shape {tuple(self.args[i].shape)}"
                return
        if not vector and arg.dim() == 3 and arg.shape[2] == 1:
            arg = arg[..., 0]
        if arg.dim() != len(shape) + 1:
            self.reason = f"argument {i} has shape {tuple(self.args[i].shape)}, expected [rows, {shape}]"
            return
        # traced, an edge argument's rows and the edge count may be two unbacked sizes (each edge tensor masked by
        # its own nonzero, as PyG's remove_self_loops does): undecidable there, taken as equal; the op checks the
        # real sizes at run time (a ValueError or the reference, never a wrong read)
        if role == ROLE_EDGE and guard_or_false(arg.shape[0] != self.num_edges):
            self.reason = f"edge argument {i} has {arg.shape[0]} rows for {self.num_edges} edges"
            return
        try:
            view = arg.expand(arg.shape[0], *shape)
        except RuntimeError:
            self.reason = f"argument {i} of shape {tuple(self.args[i].shape)} does not broadcast to {shape}"
            return
        self.views[i] = view

    def slot(self, i: int | None, vector: bool) -> list:
        """Pointer and strides (row, head[, channel]) of argument ``i``, a dummy for an empty slot."""
        if i is None:
            any_view = next(iter(self.views.values()))
            return [any_view, 0, 0, 0] if vector else [any_view, 0, 0]
        view = self.views[i]
        strides = [view.stride(0), view.stride(1)] + ([view.stride(2)] if vector else [])
        if self.roles[i] == ROLE_DENSE:
            strides[0] = 0
        return [view, *strides]

    def role(self, i: int | None) -> int:
        return NO_ROLE if i is None else self.roles[i]

    def keep_bits_slot(self) -> list:
        """The CSR kernels' ``keep_bits_ptr, dropout_scale`` arguments: the call's dropout mask as a bitset by
        counter ``e * H + h`` (:func:`kernels.runtime.rng.keep_bits_by_triton`), drawn at the first launch of this
        layout and shared by its launches (a forward; a backward's dst and src passes draw it again, identically). The
        kernels' edge loop steps over one or two edges, so a Philox-10 chain in it costs as much as a full
        tile's; drawn apart, every lane of the draw is used. ``E * H / 8`` bytes while the call runs."""
        if self.dropout is None:
            return [self.slot(None, False)[0], 1.0]
        if self._keep_bits is None:
            self._keep_bits = keep_bits_by_triton(self.dropout, self.num_edges * self.heads)
        return [self._keep_bits, self.dropout.scale]


def padded(seq, n):
    return list(seq) + [None] * (n - len(seq))


def common_slots(layout: Layout) -> tuple:
    form = layout.form
    vector = form.family != "gat"
    s = padded(form.score_terms, MAX_SCORE_TERMS)
    v = padded(form.value_terms, MAX_VALUE_TERMS)
    pointers = [*layout.slot(s[0], True), *layout.slot(s[1], True), *layout.slot(s[2], True)] if vector else \
        [x for i in s for x in (*layout.slot(i, False), 0)]
    pointers += layout.slot(form.query, True) + layout.slot(v[0], True) + layout.slot(v[1], True)
    pointers += layout.keep_bits_slot()
    pointers += layout.slot(form.score_factor, False)
    constexprs = {"KIND": FAMILIES[form.family], "S0": layout.role(s[0]), "S1": layout.role(s[1]), "S2": layout.role(s[2]),
                      "Q": layout.role(form.query), "V0": layout.role(v[0]), "V1": layout.role(v[1]),
                      "F": layout.role(form.score_factor), "DROPOUT": layout.dropout is not None}
    # the dropout counter is the original edge id: read through perm like an edge-role argument
    constexprs["NEED_EID"] = layout.dropout is not None or \
        ROLE_EDGE in [constexprs[k] for k in ("S0", "S1", "S2", "Q", "V0", "V1", "F")]
    return pointers, constexprs


def dropout_slot(dropout: Dropout | None, dummy: Tensor) -> list:
    """The block-sparse kernels' ``seed_ptr, dropout_p, dropout_scale`` arguments (``dummy`` and no-ops without
    dropout): they draw the mask per tile cell, where the draw fills whole 16 x 16 tiles."""
    if dropout is None:
        return [dummy, 0.0, 1.0]
    return [dropout.seed, as_float32(dropout.p), dropout.scale]


def call_items(rowptr: Tensor, col: Tensor, items, max_edges: int):
    """The plan's work items, or this call's own (one device sync) when the caller has none."""
    if items:
        return list(items), max_edges
    return list(work_items_op(rowptr, col, MAX_EDGES)), MAX_EDGES


def out_dtype(args) -> torch.dtype:
    return next((a.dtype for a in args if a.dtype in (torch.float16, torch.bfloat16)), torch.float32)


def prepare(args, roles, perm: Tensor, score_key: str, message_key: str,
            dropout: Dropout | None = None) -> Layout | str:
    """The kernels' :class:`Layout` of an attention op's arguments, or the reason the reference runs."""
    form = recognise(score_key, message_key, roles)
    if isinstance(form, str):
        return form
    layout = Layout(form, args, roles, perm.shape[0], dropout)
    return layout.reason if layout.reason is not None else layout


def undo_view_grad(view_grad: Tensor, arg: Tensor, role: int) -> Tensor:
    """A gradient in a slot's ``[rows, H(, C)]`` layout back in ``arg``'s shape (broadcasts summed)."""
    if role == ROLE_DENSE:
        view_grad = view_grad.sum(0, keepdim=True)
        return view_grad.sum_to_size(arg.shape) if arg.dim() == view_grad.dim() else \
            view_grad.reshape(view_grad.shape[1:]).sum_to_size(arg.shape)
    if arg.dim() == view_grad.dim() + 1:
        view_grad = view_grad.unsqueeze(-1)
    return view_grad.sum_to_size(arg.shape)
