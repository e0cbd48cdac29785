r"""Gather-scatter family: reductions of arbitrary per-edge messages.

.. math::
    \mathrm{out}_i = \bigoplus_{e = (j \to i)} \phi(a^{(1)}_e, \dots, a^{(k)}_e),
    \qquad \oplus \in \{\sum, \mathrm{mean}, \max, \min\}

``phi`` is an edge function cut from the model (registered under ``fn_key``, see
``gnn_inductor.kernels.runtime.edge_functions``); each argument reaches the edge through its role (source row,
destination row, edge row or dense, see ``kernels/runtime/roles.py``). Output ``[num_dst, *M]`` where
``phi`` returns ``[E, *M]``; empty rows are 0, as PyG's ``scatter``. Max/min ties share the
gradient equally (``scatter_reduce`` semantics). Covers SAGEConv/GraphConv max, GINEConv-style
``relu(x_j + e_ij)`` messages and any pointwise chain PyG or users write.

Kernels: on CUDA, the fused degree-split Triton kernels of ``fused.py`` (forward) and ``backward.py``
(``phi`` and its VJP generated into them by ``codegen.py`` and ``template.py``; no edge-sized message tensor),
when ``phi`` lowers and no argument is float64; otherwise, and on every other device, the exact
segment reference below. The optional ``t_plan = [t_rowptr, t_col, t_perm]`` (the transposed CSR),
``items`` and ``t_items`` (work items of the CSR and of its transpose, ``gnn_io::gather_scatter_items``)
come from the graph plan; the kernels compute them when they are not given.

``gnn_io::gather_scatter`` is CompositeImplicitAutograd over ``gnn_io::gather_scatter_forward``,
which owns the autograd formula. The max/min backward walks every edge again (``backward.py`` says why the
forward saves no arg for it).

Several reductions over the same messages (``SAGEConv(aggr=['mean', 'max'])``, ``MultiAggregation``,
PNA's mean/min/max/std) share one pass: ``gnn_io::gather_scatter_multi(args, roles, rowptr, col, row,
perm, fn_keys, reduces, ...)`` returns ``out_j = reduce_j(phi_j(args at e))`` for each member ``j``, all
over the same arguments and plan. On the Triton path one kernel walks each work item's edges once, loads
the arguments once per edge, computes each distinct ``phi`` once and folds it into one accumulator per
member; elsewhere (and when the members' messages do not share a shape) each member runs as
``gnn_io::gather_scatter`` would. The backward is the single op's, per member (sum and mean members of
one ``phi`` share one walk: their cotangents add, the mean's divided by the degree); gradients add up.
"""
from __future__ import annotations


import torch
from torch import Tensor
from gnn_inductor.kernels.runtime.op_layout import contiguous_results, fresh_like

from gnn_inductor import config
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.dense import gemm as dense_triton
from gnn_inductor.kernels.gather_scatter import backward, fused, launches
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_SRC, check_reduce, edge_values, fake_edge_values
from gnn_inductor.kernels.runtime.launch import INTERPRETED
from gnn_inductor.kernels.runtime.reference import in_float32, recompute_grads, segment_reduce


def gather_scatter_reference(args: list, roles: list, rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor,
                             fn_key: str, reduce: str) -> Tensor:
    args, half = in_float32(args)
    messages = edge_functions.lookup(fn_key)(*edge_values(args, roles, col, row, perm))
    out = segment_reduce(messages, row, rowptr, reduce)
    return out if half is None else out.to(half)


KERNEL = {"cuda": "fused degree-split Triton (message and its VJP generated in; split at 8 x the plan's mean degree)",
          "cpu": "segment reference"}


def kernel_name(device_type: str, details: dict) -> str:
    """The report's kernel: the fused kernels on CUDA when the rewrite's message lowers
    (``details['lowering']``, set by the pattern), else the reference and why. A merged rewrite
    (``details['members']``) names its one pass, or says that its members run one by one."""
    lowering = details.get("lowering", "triton")
    members = details.get("members")
    if device_type == "cuda" and lowering != "triton":
        reason = lowering.removeprefix("reference: ")
        return f"one kernel per member ({reason})" if members else f"segment reference: {reason}"
    if device_type == "cuda" and members:
        return f"{KERNEL['cuda']}, one pass for {len(members)} reductions"
    return KERNEL.get(device_type, KERNEL["cpu"])


