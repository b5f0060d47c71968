"""Bad input on a live broker: oversized records, poisoned records, refused configurations."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import (
    AvroSerde,
    Cluster,
    InitialOffsetScheme,
    MemorySchemaRegistry,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    SerializationError,
    StoreError,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import Archiver, SqlStore
from bolide.stores.typed_archive import typed_table_name
from tests.conftest import DATABASES, eventually, make_db_url

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

EARLIEST = InitialOffsetScheme.EARLIEST
#: Nothing listens here: a client that tried to connect would wait, then fail.
NOWHERE = Cluster("127.0.0.1:9")


def test_oversized_record_fails_its_future_with_the_reason(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        big = Record(b"x" * 2_000_000)
        future = pub.publish_async(big)
        with pytest.raises(PublishError, match=r"(?i)message size too large") as caught:
            future.result(10)
        assert caught.value.record is big
        assert caught.value.retriable is False
        assert pub.publish(Record(b"small")) >= 0, "the publisher still works"


def test_a_poisoned_record_does_not_stop_a_receiver(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(20):
            pub.publish_async(Record(b"poison" if i == 7 else b"%d" % i))
        pub.flush(10)
    handled: list[bytes] = []
    reports: list[tuple[str, BaseException | None]] = []

    def handle(record: Record) -> None:
        if record.data == b"poison":
            raise RuntimeError("cannot handle this one")
        handled.append(record.data)

    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=EARLIEST,
        error_handler=lambda summary, error: reports.append((summary, error)),
    )  # fmt: skip
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handle, poll_timeout_ms=50)
        eventually(lambda: len(handled) == 19, 15)
        assert receiver.running
    assert handled == [b"%d" % i for i in range(20) if i != 7]
    [(summary, error)] = reports
    assert isinstance(error, RuntimeError) and "offset=7" in summary


def test_an_undecodable_record_costs_a_receiver_only_itself(cluster, stream_factory):
    stream = stream_factory()
    serde = AvroSerde({"type": "string"}, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        for i in range(20):
            pub.publish_async(Record(b"junk") if i == 7 else f"v{i}")
        pub.flush(10)
    values: list[str] = []
    reports: list[BaseException | None] = []
    config = SubscriberConfig(
        stream=stream, serde=serde, initial_offset_scheme=EARLIEST,
        error_handler=lambda summary, error: reports.append(error),
    )  # fmt: skip
    with Subscriber(cluster, config) as sub:
        sub.attach_receiver(lambda record: values.append(record.value), poll_timeout_ms=50)
        time.sleep(0.5)  # the whole stream is in one poll
        eventually(lambda: len(values) >= 12, 15)
        time.sleep(0.5)
    assert [type(e) for e in reports] == [SerializationError]
    assert values == [f"v{i}" for i in range(20) if i != 7]


def _refused(make: object) -> BaseException:
    """Run ``make()``; it must raise TypeError or ValueError.

    The clusters here have no broker: anything that connected before checking its arguments
    would fail with a ``BrokerError`` (or a timeout) instead, whatever the machine's speed.
    """
    with pytest.raises((TypeError, ValueError)) as caught:
        make()  # type: ignore[operator]
    return caught.value


def test_bad_configs_are_refused_before_anything_connects():
    stream = StreamConfig(name="s")
    bad = [
        lambda: Publisher(NOWHERE, "not a config"),  # type: ignore[arg-type]
        lambda: Subscriber(NOWHERE, {"stream": stream}),  # type: ignore[arg-type]
        lambda: Publisher("127.0.0.1:9", PublisherConfig(stream=stream)),  # type: ignore[arg-type]
        lambda: PublisherConfig(stream=stream, linger_ms=5),  # type: ignore[call-arg]
        lambda: SubscriberConfig(stream=stream, lease_timeout_ms="10s"),  # type: ignore[arg-type]
        lambda: SubscriberConfig(stream=stream, consumer_config={"fetch.min.bytes": [1]}),
        lambda: Cluster("127.0.0.1:9", **{"sasl.password": object()}),
        lambda: StreamConfig(name="bad name"),
    ]
    for make in bad:
        _refused(make)


def test_an_unknown_librdkafka_setting_is_refused_before_connecting(stream_factory):
    config = PublisherConfig(stream=stream_factory(), producer_config={"no.such.key": 1})
    error = _refused(lambda: Publisher(NOWHERE, config))
    assert "no.such.key" in str(error)


def test_receiver_threads_end_with_their_subscriber(cluster, stream_factory):
    before = threading.active_count()
    with Subscriber(cluster, SubscriberConfig(stream=stream_factory())) as sub:
        sub.attach_receiver(lambda record: None, poll_timeout_ms=20)
    eventually(lambda: threading.active_count() <= before, 5)


# -- records the database rejects: the archiver goes on ----------------------------------------

#: Short sessions: joining a group on the embedded broker takes about half of this.
FAST_GROUP = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}
#: 32 two-byte characters: 64 bytes, one more than a PostgreSQL identifier keeps.
LONG = "\u00e9" * 32


def _row_schema(*fields: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Row",
        "fields": [{"name": name, "type": kind} for name, kind in fields],
    }


def _publish(cluster: Cluster, stream: StreamConfig, serde: AvroSerde, values: list[Any]) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        for value in values:
            pub.publish_async(value)
        pub.flush(30)


def _typed_rows(store: SqlStore, stream: StreamConfig) -> list[dict[str, Any]]:
    table = typed_table_name(stream.name)
    if not sa.inspect(store.engine).has_table(table):
        return []
    with store.engine.connect() as conn:
        found = conn.execute(sa.text(f'SELECT * FROM "{table}" ORDER BY kafka_offset'))
        return [dict(row._mapping) for row in found]


def _archiver(
    cluster: Cluster, store: SqlStore, stream: StreamConfig, serde: AvroSerde, reports: list[Any]
) -> Archiver:
    return Archiver(
        cluster,
        store,
        [stream],
        group=f"g-{uuid.uuid4().hex[:8]}",
        consumer_config=FAST_GROUP,
        max_backoff_s=0.2,
        serdes={stream.name: serde},
        error_handler=lambda summary, error: reports.append((summary, error)),
    )


@pytest.mark.parametrize("kind", DATABASES)
def test_colliding_field_names_get_columns_of_their_own(
    cluster: Cluster, stream_factory: Any, kind: str, tmp_path: Path, request: Any
) -> None:
    """``Name`` and ``name`` are one column name on SQLite; two names longer than 63 bytes
    with one prefix are one on PostgreSQL. Each field still gets its own column."""
    stream = stream_factory(name_prefix="collide")
    registry = MemorySchemaRegistry()
    fields = [("Name", "string"), ("name", "string"), (LONG + "a", "long"), (LONG + "b", "long")]
    serde = AvroSerde(_row_schema(*fields), registry=registry)
    values = [{"Name": f"A{i}", "name": f"a{i}", LONG + "a": i, LONG + "b": -i} for i in range(5)]
    _publish(cluster, stream, serde, values)
    reports: list[Any] = []
    with SqlStore(make_db_url(kind, tmp_path, request)) as store:
        store.upgrade()
        archiver = _archiver(cluster, store, stream, serde, reports)
        archiver.start()
        try:
            eventually(lambda: len(_typed_rows(store, stream)) == 5, 30)
        finally:
            stats = archiver.stop()
        assert len(store.read(stream.name, 0, 0, 100)) == 5
        rows = _typed_rows(store, stream)
    keys = {"kafka_partition", "kafka_offset", "timestamp_ms", "schema_id"}
    for i, row in enumerate(rows):
        data = {k: v for k, v in row.items() if k not in keys}
        assert len(data) == 4, data  # one column per field
        assert sorted(data.values(), key=str) == sorted([f"A{i}", f"a{i}", i, -i], key=str)
    assert "Name" in rows[0] and rows[0]["Name"] == "A0"  # the first name keeps its own
    assert stats.retries == 0 and stats.typed_rejected == 0 and reports == []


@pytest.mark.postgres
def test_a_typed_row_the_database_rejects_is_skipped_and_reported(
    cluster: Cluster, stream_factory: Any, tmp_path: Path, request: Any
) -> None:
    """U+0000 is a valid Avro string, but PostgreSQL text refuses it: that row alone is lost
    to the typed table, and the raw archive keeps every record."""
    stream = stream_factory(name_prefix="nul")
    serde = AvroSerde(
        _row_schema(("id", "long"), ("text", "string")), registry=MemorySchemaRegistry()
    )
    values = [{"id": i, "text": "a\x00b" if i == 3 else f"t{i}"} for i in range(10)]
    _publish(cluster, stream, serde, values)
    reports: list[Any] = []
    with SqlStore(make_db_url("postgresql", tmp_path, request)) as store:
        store.upgrade()
        stats = _archiver(cluster, store, stream, serde, reports).run(until_caught_up=True)
        raw = store.read(stream.name, 0, 0, 100)
        rows = _typed_rows(store, stream)
    assert [r.offset for r in raw] == list(range(10))
    assert [(r["kafka_offset"], r["text"]) for r in rows] == [
        (i, f"t{i}") for i in range(10) if i != 3
    ]
    assert (stats.records, stats.typed_rejected, stats.retries) == (10, 1, 0)
    [(summary, error)] = reports
    assert isinstance(error, StoreError) and not error.retriable
    assert (error.stream, error.partition, error.offset) == (stream.name, 0, 3)
    assert "offset 3" in summary and "NUL" in summary


@pytest.mark.parametrize("kind", DATABASES)
def test_a_typed_table_the_database_cannot_widen_costs_only_the_typed_rows(
    cluster: Cluster, stream_factory: Any, kind: str, tmp_path: Path, request: Any
) -> None:
    """Adding columns past the database's limit fails every time: the archiver reports it
    and goes on with the raw archive instead of retrying the batch forever."""
    stream = stream_factory(name_prefix="wide")
    serde = AvroSerde(_row_schema(("x", "long"), ("y", "long")), registry=MemorySchemaRegistry())
    _publish(cluster, stream, serde, [{"x": i, "y": i} for i in range(5)])
    limit = (
        1600
        if kind == "postgresql"
        else sqlite3.connect(":memory:").getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
    )
    reports: list[Any] = []
    with SqlStore(make_db_url(kind, tmp_path, request)) as store:
        store.upgrade()
        filler = ", ".join(f"f{i} BIGINT" for i in range(limit - 5))  # one column short
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                f'CREATE TABLE "{typed_table_name(stream.name)}" (kafka_partition INTEGER, '
                "kafka_offset BIGINT, timestamp_ms BIGINT, schema_id INTEGER, "
                f"{filler}, PRIMARY KEY (kafka_partition, kafka_offset))"
            )
        archiver = _archiver(cluster, store, stream, serde, reports)
        archiver.start()
        try:
            eventually(lambda: archiver.stats.typed_rejected == 5, 30)
            _publish(cluster, stream, serde, [{"x": 5, "y": 5}])  # the archiver goes on
            eventually(lambda: store.largest_offset(stream.name, 0) == 5, 30)
        finally:
            stats = archiver.stop()
        assert not _typed_rows(store, stream)
    assert stats.retries == 0 and stats.typed_rejected == 6
    assert reports and all(isinstance(e, StoreError) and not e.retriable for _, e in reports)
    assert "columns" in reports[0][0]
