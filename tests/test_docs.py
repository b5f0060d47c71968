"""Every ```python or ```sh block of README.md and docs/*.md whose first line is ``# runnable``.

Every other code block (python, sh, bash, sql, dockerfile) opens with ``# not runnable: <why>``
or ``# tested in tests/<file>`` (``--`` in SQL), so a block that cannot run here says so where a
reader sees it, and one another test runs names that test.
Versions in the docs (PySpark, its Kafka connector) are the ones pyproject.toml pins.

Each runnable block runs as written, in a fresh interpreter (``sh`` blocks: bash with ``-eu -o
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
#: Every fenced block in a language that runs, whatever its marker.
_CODE = re.compile(
    r"^```(python|sh|bash|sql|dockerfile)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL
)
_NOT_RUNNABLE = re.compile(r"^(#|--) (not runnable: \S|tested in (?P<test>tests/\S+\.py))")


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


def _doc_files(root: Path = ROOT) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def unmarked_blocks(root: Path = ROOT) -> list[str]:
    """``file:line`` of every code block that neither runs nor says why it cannot."""
    found = []
    for path in _doc_files(root):
        text = path.read_text(encoding="utf-8")
        for match in _CODE.finditer(text):
            first = match.group(2).lstrip("\n").split("\n", 1)[0]
            marked = _NOT_RUNNABLE.match(first)
            if marked and marked.group("test") and not (root / marked.group("test")).is_file():
                marked = None
            if first.strip() != MARKER and not marked:
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(root)}:{line}")
    return found


def test_every_code_block_runs_or_says_why() -> None:
    assert unmarked_blocks() == [], "mark each '# runnable' or '# not runnable: <reason>'"


def test_unmarked_blocks_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "```bash\npip install x\n```\n"
        "```sql\n-- not runnable: needs a store\nSELECT 1\n```\n"
        "```python\n# not runnable:\nx\n```\n"
        "```text\nnot code\n```\n"
        "```python\n# tested in tests/test_gone.py\nx\n```\n",
        encoding="utf-8",
    )
    assert unmarked_blocks(tmp_path) == ["docs/a.md:1", "docs/a.md:8", "docs/a.md:15"]


def _pinned_pyspark() -> str:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'"pyspark==([0-9.]+)"', pyproject)
    assert found is not None, "pyproject.toml pins pyspark"
    return found.group(1)


def test_spark_versions_in_the_docs_are_the_pinned_one() -> None:
    pinned = _pinned_pyspark()
    mentioned = re.compile(
        r"spark-sql-kafka-0-10_2\.13:([0-9][0-9.]*[0-9])|SPARK_VERSION=([0-9.]+)|pyspark==([0-9.]+)"
    )
    wrong = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in _doc_files()
        for match in mentioned.finditer(path.read_text(encoding="utf-8"))
        if next(v for v in match.groups() if v) != pinned
    ]
    assert wrong == [], f"the docs name versions other than pyspark=={pinned}"


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