def _on_kernel_device(rowptr: Tensor) -> bool:
    """CUDA tensors, or CPU tensors under the Triton interpreter when ``GNN_IO_TRITON_ON_CPU=1`` (the tests)."""
    return rowptr.is_cuda or (INTERPRETED and config.get("triton_on_cpu"))


def _runs_fused(args, roles, rowptr: Tensor, fn_keys) -> bool:
    """The Triton path: tensors on the kernels' device and a message the generator lowers (a key), or
    messages it lowers into one kernel (a list of keys)."""
    return _on_kernel_device(rowptr) and launches.unsupported_reason(args, roles, fn_keys) is None


def _plan(args, roles, rowptr, col, row, perm, t_plan, items, t_items) -> fused.Plan:
    num_src = next((a.shape[0] for a, r in zip(args, roles) if r == ROLE_SRC), rowptr.numel() - 1)
    return fused.make_plan(rowptr, col, row, perm, num_src, *(t_plan or (None, None, None)), items, t_items)


def _out_dtype(args, roles, fn_key) -> torch.dtype:
    _, half = in_float32(list(args))
    return half or launches.lowering(fn_key, launches.argument_specs(args, roles)).message_dtype


_lib = torch.library.Library("gnn_io", "FRAGMENT")
_lib.define("gather_scatter(Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, "
            "str fn_key, str reduce, Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) -> Tensor")


def _gather_scatter(args, roles, rowptr, col, row, perm, fn_key, reduce, t_plan=None, items=None, t_items=None):
    """The op (CompositeImplicitAutograd): :func:`gather_scatter_forward`."""
    return gather_scatter_forward(args, roles, rowptr, col, row, perm, fn_key, reduce, t_plan, items, t_items)


_lib.impl("gather_scatter", _gather_scatter, "CompositeImplicitAutograd")


@torch.library.custom_op("gnn_io::gather_scatter_forward", mutates_args=(), schema=(
    "(Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, str fn_key, str reduce, "
    "Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) -> Tensor"))
@contiguous_results
def gather_scatter_forward(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor,
                           perm: Tensor, fn_key: str, reduce: str, t_plan: list[Tensor] | None = None,
                           items: list[Tensor] | None = None, t_items: list[Tensor] | None = None) -> Tensor:
    """``out``: the fused kernels where they run, else the reference."""
    check_reduce(reduce)
    num_dst = rowptr.shape[0] - 1
    if not _runs_fused(args, roles, rowptr, fn_key):
        return gather_scatter_reference(args, roles, rowptr, col, row, perm, fn_key, reduce)
    plan = _plan(args, roles, rowptr, col, row, perm, t_plan, items, t_items)
    shape = launches.lowering(fn_key, launches.argument_specs(args, roles)).message_shape
    out = fused.forward(args, roles, plan, fn_key, reduce)
    return out.reshape(num_dst, *shape).to(_out_dtype(args, roles, fn_key))


@gather_scatter_forward.register_fake
def _(args, roles, rowptr, col, row, perm, fn_key, reduce, t_plan=None, items=None, t_items=None):
    messages = edge_functions.lookup(fn_key)(*fake_edge_values(args, roles, col.shape[0]))
    return messages.new_empty((rowptr.shape[0] - 1, *messages.shape[1:]))


@torch.library.custom_op("gnn_io::gather_scatter_backward", mutates_args=(), schema=(
    "(Tensor grad_out, Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, str fn_key, "
    "str reduce, bool[] needs_grad, Tensor? out=None, Tensor[]? t_plan=None, Tensor[]? items=None, "
    "Tensor[]? t_items=None) -> Tensor[]"))
@contiguous_results
def gather_scatter_backward(grad_out: Tensor, args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor,
                            row: Tensor, perm: Tensor, fn_key: str, reduce: str, needs_grad: list[bool],
                            out: Tensor | None = None, t_plan: list[Tensor] | None = None,
                            items: list[Tensor] | None = None, t_items: list[Tensor] | None = None) -> list[Tensor]:
    """Gradient for each argument (an empty tensor where ``needs_grad`` is False); ``out`` is the
    forward result (max/min ties are found against it when it is float32, else recomputed)."""
    grads = _member_grads(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad, out,
                          t_plan, items, t_items)
    return [g if g is not None else grad_out.new_empty((0,)) for g in grads]


