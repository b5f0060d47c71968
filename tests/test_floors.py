"""The dependency floors: derived from pyproject.toml, and installed where the floor run says so.

``./dev test`` ends with a run of ``tests.floors.FLOOR_TESTS`` in a virtualenv holding the
lowest versions pyproject.toml allows (``BOLIDE_FLOORS=1``); there this file checks that they are
the versions installed.
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.floors import constraints, floors

ON_FLOORS = os.environ.get("BOLIDE_FLOORS") == "1"


def _release(text: str) -> tuple[int, ...]:
    """``"8"``, ``"8.0"`` and ``"8.0.0"`` alike: the numeric release without trailing zeros."""
    parts = [int(part) for part in text.split("+")[0].split(".") if part.isdigit()]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def test_floors_come_from_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[project]\n"
        'dependencies = ["a-b>=1.2", "c[x]>=3.1.4", "d", "e>=2,<3", "bolide[postgres]"]\n'
        "[project.optional-dependencies]\n"
        'postgres = ["p>=0.1"]\n'
        'testing = ["pytest>=8"]\n',
        encoding="utf-8",
    )
    assert floors(tmp_path) == {"a-b": "1.2", "c": "3.1.4", "e": "2", "p": "0.1", "pytest": "8"}
    assert constraints(tmp_path).splitlines()[0] == "a-b==1.2"


def test_every_core_dependency_has_a_floor() -> None:
    assert {"confluent-kafka", "sqlalchemy", "alembic", "fastavro", "rich"} <= set(floors())


@pytest.mark.skipif(not ON_FLOORS, reason="only in the floor run (BOLIDE_FLOORS=1)")
def test_the_floor_run_has_the_floors_installed() -> None:
    wanted = floors()
    installed = {name: version(name) for name in wanted}
    wrong = {n: v for n, v in installed.items() if _release(v) != _release(wanted[n])}
    assert wrong == {}, f"installed above the floor: {wrong}"
