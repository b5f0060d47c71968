"""Every ```python or ```sh block of README.md and docs/*.md whose first line is ``# runnable``.

Each block runs as written, in a fresh interpreter (``sh`` blocks: bash with ``-eu -o
pipefail``, the ``bolide`` command on the PATH), in an empty temporary directory, with a
timeout, so the docs never rot. Python blocks start their own embedded broker; ``BOLIDE_BOOTSTRAP``
names the session's broker for blocks that read it. A block that mentions PostgreSQL or Spark
gets the matching marker, so ``-m 'not postgres'`` and ``-m 'not spark'`` skip it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bolide.facade import Cluster

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# runnable"
_FENCE = re.compile(r"^```(python|sh)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runnable_blocks(root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """``(file, line, language, code)`` of every runnable block, in file order."""
    found = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            language, code = match.group(1), match.group(2)
            if code.lstrip("\n").startswith(MARKER):
                line = text.count("\n", 0, match.start()) + 1
                found.append((str(path.relative_to(root)), line, language, code))
    return found


def _param(file: str, line: int, language: str, code: str) -> object:
    marks = [pytest.mark.kafka, pytest.mark.slow]
    lowered = code.lower()
    if "postgresql" in lowered:
        marks.append(pytest.mark.postgres)
    if "spark" in lowered:
        marks.append(pytest.mark.spark)
    return pytest.param(language, code, id=f"{file}:{line}", marks=marks)


BLOCKS = runnable_blocks()


def test_the_docs_have_runnable_blocks() -> None:
    files = {file for file, *_ in BLOCKS}
    assert "README.md" in files
    assert {"python", "sh"} <= {language for file, _, language, _ in BLOCKS if "quickstart" in file}


def test_the_extractor_finds_only_marked_python_blocks(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "intro\n```python\n# runnable\nprint(1)\n```\n"
        "```python\nprint('not marked')\n```\n"
        "```sh\n# runnable\nls\n```\n"
        "```text\n# runnable\nnot code\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "a.md").write_text("```python\n# runnable\nx = 2\n```\n", "utf-8")
    assert runnable_blocks(tmp_path) == [
        ("README.md", 2, "python", "# runnable\nprint(1)\n"),
        ("README.md", 9, "sh", "# runnable\nls\n"),
        ("docs/a.md", 1, "python", "# runnable\nx = 2\n"),
    ]


@pytest.mark.parametrize(("language", "code"), [_param(*block) for block in BLOCKS])
def test_runnable_block(language: str, code: str, cluster: Cluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    env["BOLIDE_BOOTSTRAP"] = cluster.bootstrap_servers
    # The interpreter's folder first: its `bolide` script is the one under test.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = (
        [sys.executable, "-c", code]
        if language == "python"
        else ["bash", "-eu", "-o", "pipefail", "-c", code]
    )
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-4000:]}"