def _member_grads(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad, out, t_plan, items,
                  t_items, into=None) -> list:
    """:func:`gather_scatter_backward`'s gradients, None where not needed. ``into`` (fused path only): float32
    buffers the kernels add the gradients of those arguments to (None for them in the result)."""
    if _runs_fused(args, roles, rowptr, fn_key):
        plan = _plan(args, roles, rowptr, col, row, perm, t_plan, items, t_items)
        saved = out if out is not None and out.dtype == torch.float32 and reduce in ("max", "min") else None
        return backward.backward(grad_out, args, roles, plan, fn_key, reduce, needs_grad, saved, into=into)
    return recompute_grads(
        lambda *a: gather_scatter_reference(list(a), roles, rowptr, col, row, perm, fn_key, reduce),
        list(args), grad_out, needs_grad)


@gather_scatter_backward.register_fake
def _(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad, out=None, t_plan=None, items=None,
      t_items=None):
    return [fresh_like(a) if need else grad_out.new_empty((0,)) for a, need in zip(args, needs_grad)]


@torch.library.custom_op("gnn_io::gather_scatter_backward_mm", mutates_args=(), schema=(
    "(Tensor a, Tensor b, int index, Tensor grad_out, Tensor[] args, int[] roles, Tensor rowptr, Tensor col, "
    "Tensor row, Tensor perm, str fn_key, str reduce, bool[] needs_grad, Tensor? out=None, "
    "Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) -> Tensor[]"))
@contiguous_results
def gather_scatter_backward_mm(a: Tensor, b: Tensor, index: int, grad_out: Tensor, args: list[Tensor],
                               roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor, fn_key: str,
                               reduce: str, needs_grad: list[bool], out: Tensor | None = None,
                               t_plan: list[Tensor] | None = None, items: list[Tensor] | None = None,
                               t_items: list[Tensor] | None = None) -> list[Tensor]:
    """:func:`gather_scatter_backward`'s gradients, argument ``index``'s plus ``a @ b`` (a graph's
    ``mm(a, b) + grad``, folded by ``gnn_inductor/passes/gemm_accumulate.py``). On the kernels' path, for a float32
    ``[rows, features]`` argument, the product is the buffer the walk adds that gradient into: no zero-filled
    gradient buffer, no copy, no separate add. Elsewhere the product is added to the gradient."""
    base = dense_triton.matmul(a, b)
    target = args[index]
    into = {}
    if (_runs_fused(args, roles, rowptr, fn_key) and target.dtype == torch.float32 == base.dtype
            and target.dim() == 2 and tuple(base.shape) == tuple(target.shape) and base.is_contiguous()
            and roles[index] != ROLE_DENSE):
        into = {index: base}
    grads = _member_grads(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad, out,
                          t_plan, items, t_items, into=into or None)
    grads[index] = base if into else base + grads[index]
    return [g if g is not None else grad_out.new_empty((0,)) for g in grads]


@gather_scatter_backward_mm.register_fake
def _(a, b, index, grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, needs_grad, out=None,
      t_plan=None, items=None, t_items=None):
    return [fresh_like(x) if need else grad_out.new_empty((0,)) for x, need in zip(args, needs_grad)]


def _save(ctx, args, plan_and_results: list, t_plan, items, t_items) -> None:
    """Save what a backward needs: the arguments, ``plan_and_results`` (the CSR tensors, the forward's
    outputs) and the optional plan lists, whose sizes ``_saved`` reads back."""
    extras = [list(t_plan or []), list(items or []), list(t_items or [])]
    ctx.save_for_backward(*args, *plan_and_results, *extras[0], *extras[1], *extras[2])
    ctx.sizes = (len(args), len(plan_and_results), [None if e is None else len(e) for e in (t_plan, items, t_items)])
    ctx.needs = [bool(a.requires_grad) for a in args]


def _saved(ctx) -> tuple:
    """``(args, plan_and_results, [t_plan, items, t_items], no_grads)`` as :func:`_save` saved them;
    ``no_grads`` answers the optional plan lists in the backward's return value."""
    num_args, num_plan, extra_sizes = ctx.sizes
    saved = list(ctx.saved_tensors)
    args, plan_and_results, rest = saved[:num_args], saved[num_args:num_args + num_plan], saved[num_args + num_plan:]
    extras = []
    for size in extra_sizes:
        extras.append(None if size is None else rest[:size])
        rest = rest[size or 0:]
    # the dispatcher drops trailing arguments equal to their defaults; backward answers the others only
    passed = max((i + 1 for i, size in enumerate(extra_sizes) if size is not None), default=0)
    no_grads = [None if size is None else [None] * size for size in extra_sizes[:passed]]
    return args, plan_and_results, extras, no_grads


