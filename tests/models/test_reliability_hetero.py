"""Reliability of the heterogeneous layers compiled (RGCNConv with and without bases, HGTConv, HeteroConv and
``to_hetero`` models) against eager with :func:`tests.models.reliability.compare`, on the CPU and on CUDA, and the fake
implementation of every gnn_io op the models call against its real one on non-contiguous inputs."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch_geometric.nn import GATConv, HeteroConv, HGTConv, RGCNConv, SAGEConv, to_hetero

from gnn_inductor import rewrite_report
from gnn_inductor.testing import random_hetero_graph
from tests.models.reliability import (
    DEVICES,
    FEATURES,
    NODES,
    assert_rewritten,
    base_graph,
    compare,
    compiled_pair,
    model_inputs,
    no_silent_eager_fallback,  # noqa: F401  (autouse fixture)
    setup_backend,
)
from tests.tiers import covering, tiered


# -------------------- Heterogeneous models -------------------------------------------------------------------------

RGCN = {
    "plain": lambda: RGCNConv(FEATURES, 6, num_relations=3),
    "bases": lambda: RGCNConv(FEATURES, 6, num_relations=3, num_bases=2),
}


def _rgcn_inputs(device, seed=0) -> list:
    edge_index = base_graph()
    edge_type = torch.randint(0, 3, (edge_index.shape[1],), generator=torch.Generator().manual_seed(seed))
    return model_inputs("rgcn", edge_index, NODES, device, seed) + [edge_type.to(device)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("variant", "dtype"), covering(list(RGCN), [torch.float32, torch.float64]))
def test_rgcn_conv_matches_eager(variant, dtype, device, monkeypatch):
    """RGCNConv (per-relation masks: a graph whose structure work has no placeholder of its own) compiles with
    the default settings and equals eager, float32 and float64."""
    setup_backend(monkeypatch, device, strict=False)
    compiled, reference = compiled_pair(RGCN[variant], device, dtype)
    for call in range(2):
        compare(f"call {call}", compiled, reference, _rgcn_inputs(device, call), seed=call)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(RGCN))
def test_rgcn_conv_compiles_strict(variant, device, monkeypatch):
    """The same under ``GNN_IO_STRICT=1``: no backend error to hide."""
    setup_backend(monkeypatch, device)
    compiled, reference = compiled_pair(RGCN[variant], device)
    first = len(rewrite_report.reports())
    compare("strict", compiled, reference, _rgcn_inputs(device))
    assert_rewritten(first)


def _hetero_graph(device) -> tuple:
    """``(x_dict, edge_index_dict, metadata)``: papers and authors, three edge types, 8 features."""
    return random_hetero_graph({"paper": 12, "author": 9}, {("author", "writes", "paper"): 30,
                                                           ("paper", "cites", "paper"): 25,
                                                           ("paper", "rev_writes", "author"): 30},
                               FEATURES, device=device)


class _Sage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = SAGEConv((FEATURES, FEATURES), 8)
        self.conv2 = SAGEConv((8, 8), 6)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


HETERO = {
    "hgt": lambda metadata: HGTConv(FEATURES, 8, metadata, heads=2),
    "hetero_conv": lambda metadata: HeteroConv({
        ("author", "writes", "paper"): SAGEConv((FEATURES, FEATURES), 6),
        ("paper", "cites", "paper"): GATConv(FEATURES, 3, heads=2, add_self_loops=False),
        ("paper", "rev_writes", "author"): SAGEConv((FEATURES, FEATURES), 6)}),
    "to_hetero": lambda metadata: to_hetero(_Sage(), metadata),
}


def _check_hetero(name, device):
    x, edge_index, metadata = _hetero_graph(device)
    compiled, reference = compiled_pair(lambda: HETERO[name](metadata), device)
    for call in range(2):
        compare(f"call {call}", compiled, reference, [x, edge_index], seed=call)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", tiered(["hetero_conv", "to_hetero"], ["hetero_conv"]))
def test_heterogeneous_models(name, device, monkeypatch):
    """HeteroConv (SAGEConv and GATConv by edge type) and ``to_hetero`` of a two-layer GraphSAGE on a graph of two
    node types and three edge types: forward and gradients equal to eager."""
    setup_backend(monkeypatch, device)
    _check_hetero(name, device)


# HGTConv against eager runs in the default tier in tests/frontends/test_pyg_frontend.py
@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_hgt_conv_matches_eager(device, monkeypatch):
    """HGTConv with the default settings: forward and backward run (no stride assertion in the attention
    backward) and equal eager."""
    setup_backend(monkeypatch, device, strict=False)
    _check_hetero("hgt", device)


# -------------------- Fake implementations against real ones -------------------------------------------------------

class _Recorder(TorchDispatchMode):
    """Records every gnn_io op call: ``(op, args, kwargs)``. ``ignore_compile_internals``: Dynamo compiles with
    the mode off (otherwise it skips the frame and runs it eagerly, where no gnn_io op is called) and turns it
    on again while the compiled forward and backward run, so the ops their wrappers call are seen."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "gnn_io":
            self.calls.append((func, tree_map(_snapshot, args), tree_map(_snapshot, kwargs)))
        return func(*args, **kwargs)


