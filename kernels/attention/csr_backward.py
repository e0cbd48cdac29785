r"""The backward of the fused CSR attention: which variant runs, the outputs of each pass, the gradient buffers.

Backward recomputes the scores from the saved ``lse`` (``alpha_e = exp(s_e - lse_i)``, ``eps`` dropped, a
relative 1e-16) and ``D_i = <dout_i, out_i>`` (the softmax Jacobian's row term, FlashAttention's delta):
``ds_e = alpha_e (w_e <dout_i, v_e> - D_i)``. The variants, picked by ``GNN_IO_ATTENTION_BACKWARD``
(read at each call, :func:`csr_launch.backward_variant`); unset (``auto``), the GAT family runs ``mass`` where the
op's forward makes the mass, else ``one_pass_segment``, and the others ``split``:

- ``split`` (the default but for GAT; FlashAttention-2's split, no atomics outside hub rows): two launches of
  :func:`csr_split_backward.split_backward_kernel`, one program per work item for every head (the item's indices
  read once, not once per head: measured faster on the H100, :data:`csr_launch.SPLIT_BACKWARD_LAUNCH`). The **dst
  pass** walks the CSR's work items and writes the gradients of dst-role arguments (summed in registers over the
  whole item: one store per item for every head, an atomic only for the items of a hub row), of edge-role ones
  (plain stores: each edge id is one address) and GATv2's dense ``att`` (32 slots). ``D [N, H]`` comes from
  :func:`csr_delta.delta` (``gnn_io::attention_delta``, run before the backward op, so that the forward's output is
  not kept for the kernels). The **src pass** walks the transposed CSR
  (:class:`gnn_inductor.plan.source_csr.SourceCSR`: rows are sources, each with its edges' destinations and edge
  ids, and its own degree-split work items), recomputes each edge's score from the destination's terms, ``lse_i``,
  ``D_i`` and ``dout_i``, and writes the src-role gradients the same way, once per item. :func:`source_csr` builds
  the transposed CSR once per graph (a stable sort of ``E``) and keeps it in the graph's state. Row gradients
  stored by their own pass start uninitialised: only the rows without edges and the hub rows (several items add)
  are zeroed first (:func:`_stored_rows`).
- ``one_pass_segment`` (GAT's default): for the GAT family a dst-role gradient is a per-head scalar score term,
  so the src pass, which already computes every edge's ``ds_e``, also stores each edge's dst-role score-term
  gradient (``[H]`` per edge) at the edge's position in the transposed CSR, contiguously
  (:func:`gnn_inductor.plan.source_csr.source_positions` maps the CSR's positions to those; where the transposed
  CSR leaves edges out, at edge ids instead), and :func:`_sum_by_destination` sums them over each destination's
  CSR row, with ``D`` from :func:`csr_delta.delta_kernel` (the bias subtracted there); the dst pass, a second
  gather of every edge's ``[H, C]`` value row, is skipped (:func:`one_pass_outputs`). No atomics onto hub rows:
  adding the terms into the destinations' ``[H]`` rows by float32 atomics instead lost on the H100 (backward
  7.42 ms against 5.73, GATConv on RMAT 2^20: the atomics into a hub's row serialise). On the H100, GATConv on
  RMAT 2^20 (15.4M edges): 11.23 ms against the split backward's 12.20 per step (20 interleaved rounds, all won),
  1.17x on the uniform graph of 16M edges; the backward's kernels 4.59 against 5.46 ms (src pass 3.42, sum 0.81
  before its launch was fitted, ``D`` 0.36).
- ``atomic`` (kernels/attention/csr_atomic_backward.py): one pass over the CSR's work items, src- and edge-role
  gradients by float32 atomics. It also runs where the split one cannot: for the hybrid block/CSR path
  (``selector.run_backward`` passes only the rows left to the CSR kernel, and a src pass over all
  of a source's edges would count those into block rows twice), when :func:`backward` gets no
  source CSR, when one pass would write the gradients of more than four distinct arguments, and for the gradient
  of a score factor of the src or dst role (the split backward stores an edge-role one by edge id in its dst
  pass).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_inductor import config as settings
from gnn_inductor.kernels.attention.csr_atomic_backward import atomic_backward
from gnn_inductor.kernels.attention.csr_launch import DENSE_GRAD_SLOTS, MAX_EDGES, SPLIT_BACKWARD_LAUNCH, \
    all_heads_launch_config, backward_variant
from gnn_inductor.kernels.attention.csr_split_backward import BY_SOURCE_POSITION, MAX_GRAD_OUTPUTS, split_pass
from gnn_inductor.kernels.attention.forms import AttentionForm
from gnn_inductor.kernels.attention.layout import Layout, call_items, undo_view_grad
from gnn_inductor.kernels.runtime.fill import zero_rows_without_entries
from gnn_inductor.kernels.runtime.launch import next_power_of_2
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.kernels.spmm.csr_triton import triton_spmm
from gnn_inductor.plan import source_csr as plan_source_csr
from gnn_inductor.plan.source_csr import SourceCSR, source_positions
from gnn_inductor.plan.work_items import hub_items, items_memo, listed_fill_rows


def kernel_arguments(form: AttentionForm) -> list:
    """The op's arguments the kernels read (each once): score terms, query, values and the score factor, the
    arguments that may get a gradient."""
    query = (form.query,) if form.query is not None else ()
    factor = (form.score_factor,) if form.score_factor is not None else ()
    return list(dict.fromkeys(form.score_terms + query + form.value_terms + factor))


def grad_outputs(form: AttentionForm, roles, needs_grad, pass_roles) -> list:
    """``(argument, role, T, V, Q)`` for each argument of a role in ``pass_roles`` that needs a gradient:
    how often it is a score term, a value term, and whether it is the dot query."""
    query = (form.query,) if form.family == "dot" else ()
    outputs = []
    for i in dict.fromkeys(form.score_terms + query + form.value_terms):
        if needs_grad[i] and roles[i] in pass_roles:
            outputs.append((i, roles[i], form.score_terms.count(i), form.value_terms.count(i), int(i in query)))
    return outputs


def one_pass_outputs(form: AttentionForm, dst_outputs: list, src_outputs: list) -> bool:
    """Whether the src pass can write the dst pass's gradients too, so that the dst pass is skipped: the GAT
    family, where a dst-role gradient is only a per-head scalar score term (stored per edge and summed per
    destination afterwards) and edge-role ones are plain stores by edge id (each edge is walked once in either
    pass)."""
    return (form.family == "gat" and bool(dst_outputs)
            and len(dst_outputs) + len(src_outputs) <= MAX_GRAD_OUTPUTS
            and all(role == ROLE_EDGE or (role == ROLE_DST and t > 0 and v == 0 and q == 0)
                    for _, role, t, v, q in dst_outputs))


def source_csr(layout: Layout, rowptr: Tensor, col: Tensor, perm: Tensor, max_edges: int = 0) -> SourceCSR | None:
    """The graph's :class:`SourceCSR` for ``layout``'s source rows (:func:`gnn_inductor.plan.source_csr.source_csr`,
    kept in the graph's state). None when it is not built yet and a CUDA graph is being captured, so that backward
    runs the atomic variant, which needs no source CSR."""
    num_src = max((view.shape[0] for i, view in layout.views.items() if layout.roles[i] == ROLE_SRC), default=0)
    return plan_source_csr.source_csr(rowptr, col, perm, num_src, max_edges or MAX_EDGES)


def backward(layout: Layout, grad_out: Tensor, delta: Tensor, lse: Tensor, rowptr: Tensor, col: Tensor,
             perm: Tensor, needs_grad, items=(), max_edges: int = 0, config: dict | None = None,
             variant: str | None = None, by_src: SourceCSR | None = None, pack: dict | None = None):
    """Gradients of every argument flagged in ``needs_grad`` (None elsewhere), the dropout mask (if any)
    regenerated from ``layout.dropout``. ``delta`` is ``D = <dout, out>`` per (row, head), float32 and shaped as
    ``lse`` (:func:`csr_delta.delta`, run before the backward so that the forward's output need not be kept for it).

    With ``by_src`` (:func:`source_csr` of the whole graph) the split backward runs, for all heads at once;
    without it the atomic one, per head or for all heads at once (``variant``, default per head:
    :func:`csr_launch.heads_variant`). The split backward needs every row's items: a caller passing a subset of rows (the
    hybrid path's ``csr_items``) must pass no ``by_src``, or a source's edges into the other rows would be
    counted too. Unless ``GNN_IO_ATTENTION_BACKWARD`` is ``split`` (or ``atomic``), for the GAT family the src
    pass also writes the dst-role scalar gradients (:func:`one_pass_outputs`), per edge, summed per destination
    after it, and the dst pass, a second gather of every edge's ``[H, C]`` value row, is not run. ``config``
    (launch keys ``block_e``, ``num_warps``...) overrides both split passes' launch; its ``"src"`` and ``"dst"``
    entries (dicts of the same keys) override one pass's.

    ``pack`` (argument -> a tensor of the argument's shape and dtype whose rows are not contiguous with each
    other: a column slice of one ``[N, F]`` gradient, kernels/attention/op.py's ``attention_backward_packed``): the
    gradient of such an argument is written by the kernels into that tensor, which is then its entry of the
    result, where the split passes store it row by row (a row-role output of its own pass, float32, the
    argument's own shape); elsewhere the entry is computed as usual and the caller copies it.
    """
    form, channels = layout.form, layout.channels
    wanted = [i for i in kernel_arguments(form) if needs_grad[i]]
    if not wanted:
        return [None] * len(layout.args)
    dst_outputs = grad_outputs(form, layout.roles, needs_grad, (ROLE_DST, ROLE_EDGE))
    src_outputs = grad_outputs(form, layout.roles, needs_grad, (ROLE_SRC,))
    factor = form.score_factor if form.score_factor is not None and needs_grad[form.score_factor] else None
    split = by_src is not None and max(len(dst_outputs), len(src_outputs)) <= MAX_GRAD_OUTPUTS and \
        (factor is None or layout.roles[factor] == ROLE_EDGE)
    by_edge = []  # dst-role outputs the src pass stores per edge, summed over the CSR rows after it
    positions = None  # where it stores them: at source_positions (transposed-CSR positions), or at edge ids
    # the segment form: the src pass stores the dst-role score terms per edge, summed per destination after it;
    # only where every dst-role output has the CSR's rows (else both passes run)
    if split and backward_variant() in ("one_pass_segment", "auto", "mass") and \
            one_pass_outputs(form, dst_outputs, src_outputs) and \
            all(o[1] != ROLE_DST or layout.views[o[0]].shape[0] == rowptr.numel() - 1 for o in dst_outputs):
        by_edge = [o for o in dst_outputs if o[1] == ROLE_DST]
        # stored at each edge's position in the transposed CSR (contiguous) where every edge has one, else at its
        # edge id (scattered)
        positions = source_positions(rowptr, col, perm, by_src) if by_edge else None
        store_role = ROLE_EDGE if positions is None else BY_SOURCE_POSITION
        dst_outputs = [(o[0], store_role, *o[2:]) if o in by_edge else o for o in dst_outputs]
        src_outputs, dst_outputs = src_outputs + dst_outputs, []
    by_edge_ids = [o[0] for o in by_edge]
    targets = {}
    if split and pack:
        row_outputs = {o[0] for o in dst_outputs if o[1] == ROLE_DST} | {o[0] for o in src_outputs if o[1] == ROLE_SRC}
        targets = {i: t for i, t in pack.items()
                   if i in row_outputs and i not in by_edge_ids and t.dtype == torch.float32
                   and tuple(t.shape) == tuple(layout.views[i].shape) == tuple(layout.args[i].shape)
                   and t.dim() >= 2 and t[0].is_contiguous()}
    buffers = grad_buffers(layout, [i for i in wanted if i not in by_edge_ids],
                            _stored_rows(layout, items, rowptr, by_src, dst_outputs, src_outputs) if split else {},
                            rowptr.device, targets)
    for i in by_edge_ids:
        if positions is not None:  # [E, H] by transposed-CSR position: every position is walked, each once
            buffers[i] = torch.empty((col.numel(), layout.heads), dtype=torch.float32, device=rowptr.device)
        else:  # [E, H] by edge id; zeros: an edge without a source row is walked by no program
            buffers[i] = torch.zeros((col.numel(), layout.heads), dtype=torch.float32, device=rowptr.device)
    (item_row, item_start, item_end, item_shared), max_edges = call_items(rowptr, col, items, max_edges)
    delta = delta.contiguous()
    if not split:
        atomic_backward(layout, buffers, grad_out, delta, lse, col, perm, (item_row, item_start, item_end),
                         config, variant)
    else:
        given = config or {}
        overrides = {k: v for k, v in given.items() if k not in ("dst", "src")}

        def pass_config(measured: tuple, name: str) -> dict:
            """A pass's launch: its measured tile and warps, then ``config``'s keys, then its own entry's."""
            return {**all_heads_launch_config(layout.heads, channels, measured, min_block_c=16, min_block_e=1),
                    **overrides, **(given.get(name) or {})}
        dst_launch, src_launch = SPLIT_BACKWARD_LAUNCH[form.family]
        config, src_config = pass_config(dst_launch, "dst"), pass_config(src_launch, "src")
        cap = settings.get("src_maxnreg")
        if cap and "maxnreg" not in src_config:
            src_config["maxnreg"] = cap
        grad_out = grad_out.contiguous()
        att_grad = buffers.get(form.query) if form.family == "gatv2" else None
        if dst_outputs or att_grad is not None or factor is not None:  # the dst pass writes the factor's gradient
            split_pass(layout, ROLE_DST, dst_outputs, buffers, att_grad, (item_row, item_start, item_end, item_shared),
                        col, perm, grad_out, lse, delta, config)
        if src_outputs:
            split_pass(layout, ROLE_SRC, src_outputs, buffers, None, by_src.items, by_src.dst, by_src.eid, grad_out,
                        lse, delta, src_config)
        for i in by_edge_ids:
            buffers[i] = _sum_by_destination(buffers[i], rowptr, perm if positions is None else positions,
                                             (item_row, item_start, item_end, item_shared))
    result = [None] * len(layout.args)
    for i, grad in buffers.items():
        result[i] = grad if i in targets else undo_view_grad(grad, layout.args[i], layout.roles[i]).to(layout.args[i].dtype)
    return result


def _sum_by_destination(by_edge: Tensor, rowptr: Tensor, index: Tensor, items) -> Tensor:
    """``[N, H]``: row ``i`` sums ``by_edge[index[q]]`` over the CSR positions ``q`` of row ``i`` (``by_edge`` is
    ``[E, H]`` by edge id with ``index = perm``, or by transposed-CSR position with ``index`` from
    :func:`source_positions`): the Triton SpMM over the CSR with ``index`` as its columns and unit values, on the
    CSR's degree-split work items (a hub row's items add, where per-edge atomics into one ``[H]`` row would
    serialise on a hub). The unit values are kept with the plan's items (:func:`items_memo`). The launch
    fits these narrow rows (:data:`SEGMENT_SUM_LAUNCH`)."""
    ones = items_memo(items, ("unit_values", index.numel()),
                      lambda: torch.ones(index.numel(), dtype=torch.float32, device=index.device))
    block_e, num_warps = SEGMENT_SUM_LAUNCH
    return triton_spmm(by_edge, ones, rowptr, index, items, "sum", block_e=block_e,
                       block_f=max(4, next_power_of_2(by_edge.shape[1])), num_warps=num_warps)


# (edges per block, warps) of the per-destination sum of the segment backward, with a feature block of the heads
# (at least 4): the H100, RMAT 2^20 / 15.4M edges and 2^17 / 1.1M, 4 heads (probe part segment_sum):
# 0.733 and 0.128 ms against 0.945 and 0.155 at the SpMM's default launch (8 edges, 16 features, 1 warp)
SEGMENT_SUM_LAUNCH = (16, 1)


def _stored_rows(layout: Layout, items, rowptr: Tensor, by_src: SourceCSR, dst_outputs: list,
                 src_outputs: list) -> dict:
    """``argument -> (CSR rowptr, split, those rows listed or None)`` for the gradients the split backward stores
    row by row: a row-role output of its own pass (dst-role in the dst pass, src-role in the src pass), whose rows
    with one item are stored by it, so its buffer needs zeros only in the rows without entries and the hub rows
    (several items add; :func:`zero_rows_without_entries`). Only where the items are known to cover every row with
    entries and their split is known: the plan's own items for the dst pass (:func:`hub_items`), :class:`SourceCSR`'s
    for the src pass."""
    stored = {}
    hubs = hub_items(items) if items else None
    if hubs is not None:
        for i, role, *_ in dst_outputs:
            if role == ROLE_DST and layout.views[i].shape[0] == rowptr.numel() - 1:
                stored[i] = (rowptr, hubs[1], listed_fill_rows(items, hubs[1]))
    if by_src.max_edges:
        for i, role, *_ in src_outputs:
            if role == ROLE_SRC and layout.views[i].shape[0] == by_src.rowptr.numel() - 1:
                stored[i] = (by_src.rowptr, by_src.max_edges, by_src.fill_rows)
    return stored


def _zero_unstored_rows(buffer: Tensor, stored: tuple) -> None:
    rowptr, above, rows = stored  # (_stored_rows)
    zero_rows_without_entries(buffer, rowptr, above, rows=rows)


def grad_buffers(layout: Layout, wanted: list, stored: dict, device, targets: dict | None = None) -> dict:
    """float32 gradient buffers of the ``wanted`` arguments: zeros, but for the ``stored`` ones
    (:func:`_stored_rows`), uninitialised but for the rows no item stores (512 MiB of memset saved per
    ``[2^20, 128]`` float32 gradient). ``targets`` (argument -> float32 tensor of the buffer's shape, e.g. a
    column slice of a packed gradient) are used as the buffers of those arguments instead of new memory."""
    buffers = {}
    for i in wanted:
        view = layout.views[i]
        rows = DENSE_GRAD_SLOTS if layout.roles[i] == ROLE_DENSE else view.shape[0]
        if targets and i in targets:
            buffers[i] = targets[i]
            if i in stored:
                _zero_unstored_rows(buffers[i], stored[i])
            else:
                buffers[i].zero_()
        elif i in stored:
            buffers[i] = torch.empty((rows, *view.shape[1:]), dtype=torch.float32, device=device)
            _zero_unstored_rows(buffers[i], stored[i])
        else:
            buffers[i] = torch.zeros((rows, *view.shape[1:]), dtype=torch.float32, device=device)
    return buffers
