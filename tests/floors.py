"""The lowest versions pyproject.toml allows, as pip constraints (``python -m tests.floors``).

``./dev test`` installs bolide with these in a second virtualenv and runs ``FLOOR_TESTS`` there,
so every lower bound in pyproject.toml is one a run of the suite passed on.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The extras the floor run installs beside the core (their floors are checked too).
FLOOR_EXTRAS = ("postgres", "testing", "registry", "protobuf", "jsonschema")

#: The subset the floor run covers: publish and read (grouped and not), the SQL store on both
#: databases with its migrations, the Avro codec (it probes fastavro), Protobuf and JSON Schema
#: compatibility in every registry, the CLI, and this check.
FLOOR_TESTS = (
    "tests/test_floors.py",
    "tests/pubsub/test_ungrouped.py",
    "tests/pubsub/test_grouped.py",
    "tests/history/test_store.py",
    "tests/avro/test_serde.py",
    "tests/schemas/test_compat.py",
    "tests/test_cli.py",
)

_REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$")


def floors(root: Path = ROOT) -> dict[str, str]:
    """``{distribution: lowest version}`` of the core dependencies and ``FLOOR_EXTRAS``."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in FLOOR_EXTRAS:
        requirements += project["optional-dependencies"].get(extra, [])
    found: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement.split(";")[0].strip())
        if match is None or match.group(1).lower() == "bolide":
            continue
        lowest = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", match.group(3))
        if lowest is not None:
            found[match.group(1).lower()] = lowest.group(1)
    return found


def constraints(root: Path = ROOT) -> str:
    """``floors`` as a pip constraints file (``name==version`` lines)."""
    return "".join(f"{name}=={version}\n" for name, version in sorted(floors(root).items()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--tests"]:
        print(" ".join(FLOOR_TESTS))
    elif sys.argv[1:] == ["--extras"]:
        print(",".join(FLOOR_EXTRAS))
    else:
        sys.stdout.write(constraints())
