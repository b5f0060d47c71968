"""``bolide dlq replay`` killed with SIGKILL mid-way, then run again: every dead letter is in
the target exactly once, wherever the kill fell (between a claim, its publish and its record)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable

import pytest

from bolide.facade import Cluster, Publisher, PublisherConfig, Reason, Record, StreamConfig
from bolide.facade.deadletter import REPLAYED_FROM_HEADER, letter
from bolide.facade.kafka import admin_client, partition_count
from tests.deadletters.conftest import end_of, read_all
from tests.test_cli import _COMMAND

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

COUNT = 2_000


def _dead_letters(cluster: Cluster, dead: StreamConfig) -> None:
    """COUNT dead letters, as a receiver writes them (``letter()``, a source each)."""
    with Publisher(cluster, PublisherConfig(stream=dead)) as pub:
        for i in range(COUNT):
            failed = Record(b"order %d" % i, key=b"k%d" % (i % 7))
            pub.publish_async(letter(failed, Reason.FAILED, "boom", f"orders/0/{i}"))
        assert pub.flush(60) == 0


def _published(cluster: Cluster, name: str) -> int:
    """Records in partition 0 of ``name``; 0 before the stream exists (never asked by name:
    Tansu would create it)."""
    if partition_count(admin_client(cluster), name) is None:
        return 0
    return end_of(cluster, name)


def test_a_killed_replay_then_another_publish_each_dead_letter_once(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], db_url: str
) -> None:
    dead, out = stream_factory("crash-dlq"), stream_factory("crash-out")
    _dead_letters(cluster, dead)
    where = ["--db", db_url, "--bootstrap", cluster.bootstrap_servers]
    if cluster.fetch_gap_settle_ms:
        where += ["-X", f"fetch_gap_settle_ms={cluster.fetch_gap_settle_ms}"]
    command = [*_COMMAND, "dlq", "replay", "-t", dead.name, "--to", out.name, *where]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            if _published(cluster, out.name) > 0:
                break
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(30)
        first.stdout.close()  # type: ignore[union-attr]
        first.stderr.close()  # type: ignore[union-attr]
    before = -1
    while (now := _published(cluster, out.name)) != before:  # what the killed one sent lands
        before = now
        time.sleep(0.5)
    # Claims left young by the kill are taken over at once: nothing else replays this stream.
    second = subprocess.run(
        [*command, "--claim-timeout-s", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    published_now = json.loads(second.stdout)["replayed"]
    counts = Counter(
        (r.header(REPLAYED_FROM_HEADER) or b"").decode() for r in read_all(cluster, out)
    )
    assert counts == Counter(f"{dead.name}/0/{o}" for o in range(COUNT))
    assert published_now == COUNT - before  # what the killed replay had not published
    assert end_of(cluster, out.name) == COUNT  # nothing published twice
