"""The archiver on the real broker and real databases: end to end, restarts, failures."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from bolide.facade import (
    BrokerError,
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    SchemaOutOfDateError,
    StreamConfig,
)
from bolide.stores import Archiver, ArchiverStats, SqlStore, require_delete_records
from tests.conftest import eventually
from tests.pubsub.test_sparse_offsets import publish_transactions

pytestmark = pytest.mark.kafka

#: Short sessions: joining a group on the embedded broker takes about half of this.
FAST_GROUP = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}


def publish(cluster: Cluster, stream: StreamConfig, count: int, start: int = 0) -> list[Record]:
    """Publish ``count`` records with keys and headers; return them with their offsets."""
    records = [
        Record(
            f"payload-{i}".encode(),
            key=f"key-{i % 7}".encode(),
            headers=[("trace", f"t-{i}".encode()), ("n", str(i).encode())],
        )
        for i in range(start, start + count)
    ]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(r) for r in records]
        pub.flush(30)
    for future in futures:
        future.result(30)
    return records


def archived(store: SqlStore, stream: StreamConfig) -> list[Record]:
    out: list[Record] = []
    for p in range(stream.partitions or 1):
        out.extend(store.read(stream.name, p, 0, 1_000_000))
    return out


def committed(cluster: Cluster, group: str, stream: StreamConfig) -> dict[int, int]:
    """The group's committed offsets (missing partitions are left out)."""
    consumer = Consumer(cluster.client_config({"group.id": group}))
    try:
        asked = [TopicPartition(stream.name, p) for p in range(stream.partitions or 1)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, 10) if tp.offset >= 0}
    finally:
        consumer.close()


def key_of(rec: Record) -> tuple[object, ...]:
    return (rec.partition, rec.offset, rec.data, rec.key, rec.headers, rec.timestamp_ms)


def test_archives_every_record_of_several_streams(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    single = stream_factory(name_prefix="arch-one")
    multi = stream_factory(name_prefix="arch-three", partitions=3, global_order=False)
    sent = {single.name: publish(cluster, single, 120), multi.name: publish(cluster, multi, 150)}
    reports: list[ArchiverStats] = []
    archiver = Archiver(
        cluster,
        store,
        [single, multi],
        group=f"g-{uuid.uuid4().hex[:8]}",
        batch_size=50,
        consumer_config=FAST_GROUP,
        progress=reports.append,
    )
    stats = archiver.run(until_caught_up=True)
    assert stats.caught_up and stats.lag == 0
    assert stats.inserted == stats.records == 270
    assert stats.batches >= 270 // 50
    assert reports and reports[-1].caught_up
    for stream in (single, multi):
        got = sorted(archived(store, stream), key=key_of)
        want = sorted(sent[stream.name], key=key_of)
        assert [key_of(r) for r in got] == [key_of(r) for r in want]
        assert all(r.stream == stream.name for r in got)
    assert {p for p in range(3) if store.largest_offset(multi.name, p) is not None} == {0, 1, 2}


def test_restart_resumes_from_committed_offsets(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    group = f"g-{uuid.uuid4().hex[:8]}"
    publish(cluster, stream, 40)
    first = Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP).run()
    assert first.inserted == 40
    assert committed(cluster, group, stream) == {0: 40}
    # Nothing new: returns at once without joining the group.
    again = Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP).run()
    assert (again.records, again.caught_up) == (0, True)
    publish(cluster, stream, 25, start=40)
    more = Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP).run()
    assert (more.records, more.inserted) == (25, 25)
    assert [r.offset for r in archived(store, stream)] == list(range(65))


