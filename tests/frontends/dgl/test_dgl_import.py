"""A plain ``import dgl`` on torch 2.11: the ``dgl.graphbolt`` finder of gnn_inductor/frontends/dgl_import.py,
installed at interpreter startup by ``gnn_inductor_dgl.pth`` (written into site-packages by installing the
package, ``pip install -e .`` included)."""
import importlib.util
import os
import re
import site
import subprocess
import sys
import textwrap

import pytest
import torch

from gnn_inductor.frontends import dgl_import
from tests.tiers import tiered


def _dgl_path():
    spec = importlib.util.find_spec("dgl")
    if spec is None:
        pytest.skip("dgl is not installed; pip install -e \".[dgl]\"")
    return spec.submodule_search_locations


def _python(code: str, tmp_path) -> str:
    """``code`` run by this environment's interpreter, outside the repository (only what is installed)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.fixture
def installed():
    """Fails, saying what to run, where the .pth is not in this environment's site-packages."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    if not any(os.path.isfile(os.path.join(folder, dgl_import.PTH_NAME)) for folder in folders):
        pytest.fail(f"{dgl_import.PTH_NAME} is not in {folders}: install the package (pip install -e .)")


def test_plain_import_dgl_first(installed, tmp_path):
    """``import dgl`` with nothing imported before it: DGL works, and gnn_inductor itself is not imported."""
    stubbed = dgl_import.graphbolt_library_missing(_dgl_path())
    out = _python("""
        import sys
        import dgl

        assert "gnn_inductor" not in sys.modules
        g = dgl.add_self_loop(dgl.graph(([0, 1, 2], [1, 2, 0])))
        print(g.num_nodes(), g.num_edges(), g.in_degrees().tolist())
        print(type(sys.modules["dgl.graphbolt"].__spec__.loader).__name__)
    """, tmp_path).splitlines()
    assert out[-2] == "3 6 [2, 2, 2]"
    # the stub only where the library for this torch is missing; DGL's own graphbolt otherwise
    assert (out[-1] == "GraphboltFinder") == stubbed


@pytest.mark.parametrize("first", tiered(["dgl", "gnn_inductor"], ["gnn_inductor"]))
def test_either_import_order_covers_graphs_built_after_both(installed, tmp_path, first):
    """The frontend is installed whichever of ``dgl`` and ``gnn_inductor`` a script imports first (also after a
    ``find_spec("dgl")`` that only looked for DGL in between)."""
    _dgl_path()
    second = {"dgl": "gnn_inductor", "gnn_inductor": "dgl"}[first]
    out = _python(f"""
        import importlib.util
        import {first}
        assert importlib.util.find_spec("dgl") is not None
        import {second}
        from gnn_inductor.frontends.dgl import _INSTALLED, _STRUCTURE

        g = dgl.graph(([0, 1], [1, 2]))
        print(bool(_INSTALLED), hasattr(g._graph, _STRUCTURE), type(dgl.__loader__).__name__)
    """, tmp_path).splitlines()
    assert out[-1] == "True True SourceFileLoader"


def test_startup_imports_nothing_heavy(installed, tmp_path):
    """The .pth loads one standard-library-only file: no torch, no gnn_inductor, no dgl at startup."""
    out = _python("""
        import sys
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "gnn_inductor", "dgl")))
        print(sum(getattr(f, "_gnn_inductor_graphbolt_finder", False) for f in sys.meta_path))
    """, tmp_path).splitlines()
    assert out[-2:] == ["[]", "1"]


def _fake_dgl(tmp_path, with_library: bool, with_folder: bool = True):
    root = tmp_path / "dgl"
    (root / "graphbolt" if with_folder else root).mkdir(parents=True)
    if with_library:
        name = dgl_import.graphbolt_library(torch.__version__.split("+")[0])
        (root / "graphbolt" / name).write_bytes(b"")
    return [str(root)]


def test_finder_stubs_only_a_missing_library(tmp_path):
    finder = dgl_import.GraphboltFinder()
    missing = _fake_dgl(tmp_path / "a", with_library=False)
    spec = finder.find_spec("dgl.graphbolt", missing)
    assert spec is not None and spec.loader is finder
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(AttributeError, match=re.escape(f"no library for torch {torch.__version__}")):
        module.LegacyDataset  # noqa: B018
    # the library there, or no graphbolt folder at all: DGL's own import, and its own errors
    assert finder.find_spec("dgl.graphbolt", _fake_dgl(tmp_path / "b", with_library=True)) is None
    assert finder.find_spec("dgl.graphbolt", _fake_dgl(tmp_path / "c", False, with_folder=False)) is None
    for name in ("dgl", "dgl.graphbolt.impl", "dgl.graphboltx", "graphbolt"):
        assert finder.find_spec(name, missing) is None


def test_install_finder_once():
    """Installed once, by the .pth or by importing the frontend; import_dgl() still returns dgl."""
    from gnn_inductor.frontends.dgl import _INSTALLED, import_dgl

    assert dgl_import.install_finder() is False
    assert sum(getattr(f, "_gnn_inductor_graphbolt_finder", False) for f in sys.meta_path) == 1
    _dgl_path()
    dgl = import_dgl()
    assert dgl.graph(([0], [1])).num_edges() == 1 and _INSTALLED
