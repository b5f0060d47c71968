"""Topic identity: a topic deleted and created again under the same name is a new topic (a new
topic id, offsets from 0). The store keeps each incarnation's history apart: the archiver
fills the new one from offset 0, reads never splice the old one into the new, a capacity never
trims what the new one has not archived, ``SqlPositions`` never resumes the new topic from the
old one's positions, and a store met with another cluster refuses until it adopts it. On
SQLite and PostgreSQL, on Apache Kafka (the embedded Tansu engine reports no topic ids).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from bolide.facade import (
    Cluster,
    ClusterMismatchError,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
    TopicRecreatedError,
)
from bolide.facade.kafka import admin_client, partition_count, probe_consumer, topic_identity
from bolide.facade.ports import TopicIdentity
from bolide.stores import Archiver, SqlPositions, SqlStore
from tests.conftest import eventually

pytestmark = pytest.mark.kafka

FAST_GROUP = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}
FIXTURE_DB = Path(__file__).parent / "fixtures" / "release-0010.db"


@pytest.fixture
def kafka_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine reports no topic ids")
    return bolide_backend[1]


def recreate(cluster: Cluster, name: str, partitions: int = 1) -> str:
    """Delete topic ``name``, wait until it is gone, create it again; its new topic id."""
    admin = admin_client(cluster)
    before = topic_identity(cluster, name)
    admin.delete_topics([name], operation_timeout=30)[name].result(timeout=60)
    eventually(lambda: partition_count(admin_client(cluster), name) is None, 60)

    def created() -> bool:
        topic = NewTopic(name, partitions, 1)
        try:
            admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)
        except Exception:  # still being deleted
            return False
        return True

    eventually(created, 60, 0.5)
    after = eventually(lambda: topic_identity(cluster, name), 60)
    assert before is None or after.topic_id != before.topic_id
    return str(after.topic_id)


def publish(cluster: Cluster, stream: StreamConfig, tag: bytes, count: int) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish(Record(b"%s %d" % (tag, i), key=b"k"))


def archive(cluster: Cluster, store: SqlStore, stream: StreamConfig, group: str) -> Any:
    return Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP).run()


def read_all(cluster: Cluster, stream: StreamConfig, count: int, **config: Any) -> list[bytes]:
    """What an ungrouped subscriber from the earliest record reads: ``count`` records."""
    got: list[Record] = []
    settings = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, **config
    )
    with Subscriber(cluster, settings) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
        got.extend(sub.poll(300))
    return [r.data or b"" for r in got]


def test_a_recreated_topic_is_archived_apart_and_never_spliced_into_the_new_one(
    kafka_cluster: Cluster,
    cluster_with_starts: Callable[..., Cluster],
    store: SqlStore,
    stream_factory: Callable[..., StreamConfig],
) -> None:
    stream = stream_factory(store=store, partitions=1)
    group = f"arch-{uuid.uuid4().hex[:8]}"
    publish(kafka_cluster, stream, b"old", 10)
    assert archive(kafka_cluster, store, stream, group).inserted == 10
    old_id = topic_identity(kafka_cluster, stream.name)
    new_id = recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 5)
    errors: list[BaseException | None] = []
    stats = Archiver(
        kafka_cluster,
        store,
        [stream],
        group=group,
        consumer_config=FAST_GROUP,
        error_handler=lambda summary, error: errors.append(error),
    ).run()
    assert (stats.records, stats.inserted) == (5, 5)
    assert [type(e) for e in errors] == [TopicRecreatedError]
    # Both histories are kept, each under its own key; reads see the current one.
    found = store.incarnations(stream.name)
    assert [(i.topic_id, i.current) for i in found] == [
        (old_id.topic_id if old_id else None, False),
        (new_id, True),
    ]
    assert found[0].stored_as == stream.name and found[1].stored_as == f"{stream.name}@{new_id}"
    assert [r.data for r in store.read(stream.name, 0, 0, 100)] == [b"new %d" % i for i in range(5)]
    old = store.read(stream.name, 0, 0, 100, stored_as=found[0].stored_as)
    assert [r.data for r in old] == [b"old %d" % i for i in range(10)]
    assert store.streams().count(stream.name) == 1
    # The incarnations in plain SQL (docs/history.md).
    per_topic = sa.text(
        "SELECT t.topic_id, t.retired_ms, count(*) FROM bolide_records r "
        "JOIN bolide_topics t ON t.stored_as = r.stream "
        "WHERE t.stream = :s GROUP BY t.topic_id, t.retired_ms"
    )
    with store.engine.connect() as conn:
        counts = {
            row[0]: (row[1] is None, row[2]) for row in conn.execute(per_topic, {"s": stream.name})
        }
    assert counts == {found[0].topic_id: (False, 10), new_id: (True, 5)}
    # A reader whose Kafka log starts at 3 splices the new topic's history only.
    trimmed = cluster_with_starts({stream.name: {0: 3}})
    assert read_all(trimmed, stream, 5) == [b"new %d" % i for i in range(5)]


def test_a_running_archiver_follows_the_topic_into_its_new_incarnation(
    kafka_cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    """An archiver that follows a stream while its topic is deleted and created again writes
    what it read of the old topic under the old one, then archives the new topic from its
    start under the new one: nothing of either is lost or mixed."""
    stream = stream_factory(store=store, partitions=1)
    errors: list[BaseException | None] = []
    archiver = Archiver(
        kafka_cluster,
        store,
        [stream],
        group=f"follow-{uuid.uuid4().hex[:8]}",
        consumer_config=FAST_GROUP,
        error_handler=lambda summary, error: errors.append(error),
    )
    publish(kafka_cluster, stream, b"old", 6)
    archiver.start()
    try:
        eventually(lambda: len(store.read(stream.name, 0, 0, 100)) == 6, 60)
        new_id = recreate(kafka_cluster, stream.name)
        publish(kafka_cluster, stream, b"new", 4)
        current = lambda: [r.data for r in store.read(stream.name, 0, 0, 100)]  # noqa: E731
        eventually(lambda: current() == [b"new %d" % i for i in range(4)], 120)
    finally:
        archiver.stop()
    old = store.read(stream.name, 0, 0, 100, stored_as=stream.name)
    assert [r.data for r in old] == [b"old %d" % i for i in range(6)]
    assert [i.topic_id for i in store.incarnations(stream.name) if i.current] == [new_id]
    assert len([e for e in errors if isinstance(e, TopicRecreatedError)]) == 1


def test_a_commit_made_on_the_old_topic_is_no_position_in_the_new_one(
    kafka_cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    """An archiver member that commits its old topic's offsets after the topic was replaced
    (Kafka accepts a commit by name) leaves a position the archiver must not start from: its
    commits name the topic id, and one of another topic counts as none."""
    stream = stream_factory(store=store, partitions=1)
    group = f"late-{uuid.uuid4().hex[:8]}"
    publish(kafka_cluster, stream, b"old", 6)
    archive(kafka_cluster, store, stream, group)
    old = topic_identity(kafka_cluster, stream.name)
    assert old is not None
    recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 5)
    new = topic_identity(kafka_cluster, stream.name)
    assert new is not None
    store.identify(stream.name, new)  # met first by someone else: a subscriber, say
    late = probe_consumer(kafka_cluster, **{"group.id": group})
    try:
        where = TopicPartition(stream.name, 0, 3, metadata=old.topic_id)
        late.commit(offsets=[where], asynchronous=False)
    finally:
        late.close()
    assert archive(kafka_cluster, store, stream, group).inserted == 5
    assert [r.data for r in store.read(stream.name, 0, 0, 10)] == [b"new %d" % i for i in range(5)]


def test_capacity_never_trims_what_the_new_topic_has_not_archived(
    kafka_cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(store=store, partitions=1, capacity=2)
    group = f"cap-{uuid.uuid4().hex[:8]}"
    publish(kafka_cluster, stream, b"old", 10)
    archive(kafka_cluster, store, stream, group)
    recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 6)
    assert archive(kafka_cluster, store, stream, group).inserted == 6
    probe = probe_consumer(kafka_cluster)
    try:
        low, high = probe.get_watermark_offsets(TopicPartition(stream.name, 0), timeout=10)
    finally:
        probe.close()
    assert high == 6 and low <= 6
    assert read_all(kafka_cluster, stream, 6) == [b"new %d" % i for i in range(6)]


def test_sql_positions_never_resume_the_new_topic_from_the_old_ones(
    kafka_cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=1)
    group = f"pos-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException | None] = []
    config = SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=6000,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        positions=SqlPositions(store),
        error_handler=lambda summary, error: errors.append(error),
    )

    def consume(count: int) -> list[bytes]:
        got: list[Record] = []
        with Subscriber(kafka_cluster, config) as sub:

            def step() -> bool:
                batch = sub.poll(200)
                if len(batch):
                    got.extend(batch)
                    with store.engine.begin() as conn:
                        sub.confirm(conn=conn)
                return len(got) >= count

            eventually(step, 60)
        return [r.data or b"" for r in got]

    publish(kafka_cluster, stream, b"old", 10)
    assert len(consume(10)) == 10
    assert SqlPositions(store).positions(group, stream.name) == {0: 10}
    new_id = recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 5)
    assert consume(5) == [b"new %d" % i for i in range(5)]
    recreated = [e for e in errors if isinstance(e, TopicRecreatedError)]
    assert len(recreated) == 1 and recreated[0].topic_id == new_id
    assert SqlPositions(store).positions(group, stream.name) == {0: 5}
    old = SqlPositions(store).positions(group, stream.name, stored_as=stream.name)
    assert old == {0: 10}  # the old topic's, kept under its key


def test_a_group_on_kafka_offsets_reads_the_new_topic_without_the_old_history(
    kafka_cluster: Cluster,
    cluster_with_starts: Callable[..., Cluster],
    store: SqlStore,
    stream_factory: Callable[..., StreamConfig],
) -> None:
    """A grouped subscriber with a history store and Kafka's group offsets: Kafka forgot the
    old topic's offsets, and the splice below the new topic's log start reads the new topic's
    history only; the error handler is told of the recreation once."""
    stream = stream_factory(store=store, partitions=1)
    group = f"kgrp-{uuid.uuid4().hex[:8]}"
    publish(kafka_cluster, stream, b"old", 10)
    archive(kafka_cluster, store, stream, f"arch-{group}")
    recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 5)
    archive(kafka_cluster, store, stream, f"arch-{group}")
    errors: list[BaseException | None] = []
    config = SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=6000,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        error_handler=lambda summary, error: errors.append(error),
    )
    got: list[Record] = []
    trimmed = cluster_with_starts({stream.name: {0: 2}})
    with Subscriber(trimmed, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= 5, 60)
        got.extend(sub.poll(300))
    assert [r.data for r in got] == [b"new %d" % i for i in range(5)]
    assert not [e for e in errors if e is not None and not isinstance(e, TopicRecreatedError)]


def test_another_cluster_is_refused_until_the_stream_adopts_it(
    kafka_cluster: Cluster, store: SqlStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(store=store, partitions=1)
    publish(kafka_cluster, stream, b"r", 3)
    real = topic_identity(kafka_cluster, stream.name)
    assert real is not None
    # The store archived the stream from another cluster before.
    store.identify(stream.name, TopicIdentity("AAAAAAAAAAAAAAAAAAAAAQ", "production-cluster"))
    with pytest.raises(ClusterMismatchError) as refused:
        archive(kafka_cluster, store, stream, f"adopt-{uuid.uuid4().hex[:8]}")
    message = str(refused.value)
    assert "production-cluster" in message and real.cluster_id in message
    assert f"bolide db adopt {stream.name} --cluster-id {real.cluster_id}" in message
    assert store.read(stream.name, 0, 0, 10) == []  # nothing written
    store.adopt(stream.name, real.cluster_id)
    assert archive(kafka_cluster, store, stream, f"adopt-{uuid.uuid4().hex[:8]}").inserted == 3
    assert [(i.cluster_id, i.current) for i in store.incarnations(stream.name)] == [
        (real.cluster_id, False),
        (real.cluster_id, True),
    ]


def test_incarnations_from_the_command_line(
    kafka_cluster: Cluster,
    db_url: str,
    store: SqlStore,
    stream_factory: Callable[..., StreamConfig],
) -> None:
    stream = stream_factory(store=store, partitions=1)
    group = f"cli-{uuid.uuid4().hex[:8]}"
    publish(kafka_cluster, stream, b"old", 4)
    archive(kafka_cluster, store, stream, group)
    new_id = recreate(kafka_cluster, stream.name)
    publish(kafka_cluster, stream, b"new", 2)
    archive(kafka_cluster, store, stream, group)
    old = store.incarnations(stream.name)[0]

    def bolide(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bolide.cli.main", "db", *args, "--db", db_url]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    listed = bolide("incarnations", "--stream", stream.name)
    assert listed.returncode == 0, listed.stderr
    assert old.topic_id in listed.stdout and new_id in listed.stdout
    refused = bolide("drop-incarnation", stream.name, new_id)
    assert refused.returncode == 1 and "current incarnation" in refused.stderr
    dropped = bolide("drop-incarnation", stream.name, old.topic_id)
    assert dropped.returncode == 0, dropped.stderr
    assert "4 records" in dropped.stdout
    assert [i.topic_id for i in store.incarnations(stream.name)] == [new_id]
    assert store.read(stream.name, 0, 0, 10, stored_as=stream.name) == []
    assert len(store.read(stream.name, 0, 0, 10)) == 2


def test_a_database_of_the_previous_release_is_carried_forward(
    kafka_cluster: Cluster, tmp_path: Path, stream_factory: Callable[..., StreamConfig]
) -> None:
    """A SQLite database written at revision 0010 (``fixtures/release-0010.db``: 3 records of
    stream ``orders``, one with headers, and a position of group ``billing``) upgrades, and
    its rows belong to the first incarnation the store meets."""
    copy = tmp_path / "old.db"
    copy.write_bytes(FIXTURE_DB.read_bytes())
    with sqlite3.connect(copy) as raw:
        assert raw.execute("SELECT version_num FROM bolide_alembic_version").fetchone() == ("0010",)
    store = SqlStore(f"sqlite:///{copy}")
    try:
        store.upgrade()
        assert [r.data for r in store.read("orders", 0, 0, 10)] == [b"a", b"b", b"c"]
        assert store.read("orders", 0, 1, 1)[0].headers == [("h", b"1")]
        # Met for the first time: the rows written before are this incarnation's.
        identity = TopicIdentity("AAAAAAAAAAAAAAAAAAAAAg", "some-cluster")
        current, retired = store.identify("orders", identity)
        assert (current.stored_as, retired) == ("orders", None)
        assert [r.data for r in store.read("orders", 0, 0, 10)] == [b"a", b"b", b"c"]
        assert SqlPositions(store).positions("billing", "orders") == {0: 3}
        with store.engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        assert "bolide_topics" in tables
    finally:
        store.close()
