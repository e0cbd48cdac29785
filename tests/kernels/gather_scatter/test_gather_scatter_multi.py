"""Several reductions in one pass: ``gnn_io::gather_scatter_multi`` (kernels/gather_scatter) against the single op's
exact CPU reference per member, its shared forward kernel and backward walks, the members run one by one where they
share no kernel, opcheck of its forward and backward ops, and the op under ``torch.compile``.

The kernels run through the op on CUDA when there is a GPU, and on CPU tensors in the interpreter tier
(``TRITON_INTERPRET=1 pytest -m triton``), at small sizes, on the graph of tests/kernels/gather_scatter/cases.py
(isolated nodes, self loops, duplicate edges, a hub split into several items).
"""

import pytest
import torch

from gnn_inductor.kernels.gather_scatter import launches
from gnn_inductor.kernels.gather_scatter.op import gather_scatter_reference
from tests.kernels.gather_scatter.cases import (
    DEVICE,
    MESSAGES,
    NUM_NODES,
    E,
    S,
    assert_within,
    cotangent,
    inputs,
    message_key,
    valued_inputs,
)
from tests.tiers import covering, runs_kernel

# members over one argument list: (message, reduce); PyG's std is the mean of x and of x * x
MULTI = {
    "all_reduces": ([(S, (6,))], [(lambda x_j: x_j, r) for r in ("sum", "mean", "max", "min")]),
    "std": ([(S, (6,))], [(lambda x_j: x_j, "mean"), (lambda x_j: x_j * x_j, "mean"), (lambda x_j: x_j, "max")]),
    "relu_edge": ([(S, (6,)), (E, (6,))], [(lambda x_j, e: torch.relu(x_j + e), "max"),
                                           (lambda x_j, e: torch.relu(x_j + e), "mean"),
                                           (lambda x_j, e: x_j * e, "min")]),
    "leaky_dst": (MESSAGES["leaky_dst"][1], [(MESSAGES["leaky_dst"][0], "sum"), (MESSAGES["leaky_dst"][0], "min")]),
    "edge_message": ([(E, (1, 6))], [(lambda m: m, "mean"), (lambda m: m, "min"), (lambda m: m, "max"),
                                     (lambda m: m * m, "mean")]),  # PNA: one computed edge tensor
    "unread_argument": ([(S, (6,)), (E, (6,))], [(lambda x_j, e: torch.relu(x_j + e), "max"),
                                                 (lambda x_j, e: x_j * x_j, "mean")]),  # e: no gradient from the mean
}


def _members(name):
    specs, members = MULTI[name]
    return [role for role, _ in specs], specs, [message_key(fn) for fn, _ in members], [reduce for _, reduce in members]


def _run_multi(args, roles, plan, keys, reduces, grad_outs):
    leaves = [a.detach().requires_grad_(True) for a in args]
    rowptr, col, row, perm, *t_plan = plan
    outs = torch.ops.gnn_io.gather_scatter_multi(leaves, roles, rowptr, col, row, perm, keys, reduces, t_plan)
    grads = torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in zip(grad_outs, outs)])
    return outs, grads


def _reference_multi(args, roles, plan, keys, reduces, grad_outs):
    """The single op's reference per member, gradients summed over the members (float64)."""
    leaves = [a.detach().cpu().double().requires_grad_(True) for a in args]
    outs = [gather_scatter_reference(leaves, roles, *(p.cpu() for p in plan[:4]), key, reduce)
            for key, reduce in zip(keys, reduces)]
    return outs, torch.autograd.grad(outs, leaves, [g.double() for g in grad_outs])


@runs_kernel
@pytest.mark.parametrize("name, values", covering(list(MULTI), ["random", "integer"]))
def test_multi_matches_the_reference_per_member(plan, name, values, launched):
    """Every member's output and the gradients summed over the members, against the single op's reference:
    duplicate edges, integer ties, isolated nodes, the hub split into items (``MAX_EDGES``); one forward kernel
    computes every member."""
    roles, specs, keys, reduces = _members(name)
    args = valued_inputs(specs, values, seed=8)
    grad_outs = [cotangent(key, args, roles, seed=9 + j) for j, key in enumerate(keys)]
    outs, grads = _run_multi([a.float().to(DEVICE) for a in args], roles, plan, keys, reduces,
                             [g.to(DEVICE) for g in grad_outs])
    refs, ref_grads = _reference_multi(args, roles, plan, keys, reduces, grad_outs)
    for out, ref in zip(outs, refs):
        assert_within(out, ref)
    for g, r in zip(grads, ref_grads):
        assert_within(g, r)
    (forward,) = [s for s in launched if s.kind == "forward"]
    assert [reduce for reduce, _ in forward.members] == reduces
    assert len({index for _, index in forward.members}) == len(set(keys))  # each distinct message computed once


@runs_kernel
def test_multi_sum_and_mean_of_one_message_share_a_backward_walk(plan, launched):
    """The linear members of one message take one backward walk (cotangents added, the mean's over the
    degree); unused outputs take none."""
    roles, specs, keys, reduces = _members("all_reduces")
    args = [a.float().to(DEVICE) for a in inputs(specs, torch.float32, seed=12)]
    grad_outs = [cotangent(key, args, roles, seed=13 + j).float().to(DEVICE) for j, key in enumerate(keys)]
    _run_multi(args, roles, plan, keys, reduces, grad_outs)
    walks = [s for s in launched if s.kind == "grad"]
    assert sorted(s.reduce for s in walks) == ["max", "min", "sum"]
    launched.clear()
    leaves = [a.clone().requires_grad_(True) for a in args]
    outs = torch.ops.gnn_io.gather_scatter_multi(leaves, roles, *plan[:4], keys, reduces, plan[4:])
    torch.autograd.grad(outs[2], leaves, grad_outs[2])  # the max alone
    assert [s.reduce for s in launched if s.kind == "grad"] == ["max"]


