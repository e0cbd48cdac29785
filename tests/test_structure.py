"""The package's structure rules, checked on the source tree: every module imports in a fresh interpreter, the import
graph has no cycle, no project module is imported inside a function, no private name crosses files, the layers
import only downwards, no file is over 600 lines, only the config module reads the environment, and no comment
cites the work history."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# source folder -> the package it is installed as (pyproject.toml's package-dir)
FOLDERS = {"gnn_inductor": "gnn_inductor", "kernels": "gnn_inductor.kernels", "patterns": "gnn_inductor.patterns"}
MAX_LINES = 600

# Layers, lowest first: a module may import its own layer and the ones before it. The config module and the package
# roots' __init__ files are outside the layers (config imports nothing of the project; an __init__ registers).
LAYERS = [
    ("runtime", ("gnn_inductor.kernels.runtime",)),
    ("plan", ("gnn_inductor.plan",)),
    ("kernels", ("gnn_inductor.kernels",)),
    ("compiler", ("gnn_inductor.patterns", "gnn_inductor.passes", "gnn_inductor.graph_match",
                  "gnn_inductor.canonical", "gnn_inductor.cost", "gnn_inductor.rewrite_report",
                  "gnn_inductor.frontends", "gnn_inductor.report_sources")),
    ("entry", ("gnn_inductor",)),
]
UNLAYERED = {"gnn_inductor", "gnn_inductor.config", "gnn_inductor.kernels", "gnn_inductor.patterns"}


def _modules() -> dict:
    """Dotted name -> path of every module of the package."""
    found = {}
    for folder, package in FOLDERS.items():
        for directory, subdirs, files in os.walk(os.path.join(ROOT, folder)):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                parts = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join([package] + parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int | None:
    if module in UNLAYERED:
        return None
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return None if best is None else best[0]


class _Imports(ast.NodeVisitor):
    """The project imports of one module: (target module, imported name or None, inside a function, line)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package, self.depth, self.found = module, is_package, 0, []

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name in MODULES:
                self.found.append((alias.name, None, self.depth > 0, node.lineno))

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            parts = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in MODULES:
                self.found.append((full, None, self.depth > 0, node.lineno))
            elif base in MODULES:
                self.found.append((base, alias.name, self.depth > 0, node.lineno))


def _imports() -> dict:
    graph = {}
    for module, path in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        visitor = _Imports(module, path.endswith("__init__.py"))
        visitor.visit(tree)
        graph[module] = visitor.found
    return graph


IMPORTS = _imports()


def _cycles(edges: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_imports_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", code, *sorted(MODULES)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_import_graph_has_no_cycle():
    edges = defaultdict(set)
    for module, found in IMPORTS.items():
        edges[module] |= {target for target, _, _, _ in found if target != module}
    for module in MODULES:
        edges.setdefault(module, set())
    assert _cycles(edges) == []


def test_no_project_module_is_imported_inside_a_function():
    inside = [f"{module}:{line} imports {target}" for module, found in IMPORTS.items()
              for target, _, in_function, line in found if in_function]
    assert inside == []


def test_no_private_name_crosses_files():
    private = [f"{module}:{line} imports {target}.{name}" for module, found in IMPORTS.items()
               for target, name, _, line in found
               if name and name.startswith("_") and not name.startswith("__") and target != module]
    assert private == []


def test_no_private_name_is_read_through_a_module():
    """``module._name`` where ``module`` is a project module imported under that name."""
    private = []
    for module, path in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                                if f"{node.module}.{a.name}" in MODULES})
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.name in MODULES and a.asname})
        private += [f"{module}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert private == []


def test_layers_import_only_downwards():
    upward = []
    for module, found in IMPORTS.items():
        own = _layer(module)
        if own is None:
            continue
        for target, _, _, line in found:
            other = _layer(target)
            if other is not None and other > own:
                upward.append(f"{module}:{line} ({LAYERS[own][0]}) imports {target} ({LAYERS[other][0]})")
    assert upward == []


def test_no_source_file_is_over_the_limit():
    long = {module: n for module, path in MODULES.items() if (n := sum(1 for _ in open(path))) > MAX_LINES}
    assert long == {}


def test_only_the_config_module_reads_the_environment():
    readers = [module for module, path in MODULES.items()
               if module != "gnn_inductor.config" and "os.environ" in open(path).read()]
    assert readers == []


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_work_history_in_the_code(folder):
    history = re.compile(r"session [0-9]|issue [0-9]", re.IGNORECASE)
    cited = [f"{path}:{i}" for module, path in MODULES.items() if path.startswith(os.path.join(ROOT, folder) + os.sep)
             for i, line in enumerate(open(path), 1) if history.search(line)]
    assert cited == []