def _snapshot(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _non_contiguous(value):
    """A floating point tensor as a same-valued copy of other strides: a strided slice (1-D), the reverse dim
    order (2-D and up)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() == 0:
        return value
    if value.dim() == 1:
        return torch.zeros(2 * value.numel(), dtype=value.dtype, device=value.device)[::2].copy_(value)
    order = list(reversed(range(value.dim())))
    return value.permute(order).contiguous().permute(order)


def _layout_mismatch(real, fake):
    """Why ``fake`` does not describe ``real`` (shape, dtype, the strides of dims longer than 1), or None. Sizes
    the fake left symbolic (data dependent) are not compared."""
    if real.dtype != fake.dtype:
        return f"dtype {fake.dtype} != real {real.dtype}"
    sizes = [s if isinstance(s, int) else None for s in fake.shape]
    if len(sizes) != real.dim() or any(s is not None and s != r for s, r in zip(sizes, real.shape)):
        return f"shape {tuple(fake.shape)} != real {tuple(real.shape)}"
    if real.numel() > 1:
        for dim, size in enumerate(real.shape):
            fake_stride = fake.stride(dim)
            if size > 1 and isinstance(fake_stride, int) and fake_stride != real.stride(dim):
                return f"strides {fake.stride()} != real {real.stride()} (shape {tuple(real.shape)})"
    return None


def test_fake_implementations_match_real_on_non_contiguous_inputs(monkeypatch):
    """Every gnn_io op the compiled models call (forward, backward and the plan's structure ops; recorded while
    compiled SAGEConv max, GINConv, GATConv, TransformerConv with edge features and GCNConv run on CPU) called again
    with each floating point tensor argument non-contiguous: the fake implementation, which Inductor plans buffers
    and its ``assert_size_stride`` checks by, must give each output's shape, dtype and strides as the real one
    does. Ops that mutate or return nothing are skipped."""
    setup_backend(monkeypatch, "cpu")
    recorder = _Recorder()
    for name in ["sage_max", "gin", "gat", "transformer", "gcn"]:
        compiled, reference = compiled_pair(name, "cpu")
        compare(name, compiled, reference, model_inputs(name, base_graph(), NODES, "cpu"))
        with recorder:  # a new graph: its plan is built while recording
            compare(name, compiled, reference, model_inputs(name, base_graph(1), NODES, "cpu", 1), seed=1)
    seen, failures = {}, []
    for func, args, kwargs in recorder.calls:
        schema = func._schema
        if schema.is_mutable or not schema.returns or seen.get(func, 0) >= 2:
            continue
        seen[func] = seen.get(func, 0) + 1
        args, kwargs = tree_map(_non_contiguous, args), tree_map(_non_contiguous, kwargs)
        real = func(*args, **kwargs)
        mode = FakeTensorMode(shape_env=ShapeEnv())  # a shape env: data-dependent sizes become unbacked symbols
        fake_args, fake_kwargs = tree_map(
            lambda v: mode.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v, (args, kwargs))
        with mode:
            fake = func(*fake_args, **fake_kwargs)
        reals, fakes = tree_flatten(real)[0], tree_flatten(fake)[0]
        if len(reals) != len(fakes):
            failures.append(f"{func}: {len(fakes)} fake outputs, {len(reals)} real")
        for i, (r, f) in enumerate(zip(reals, fakes)):
            if isinstance(r, torch.Tensor) and (why := _layout_mismatch(r, f)):
                failures.append(f"{func} output {i}: {why}")
    assert any("backward" in str(func) for func in seen), f"no backward op among the recorded calls: {list(seen)}"
    assert not failures, "fake implementations disagree with real ones:\n" + "\n".join(failures)
