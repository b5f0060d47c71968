"""Kill -9 an archiver process mid-run: no row lost, none duplicated, Kafka never ahead."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import Cluster, StreamConfig
from bolide.stores import Archiver, SqlStore
from tests.history.test_archiver import FAST_GROUP, committed, publish

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

TOTAL = 5_000


def stored_offsets(store: SqlStore, stream: str) -> list[int]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT kafka_offset FROM bolide_records WHERE stream = :s ORDER BY kafka_offset"
            ),
            {"s": stream},
        )
        return [int(o) for (o,) in rows]


def test_sigkill_mid_run_then_restart(
    cluster: Cluster,
    store: SqlStore,
    db_url: str,
    stream_factory: Callable[..., StreamConfig],
    tmp_path: Path,
) -> None:
    stream = stream_factory()
    group = f"crash-{uuid.uuid4().hex[:8]}"
    sent = publish(cluster, stream, TOTAL)
    command = [
        sys.executable, "-m", "bolide.cli.main", "archive",
        "--stream", stream.name, "--db", db_url, "--bootstrap", cluster.bootstrap_servers,
        "--group", group, "--batch-size", "5", "--follow",
        *(f"-X{k}={v}" for k, v in FAST_GROUP.items()),
    ]  # fmt: skip
    log = (tmp_path / "archiver.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(stored_offsets(store, stream.name)) < 200:
            assert proc.poll() is None, (tmp_path / "archiver.log").read_text()
            assert time.monotonic() < deadline, "the archiver wrote nothing"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # mid-run: between, or inside, a transaction
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()

    at_kill = stored_offsets(store, stream.name)
    assert 200 <= len(at_kill) < TOTAL, "the kill came too late to test anything"
    assert at_kill == list(range(len(at_kill)))  # a prefix: no hole, no duplicate
    # Kafka's committed offset never runs ahead of what the database holds.
    assert committed(cluster, group, stream).get(0, 0) <= len(at_kill)

    stats = Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP).run()
    assert stats.caught_up
    final = store.read(stream.name, 0, 0, TOTAL + 10)
    assert [r.offset for r in final] == list(range(TOTAL))
    assert [r.data for r in final] == [r.data for r in sent]
    assert [r.headers for r in final] == [r.headers for r in sent]
    with store.engine.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM bolide_records WHERE stream = :s"), {"s": stream.name}
        ).scalar()
    assert count == TOTAL
    assert committed(cluster, group, stream) == {0: TOTAL}
