"""The JSON report is versioned and matches docs/report_schema.json, and docs/report.md documents every key of it.
The schema is checked by a small validator of the JSON Schema keywords the file uses (no dependency)."""
import json
import os
import re

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv

from gnn_inductor import config, rewrite_report
from gnn_inductor.plan import state as graph_state
from gnn_inductor.plan.decisions import PathDecision
from gnn_inductor.testing import random_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = json.load(open(os.path.join(ROOT, "docs", "report_schema.json")))
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[name])


def validate(value, schema: dict, path: str = "$") -> list:
    """The errors of ``value`` against ``schema``: type, const, enum, required, properties, additionalProperties,
    items, allOf and local $ref, the keywords docs/report_schema.json uses."""
    if "$ref" in schema:
        target = SCHEMA
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return validate(value, target, path)
    errors = []
    for sub in schema.get("allOf", ()):
        errors += validate(value, sub, path)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, n) for n in names):
            return errors + [f"{path}: {value!r} is not {names}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        errors += [f"{path}: no {key!r}" for key in schema.get("required", ()) if key not in value]
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += validate(item, props[key], f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                errors += validate(item, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors


def test_the_validator_finds_errors():
    assert validate({"schema_version": 2}, SCHEMA)  # wrong version, keys missing
    assert validate(True, {"type": "integer"}) and not validate(3, {"type": ["integer", "null"]})


@pytest.fixture(scope="module")
def report_json():
    """The JSON of real compiles: a GAT rewritten on CPU, a GCN the cost model declines, a kernel path decision."""
    torch._dynamo.reset()
    rewrite_report.clear()
    torch.manual_seed(0)
    x, edge_index = torch.randn(30, 6), random_graph(30, 100, hub_degree=12)
    with config.patch(cpu_rewrite=True):
        torch.compile(GATConv(6, 4, heads=2), backend="gnn_io")(x.clone().requires_grad_(), edge_index).sum().backward()
    with config.patch(cpu_rewrite=False, force=False):
        torch.compile(GCNConv(6, 4), backend="gnn_io")(x, edge_index)
    decision = PathDecision("csr", "cost model: CSR predicted faster", "gat", "ieee", predicted_ms={"csr": 0.5},
                            measured_forward_ms={"csr": 0.61})
    graph_state.record_decision(decision)
    data = json.loads(json.dumps(rewrite_report.as_json()))
    yield data
    graph_state.clear()
    torch._dynamo.reset()


def test_the_json_report_matches_its_schema(report_json):
    assert report_json["schema_version"] == rewrite_report.SCHEMA_VERSION == 1
    assert validate(report_json, SCHEMA) == []
    kinds = {m["kind"] for m in report_json["near_misses"]}
    assert "declined" in kinds and report_json["rewrites"], report_json["near_misses"]
    declined = next(m for m in report_json["near_misses"] if m["kind"] == "declined")
    assert declined["override"][0]["env"] == "GNN_IO_CPU_REWRITE=1"
    assert declined["override"][0]["option"] == {"cpu_rewrite": True}
    stats = next(w["graph_stats"] for w in report_json["rewrites"] if w["graph_stats"])
    assert sum(stats["degree_histogram"]) == stats["nodes"]
    graph = next(g for g in report_json["graphs"] if g["rewrites"])
    assert graph["plan_build_ms"] and graph["sides"] == ["forward", "backward"]
    assert graph["counts"]["rewritten"] == len(graph["rewrites"])


def _keys(schema: dict) -> set:
    found = set()
    if isinstance(schema, dict):
        for key, sub in schema.get("properties", {}).items():
            found.add(key)
            found |= _keys(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                found |= _keys(schema[key])
        for sub in schema.get("$defs", {}).values():
            found |= _keys(sub)
        for sub in schema.get("allOf", ()):
            found |= _keys(sub)
    return found


def test_every_key_is_documented():
    text = open(os.path.join(ROOT, "docs", "report.md")).read()
    documented = set(re.findall(r"`([a-z_]+)`", text))
    assert sorted(_keys(SCHEMA) - documented) == []