def _setup(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, fn_key, reduce, t_plan, items, t_items = inputs
    _save(ctx, args, [rowptr, col, row, perm, output], t_plan, items, t_items)
    ctx.meta = (roles, fn_key, reduce)


def _backward(ctx, grad_out):
    roles, fn_key, reduce = ctx.meta
    args, (rowptr, col, row, perm, out), extras, no_grads = _saved(ctx)
    grads = gather_scatter_backward(grad_out, args, roles, rowptr, col, row, perm, fn_key, reduce, ctx.needs, out,
                                    *extras)
    return [g if need else None for g, need in zip(grads, ctx.needs)], *(None,) * 7, *no_grads


gather_scatter_forward.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------------------------------------
# Several reductions, one pass
# ---------------------------------------------------------------------------------------------

_lib.define("gather_scatter_multi(Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, "
            "str[] fn_keys, str[] reduces, Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) "
            "-> Tensor[]")


def _gather_scatter_multi(args, roles, rowptr, col, row, perm, fn_keys, reduces, t_plan=None, items=None,
                          t_items=None):
    """The op (CompositeImplicitAutograd): the outputs of :func:`gather_scatter_multi_forward`, one per
    member."""
    return gather_scatter_multi_forward(args, roles, rowptr, col, row, perm, fn_keys, reduces, t_plan, items,
                                        t_items)


_lib.impl("gather_scatter_multi", _gather_scatter_multi, "CompositeImplicitAutograd")


@torch.library.custom_op("gnn_io::gather_scatter_multi_forward", mutates_args=(), schema=(
    "(Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, str[] fn_keys, str[] reduces, "
    "Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) -> Tensor[]"))
@contiguous_results
def gather_scatter_multi_forward(args: list[Tensor], roles: list[int], rowptr: Tensor, col: Tensor, row: Tensor,
                                 perm: Tensor, fn_keys: list[str], reduces: list[str],
                                 t_plan: list[Tensor] | None = None, items: list[Tensor] | None = None,
                                 t_items: list[Tensor] | None = None) -> list[Tensor]:
    """The members' outputs (each as :func:`gather_scatter_forward`'s)."""
    if len(fn_keys) != len(reduces) or not fn_keys:
        raise ValueError(f"gather_scatter_multi needs one reduce per edge function, got {len(fn_keys)} functions "
                         f"and {len(reduces)} reduces")
    for reduce in reduces:
        check_reduce(reduce)
    if not _runs_fused(args, roles, rowptr, fn_keys):
        # members that cannot share a kernel run as the single op does, each on its own path
        return [gather_scatter_forward(args, roles, rowptr, col, row, perm, key, reduce, t_plan, items, t_items)
                for key, reduce in zip(fn_keys, reduces)]
    plan = _plan(args, roles, rowptr, col, row, perm, t_plan, items, t_items)
    num_dst = rowptr.shape[0] - 1
    shape = launches.lowering(fn_keys[0], launches.argument_specs(args, roles)).message_shape
    outs = fused.forward_multi(args, roles, plan, fn_keys, reduces)
    return [out.reshape(num_dst, *shape).to(_out_dtype(args, roles, key)) for out, key in zip(outs, fn_keys)]


@gather_scatter_multi_forward.register_fake
def _(args, roles, rowptr, col, row, perm, fn_keys, reduces, t_plan=None, items=None, t_items=None):
    values = fake_edge_values(args, roles, col.shape[0])
    outs = []
    for key in fn_keys:
        messages = edge_functions.lookup(key)(*values)
        outs.append(messages.new_empty((rowptr.shape[0] - 1, *messages.shape[1:])))
    return outs


def _setup_multi(ctx, inputs, output):
    args, roles, rowptr, col, row, perm, fn_keys, reduces, t_plan, items, t_items = inputs
    ctx.set_materialize_grads(False)  # members whose output is unused get no backward
    _save(ctx, args, [rowptr, col, row, perm, *output], t_plan, items, t_items)
    ctx.meta = (roles, list(fn_keys), list(reduces))


@torch.library.custom_op("gnn_io::gather_scatter_multi_backward", mutates_args=(), schema=(
    "(Tensor?[] grad_outs, Tensor[] args, int[] roles, Tensor rowptr, Tensor col, Tensor row, Tensor perm, "
    "str[] fn_keys, str[] reduces, bool[] needs_grad, Tensor[] outs, "
    "Tensor[]? t_plan=None, Tensor[]? items=None, Tensor[]? t_items=None) -> Tensor[]"))
@contiguous_results
def gather_scatter_multi_backward(grad_outs: list[Tensor | None], args: list[Tensor], roles: list[int],
                                  rowptr: Tensor, col: Tensor, row: Tensor, perm: Tensor, fn_keys: list[str],
                                  reduces: list[str], needs_grad: list[bool], outs: list[Tensor],
                                  t_plan: list[Tensor] | None = None, items: list[Tensor] | None = None,
                                  t_items: list[Tensor] | None = None) -> list[Tensor]:
    r"""Gradient for each argument of :func:`gather_scatter_multi_forward` (an empty tensor where ``needs_grad``
    is False): :math:`\sum_j` member ``j``'s gradient (:func:`gather_scatter_backward`), members with no
    cotangent (``None``: output unused) skipped.

    The sum and mean members of one edge function take one walk: the message cotangent of a sum is ``dY_i``,
    of a mean ``dY_i / deg_i``, so their total is one sum's backward with those cotangents added. The walks
    run one after another inside this op. On the kernels' path (the members lower into one kernel, as in the
    forward) they all add into one float32 buffer per argument: their kernels load, add and store where they
    would store. Elsewhere each walk's gradients are added into the first walk's, in place. Either way no sum of
    the members' gradients is left to the backward graph, where Inductor fused it into one add and so kept every
    member's gradient alive (an edge tensor's are edge-sized: PNA's messages)."""
    walks = []  # (cotangent, key, reduce, out)
    linear: dict = {}
    for j, (key, reduce, grad) in enumerate(zip(fn_keys, reduces, grad_outs)):
        if grad is None:
            continue
        if reduce in ("max", "min"):
            walks.append((grad, key, reduce, outs[j]))
        else:
            linear.setdefault(key, []).append((grad, reduce))
    for key, cotangents in linear.items():
        if len(cotangents) == 1:
            (grad, reduce), = cotangents
            walks.append((grad, key, reduce, None))
            continue
        degree = (rowptr[1:] - rowptr[:-1]).clamp(min=1).float()
        total = sum(grad.float() if reduce == "sum" else grad.float() / degree.view(-1, *[1] * (grad.dim() - 1))
                    for grad, reduce in cotangents)
        walks.append((total.to(cotangents[0][0].dtype), key, "sum", None))
    totals = [None] * len(args)
    buffers = {}
    if len(walks) > 1 and _runs_fused(args, roles, rowptr, [key for _, key, *_ in walks]):
        buffers = backward.gradient_buffers(args, roles, walks[0][1], needs_grad)
    for cotangent, key, reduce, out in walks:
        member_grads = _member_grads(cotangent, args, roles, rowptr, col, row, perm, key, reduce, needs_grad, out,
                                     t_plan, items, t_items, into=buffers)
        for i, grad in enumerate(member_grads):
            if grad is None:
                continue
            if totals[i] is None:
                # the first gradient becomes the sum, so it must be this op's own memory
                totals[i] = grad if not _shares_memory(grad, [*args, cotangent]) else grad.clone()
            else:
                totals[i].add_(grad)
            del grad
        del member_grads
    for i, buffer in buffers.items():
        totals[i] = backward.from_buffer(buffer, args[i])
    return [total if total is not None and need else a.new_empty((0,))
            for a, total, need in zip(args, totals, needs_grad)]


def _shares_memory(tensor: Tensor, others: list) -> bool:
    storage = tensor.untyped_storage().data_ptr()
    return any(isinstance(o, Tensor) and o.untyped_storage().data_ptr() == storage for o in others)


@gather_scatter_multi_backward.register_fake
def _(grad_outs, args, roles, rowptr, col, row, perm, fn_keys, reduces, needs_grad, outs, t_plan=None, items=None,
      t_items=None):
    return [fresh_like(a) if need else a.new_empty((0,)) for a, need in zip(args, needs_grad)]


def _backward_multi(ctx, grads):
    roles, fn_keys, reduces = ctx.meta
    args, (rowptr, col, row, perm, *outs), extras, no_grads = _saved(ctx)
    if all(grad is None for grad in grads):
        return [None] * len(args), *(None,) * 7, *no_grads
    total_grads = gather_scatter_multi_backward(list(grads), args, roles, rowptr, col, row, perm, fn_keys, reduces,
                                                ctx.needs, outs, *extras)
    return [g if need else None for g, need in zip(total_grads, ctx.needs)], *(None,) * 7, *no_grads


gather_scatter_multi_forward.register_autograd(_backward_multi, setup_context=_setup_multi)
