"""Publisher and Subscriber with an Avro serde, on a real broker."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from bolide.facade import (
    AvroSerde,
    InitialOffsetScheme,
    MemorySchemaRegistry,
    Publisher,
    PublisherConfig,
    Record,
    SerializationError,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import Archiver, SqlSchemaRegistry, SqlStore
from bolide.stores.typed_archive import typed_table_name
from tests.avro.conftest import ORDER_V1, ORDER_V2, order
from tests.conftest import eventually
from tests.history.conftest import make_db_url

pytestmark = pytest.mark.kafka

EARLIEST = InitialOffsetScheme.EARLIEST


def drain(sub: Subscriber, count: int, timeout_ms: int = 5_000) -> list[Record]:
    """Poll until ``count`` records arrived (or a poll comes back empty)."""
    out: list[Record] = []
    while len(out) < count:
        batch = sub.poll(timeout_ms)
        if not batch:
            break
        out.extend(batch)
    return out


def test_publish_objects_poll_values(cluster, stream_factory) -> None:
    stream = stream_factory()
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        futures = [pub.publish_async(order(n)) for n in range(5)]
        assert [f.result(10) for f in futures] == list(range(5))
    config = SubscriberConfig(stream=stream, serde=serde, initial_offset_scheme=EARLIEST)
    with Subscriber(cluster, config) as sub:
        records = drain(sub, 5)
    assert [r.value for r in records] == [order(n) for n in range(5)]
    assert records[2].data == serde.encode(order(2), stream=stream.name)  # raw bytes kept


def test_evolved_writers_read_in_one_shape(cluster, stream_factory) -> None:
    stream = stream_factory()
    registry = MemorySchemaRegistry()
    with Publisher(
        cluster, PublisherConfig(stream=stream, serde=AvroSerde(ORDER_V1, registry=registry))
    ) as pub:
        pub.publish(order(1))
    with Publisher(
        cluster, PublisherConfig(stream=stream, serde=AvroSerde(ORDER_V2, registry=registry))
    ) as pub:
        pub.publish(order(2, country="DE"))
    reader = AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2)
    config = SubscriberConfig(stream=stream, serde=reader, initial_offset_scheme=EARLIEST)
    with Subscriber(cluster, config) as sub:
        values = [r.value for r in drain(sub, 2)]
    assert values == [order(1, country="FR"), order(2, country="DE")]


def poll_all(sub: Subscriber, errors: list[SerializationError]) -> list[Record]:
    """Poll until an empty batch follows some records, collecting decode errors on the way."""
    seen: list[Record] = []
    for _ in range(10):
        try:
            batch = sub.poll(2_000)
        except SerializationError as exc:
            errors.append(exc)
            continue
        if not batch and seen:
            break
        seen.extend(batch)
    return seen


def test_bad_payload_raises_naming_its_position_then_reading_goes_on(
    cluster, stream_factory
) -> None:
    stream = stream_factory()
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        pub.publish(Record(b"not avro"))  # a Record goes out as is
        pub.publish(order(1))
    config = SubscriberConfig(stream=stream, serde=serde, initial_offset_scheme=EARLIEST)
    errors: list[SerializationError] = []
    with Subscriber(cluster, config) as sub:
        seen = poll_all(sub, errors)
    [err] = errors
    assert (err.stream, err.partition, err.offset) == (stream.name, 0, 0)
    assert "magic byte" in str(err)
    assert [(r.offset, r.value) for r in seen] == [(1, order(1))]


def test_records_before_a_bad_payload_are_not_lost(cluster, stream_factory) -> None:
    stream = stream_factory()
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        pub.publish(order(0))
        pub.publish(Record(b"not avro"))
        pub.publish(order(2))
    config = SubscriberConfig(stream=stream, serde=serde, initial_offset_scheme=EARLIEST)
    errors: list[SerializationError] = []
    with Subscriber(cluster, config) as sub:
        seen = poll_all(sub, errors)
    assert [e.offset for e in errors] == [1]
    assert [(r.offset, r.value) for r in seen] == [(0, order(0)), (2, order(2))]


def test_bad_payload_goes_to_the_dead_letter_stream(cluster, stream_factory) -> None:
    stream, dead = stream_factory(), stream_factory()
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        pub.publish(order(0))
        pub.publish(Record(b"\x00\x00\x00\x00\x63junk", headers={"trace": "t1"}))
        pub.publish(order(2))
    config = SubscriberConfig(
        stream=stream, serde=serde, dead_letter=dead, initial_offset_scheme=EARLIEST
    )
    with Subscriber(cluster, config) as sub:
        records = drain(sub, 3)
    decoded = [(r.offset, r.value) for r in records if r.value is not None]
    assert decoded == [(0, order(0)), (2, order(2))]
    with Subscriber(cluster, SubscriberConfig(stream=dead, initial_offset_scheme=EARLIEST)) as sub:
        [letter] = drain(sub, 1)
    assert letter.data == b"\x00\x00\x00\x00\x63junk"
    assert letter.header("trace") == b"t1"
    assert letter.header("bolide.source") == f"{stream.name}/0/1".encode()
    assert letter.header("bolide.reason") == b"undecodable"
    assert b"schema id 99 is not registered" in (letter.header("bolide.reason.detail") or b"")


def test_bad_payloads_never_stop_a_receiver(cluster, stream_factory) -> None:
    stream = stream_factory()
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    reported: list[BaseException | None] = []
    values: list[object] = []
    config = SubscriberConfig(
        stream=stream,
        serde=serde,
        initial_offset_scheme=EARLIEST,
        error_handler=lambda summary, error: reported.append(error),
    )
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        pub.publish(Record(b""))
        pub.publish(Record(b"\x00\x00"))
        pub.publish(order(2))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(lambda record: values.append(record.value), 200)
        eventually(lambda: values, timeout_s=15)
        assert receiver.running
    assert values == [order(2)]
    assert [type(e) for e in reported] == [SerializationError, SerializationError]
    assert [e.offset for e in reported if isinstance(e, SerializationError)] == [0, 1]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_archiver_fills_the_typed_table_across_an_evolution(
    cluster, stream_factory, kind, tmp_path, request
) -> None:
    stream = stream_factory(name_prefix="typed")
    with SqlStore(make_db_url(kind, tmp_path, request)) as store:
        store.upgrade()
        registry = SqlSchemaRegistry(store)
        v1, v2 = AvroSerde(ORDER_V1, registry=registry), AvroSerde(ORDER_V2, registry=registry)
        with Publisher(cluster, PublisherConfig(stream=stream, serde=v1)) as pub:
            for n in range(3):
                pub.publish(order(n))
            pub.publish(Record(b"not avro"))
        with Publisher(cluster, PublisherConfig(stream=stream, serde=v2)) as pub:
            for n in range(4, 6):
                pub.publish(order(n, country="DE"))
        group = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}
        archiver = Archiver(
            cluster,
            store,
            [stream],
            group=f"g-{uuid.uuid4().hex[:8]}",
            consumer_config=group,
            serdes={stream.name: AvroSerde(ORDER_V1, registry=registry)},
        )
        stats = archiver.run(until_caught_up=True)
        assert stats.records == 6
        assert len(store.read(stream.name, 0, 0, 100)) == 6  # the raw archive has all six
        table = typed_table_name(stream.name)
        with store.engine.connect() as conn:
            got = conn.execute(
                sa.text(f"SELECT kafka_offset, id, country, address__city FROM {table} ORDER BY 1")
            ).all()
        assert [tuple(r) for r in got] == [
            (0, 0, None, "Paris"),
            (1, 1, None, "Lyon"),
            (2, 2, None, "Paris"),
            (4, 4, "DE", "Paris"),
            (5, 5, "DE", "Lyon"),
        ]
