"""The text report for people: each entry names the layer and the user's line, then what happened, in three sections
(rewritten, declined on purpose with its override, not matched with what was found); no internal identifiers."""
import inspect

import pytest
import torch
from torch_geometric.nn import GATConv, MessagePassing

import gnn_inductor
from gnn_inductor import config, cost, rewrite_report
from gnn_inductor.rewrite_report import DECLINED, FALLBACK, NOT_MATCHED, Declined, NearMiss
from gnn_inductor.testing import random_graph


class TwoLayerGAT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GATConv(8, 4, heads=2)
        self.conv2 = GATConv(8, 3, heads=1)

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()  # line CONV1
        return self.conv2(h, edge_index)  # line CONV2


class ProductConv(MessagePassing):
    """reduce='mul' has no gnn_io op: a pattern that does not match."""

    def __init__(self):
        super().__init__(aggr="mul")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)  # line PROPAGATE


class WithProduct(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.product = ProductConv()

    def forward(self, x, edge_index):
        return self.product(x, edge_index)


def _line(cls, marker: str) -> str:
    """``tests/test_report_text.py:N`` of the line of ``cls`` marked ``# line marker``."""
    lines, start = inspect.getsourcelines(cls)
    offset = next(i for i, text in enumerate(lines) if text.rstrip().endswith(f"# line {marker}"))
    return f"tests/test_report_text.py:{start + offset}"


def _compiled(model, x, edge_index, cpu_rewrite: bool):
    torch._dynamo.reset()
    rewrite_report.clear()
    torch.manual_seed(0)
    with config.patch(cpu_rewrite=cpu_rewrite, force=False):
        out = torch.compile(model, backend="gnn_io")(x.clone().requires_grad_(), edge_index)
        out.sum().backward()
    return model


@pytest.fixture(scope="module")
def inputs():
    torch.manual_seed(0)
    return torch.randn(40, 8), random_graph(40, 150, hub_degree=20)


@pytest.fixture(scope="module")
def forced_text(inputs):
    model = _compiled(TwoLayerGAT(), *inputs, cpu_rewrite=True)
    yield rewrite_report.format_text(model), rewrite_report.as_json(model)
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def declined_text(inputs):
    model = _compiled(TwoLayerGAT(), *inputs, cpu_rewrite=False)
    yield rewrite_report.format_text(model), rewrite_report.reports(model)
    torch._dynamo.reset()


def test_rewrites_name_the_layer_and_the_users_line(forced_text):
    text, _ = forced_text
    conv1, conv2 = _line(TwoLayerGAT, "CONV1"), _line(TwoLayerGAT, "CONV2")
    assert f"GATConv conv1 at {conv1} -> fused attention (GAT scores" in text, text
    assert f"GATConv conv2 at {conv2} -> fused attention (GAT scores" in text, text
    assert "forward+backward" in text and "runs gnn_io.attention: the CPU reference" in text, text
    assert "  Rewritten (" in text and "  Declined on purpose (0): none" in text and "  Not matched (0): none" in text
    assert "max degree" in text and "plan built 1x" in text, text


def test_no_internal_identifiers_in_the_text(forced_text):
    text, data = forced_text
    assert "ef_" not in text and "roles" not in text and "structure node" not in text and "backward's D" not in text
    assert any(w["details"].get("score", "").startswith("ef_") for w in data["rewrites"])  # the JSON keeps them


def test_cost_model_declines_are_their_own_section_with_the_override(declined_text):
    text, graphs = declined_text
    misses = [m for g in graphs for m in g.near_misses]
    assert misses and all(m.kind == DECLINED for m in misses), [(m.kind, m.reason) for m in misses]
    assert "near miss" not in text and "Rewritten (0): none" in text and "Not matched (0): none" in text, text
    head = f"GATConv conv1 at {_line(TwoLayerGAT, 'CONV1')}: edge softmax"
    assert head in text and "not rewritten" in text, text
    assert "override: GNN_IO_CPU_REWRITE=1 (options={'cpu_rewrite': True}) or GNN_IO_FORCE=1" in text, text
    # one entry per layer and reason, however many patterns the cost model stopped there
    assert text.count("        why: cost model: on CPU") == 2, text


def test_a_pattern_that_does_not_match_says_what_it_found_and_expected(inputs):
    model = _compiled(WithProduct(), torch.rand(40, 8) + 0.5, inputs[1], cpu_rewrite=True)
    text = rewrite_report.format_text(model)
    (miss,) = [m for g in rewrite_report.reports(model) for m in g.near_misses]
    assert miss.kind == NOT_MATCHED and miss.expected, miss
    # the innermost line of the user's code: the layer's own propagate call
    assert f"ProductConv product at {_line(ProductConv, 'PROPAGATE')}: " in text and " not matched" in text, text
    assert "        found: " in text and "prod" in text and "        expected: " in text, text
    torch._dynamo.reset()


def test_a_layer_compiled_on_its_own_is_named_by_its_class(inputs):
    conv = _compiled(GATConv(8, 4, heads=2), *inputs, cpu_rewrite=True)
    text = gnn_inductor.report(conv)
    assert "GATConv at torch_geometric/nn/conv/gat_conv.py:" in text, text
    torch._dynamo.reset()


def test_near_miss_kinds_follow_the_reason_unless_given():
    place = {"source": "<graph>", "layer": None, "frames": []}
    declined = cost.cpu_declined("cpu") if not cost.cpu_rewrites() else Declined("cost model: x", (("force", True),))
    assert isinstance(declined, Declined) and declined.override
    assert NearMiss("spmm", declined, place).kind == DECLINED
    assert NearMiss("spmm", declined, place).override == declined.override
    assert NearMiss("spmm", "found something else", place).kind == NOT_MATCHED
    assert NearMiss("inductor", "it crashed", place, FALLBACK).kind == FALLBACK
    with pytest.raises(ValueError):
        NearMiss("spmm", "x", place, "near_miss")
    # a declined reason is still the string it always was
    assert Declined("cost model: 10 edges < 20") == "cost model: 10 edges < 20"


def test_the_cost_models_declines_carry_their_settings():
    with config.patch(cpu_rewrite=False, force=False):
        reason = cost.spmm_declined("cpu", 100)
        assert reason.override == (("cpu_rewrite", True), ("force", True))
    with config.patch(cpu_rewrite=False, force=False, spmm_min_edges=1000):
        reason = cost.spmm_declined("cuda", 100)
        assert reason.startswith("cost model: 100 edges < 1000") and reason.override[0] == ("spmm_min_edges", 100)
