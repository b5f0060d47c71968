"""The campaign itself, short: a seeded run of every workload (``CI_WORKLOADS``) under every
fault kind keeps each promise, and a run of the at-least-once workload interrupted midway
still checks what it recorded. Neither leaves a process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bolide.facade.broker.apache import kafka_unavailable
from tests.chaos.supervisor import PARENT_ENV, ROOT
from tests.chaos.workloads import WORKLOADS
from tests.conftest import eventually

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.reliability,
    pytest.mark.slow,
    pytest.mark.skipif(
        kafka_unavailable() is not None, reason=f"needs Apache Kafka: {kafka_unavailable()}"
    ),
]

#: The seed of the CI campaign: a failure is rerun with ``./dev chaos --seed`` and these.
SEED = 20261127
#: Every workload.
CI_WORKLOADS = sorted(WORKLOADS)


def _campaign(
    folder: Path, mark: str, *args: str, sigint_ignored: bool = False
) -> subprocess.Popen[bytes]:
    """``python -m tests.chaos`` with ``mark`` in its environment, which its children inherit.

    ``sigint_ignored``: started with SIGINT ignored, as a shell starts a background command
    (``nohup ./dev test &`` from a script): an ignored signal stays ignored across ``exec``.
    """
    env = {**os.environ, "BOLIDE_CHAOS_MARK": mark}
    command = [sys.executable, "-m", "tests.chaos", "--folder", str(folder), *args]
    if sigint_ignored:
        command = ["sh", "-c", 'trap "" INT && exec "$@"', "sh", *command]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _left_behind(mark: str) -> list[int]:
    """Processes still running with ``mark`` in their environment."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _outcome(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "outcome.json").read_text())


@pytest.mark.timeout(1800)
def test_a_seeded_campaign_keeps_every_promise(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    chosen = [arg for name in CI_WORKLOADS for arg in ("--workload", name)]
    campaign = _campaign(tmp_path, mark, "--minutes", "1", "--seed", str(SEED), *chosen)
    output, _ = campaign.communicate(timeout=1500)
    report = output.decode(errors="replace")
    assert campaign.returncode == 0, f"{report}\nhistories in {tmp_path}"
    outcome = _outcome(tmp_path)
    assert sum(outcome["faults"].values()) > 0
    assert set(outcome["results"]) == set(CI_WORKLOADS)
    assert all(counts["acknowledged"] > 0 for counts in outcome["results"].values())
    assert _left_behind(mark) == []


@pytest.mark.timeout(1800)
def test_an_interrupted_campaign_still_checks_and_leaves_nothing(tmp_path: Path) -> None:
    """Interrupted even when started with SIGINT ignored (a suite run in the background):
    the campaign takes Ctrl-C as its own, or it would run its whole hour of faults."""
    mark = uuid.uuid4().hex
    campaign = _campaign(
        tmp_path, mark, "--minutes", "60", "--workload", "alo", "--seed", "3",
        sigint_ignored=True,
    )  # fmt: skip

    def read_some() -> bool:
        assert campaign.poll() is None, campaign.communicate()[0].decode(errors="replace")
        return any(b'"read"' in path.read_bytes() for path in tmp_path.glob("alo-*.jsonl"))

    try:
        eventually(read_some, 600, 1.0)
        campaign.send_signal(signal.SIGINT)  # as Ctrl-C does
        campaign.communicate(timeout=600)
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.communicate()  # reaped, its pipes closed: nothing left for later tests
    outcome = _outcome(tmp_path)
    assert outcome["interrupted"] is True
    assert outcome["results"]["alo"]["acknowledged"] > 0
    assert _left_behind(mark) == []


def test_a_worker_whose_campaign_died_before_it_started_ends(tmp_path: Path) -> None:
    """The campaign's pid comes with the worker, so a campaign gone before the worker's first
    look at its parent still ends it (its own parent is then another process)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {**os.environ, PARENT_ENV: str(gone.pid)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.worker", "alo", "127.0.0.1:9", "t", "out", "1",
         "g", "0", "sqlite://", str(tmp_path / "h.jsonl"), "alo-0.1", str(tmp_path / "stop")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert worker.wait(timeout=120) == 3
