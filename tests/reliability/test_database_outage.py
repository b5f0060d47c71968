"""PostgreSQL drops the archiver's connections mid-archive (``pg_terminate_backend``).

The archiver retries with backoff, never commits Kafka offsets past what the database holds,
and catches up once the database lets it in again: every record in the table exactly once.
Only the archiver's own backends are terminated, picked by the ``application_name`` in its URL.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import Publisher, PublisherConfig, Record
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually
from tests.reliability.conftest import (
    LEASE_MS,
    committed,
    make_db_url,
    record_figures,
    scaled,
)
from tests.reliability.test_archiver_kills import stored

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.reliability]

OUTAGE_S = 3.0
PUBLISH_S = 6.0


def terminate(admin: sa.Engine, application: str) -> int:
    """Terminate every backend of ``application``; return how many."""
    with admin.connect() as conn:
        return len(
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                    "'test' AND pid <> pg_backend_pid() AND application_name = :app"
                ),
                {"app": application},
            ).all()
        )


def test_archiver_survives_terminated_backends(
    cluster, stream_factory, group_name, tmp_path: Path, request, pg_admin
):
    application = f"bolide-archiver-{uuid.uuid4().hex[:8]}"
    url = f"{make_db_url('postgresql', tmp_path, request)}&application_name={application}"
    store = SqlStore(url)
    store.upgrade()
    request.addfinalizer(store.close)
    stream = stream_factory(partitions=2, global_order=False)
    total = scaled(3_000)
    archiver = Archiver(
        cluster, store, [stream], group=group_name, batch_size=50, max_backoff_s=0.5,
        consumer_config={"session.timeout.ms": LEASE_MS, "heartbeat.interval.ms": 500},
    )  # fmt: skip
    publishing = threading.Event()
    violations: list[str] = []

    def publish() -> None:
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            pause = PUBLISH_S / (total / 50)
            for i in range(total):
                pub.publish_async(Record(b"%d" % i, group=f"k{i % 5}"))
                if i % 50 == 49:
                    time.sleep(pause)  # a steady flow before, across and after the outage
            pub.flush(60)
        publishing.set()

    def kafka_never_ahead() -> None:
        # Kafka first: the database commits before Kafka does, so the table can only be ahead.
        positions = committed(cluster, group_name, stream.name, 2)
        rows = stored(store_view, stream.name)
        for p, position in positions.items():
            held = len(rows.get(p, []))
            if position > held:
                violations.append(f"partition {p}: committed {position}, table {held}")

    store_view = SqlStore(make_db_url_view(url))
    request.addfinalizer(store_view.close)

    def watch() -> None:
        while not publishing.is_set() or not done.is_set():
            kafka_never_ahead()
            time.sleep(0.05)

    done = threading.Event()
    archiver.start()
    publisher = threading.Thread(target=publish)
    publisher.start()
    watcher = threading.Thread(target=watch)
    watcher.start()
    eventually(lambda: sum(map(len, stored(store_view, stream.name).values())) > total // 10, 30)
    # The outage, for OUTAGE_S: a lock stalls every write of the archiver (reads go on), and
    # its backends are cut while they wait, so each attempt fails.
    terminated = 0
    with store_view.engine.connect() as locker:
        locker.execute(sa.text("LOCK TABLE bolide_records IN EXCLUSIVE MODE"))
        outage_end = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_end:
            terminated += terminate(pg_admin, application)
            time.sleep(0.05)
        locker.rollback()
    recovered_from = time.monotonic()
    publisher.join(60)
    assert publishing.is_set()
    eventually(lambda: sum(map(len, stored(store_view, stream.name).values())) == total, 60)
    recovery_s = time.monotonic() - recovered_from
    done.set()
    watcher.join(30)
    kafka_never_ahead()
    stats = archiver.stop()
    assert not violations, violations
    assert terminated > 0, "the outage never hit the archiver"
    assert stats.retries > 0, "the archiver never had to retry a write"
    rows = stored(store_view, stream.name)
    for p, offsets in rows.items():
        assert offsets == list(range(len(offsets))), f"partition {p}: hole or duplicate"
    assert sum(map(len, rows.values())) == total
    eventually(
        lambda: (
            committed(cluster, group_name, stream.name, 2) == {p: len(v) for p, v in rows.items()}
        ),
        10,
    )
    record_figures(
        "database-outage", runs=1, records=total, lost=0, duplicates=0,
        terminated=terminated, retries=stats.retries, outage_s=OUTAGE_S,
        recovery_s=round(recovery_s, 2),
    )  # fmt: skip


def make_db_url_view(url: str) -> str:
    """The same database and schema under another application name (never terminated)."""
    return url.rsplit("&application_name=", 1)[0]
