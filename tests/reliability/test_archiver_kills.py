"""SIGKILL the archiver (``bolide archive --follow``) at random points, again and again.

After every kill the table holds, per partition, a prefix of the stream with no hole and no
duplicate, and the group's committed offsets never pass what the table holds. A last run
catches up: every record is in the table exactly once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import Publisher, PublisherConfig, Record
from bolide.stores import Archiver, SqlStore
from tests.reliability.conftest import (
    KILLS,
    LEASE_MS,
    committed,
    make_db_url,
    record_figures,
    scaled,
    wait_session_expiry,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.reliability]

FAST_GROUP = {"session.timeout.ms": LEASE_MS, "heartbeat.interval.ms": 500}


def stored(store: SqlStore, stream: str) -> dict[int, list[int]]:
    """Archived offsets per partition, in order (duplicates would show twice)."""
    out: dict[int, list[int]] = {}
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT kafka_partition, kafka_offset FROM bolide_records WHERE stream = :s "
                "ORDER BY kafka_partition, kafka_offset"
            ),
            {"s": stream},
        )
        for p, o in rows:
            out.setdefault(int(p), []).append(int(o))
    return out


def test_archiver_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path: Path, request, rng
):
    url = make_db_url("postgresql", tmp_path, request)
    total = scaled(4_000)
    stream = stream_factory(partitions=2, global_order=False)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(b"%d" % i, group=f"k{i % 7}")) for i in range(total)]
        pub.flush(60)
        sent = [(f.result(10), i) for i, f in enumerate(futures)]
    assert len(sent) == total
    command = [
        sys.executable, "-m", "bolide.cli.main", "archive", "--stream", stream.name,
        "--db", url, "--bootstrap", cluster.bootstrap_servers, "--group", group_name,
        "--batch-size", "25", "--follow", *(f"-X{k}={v}" for k, v in FAST_GROUP.items()),
    ]  # fmt: skip
    store = SqlStore(url)
    store.upgrade()
    request.addfinalizer(store.close)
    recovery: list[float] = []
    started = time.monotonic()
    for run in range(KILLS):
        count = sum(len(v) for v in stored(store, stream.name).values())
        target = rng.randint(count + 1, count + max(1, (total - count) // 2))
        with (tmp_path / f"archiver{run}.log").open("w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            launched = time.monotonic()
            first_write = None
            deadline = launched + 60
            while sum(len(v) for v in stored(store, stream.name).values()) < target:
                assert proc.poll() is None, (tmp_path / f"archiver{run}.log").read_text()
                assert time.monotonic() < deadline, "the archiver did not reach the kill point"
                if (
                    first_write is None
                    and sum(map(len, stored(store, stream.name).values())) > count
                ):
                    first_write = time.monotonic()
                time.sleep(0.005)
            proc.kill()  # SIGKILL: between, or inside, a transaction
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if run:  # from the restart to the first new row
            recovery.append((first_write or time.monotonic()) - launched)
        rows = stored(store, stream.name)
        for p, offsets in rows.items():
            assert offsets == list(range(len(offsets))), f"partition {p}: hole or duplicate"
        position = committed(cluster, group_name, stream.name, 2)
        for p, next_offset in position.items():
            assert next_offset <= len(rows.get(p, [])), "Kafka committed past the database"
        wait_session_expiry()

    stats = Archiver(cluster, store, [stream], group=group_name, consumer_config=FAST_GROUP).run()
    assert stats.caught_up
    rows = stored(store, stream.name)
    assert sum(len(v) for v in rows.values()) == total
    for offsets in rows.values():
        assert offsets == list(range(len(offsets)))
    data = {
        (r.partition, r.offset): r.data for p in rows for r in store.read(stream.name, p, 0, total)
    }
    assert sorted(int(v) for v in data.values()) == list(range(total))
    assert committed(cluster, group_name, stream.name, 2) == {p: len(v) for p, v in rows.items()}
    record_figures(
        "archiver-crash", runs=KILLS, records=total, lost=0, duplicates=0,
        recovery_s=round(max([*recovery, stats.elapsed_s]), 2),
        reread=stats.records - stats.inserted, elapsed_s=round(time.monotonic() - started, 1),
    )  # fmt: skip
