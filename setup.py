"""Builds the ``_cy`` modules (Cython's pure-Python mode) into extension modules when it can.

Everything else is in pyproject.toml. Where Cython or a C compiler is missing, or
``DISABLE_BOLIDE_CEXT=1`` is set, the package installs without them: the same modules then
run as Python (docs/performance.md#compiled-record-path).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: The ``_cy`` modules: dotted name and source file.
CYTHON_MODULES = {
    "bolide.facade._record_cy": "facade/_record_cy.py",
    "bolide.facade.producer._delivery_cy": "facade/producer/_delivery_cy.py",
    "bolide.facade.consumer._fetch_cy": "facade/consumer/_fetch_cy.py",
    "bolide.stores._rows_cy": "stores/_rows_cy.py",
}
DIRECTIVES = {
    "language_level": "3",
    # Annotations are for mypy: a ``bytes`` annotation must not become Cython's exact-type
    # check, so that the compiled module takes what the Python one takes.
    "annotation_typing": False,
    "binding": True,
}


def _say(message: str) -> None:
    print(f"bolide setup: {message}", file=sys.stderr)


class _OptionalBuildExt(build_ext):
    """``build_ext`` that leaves the modules as Python when compiling fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: distutils' PlatformError and kin
            _say(f"no C extension ({exc}); the pure-Python modules are installed")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler failed on this module
            _say(f"could not compile {ext.name} ({exc}); it runs as Python")


def _pxd_tree() -> str:
    """A folder holding each module's ``.pxd`` under its dotted name (``bolide/facade/...``).

    Cython finds the ``.pxd`` that declares a module's C layout by the module's full name; the
    sources sit in ``facade/`` (mapped to ``bolide.facade``), so they are copied where the
    name leads."""
    root = os.path.join("build", "cython-include")
    for name, path in CYTHON_MODULES.items():
        pxd = os.path.splitext(path)[0] + ".pxd"
        if os.path.exists(pxd):
            target = os.path.join(root, *name.split(".")) + ".pxd"
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(pxd, target)
    return root


def _extensions() -> list[Any]:
    if os.environ.get("DISABLE_BOLIDE_CEXT", "") not in ("", "0"):
        _say("DISABLE_BOLIDE_CEXT is set: the pure-Python modules are installed")
        return []
    if sys.implementation.name != "cpython":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _say("Cython is not installed: the pure-Python modules are installed")
        return []
    include = _pxd_tree()
    built: list[Any] = []
    for name, path in CYTHON_MODULES.items():
        try:  # one module at a time: one that Cython refuses stays Python, the rest compile
            built += cythonize(
                [Extension(name, [path])],
                compiler_directives=DIRECTIVES,
                build_dir="build/cython",
                include_path=[include],
                quiet=True,
            )
        except Exception as exc:  # Cython's CompileError, or its own crash
            _say(f"could not translate {name} to C ({exc}); it runs as Python")
    return built


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
