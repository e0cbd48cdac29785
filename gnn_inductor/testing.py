"""Regression testing for users' own models: does ``gnn_io`` still rewrite what it should, and
does the compiled model still match eager?

>>> from gnn_inductor.testing import check_rewrites
>>> check_rewrites(model, x, edge_index, expect={"attention": 2})

The project's own pattern tests use this same helper.
"""
from __future__ import annotations

import contextlib
import copy
from collections import Counter
from dataclasses import dataclass

import torch

from gnn_inductor import rewrite_report as _report
from gnn_inductor.frontends import pyg

# Every comparison tolerance of the tests, by kind and dtype: (rtol, atol). A comparison passes where
# |actual - expected| <= atol + rtol * |expected| elementwise (torch.testing.assert_close; NaN never passes, as
# assert_close's equal_nan is off). Fetch an entry with :func:`tolerance`. Half an ulp is 2^-24 (6e-8) in float32,
# 2^-53 in float64, 2^-11 in float16 and 2^-9 in bfloat16.
TOLERANCE_TABLE = {
    # A kernel or compiled graph against eager in the same dtype (or against float64 rounded to it) that differs
    # only by the order of its reductions' additions: float32 to about 1e-5 relative (sums of up to a few hundred
    # terms, each addition rounding by 2^-24), float64 to 1e-10; float16 and bfloat16 a few ulps of their own.
    "default": {
        torch.float64: (1e-10, 1e-10),
        torch.float32: (1e-5, 1e-5),
        torch.float16: (2e-3, 2e-3),
        torch.bfloat16: (1.6e-2, 1.6e-2),
    },
    # The same operations in the same order: bit for bit.
    "exact": {dtype: (0.0, 0.0) for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)},
    # The same few terms per element added in another order, or one rounding step moved (a GEMM's bias added
    # inside it, two gradients summed in the other order), with no long reduction: a few ulps, far under the default.
    "reassociated": {
        torch.float64: (1e-12, 1e-12),
        torch.float32: (1e-6, 1e-6),
        torch.bfloat16: (1e-2, 1e-2),
    },
    # One float32 kernel at two launches (other warps, stages or heads per program): the elements' arithmetic is
    # the same up to the order of a tile's in-register reductions, a few ulps of each partial sum; the outputs near
    # 0 are not sums that cancel, so the absolute part stays at a tenth of the default.
    "relaunch": {
        torch.float32: (1e-5, 1e-6),
    },
    # A float32 GEMM kernel (no TF32) against the float64 product: each output sums its inner products in float32
    # tiles, about K * 2^-24 relative to the sum of |terms|, which exceeds |result| where the terms cancel; inner
    # sizes of up to ~100 give 2e-5.
    "gemm": {
        torch.float32: (2e-5, 2e-5),
    },
    # A float32 GEMM with TF32 inputs: TF32 keeps 10 mantissa bits, so each input rounds by up to 2^-11 (5e-4)
    # relative and a product by twice that; 2e-3 covers the products' rounding and the float32 sum over them.
    "tf32": {
        torch.float32: (2e-3, 2e-3),
    },
    # A fused kernel (attention's online softmax, a gather-scatter with an edge function) against a float64
    # reference rounded to the dtype: the reference's rounding (half an ulp), the kernel's rounding of its inputs'
    # products and its float32 accumulation, and in attention exp, which turns a score's absolute error into a
    # relative error of every weight (scores of a few units multiply it by that many): four times the default.
    "kernel": {
        torch.float64: (4e-10, 4e-10),
        torch.float32: (4e-5, 4e-5),
        torch.float16: (8e-3, 8e-3),
        torch.bfloat16: (6.4e-2, 6.4e-2),
    },
    # A compiled float32 GNN layer (its GEMMs, an attention softmax over a hub's edges, and their backward's sums
    # over those edges) against eager float32: both sides carry their own chain of float32 reductions, each adding
    # about sqrt(K) * 2^-24 relative, and exp turns the score's absolute error into the weights' relative error:
    # 1e-4 relative; the absolute part stays at the default, as no output cancels to near 0.
    "layer": {
        torch.float32: (1e-4, 1e-5),
    },
    # A float32 sum of about HUB_TERMS unit-size terms (a hub's in-edges, a bias gradient's column over a thousand
    # rows) whose result may cancel toward 0, where relative error means nothing: the absolute error is about
    # 2^-24 * sum(|terms|) ~ 6e-8 * 1e3, bounded at 1e-4. For n terms scale the atol by sqrt(n / HUB_TERMS) (the
    # rounding errors of a blocked sum add like a random walk). bfloat16: that float32 sum rounded once to bfloat16
    # (half an ulp, 2^-9), within 2^-8 relative.
    "hub_sum": {
        torch.float32: (1e-5, 1e-4),
        torch.bfloat16: (2 ** -8, 1e-4),
    },
}

