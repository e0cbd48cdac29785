"""Build step (setuptools ``build_py``, named in pyproject.toml's ``[tool.setuptools.cmdclass]``) that
adds ``gnn_inductor_dgl.pth`` to the root of what gets installed, i.e. site-packages: the line that
installs the ``dgl.graphbolt`` finder of gnn_inductor/frontends/dgl_import.py at interpreter startup.

setuptools loads this file by its path at build time, without importing ``gnn_inductor`` (whose
dependencies the build environment does not have); it loads dgl_import.py the same way.

- A wheel (``pip install .``): the file is written to ``build_lib``, whose tree is the wheel's root.
- An editable install (``pip install -e .``): setuptools builds an editable wheel from a folder that
  it hands to the ``install`` command as ``install_lib`` and that becomes that wheel's root; the
  package itself is then found in the source tree, so the file is written there, and pip installs
  and uninstalls it with the rest of the editable wheel.
"""
from __future__ import annotations

import importlib.util
import os

from setuptools.command.build_py import build_py as _build_py


def _dgl_import():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dgl_import.py")
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_gnn_inductor_dgl_import", path))
    module.__spec__.loader.exec_module(module)
    return module


class build_py(_build_py):  # noqa: N801  (the name of the command it extends)
    """setuptools' ``build_py``, plus ``gnn_inductor_dgl.pth`` at the root of the installed files."""

    def _pth_path(self) -> str:
        if getattr(self, "editable_mode", False):
            root = self.get_finalized_command("install").install_lib
        else:
            root = self.build_lib
        return os.path.join(root, _dgl_import().PTH_NAME)

    def run(self):
        super().run()
        path = self._pth_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(_dgl_import().PTH_LINE + "\n")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):  # not under build_lib: setuptools' editable strategies skip it
            return outputs
        return [*outputs, self._pth_path()]
