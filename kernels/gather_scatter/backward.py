r"""Fused degree-split Triton kernels for ``gnn_io::gather_scatter``: the backward drivers.

**Backward.** The cotangent of a message is ``g_e = dY_i`` (sum), ``dY_i / deg_i`` (mean) or, for max/min,
``[phi_e == out_i] dY_i / count_i`` with ``count_i`` the number of tied messages per (node, feature): PyG's
``scatter_reduce`` semantics, ties share the gradient equally (and, as there, the zero base of
``scatter_reduce(include_self=False)`` counts as one more tie where the result is 0). The gradient kernel of a light
row counts the ties itself (a first walk over the row's edges, recomputing the messages; the second walk finds them
in cache); a *count* kernel does it for the hub rows first, launched over the hub items alone (they lead the plan's
items, ``hub_item_count``) and adding into one row of counts per hub row (at the row's first item) rather than one
per node. The gradient kernels recompute the messages' inputs, evaluate the generated VJP of ``phi`` and reduce each
argument's contributions by its role. Sum/mean: SRC arguments through the transposed CSR (walk by source,
accumulated in registers, no atomics except for hub items), DST arguments through the CSR. Max/min: everything in
the CSR walk, SRC rows by atomics masked to the edges whose message reached the output (about one per output
element, not one per edge and feature). EDGE arguments are stored per edge; DENSE arguments summed per program into
one of ``DENSE_SLOTS`` partial rows (spreading the atomics) and summed on the host. Arguments broadcast over
features (an edge weight ``[E, 1]``) sum over the features they are broadcast over too.

The max/min backward walks every edge again rather than having the forward save the arg (the one edge at each
result) for it: that variant measured slower on the H100 (SAGEConv max, 128 features, forward+backward: RMAT 2^20 /
15.4M edges 13.83 ms against 15.91 ms with the arg, RMAT 2^17 / 1.1M edges 2.22 against 2.57 ms), as the arg costs
the forward a 4-byte fill and store per output element and the hub rows, 64% of that graph's edges, are walked
either way (docs/reductions.md).

Kernels generated with ``KernelSpec.accumulate`` load, add and store where the others store, so several backward
calls can add into one buffer (``gather_scatter_multi``'s members, ``backward(..., into=...)``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gnn_inductor.kernels.gather_scatter import fused, launches
from gnn_inductor.kernels.gather_scatter.fused import Plan
from gnn_inductor.kernels.gather_scatter.arguments import DENSE_SLOTS
from gnn_inductor.kernels.gather_scatter.template import KernelSpec
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_EDGE, ROLE_SRC
from gnn_inductor.plan.work_items import hub_items


def grad_walks(layouts, needs_grad, reduce: str) -> dict:
    """Which walk computes each needed gradient. Sum/mean: SRC by source (transposed CSR, no
    atomics), DST by destination; EDGE and DENSE ride along with the walk that runs anyway (by
    destination when there is no SRC gradient). Max/min: everything by destination, where the
    output and cotangent rows are loaded once per item, and SRC rows get atomics only from the
    edges whose message is the max/min (about one per output element)."""
    wanted = [i for i, (layout, need) in enumerate(zip(layouts, needs_grad)) if need and not layout.is_bool]
    if reduce in ("max", "min"):
        return {"src": (), "dst": tuple(wanted)}
    src = [i for i in wanted if layouts[i].role == ROLE_SRC]
    dst = [i for i in wanted if layouts[i].role == ROLE_DST]
    other = [i for i in wanted if layouts[i].role in (ROLE_EDGE, ROLE_DENSE)]
    if src and not dst:
        src += other
    else:
        dst += other
    return {"src": tuple(src), "dst": tuple(dst)}


def backward(grad_out: Tensor, args, roles, plan: Plan, fn_key: str, reduce: str, needs_grad, out=None,
             launch=None, into: dict | None = None) -> list:
    """Gradients of the arguments flagged in ``needs_grad`` (None for the others), in their dtypes.
    ``out`` is the forward result (float32, ``[num_dst, F]``) for max/min; recomputed when None. ``into``:
    float32 buffers (argument index -> ``[rows, numel]``, from :func:`gradient_buffers`) the kernels add this
    call's gradients to, for those arguments; then the result holds None there."""
    explicit_launch = launch is not None
    launch = launch or launches.LAUNCH
    lowered = launches.lowering(fn_key, launches.argument_specs(args, roles))
    layouts = lowered.layouts
    num_features = math.prod(lowered.message_shape)
    num_dst = plan.rowptr.numel() - 1
    device = plan.rowptr.device
    cot = grad_out.reshape(num_dst, num_features).float()
    res = cot  # unused by sum/mean kernels
    if reduce == "mean":
        degree = (plan.rowptr[1:] - plan.rowptr[:-1]).clamp(min=1).float()
        cot = cot / degree[:, None]
    elif reduce in ("max", "min"):
        if out is None:
            res = fused.forward(args, roles, plan, fn_key, reduce, launch if explicit_launch else None)
        else:
            res = out.reshape(num_dst, num_features).float()
        # ties of hub rows (the gradient kernel counts light rows itself): one row per hub row where the hub items
        # are known (at the row's first item), else one per node
        hubs, width = hub_items(plan.items) or (None, 0)
        count = torch.zeros((num_dst if hubs is None else max(hubs, 1), num_features), dtype=torch.float32,
                            device=device)
        kernel = launches.kernel(lowered, KernelSpec("count", "dst", reduce))
        tensors = [*launches.prepare(args, roles), res, count, count, width, plan.rowptr, plan.col, plan.col,
                   plan.perm, *plan.items]
        launches.launch(kernel, plan.items[0].shape[0] if hubs is None else hubs, tensors, num_features, launch)
    cot, res = cot.contiguous(), res.contiguous()
    if reduce not in ("max", "min"):
        count, width = cot, 0  # unused
    prepared = launches.prepare(args, roles)
    into = into or {}
    grads = {i: into[i] if i in into else torch.zeros(grad_shape(args[i], layout), dtype=torch.float32,
                                                      device=device)
             for i, layout in enumerate(layouts) if needs_grad[i] and not layout.is_bool}
    accumulate = bool(into)
    walks = grad_walks(layouts, needs_grad, reduce)
    for walk, indices in walks.items():
        if not indices:
            continue
        kernel = launches.kernel(lowered, KernelSpec("grad", walk, reduce, indices, accumulate=accumulate))
        if walk == "dst":
            index = [plan.rowptr, plan.col, plan.col, plan.perm, *plan.items]
            items = plan.items
        else:
            index = [plan.t_rowptr, plan.t_col, plan.t_perm, plan.perm, *plan.t_items]
            items = plan.t_items
        tensors = [*prepared, *(grads[i] for i in indices), res, cot, count, width, *index[:-len(items)]]
        # only a hub item's program needs its index within the plan's items (its tie-count row); a light item's
        # index only spreads the dense slots, so the light items may run in a launch of their own
        launches.launch_items(kernel, items, tensors, num_features, launch,
                              not explicit_launch and launches.light_launch("backward", items[0].shape[0]))
    result = []
    for i, a in enumerate(args):
        if i not in grads or i in into:
            result.append(None)
            continue
        grad = grads[i].sum(0) if layouts[i].role == ROLE_DENSE else grads[i]
        result.append(grad.reshape(a.shape).to(a.dtype))
    return result


def grad_shape(arg: Tensor, layout) -> tuple:
    """The float32 buffer the kernels write an argument's gradient into (a dense one: ``DENSE_SLOTS`` partial
    rows, summed after)."""
    return (DENSE_SLOTS, layout.numel) if layout.role == ROLE_DENSE else (arg.shape[0], layout.numel)


def gradient_buffers(args, roles, fn_key: str, needs_grad) -> dict:
    """Zeroed float32 gradient buffers for :func:`backward`'s ``into``, for the wanted arguments that are not
    dense (whose partial rows stay per call): argument index -> buffer."""
    layouts = launches.lowering(fn_key, launches.argument_specs(args, roles)).layouts
    return {i: torch.zeros(grad_shape(args[i], layout), dtype=torch.float32, device=args[i].device)
            for i, layout in enumerate(layouts) if needs_grad[i] and not layout.is_bool and layout.role != ROLE_DENSE}


def from_buffer(buffer: Tensor, arg: Tensor) -> Tensor:
    """An argument's gradient from its :func:`gradient_buffers` buffer."""
    return buffer.reshape(arg.shape).to(arg.dtype)