# The number of terms a "hub_sum" entry's atol covers.
HUB_TERMS = 1024

# The default tolerance per dtype, (rtol, atol-scale), as check_rewrites applies it:
# |compiled - eager| <= atol_scale * max(1, |eager|max) + rtol * |eager|.
TOLERANCES = dict(TOLERANCE_TABLE["default"])


def tolerance(dtype: torch.dtype, kind: str = "default", *, scale: float = 1.0) -> dict:
    """``dict(rtol=..., atol=...)`` of ``TOLERANCE_TABLE[kind][dtype]``, its atol multiplied by ``scale`` (for a
    comparison relative to the expected values' magnitude, see :func:`magnitude`):

    >>> torch.testing.assert_close(actual, expected, **tolerance(torch.float32))
    """
    if kind not in TOLERANCE_TABLE:
        raise KeyError(f"no tolerance kind {kind!r}; kinds: {sorted(TOLERANCE_TABLE)}")
    entries = TOLERANCE_TABLE[kind]
    if dtype not in entries:
        raise KeyError(f"no {kind!r} tolerance for {dtype}; it has {sorted(map(str, entries))}")
    if not scale >= 0:
        raise ValueError(f"scale must be a number >= 0, got {scale}")
    rtol, atol = entries[dtype]
    return {"rtol": rtol, "atol": atol * float(scale)}


def magnitude(expected: torch.Tensor) -> float:
    """``max(1, |expected|max)``: the scale of an atol relative to the largest expected element."""
    return max(1.0, float(expected.abs().max())) if expected.numel() else 1.0


def random_graph(num_nodes: int, num_edges: int, *, seed: int = 0, hub_degree: int = 0, num_isolated: int = 2,
                 self_loops: int = 3, duplicates: int = 3) -> torch.Tensor:
    """A random ``edge_index [2, E]`` with the cases kernels get wrong: ``num_isolated`` nodes with
    no edges at all (the last ones), ``self_loops`` self loops, ``duplicates`` repeated edges and,
    when ``hub_degree`` > 0, node 0 as a hub receiving ``hub_degree`` extra edges."""
    generator = torch.Generator().manual_seed(seed)
    active = num_nodes - num_isolated
    if active < 2:
        raise ValueError(f"need at least 2 non-isolated nodes, got num_nodes={num_nodes}, num_isolated={num_isolated}")
    src = torch.randint(0, active, (num_edges,), generator=generator)
    dst = torch.randint(0, active, (num_edges,), generator=generator)
    parts = [torch.stack([src, dst])]
    if hub_degree:
        parts.append(torch.stack([torch.randint(0, active, (hub_degree,), generator=generator),
                                  torch.zeros(hub_degree, dtype=torch.long)]))
    loops = torch.randint(0, active, (self_loops,), generator=generator)
    parts.append(torch.stack([loops, loops]))
    parts.append(parts[0][:, :duplicates])
    edge_index = torch.cat(parts, dim=1)
    return edge_index[:, torch.randperm(edge_index.shape[1], generator=generator)]


def random_hetero_graph(sizes: dict, edges: dict, features: int, *, seed: int = 0, dtype=torch.float32,
                        device="cpu") -> tuple:
    """``(x_dict, edge_index_dict, metadata)`` of a random heterogeneous graph: ``sizes`` maps each node type to its
    node count, ``edges`` each edge type ``(src, relation, dst)`` to its edge count (endpoints drawn uniformly, with
    repeats); ``metadata`` is ``(node_types, edge_types)`` as ``to_hetero`` takes it."""
    generator = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(n, features, generator=generator, dtype=dtype).to(device) for t, n in sizes.items()}
    edge_index = {(src, rel, dst): torch.stack([torch.randint(0, sizes[src], (num,), generator=generator),
                                                torch.randint(0, sizes[dst], (num,), generator=generator)]).to(device)
                  for (src, rel, dst), num in edges.items()}
    return x, edge_index, (list(sizes), list(edge_index))


