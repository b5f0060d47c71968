"""Which record path runs: the compiled ``_cy`` modules or the same modules as Python.

Built with a C compiler (and without ``DISABLE_BOLIDE_CEXT=1``), each ``_cy`` module is an
extension module beside its ``.py`` source. ``DISABLE_BOLIDE_CEXT_RUNTIME=1`` at run time makes
the import system load the ``.py`` source instead, so the two paths can be compared and tested
in one install. ``bolide.facade`` installs that choice before any ``_cy`` module is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MODULES", "RUNTIME_SWITCH", "compiled_modules", "describe", "pure_python_forced"]

#: The modules written in Cython's pure-Python mode (compiled by setup.py when it can).
MODULES = (
    "bolide.facade._record_cy",
    "bolide.facade.producer._delivery_cy",
    "bolide.facade.consumer._fetch_cy",
    "bolide.stores._rows_cy",
)
#: Set to a non-empty value other than ``0``: run the ``.py`` sources even where compiled.
RUNTIME_SWITCH = "DISABLE_BOLIDE_CEXT_RUNTIME"


def pure_python_forced() -> bool:
    """True when the run-time switch asks for the ``.py`` sources."""
    return os.environ.get(RUNTIME_SWITCH, "") not in ("", "0")


class _SourceOnly(importlib.abc.MetaPathFinder):
    """Finds the ``_cy`` modules as ``.py`` sources only, passing over their extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MODULES or not path:
            return None
        for entry in path:
            finder = importlib.machinery.FileFinder(
                entry,
                (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
            )
            spec = finder.find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def install() -> None:
    """Load the ``.py`` sources of the ``_cy`` modules when the run-time switch is set."""
    if pure_python_forced() and not any(isinstance(f, _SourceOnly) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceOnly())


def compiled_modules() -> dict[str, bool]:
    """Each ``_cy`` module's name and whether the running copy is compiled."""
    return {name: bool(importlib.import_module(name).is_compiled()) for name in MODULES}


def describe() -> str:
    """One line on the record path in use, for ``bolide --version``."""
    compiled = compiled_modules()
    if all(compiled.values()):
        return "compiled record path (Cython)"
    if pure_python_forced():
        return f"pure-Python record path ({RUNTIME_SWITCH} is set)"
    missing = ", ".join(name for name, done in compiled.items() if not done)
    return f"pure-Python record path (not compiled: {missing})"


install()