@runs_kernel
def test_multi_members_that_share_no_kernel_run_one_by_one(plan, launched):
    """Messages of different shapes (or one the generator refuses) cannot share a kernel: each member runs as
    the single op would, with the same results."""
    specs = [(S, (3,))]
    roles = [S]
    keys = [message_key(lambda x_j: x_j), message_key(lambda x_j: x_j.view(-1, 1, 3) * 2.0),
            message_key(lambda x_j: x_j.sum(-1, keepdim=True))]
    reduces = ["max", "mean", "sum"]
    args = [a.float() for a in inputs(specs, torch.float32, seed=14)]
    assert "different shapes" in launches.unsupported_reason(args, roles, keys[:2])
    assert "not a pointwise op" in launches.unsupported_reason(args, roles, keys[::2])
    grad_outs = [cotangent(key, args, roles, seed=15 + j) for j, key in enumerate(keys[:2])]
    grad_outs.append(torch.randn(NUM_NODES, 1, dtype=torch.float64))
    outs, grads = _run_multi([a.to(DEVICE) for a in args], roles, plan, keys, reduces,
                             [g.to(DEVICE) for g in grad_outs])
    refs, ref_grads = _reference_multi(args, roles, plan, keys, reduces, grad_outs)
    assert [tuple(o.shape) for o in outs] == [(NUM_NODES, 3), (NUM_NODES, 1, 3), (NUM_NODES, 1)]
    for out, ref in zip(outs, refs):
        assert_within(out, ref)
    for g, r in zip(grads, ref_grads):
        assert_within(g, r)
    assert [s.members for s in launched if s.kind == "forward"] == [(("max", 0),), (("mean", 0),)]


@runs_kernel
def test_opcheck_multi_forward(plan):
    roles, specs, keys, reduces = _members("relu_edge")
    args = [a.float().to(DEVICE).requires_grad_(True) for a in inputs(specs, torch.float32, seed=16)]
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    items = list(torch.ops.gnn_io.gather_scatter_items(rowptr, col))
    t_items = list(torch.ops.gnn_io.gather_scatter_items(t_rowptr, t_col))
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter_multi_forward.default,
                          (args, roles, rowptr, col, row, perm, keys, reduces, [t_rowptr, t_col, t_perm], items,
                           t_items),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@runs_kernel
def test_opcheck_multi_backward(plan):
    """The backward op (members walked one after another, gradients added in place) is a well-formed op: schema,
    fake implementation, and an unused member's cotangent (None) skipped."""
    roles, specs, keys, reduces = _members("relu_edge")
    args = [a.float().to(DEVICE) for a in inputs(specs, torch.float32, seed=18)]
    rowptr, col, row, perm, t_rowptr, t_col, t_perm = plan
    t_plan = [t_rowptr, t_col, t_perm]
    outs = torch.ops.gnn_io.gather_scatter_multi_forward(args, roles, rowptr, col, row, perm, keys, reduces, t_plan)
    cotangents = [torch.randn_like(o) for o in outs]
    cotangents[1] = None
    torch.library.opcheck(torch.ops.gnn_io.gather_scatter_multi_backward.default,
                          (cotangents, args, roles, rowptr, col, row, perm, keys, reduces, [True, True], outs,
                           t_plan),
                          test_utils=("test_schema", "test_faketensor"))
    grads = torch.ops.gnn_io.gather_scatter_multi_backward(cotangents, args, roles, rowptr, col, row, perm, keys,
                                                           reduces, [True, True], outs, t_plan)
    kept = [0, 2]
    _, want = _reference_multi(args, roles, plan, [keys[j] for j in kept], [reduces[j] for j in kept],
                               [cotangents[j].cpu() for j in kept])
    for got, ref in zip(grads, want):
        assert_within(got, ref)


@runs_kernel
def test_compiled_multi_matches_eager(plan):
    """Under ``torch.compile`` (AOTAutograd traces the CompositeImplicitAutograd op through the fake
    implementations) the outputs and gradients are the eager op's."""
    roles, specs, keys, reduces = _members("std")
    rowptr, col, row, perm, *t_plan = plan
    args = [a.float().to(DEVICE) for a in inputs(specs, torch.float32, seed=17)]

    def std(x):
        mean, mean_sq, top = torch.ops.gnn_io.gather_scatter_multi([x], roles, rowptr, col, row, perm, keys, reduces,
                                                                   t_plan)
        return torch.sqrt(torch.relu(mean_sq - mean * mean) + 1e-5) + top

    leaves = [a.clone().requires_grad_(True) for a in args]
    compiled_out = torch.compile(std, backend="aot_eager", fullgraph=True)(*leaves)
    compiled = torch.autograd.grad(compiled_out.sum(), leaves)
    leaves = [a.clone().requires_grad_(True) for a in args]
    eager_out = std(*leaves)
    torch.testing.assert_close(compiled_out, eager_out)
    torch.testing.assert_close(compiled, torch.autograd.grad(eager_out.sum(), leaves))