@dataclass
class RewriteCheck:
    """What :func:`check_rewrites` saw: rewrite counts by pattern, near misses, the JSON report."""
    counts: Counter
    near_misses: list
    report: dict


def _flatten(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _flatten(item)]
    if isinstance(out, dict):
        return [t for item in out.values() for t in _flatten(item)]
    return []


def assert_close_to_reference(name: str, actual: torch.Tensor, expected: torch.Tensor, baseline=None,
                              scale: float = 0.0) -> None:
    """``actual`` against ``expected`` within the dtype's tolerance. An ``actual`` of a lower precision than
    ``expected`` (half precision against float32, or float32 against float64) is judged relative to
    ``baseline``, the same model run eagerly in ``actual``'s dtype: it may be at most twice as far from
    ``expected`` as eager is (plus the dtype's tolerance), since rounding inside the model, not in the rewritten
    ops, dominates there.

    ``scale`` (gradients): the largest root mean square element among the reference gradients of the same step (see
    :func:`gradient_scale`). In lower precision the bound then also allows the dtype's tolerance of that scale per
    element. A gradient whose exact value cancels to 0 (the query and key gradients of a destination with one
    edge: its softmax weight is 1 whatever the score) has eager's error 0 where eager rounds to exactly 0, while a
    fused backward's ``D = <dout, out>`` reads the half-precision output and leaves rounding noise of the layer's
    gradient scale there (docs/attention.md, "Precision of the backward in half precision")."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}")
    if not torch.isfinite(actual).all():
        raise AssertionError(f"{name}: compiled result has NaN or inf")
    if not torch.isfinite(expected).all():
        raise AssertionError(f"{name}: eager result has NaN or inf; pick inputs that make eager finite")
    if actual.dtype != expected.dtype:
        rtol, _ = TOLERANCES[actual.dtype]
        error = float((actual.to(expected.dtype) - expected).norm())
        eager_error = float((baseline.to(expected.dtype) - expected).norm())
        bound = 2 * eager_error + rtol * (float(expected.norm()) + scale * actual.numel() ** 0.5)
        if error > bound:
            raise AssertionError(f"{name}: {actual.dtype} result is {error:.4g} from {expected.dtype} (norm), eager "
                                 f"{actual.dtype} is {eager_error:.4g}; allowed {bound:.4g}")
        return
    rtol, atol_scale = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    atol = atol_scale * max(1.0, float(expected.abs().max()) if expected.numel() else 1.0)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def gradient_scale(grads) -> float:
    """The largest root mean square element among ``grads`` (tensors or None): the scale of a step's gradients, of
    which ``assert_close_to_reference`` allows its dtype's tolerance per element in lower precision."""
    return max((float(g.norm()) / g.numel() ** 0.5 for g in grads if g is not None and g.numel()), default=0.0)


def forward_backward(model, inputs, grad: bool, seed: int, kwargs):
    """Outputs, parameter gradients and input gradients of one forward(+backward); the backward
    seeds each output with the same random weights (float32, drawn from ``seed``) in every model."""
    model.zero_grad(set_to_none=True)
    outputs = _flatten(model(*inputs, **kwargs))
    if grad:
        generator = torch.Generator().manual_seed(seed)
        loss = torch.zeros((), device=outputs[0].device)
        for o in outputs:
            if o.is_floating_point():
                weight = torch.randn(o.shape, generator=generator).to(o.device, o.dtype)
                if o.requires_grad:
                    loss = loss + (o * weight).sum()
        loss.backward()
    params = [(name, p.grad) for name, p in model.named_parameters()]
    input_grads = [t.grad if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs]
    return [o.detach() for o in outputs], params, input_grads


