"""Reliability suite: scale knobs, worker processes, group and offset probes, figures.

The CI defaults keep the whole suite within its time budget. Environment variables give the
full figures:

``BOLIDE_RELIABILITY_SCALE``
    multiplies record counts (default 1; 25 gives the 50,000-record crash runs);
``BOLIDE_RELIABILITY_KILLS``
    SIGKILLs per crash run (default 2);
``BOLIDE_SOAK_SECONDS``
    length of the load soak (default 15);
``BOLIDE_RELIABILITY_SEED``
    seed for the kill points (default: random, printed on failure);
``BOLIDE_RELIABILITY_FIGURES``
    a file that receives one JSON line of figures per run (for docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import probe_consumer
from tests.history.conftest import PG_ADMIN_URL, make_db_url, pg_admin
from tests.reliability.worker import LEASE_MS

__all__ = [
    "KILLS",
    "LEASE_MS",
    "PG_ADMIN_URL",
    "SCALE",
    "SOAK_SECONDS",
    "Member",
    "committed",
    "make_db_url",
    "pg_admin",
    "publish_numbered",
    "record_figures",
    "wait_session_expiry",
]

ROOT = Path(__file__).resolve().parents[2]


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = float(raw)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return value


SCALE = _env_number("BOLIDE_RELIABILITY_SCALE", 1.0)
KILLS = int(_env_number("BOLIDE_RELIABILITY_KILLS", 2))
SOAK_SECONDS = _env_number("BOLIDE_SOAK_SECONDS", 15.0)


def scaled(count: int) -> int:
    """``count`` times the scale, at least 1."""
    return max(1, int(count * SCALE))


@pytest.fixture
def rng() -> random.Random:
    """A seeded random source; the seed is in the test's report when it fails."""
    seed = int(os.environ.get("BOLIDE_RELIABILITY_SEED") or random.randrange(2**32))
    print(f"BOLIDE_RELIABILITY_SEED={seed}")
    return random.Random(seed)


def record_figures(scenario: str, **figures: Any) -> None:
    """Print one run's figures, and append them to ``$BOLIDE_RELIABILITY_FIGURES`` if set."""
    line = json.dumps({"scenario": scenario, "scale": SCALE, **figures}, sort_keys=True)
    print(f"FIGURES {line}")
    path = os.environ.get("BOLIDE_RELIABILITY_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def publish_numbered(cluster: Cluster, stream: StreamConfig, count: int) -> list[int]:
    """Publish ``count`` records ``b"<i>"``; return their offsets (partition 0 streams)."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(b"%d" % i)) for i in range(count)]
        pub.flush(60)
        return [f.result(60) for f in futures]


def committed(cluster: Cluster, group: str, topic: str, partitions: int) -> dict[int, int]:
    """A group's committed positions (next offset to read); partitions without one are left out.

    Offsets a still-open transaction sent are not counted: a ``read_committed`` reader asks
    Kafka for stable offsets and waits for that transaction to end (a killed one: its
    timeout), so this asks as a ``read_uncommitted`` reader, which is answered at once.
    """
    consumer = probe_consumer(cluster, **{"group.id": group, "isolation.level": "read_uncommitted"})
    try:
        asked = [TopicPartition(topic, p) for p in range(partitions)]
        return {
            tp.partition: tp.offset
            for tp in consumer.committed(asked, timeout=30)
            if tp.offset >= 0
        }
    finally:
        consumer.close()


def wait_session_expiry(lease_ms: int = LEASE_MS) -> float:
    """Wait until a killed member's session has expired; return the wait in seconds.

    The next member then joins an empty group. (The embedded broker describes every group as
    STABLE with no members, so the wait cannot be read from DescribeGroups there.)
    """
    wait = lease_ms / 1000 + 1.0
    time.sleep(wait)
    return wait


class Member:
    """A worker process (``tests.reliability.worker``) and the lines it logged."""

    def __init__(self, tmp_path: Path, name: str, args: list[str]) -> None:
        self.log = tmp_path / f"{name}.log"
        self.stop_file = tmp_path / f"{name}.stop"
        self.stderr = (tmp_path / f"{name}.err").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.worker", *args[:5], str(self.log),
             str(self.stop_file), *args[5:]],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self.stderr,
        )  # fmt: skip

    def lines(self) -> list[str]:
        try:
            text = self.log.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return text.splitlines()

    def processed(self) -> list[list[str]]:
        """The ``P`` lines, split into fields after the tag."""
        return [line.split()[1:] for line in self.lines() if line.startswith("P ")]

    def ready(self) -> bool:
        self.check_alive()
        return "READY" in self.lines()

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            self.stderr.flush()
            err = Path(self.stderr.name).read_text(encoding="utf-8")[-3000:]
            raise AssertionError(f"worker {self.log.stem} exited with {code}: {err}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.stderr.close()

    def finish(self, timeout_s: float = 30.0) -> None:
        self.stop_file.touch()
        try:
            code = self.process.wait(timeout_s)
        finally:
            self.close()
        assert code == 0, Path(self.stderr.name).read_text(encoding="utf-8")[-3000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.stderr.close()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    """Worker processes started by a test; any still running are killed at teardown."""
    started: list[Member] = []
    yield started
    for member in started:
        member.close()


@pytest.fixture
def group_name() -> str:
    return f"rel-{uuid.uuid4().hex[:10]}"
