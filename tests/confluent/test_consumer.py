"""``bolide.confluent``: confluent-kafka's consumers, reading past Kafka's retention from the
history store. Each test trims a topic for real (DeleteRecords) after archiving it, on
Apache Kafka, with the store on SQLite and PostgreSQL; where the drop-in must behave as
confluent-kafka's own consumer does, the same test runs against both classes."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.serialization import StringDeserializer

from bolide.confluent import Consumer, DeserializingConsumer
from bolide.facade import (
    Cluster,
    ClusterMismatchError,
    Publisher,
    PublisherConfig,
    Record,
    SchemaOutOfDateError,
    StreamConfig,
)
from bolide.facade.ports import TopicIdentity
from bolide.stores import Archiver, SqlStore
from tests.conftest import DATABASES, eventually, make_db_url, upgraded_db_url

pytestmark = pytest.mark.kafka

COUNT, START = 20, 12  # records published; Kafka's log start once trimmed


@pytest.fixture
def kafka_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine cannot delete records")
    return bolide_backend[1]


@pytest.fixture(params=DATABASES)
def history_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return upgraded_db_url(request.param, tmp_path, request)


@pytest.fixture
def trimmed(
    kafka_cluster: Cluster,
    history_url: str,
    stream_factory: Callable[..., StreamConfig],
    cluster_with_starts: Callable[..., Cluster],
) -> Iterator[StreamConfig]:
    """A one-partition stream of ``COUNT`` records, archived, then trimmed in Kafka to
    ``START``.."""
    stream = stream_factory(partitions=1)
    with Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(COUNT):
            pub.publish(Record(b"v-%d" % i, key=b"k", headers=[("i", b"%d" % i)]))
    with SqlStore(history_url) as store:
        Archiver(kafka_cluster, store, [stream], group=f"arch-{stream.name}").run()
    cluster_with_starts({stream.name: {0: START}})
    yield stream


def config(cluster: Cluster, history_url: str | None, **more: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **cluster.settings,
        **more,
    }
    if history_url is not None:
        settings["bolide.history"] = history_url
    return settings


def drain(consumer: Any, until: int, *, batch: bool = False) -> list[Any]:
    """Messages (errors left out) until one at offset ``until - 1`` has come."""
    got: list[Any] = []

    def step() -> bool:
        found = consumer.consume(5, 0.2) if batch else [consumer.poll(0.2)]
        got.extend(m for m in found if m is not None and m.error() is None)
        return bool(got) and got[-1].offset() >= until - 1

    eventually(step, 60)
    return got


def test_subscribe_from_earliest_reads_the_archive_then_kafka(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    drop_in = Consumer(config(kafka_cluster, history_url))
    plain = confluent_kafka.Consumer(config(kafka_cluster, None))
    try:
        drop_in.subscribe([trimmed.name])
        plain.subscribe([trimmed.name])
        read = drain(drop_in, COUNT)
        lost = drain(plain, COUNT)
    finally:
        drop_in.close()
        plain.close()
    assert [m.offset() for m in read] == list(range(COUNT))  # no gap, no repeat
    assert [m.value() for m in read] == [b"v-%d" % i for i in range(COUNT)]
    assert [m.headers() for m in read] == [[("i", b"%d" % i)] for i in range(COUNT)]
    assert all(m.key() == b"k" and m.topic() == trimmed.name for m in read)
    assert all(m.timestamp()[1] > 0 for m in read)
    # The archive's records carry Kafka's own timestamps: the same as the trimmed ones had.
    stamps = [m.timestamp()[1] for m in read]
    assert stamps == sorted(stamps)
    assert [m.offset() for m in lost] == list(range(START, COUNT))  # retention took the rest


def test_consume_in_batches_and_the_deserializing_consumer(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    consumer = DeserializingConsumer(
        config(kafka_cluster, history_url, **{"value.deserializer": StringDeserializer("utf_8")})
    )
    try:
        consumer.subscribe([trimmed.name])
        values = [m.value() for m in drain(consumer, COUNT)]
    finally:
        consumer.close()
    assert values == [f"v-{i}" for i in range(COUNT)]
    batched = Consumer(config(kafka_cluster, history_url))
    try:
        batched.subscribe([trimmed.name])
        assert [m.offset() for m in drain(batched, COUNT, batch=True)] == list(range(COUNT))
    finally:
        batched.close()


def test_a_commit_in_the_archived_range_resumes_there_in_a_new_member(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    settings = config(kafka_cluster, history_url)
    first = Consumer(settings)
    try:
        first.subscribe([trimmed.name])
        read = drain(first, 6)
        first.commit(message=read[5], asynchronous=False)
        committed = first.committed([TopicPartition(trimmed.name, 0)], 30)
    finally:
        first.close()
    assert committed[0].offset == 6  # an ordinary group offset, below Kafka's log start
    second = Consumer(settings)
    try:
        second.subscribe([trimmed.name])
        again = drain(second, COUNT)
    finally:
        second.close()
    assert [m.offset() for m in again] == list(range(6, COUNT))


@pytest.mark.parametrize("how", ["bare commit", "auto-commit"])
def test_archived_records_count_in_a_bare_commit_and_in_auto_commit(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig, how: str
) -> None:
    """With the offset store automatic (librdkafka's default), the archived records handed
    out are committed as Kafka's are: by a bare ``commit()``, and by auto-commit (here, on
    close)."""
    auto = how == "auto-commit"
    settings = config(kafka_cluster, history_url, **{"enable.auto.commit": auto})
    first = Consumer(settings)
    try:
        first.subscribe([trimmed.name])
        drain(first, 6)
        if not auto:
            first.commit(asynchronous=False)
    finally:
        first.close()
    second = Consumer(settings)
    try:
        second.subscribe([trimmed.name])
        assert drain(second, COUNT)[0].offset() == 6
    finally:
        second.close()


def test_assign_seek_and_position_at_archived_offsets(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    consumer = Consumer(config(kafka_cluster, history_url))
    try:
        consumer.assign([TopicPartition(trimmed.name, 0, 3)])
        assert [m.offset() for m in drain(consumer, 6)][:3] == [3, 4, 5]
        assert consumer.position([TopicPartition(trimmed.name, 0)])[0].offset == 6
        consumer.seek(TopicPartition(trimmed.name, 0, 1))
        assert [m.offset() for m in drain(consumer, COUNT)] == list(range(1, COUNT))
        consumer.seek(TopicPartition(trimmed.name, 0, 15))  # in Kafka: Kafka seeks
        assert [m.offset() for m in drain(consumer, COUNT)] == list(range(15, COUNT))
        consumer.seek(TopicPartition(trimmed.name, 0, OFFSET_BEGINNING))  # the archive's first
        assert [m.offset() for m in drain(consumer, COUNT)] == list(range(COUNT))
    finally:
        consumer.close()


def test_pause_and_resume_hold_the_archive_read_where_it_stands(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    consumer = Consumer(config(kafka_cluster, history_url))
    part = TopicPartition(trimmed.name, 0)
    try:
        consumer.assign([TopicPartition(trimmed.name, 0, 0)])
        assert [m.offset() for m in drain(consumer, 3)] == [0, 1, 2]
        consumer.pause([part])
        assert consumer.poll(0.5) is None
        assert consumer.position([part])[0].offset == 3
        consumer.resume([part])
        assert [m.offset() for m in drain(consumer, COUNT)] == list(range(3, COUNT))
    finally:
        consumer.close()


def test_offsets_for_times_and_watermarks_reach_into_the_archive(
    kafka_cluster: Cluster, history_url: str, trimmed: StreamConfig
) -> None:
    with SqlStore(history_url) as store:
        stamp = store.read(trimmed.name, 0, 4, 1)[0].timestamp_ms
    assert stamp is not None
    consumer = Consumer(config(kafka_cluster, history_url))
    part = TopicPartition(trimmed.name, 0)
    try:
        found = consumer.offsets_for_times([TopicPartition(trimmed.name, 0, stamp)], 30)
        assert found[0].offset <= 4  # records 0..4 may share a millisecond
        assert consumer.get_watermark_offsets(part, 30) == (START, COUNT)
        assert consumer.get_watermark_offsets(part, 30, archive=True) == (0, COUNT)
    finally:
        consumer.close()


@pytest.mark.parametrize("kind", ["confluent", "bolide"])
def test_without_history_it_is_confluent_kafkas_consumer(
    kafka_cluster: Cluster, stream_factory: Callable[..., StreamConfig], kind: str
) -> None:
    stream = stream_factory(partitions=2)
    with Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(10):
            pub.publish(Record(b"%d" % i, partition=i % 2))
    cls = confluent_kafka.Consumer if kind == "confluent" else Consumer
    consumer = cls(config(kafka_cluster, None))
    got: list[tuple[int, int, bytes]] = []
    try:
        consumer.subscribe([stream.name])

        def step() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append((msg.partition(), msg.offset(), msg.value()))
            return len(got) >= 10

        eventually(step, 60)
        assert consumer.get_watermark_offsets(TopicPartition(stream.name, 0), 30) == (0, 5)
    finally:
        consumer.close()
    assert sorted(got) == sorted((i % 2, i // 2, b"%d" % i) for i in range(10))


def test_bad_settings_are_refused_at_construction(
    kafka_cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(ValueError, match=r"bolide\.history"):
        Consumer({**config(kafka_cluster, None), "bolide.store": "sqlite://"})
    empty = make_db_url("sqlite", tmp_path, request)
    with pytest.raises(SchemaOutOfDateError, match="bolide db upgrade"):
        Consumer(config(kafka_cluster, empty))
    (tmp_path / "other").mkdir()
    other = upgraded_db_url("sqlite", tmp_path / "other", request)
    with SqlStore(other) as store:
        store.identify("orders", TopicIdentity("AAAAAAAAAAAAAAAAAAAAAQ", "another-cluster"))
    with pytest.raises(ClusterMismatchError, match="another-cluster"):
        Consumer(config(kafka_cluster, other))


PROTOCOLS = {
    "eager": {},
    "cooperative": {"partition.assignment.strategy": "cooperative-sticky"},
    "consumer": {"group.protocol": "consumer"},
}


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_rebalance_while_reading_archived_records_loses_nothing(
    kafka_cluster: Cluster,
    history_url: str,
    stream_factory: Callable[..., StreamConfig],
    cluster_with_starts: Callable[..., Cluster],
    protocol: str,
) -> None:
    """Two partitions, archived and trimmed; a member reads from the archive and commits each
    record, a second joins and takes a partition. Between them every record is handled (at
    least once: a commit the rebalance refused is read again)."""
    stream = stream_factory(partitions=2, global_order=False)
    with Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(2 * COUNT):
            pub.publish(Record(b"%d" % i, partition=i % 2))
    with SqlStore(history_url) as store:
        Archiver(kafka_cluster, store, [stream], group=f"arch-{stream.name}").run()
    cluster_with_starts({stream.name: {0: START, 1: START}})
    settings = config(kafka_cluster, history_url, **PROTOCOLS[protocol])
    handled: list[list[tuple[int, int]]] = [[], []]
    members = [Consumer(settings), Consumer(settings)]

    def step(i: int) -> None:
        msg = members[i].poll(0.1)
        if msg is not None and msg.error() is None:
            handled[i].append((msg.partition(), msg.offset()))
            # A commit refused in the middle of a rebalance (its generation gone) is Kafka's
            # way: the record is read again from the last commit that landed.
            with contextlib.suppress(confluent_kafka.KafkaException):
                members[i].commit(message=msg, asynchronous=False)

    try:
        members[0].subscribe([stream.name])
        eventually(lambda: step(0) or len(handled[0]) >= 4, 60)  # inside the archive
        members[1].subscribe([stream.name])
        everything = {(p, o) for p in (0, 1) for o in range(COUNT)}

        ticks = iter(range(1 << 30))

        def both() -> bool:
            # The first member reads slowly until the second holds a partition: the
            # rebalance comes while it reads the archive.
            if members[1].assignment() or next(ticks) % 5 == 0:
                step(0)
            step(1)
            return {r for h in handled for r in h} >= everything

        eventually(both, 120)
    finally:
        for member in members:
            member.close()
    seen = [r for h in handled for r in h]
    assert set(seen) == everything
    assert all(0 <= o < COUNT for _, o in seen)  # archived or in Kafka, nothing made up
    assert handled[0] and handled[1]  # the second member took a partition over