def check_rewrites(model: torch.nn.Module, *inputs, expect: dict, grad: bool = True, calls: int = 2,
                   backend: str = "gnn_io", float64_reference: bool = False, **kwargs) -> RewriteCheck:
    """Compile ``model`` with ``gnn_io``, compare outputs and gradients (parameters and floating
    point inputs) with eager, and assert the rewrites.

    ``expect`` maps pattern names (``"spmm"``, ``"gather_scatter"``, ``"edge_softmax"``,
    ``"attention"``, or ``"near_miss"``) to the exact number of times each must appear; patterns
    not named may appear any number of times. Dynamo's caches are reset first, so the model is
    compiled afresh. The compiled model is called ``calls`` times (the later calls reuse the
    graph plan) and every call is compared. Returns a :class:`RewriteCheck`.

    float16/bfloat16 models are compared with an eager float32 copy, relative to how far eager in
    the same half precision lands from it (see :func:`assert_close_to_reference`). With ``float64_reference`` a float32
    model is compared the same way with an eager float64 copy, relative to eager float32: for models whose
    eager float32 result is itself far from exact (a standard deviation aggregation's ``E[x^2] - E[x]^2``
    cancels), where the compiled model may be closer to the exact result than eager and still differ from it
    by more than float32's tolerance.
    """
    torch._dynamo.reset()
    first_report = len(_report.reports())
    # the user's own module is the compiled one, so gnn_inductor.report(model) finds its graphs
    compiled_model, reference = model, copy.deepcopy(model)
    dtypes = {p.dtype for p in model.parameters()}
    half = bool(dtypes & {torch.float16, torch.bfloat16})
    # the reference's dtype, where it is above the model's: inputs of the model's dtype are cast to it
    upcast = {torch.float16: torch.float32, torch.bfloat16: torch.float32} if half else \
        {torch.float32: torch.float64} if float64_reference else {}
    if float64_reference and (half or dtypes - {torch.float32}):
        raise ValueError(f"float64_reference compares a float32 model; its parameters are {sorted(map(str, dtypes))}")
    baseline_model = copy.deepcopy(model) if upcast else None
    if upcast:
        reference.to(dtype=torch.float64 if float64_reference else torch.float32)
    compiled = torch.compile(compiled_model, backend=backend)

    def leaf_inputs(cast=None):  # fresh feature leaves; the same structure tensors, so plans are reused
        cast = cast or {}
        return [t.detach().to(cast.get(t.dtype, t.dtype), copy=True).requires_grad_(grad)
                if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]

    for call in range(calls):
        ref_out, ref_params, ref_inputs = forward_backward(reference, leaf_inputs(upcast), grad, call, kwargs)
        out, params, input_grads = forward_backward(compiled, leaf_inputs(), grad, call, kwargs)
        base_out, base_params, base_inputs = \
            forward_backward(baseline_model, leaf_inputs(), grad, call, kwargs) if upcast \
            else (ref_out, ref_params, ref_inputs)
        if len(out) != len(ref_out):
            raise AssertionError(f"compiled model returned {len(out)} tensors, eager {len(ref_out)}")
        for i, (a, e, b) in enumerate(zip(out, ref_out, base_out)):
            assert_close_to_reference(f"call {call} output {i}", a, e, b)
        if not grad:
            continue
        scale = gradient_scale([e for _, e in ref_params] + list(ref_inputs))
        for (name, e), (_, a), (_, b) in zip(ref_params, params, base_params):
            if a is None and e is None:
                continue
            if (a is None) != (e is None):
                raise AssertionError(f"call {call} grad of {name}: eager {e is not None}, compiled {a is not None}")
            assert_close_to_reference(f"call {call} grad of parameter {name}", a, e, b, scale)
        for i, (e, a, b) in enumerate(zip(ref_inputs, input_grads, base_inputs)):
            if e is not None:
                if a is None:
                    raise AssertionError(f"call {call} grad of input {i}: compiled has none")
                assert_close_to_reference(f"call {call} grad of input {i}", a, e, b, scale)

    new_reports = _report.reports()[first_report:]
    counts = Counter(w.pattern for r in new_reports for w in r.rewrites)
    near = [m for r in new_reports for m in r.near_misses]
    counts["near_miss"] = len(near)
    for pattern, want in expect.items():
        if counts.get(pattern, 0) != want:
            raise AssertionError(
                f"expected {want} {pattern!r} rewrite(s), got {counts.get(pattern, 0)}; report:\n"
                + "\n".join(_report.format_text_for(new_reports)))
    return RewriteCheck(counts, near, {"graphs": [r.as_json() for r in new_reports]})


@contextlib.contextmanager
def plain_torch_compile():
    """``torch.compile`` inside the block as in a process that never imported gnn_inductor, for comparisons
    against it: Dynamo's default ``capture_dynamic_output_shape_ops=False`` (the import turns it on; the backend
    needs PyG's self-loop masks in one graph) and PyG's own ``HeteroLinear`` loop (gnn_inductor/frontends/pyg.py)."""
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False), pyg.plain_pyg():
        yield
