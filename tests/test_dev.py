"""``./dev``, as a newcomer runs it from a fresh clone: what it prints while it sets up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_setup_keeps_the_build_backends_notices_out_of_sight() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    env["BOLIDE_VENV"] = sys.prefix  # the virtualenv running these tests: installed again
    done = subprocess.run(
        [str(ROOT / "dev"), "demo", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: bolide demo" in done.stdout
    shown = done.stdout + done.stderr
    for notice in ("BuildBackendWarning", "Editable installation", "*****"):
        assert notice not in shown, shown
