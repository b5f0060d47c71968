"""Builds the ``_cy`` modules (Cython's pure-Python mode) into extension modules when it can.

Everything else is in pyproject.toml. Where Cython or a C compiler is missing, or
``DISABLE_BOLIDE_CEXT=1`` is set, the package installs without them: the same modules then
run as Python (docs/performance.md#compiled-record-path).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: The ``_cy`` modules: dotted name and source file.
CYTHON_MODULES = {"bolide.facade._record_cy": "facade/_record_cy.py"}
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
    extensions = [Extension(name, [path]) for name, path in CYTHON_MODULES.items()]
    return list(
        cythonize(extensions, compiler_directives=DIRECTIVES, build_dir="build/cython", quiet=True)
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
