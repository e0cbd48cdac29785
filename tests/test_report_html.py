"""The HTML report: one self-contained page (no script, nothing fetched), the three kinds of entries in their
sections, the graph statistics with an inline SVG degree histogram, the kernel path decisions, all text escaped."""
from html.parser import HTMLParser

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, MessagePassing

import gnn_inductor
from gnn_inductor import config, rewrite_report
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan.decisions import PathDecision
from gnn_inductor.testing import random_graph


class ProductConv(MessagePassing):
    def __init__(self):
        super().__init__(aggr="mul")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


class Mixed(torch.nn.Module):
    """A GAT layer (rewritten under GNN_IO_CPU_REWRITE=1) and a product aggregation (never matched)."""

    def __init__(self):
        super().__init__()
        self.gat = GATConv(6, 3, heads=2)
        self.product = ProductConv()

    def forward(self, x, edge_index):
        return self.gat(x, edge_index) + self.product(x.abs() + 0.5, edge_index)


class Page(HTMLParser):
    """The tags, classes, attributes and text of a page."""

    def __init__(self):
        super().__init__()
        self.tags, self.classes, self.attrs, self.text, self.open = [], set(), [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self.classes.update((dict(attrs).get("class") or "").split())
        if tag not in ("br", "meta"):  # HTML's void elements the page uses
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):  # <rect .../> in SVG
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self.classes.update((dict(attrs).get("class") or "").split())

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (self.open[-5:], tag)
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    torch._dynamo.reset()
    rewrite_report.clear()
    torch.manual_seed(0)
    x, edge_index = torch.randn(30, 6), random_graph(30, 100, hub_degree=12)
    model = Mixed()
    with config.patch(cpu_rewrite=True):
        torch.compile(model, backend="gnn_io")(x.clone().requires_grad_(), edge_index).sum().backward()
    with config.patch(cpu_rewrite=False, force=False):
        torch.compile(GCNConv(6, 4), backend="gnn_io")(x, edge_index)
    graph_state.record_decision(PathDecision("hybrid", "cost model: hybrid predicted fastest", "dot", "half",
                                             predicted_ms={"csr": 0.9, "hybrid": 0.5},
                                             measured_forward_ms={"csr": 1.0, "hybrid": 0.6}))
    path = tmp_path_factory.mktemp("report") / "report.html"
    text = gnn_inductor.rewrite_report.report(html=str(path))
    parsed = Page()
    source = path.read_text()
    parsed.feed(source)
    yield source, parsed, text
    graph_state.clear()
    torch._dynamo.reset()


def test_the_page_is_well_formed_and_self_contained(page):
    source, parsed, _ = page
    assert source.startswith("<!DOCTYPE html>") and parsed.open == []
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    urls = [(k, v) for k, v in parsed.attrs if k in ("src", "href", "xlink:href", "action") and v]
    assert urls == []
    assert "http://" not in source and "https://" not in source and "url(" not in source


def test_the_page_has_the_sections_and_charts(page):
    source, parsed, _ = page
    for cls in ("graph", "layers", "rewritten", "declined", "not-matched", "stats", "plan", "kernel-paths"):
        assert cls in parsed.classes, cls
    assert parsed.tags.count("svg") >= 3  # degree histogram, plan build times, the kernel path decision
    text = " ".join(parsed.text)
    assert "GATConv gat" in text and "ProductConv product" in text and "not matched" in text.lower()
    assert "nodes per in-degree bucket" in text and "measured first call" in text
    assert "GNN_IO_CPU_REWRITE=1" in text  # the declined GCN's override
    assert "self.gat(x, edge_index) + self.product" in text  # the user's line itself
    assert "ef_" not in source.split("The JSON report")[0]


def test_every_text_is_escaped(tmp_path):
    rewrite_report.clear()
    place = {"source": "/x/<b>model.py:3", "layer": None, "frames": [], "layer_class": "My<Conv>", "module": "c"}
    report = rewrite_report.GraphReport(0, [], [rewrite_report.NearMiss("spmm", "found <script>alert(1)</script>",
                                                                       place)])
    rewrite_report.add(report)
    page = rewrite_report.render_html()
    rewrite_report.clear()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "My&lt;Conv&gt;" in page and "<b>model.py" not in page