def test_follow_in_a_thread(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    with Archiver(
        cluster, store, [stream], group=f"g-{uuid.uuid4().hex[:8]}", consumer_config=FAST_GROUP
    ) as archiver:
        archiver.start()
        publish(cluster, stream, 30)
        eventually(lambda: store.largest_offset(stream.name, 0) == 29, timeout_s=20)
        publish(cluster, stream, 5, start=30)
        eventually(lambda: store.largest_offset(stream.name, 0) == 34, timeout_s=20)
    assert archiver.stats.records == 35


def test_offsets_wait_for_the_batch_being_written(
    cluster: Cluster, tmp_path: object, stream_factory: Callable[..., StreamConfig]
) -> None:
    """While a batch's transaction is open, Kafka offsets stay at what the database holds."""
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    class GatedStore(SqlStore):
        def store_batches(
            self, batches: Mapping[str, Sequence[Record]], *, also: Any = None, **keys: Any
        ) -> int:
            calls.append(1)
            if len(calls) == 2:  # hold the second batch's transaction open
                entered.set()
                release.wait(60)
            return super().store_batches(batches, also=also, **keys)

    store = GatedStore(f"sqlite:///{tmp_path}/gated.db")
    store.upgrade()
    stream = stream_factory()
    group = f"g-{uuid.uuid4().hex[:8]}"
    publish(cluster, stream, 30)
    archiver = Archiver(
        cluster, store, [stream], group=group, batch_size=5, consumer_config=FAST_GROUP
    )
    try:
        archiver.start()
        assert entered.wait(60)
        first = store.largest_offset(stream.name, 0)
        assert first is not None and first < 29
        eventually(lambda: committed(cluster, group, stream) == {0: first + 1}, timeout_s=20)
        assert store.largest_offset(stream.name, 0) == first
    finally:
        release.set()
    eventually(lambda: committed(cluster, group, stream) == {0: 30}, timeout_s=30)
    stats = archiver.stop()
    assert stats.inserted == 30 and stats.records == 30
    assert [r.offset for r in archived(store, stream)] == list(range(30))
    store.close()


def test_database_outage_is_retried_and_offsets_wait_for_it(
    cluster: Cluster, tmp_path: object, stream_factory: Callable[..., StreamConfig]
) -> None:
    """A locked SQLite database fails every write; Kafka offsets must not move meanwhile."""
    url = f"sqlite:///{tmp_path}/locked.db"
    store = SqlStore(url, busy_timeout_ms=50)
    store.upgrade()
    stream = stream_factory()
    group = f"g-{uuid.uuid4().hex[:8]}"
    publish(cluster, stream, 20)
    blocker = sa.create_engine(url, poolclass=sa.NullPool).connect()
    blocker.exec_driver_sql("BEGIN EXCLUSIVE")
    archiver = Archiver(
        cluster, store, [stream], group=group, consumer_config=FAST_GROUP, max_backoff_s=0.2
    )
    try:
        archiver.start()
        eventually(lambda: archiver.stats.retries >= 3, timeout_s=20)
        assert committed(cluster, group, stream) == {}
    finally:
        blocker.rollback()
        blocker.close()
    eventually(lambda: store.largest_offset(stream.name, 0) == 19, timeout_s=20)
    eventually(lambda: committed(cluster, group, stream) == {0: 20}, timeout_s=20)
    stats = archiver.stop()
    assert stats.inserted == 20
    store.close()


def test_refuses_a_store_behind_head(
    cluster: Cluster, db_url: str, stream_factory: Callable[..., StreamConfig]
) -> None:
    with SqlStore(db_url) as empty, pytest.raises(SchemaOutOfDateError, match="db upgrade"):
        Archiver(cluster, empty, [stream_factory()])


def test_bad_arguments(cluster: Cluster, store: SqlStore) -> None:
    stream = StreamConfig(name=f"bad-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ValueError, match="streams"):
        Archiver(cluster, store, [])
    with pytest.raises(ValueError, match="batch_size"):
        Archiver(cluster, store, [stream], batch_size=0)
    with pytest.raises(TypeError, match="store"):
        Archiver(cluster, object(), [stream])  # type: ignore[arg-type]
    other = SqlStore("sqlite://")
    with pytest.raises(ValueError, match="another store"):
        Archiver(cluster, store, [StreamConfig(name=stream.name, store=other)])


def _delete_records_supported(cluster: Cluster, stream: StreamConfig) -> bool:
    publish(cluster, stream, 1)
    try:
        require_delete_records(cluster, stream.name)
    except BrokerError:
        return False
    return True


@pytest.mark.tansu
def test_capacity_fails_clearly_without_delete_records(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    probe = stream_factory()
    if _delete_records_supported(cluster, probe):
        pytest.skip("this broker supports DeleteRecords (see the trimming test)")
    stream = stream_factory(store=store, capacity=10)
    with pytest.raises(BrokerError, match="does not support DeleteRecords") as info:
        Archiver(cluster, store, [stream])
    assert "retention_ms" in str(info.value)
    assert info.value.stream == stream.name


def test_capacity_trims_kafka_once_archived(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    probe = stream_factory()
    if not _delete_records_supported(cluster, probe):
        pytest.skip("the broker cannot delete records (the embedded one closes the connection)")
    stream = stream_factory(store=store, capacity=20)
    publish(cluster, stream, 100)
    Archiver(cluster, store, [stream], batch_size=25, consumer_config=FAST_GROUP).run()
    consumer = Consumer(cluster.client_config({"group.id": "probe"}))
    low, high = consumer.get_watermark_offsets(TopicPartition(stream.name, 0), timeout=10)
    consumer.close()
    assert high == 100
    assert 60 <= low <= 80  # about 20 left in Kafka, never one that is not archived
    assert [r.offset for r in archived(store, stream)] == list(range(100))


def test_archives_a_transactional_stream_with_marker_gaps(
    cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish_transactions(cluster, stream, count=3, size=4)
    stats = Archiver(
        cluster, store, [stream], group=f"g-{uuid.uuid4().hex[:8]}", consumer_config=FAST_GROUP
    ).run()
    rows = archived(store, stream)
    assert stats.inserted == 12
    assert [r.data for r in rows] == [f"{t}-{i}".encode() for t in range(3) for i in range(4)]
    assert [r.offset for r in rows] == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
