"""A plain ``import dgl`` on torch releases that DGL's wheel has no graphbolt library for.

DGL 2.1.0 (the newest DGL on the package index) imports ``dgl.graphbolt`` from ``import dgl``, and
``dgl.graphbolt`` loads ``libgraphbolt_pytorch_<torch version>.so``, which that wheel ships for torch
2.0-2.2 only: on torch 2.11 ``import dgl`` fails. The rest of DGL does not need graphbolt.

:class:`GraphboltFinder`, first on ``sys.meta_path``, answers the import of ``dgl.graphbolt`` (and no
other) when that library file is missing from DGL's ``graphbolt`` folder: the module becomes a stub
whose attributes raise an error that says why. When the file exists, DGL imports its own
``dgl.graphbolt``, and any error it raises is DGL's own. Other imports cost one string comparison.

:func:`call_after_import` is the frontend's hook on ``import dgl`` itself (gnn_inductor/frontends/dgl.py
installs its traceable path right after DGL's import when gnn_inductor was imported first); it only acts
in processes that imported gnn_inductor.

The finder is installed at interpreter startup by ``gnn_inductor_dgl.pth``, which installing the
package puts in site-packages (gnn_inductor/frontends/dgl_build.py writes it; ``pip install -e .``
included), so an unmodified script's ``import dgl`` works before or without ``import gnn_inductor``.
The ``.pth`` line loads this file alone, without importing ``gnn_inductor`` (and so torch): this
module imports nothing beyond the standard library at its top.
"""
from __future__ import annotations

import os
import sys
import types
from importlib.machinery import ModuleSpec

PTH_NAME = "gnn_inductor_dgl.pth"
# site.py runs a .pth line that starts with "import" at every interpreter start; this one finds the
# installed package without importing it, loads this file under a private name and installs the finder.
PTH_LINE = (
    "import importlib.util as u, os; s = u.find_spec('gnn_inductor'); "
    "p = s and s.submodule_search_locations and "
    "os.path.join(s.submodule_search_locations[0], 'frontends', 'dgl_import.py'); "
    "m = p and os.path.isfile(p) and u.module_from_spec(u.spec_from_file_location('_gnn_inductor_dgl_import', p)); "
    "m and (m.__spec__.loader.exec_module(m) or m.install_finder())"
)
_MARK = "_gnn_inductor_graphbolt_finder"  # on the finder: this file may be loaded twice (.pth and package)


def graphbolt_library(version: str) -> str | None:
    """The file name DGL's ``dgl/graphbolt/__init__.py`` loads for torch ``version`` on this platform."""
    if sys.platform.startswith("linux"):
        return f"libgraphbolt_pytorch_{version}.so"
    if sys.platform.startswith("darwin"):
        return f"libgraphbolt_pytorch_{version}.dylib"
    if sys.platform.startswith("win"):
        return f"graphbolt_pytorch_{version}.dll"
    return None


def graphbolt_library_missing(dgl_path) -> bool:
    """True when the ``graphbolt`` folder of the ``dgl`` package at ``dgl_path`` (its ``__path__``)
    exists and lacks the library for the running torch. A DGL without that folder, or on a platform
    DGL does not know, is left to fail or work as DGL does."""
    if not dgl_path:
        return False
    import torch  # imported already: dgl imports it before dgl.graphbolt

    name = graphbolt_library(torch.__version__.split("+", maxsplit=1)[0])
    folder = os.path.join(list(dgl_path)[0], "graphbolt")
    return name is not None and os.path.isdir(folder) and not os.path.exists(os.path.join(folder, name))


class GraphboltFinder:
    """Meta-path finder and loader of the ``dgl.graphbolt`` stub (see the module's docstring)."""

    _gnn_inductor_graphbolt_finder = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "dgl.graphbolt" or not graphbolt_library_missing(path):
            return None
        return ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        import torch

        version = torch.__version__
        module.__doc__ = (f"Stand-in for dgl.graphbolt, whose C++ library does not exist for torch {version}; "
                          "installed by gnn_inductor (gnn_inductor/frontends/dgl_import.py).")

        def __getattr__(name):
            raise AttributeError(
                f"dgl.graphbolt.{name}: DGL's graphbolt has no library for torch {version}, so gnn_inductor "
                "kept it out of `import dgl` (gnn_inductor/frontends/dgl_import.py); use a DGL build for this "
                "torch to get graphbolt")

        module.__getattr__ = __getattr__


class _LoaderThenCall:
    """A module's loader that calls ``done()`` once the module has run; everything else is the loader's,
    which the module gets back as its ``__loader__`` and ``__spec__.loader``."""

    def __init__(self, loader, done):
        self._loader, self._done = loader, done

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._done()

    def __getattr__(self, name):  # get_resource_reader, get_source, is_package, ...
        return getattr(self._loader, name)


class _AfterImport:
    """Meta-path finder that hands the import of ``name`` to the other finders, with a loader that calls
    ``callback()`` when the module has run; it leaves ``sys.meta_path`` then (a ``find_spec`` that only
    looks for the module, without importing it, keeps it there)."""

    def __init__(self, name: str, callback):
        self._name, self._callback, self._finding = name, callback, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._name or self._finding:
            return None
        self._finding = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)  # the other finders (this one answers None meanwhile)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoaderThenCall(spec.loader, self._done)
        return spec

    def _done(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._callback()


def call_after_import(name: str, callback) -> None:
    """``callback()`` once the top-level module ``name`` has been imported: now if it is in ``sys.modules``,
    else right after its import finishes (not when that import fails)."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def install_finder() -> bool:
    """Put :class:`GraphboltFinder` first on ``sys.meta_path`` unless one is there (from the ``.pth``
    or an earlier call). Returns True when this call installed it."""
    if any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        return False
    sys.meta_path.insert(0, GraphboltFinder())
    return True
