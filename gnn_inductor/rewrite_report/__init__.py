"""The rewrite report: what matched where in the user's source, which op and kernel, what the
graph plan saw, what the backend declined on purpose, and what did not match and why.

``gnn_inductor.report(model)`` prints it (``html="report.html"`` also writes a self-contained page);
``GNN_IO_REPORT=path.json`` writes the JSON for every graph compiled in the process (rewritten after each compile
and each plan build). docs/report.md describes the three forms.

- :mod:`.records`: the records kept per compiled graph and their JSON form (versioned, docs/report_schema.json).
- :mod:`.text`: the text for people.
- :mod:`.html`: the page.
"""
from __future__ import annotations

from typing import Optional

from gnn_inductor.rewrite_report.html import render_html, write_html
from gnn_inductor.rewrite_report.records import (
    DECLINED,
    FALLBACK,
    KINDS,
    NOT_MATCHED,
    SCHEMA_VERSION,
    Declined,
    GraphReport,
    NearMiss,
    PassRecord,
    Rewrite,
    add,
    as_json,
    clear,
    layer_of,
    reports,
    source_of,
    write_env_report,
)
from gnn_inductor.rewrite_report.text import format_text, format_text_for

__all__ = ["DECLINED", "FALLBACK", "KINDS", "NOT_MATCHED", "SCHEMA_VERSION", "Declined", "GraphReport", "NearMiss",
           "PassRecord", "Rewrite", "add", "as_json", "clear", "format_text", "format_text_for", "layer_of",
           "render_html", "report", "reports", "source_of", "write_env_report", "write_html"]


def report(model=None, html: Optional[str] = None) -> str:
    """Print (and return) the rewrite report, for ``model`` or for everything compiled so far; ``html``: a path to
    also write the report as one self-contained HTML page."""
    text = format_text(model)
    print(text)
    if html is not None:
        write_html(html, model)
    return text
