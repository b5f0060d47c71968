"""The compiled record path: in use where it was built, and not when the run-time switch asks
for the Python sources (docs/performance.md#compiled-record-path)."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bolide.facade._record_cy as record_cy
from bolide.facade import _cext
from bolide.facade.record import Record, record_from_message, trusted_record


def _built(module_name: str) -> bool:
    """True when an extension module for ``module_name`` sits beside its source."""
    module = importlib.import_module(module_name)
    folder = Path(module.__file__ or "").parent
    tail = module_name.rpartition(".")[2]
    return any(
        (folder / f"{tail}{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _version(switch: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != _cext.RUNTIME_SWITCH}
    if switch is not None:
        env[_cext.RUNTIME_SWITCH] = switch
    done = subprocess.run(
        [sys.executable, "-m", "bolide.facade.cli", "--version"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_compiled_modules_run_where_they_were_built() -> None:
    if _cext.pure_python_forced():
        pytest.skip(f"{_cext.RUNTIME_SWITCH} is set: the sources run (checked below)")
    built = {name: _built(name) for name in _cext.MODULES}
    assert _cext.compiled_modules() == built
    if all(built.values()):
        assert record_cy.is_compiled()
        assert "compiled record path" in _version(None)


def test_the_runtime_switch_runs_the_sources() -> None:
    line = _version("1")
    assert f"pure-Python record path ({_cext.RUNTIME_SWITCH} is set)" in line
    # "0" or empty leaves the choice to the build
    assert _version("0") == _version("")


def test_this_process_runs_what_the_switch_says() -> None:
    if _cext.pure_python_forced():
        assert not any(_cext.compiled_modules().values())
        assert record_cy.__file__ is not None and record_cy.__file__.endswith(".py")
    assert Record.__module__ == record_cy.__name__
    assert trusted_record is record_cy.trusted_record
    assert record_from_message is record_cy.record_from_message
