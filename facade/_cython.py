"""Stand-in for the ``cython`` module where Cython is not installed at run time.

The ``_cy`` modules are plain Python written in Cython's pure-Python mode: built with Cython
they become extension modules, otherwise they run as they are. Cython is a build requirement,
not a run-time one, so a pure-Python install imports this module in its place; it offers the
few names the ``_cy`` modules use, with no effect (docs/performance.md#compiled-record-path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Py_ssize_t", "cclass", "compiled", "final", "inline", "locals"]

_T = TypeVar("_T")

#: False: this is the interpreted module (Cython's own says True inside compiled code).
compiled = False
#: Cython: the C type of an index (here: a Python int).
Py_ssize_t = int


def _identity(target: _T) -> _T:
    return target


def cclass(target: _T) -> _T:
    """Cython: compile the class as an extension type (here: no effect)."""
    return target


def final(target: _T) -> _T:
    """Cython: the class or method is not overridden (here: no effect)."""
    return target


def inline(target: _T) -> _T:
    """Cython: inline the C function (here: no effect)."""
    return target


def locals(**types: Any) -> Callable[[_T], _T]:  # Cython's name
    """Cython: the C types of a function's locals (here: no effect)."""
    return _identity
