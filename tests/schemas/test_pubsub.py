"""Protobuf and JSON Schema streams on a real broker: publish objects, poll values (both
framings), undecodable records to the dead letter stream, and the typed archive of each format
filled by the archiver on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bolide.facade import (
    InitialOffsetScheme,
    JsonSchemaSerde,
    ProtobufSerde,
    Publisher,
    PublisherConfig,
    Record,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.schemas.registry import ConfluentSchemaRegistry
from bolide.stores import Archiver, SqlSchemaRegistry, SqlStore
from bolide.stores.typed_archive import typed_table_name
from tests.conftest import DATABASES, make_db_url
from tests.schemas.conftest import ORDER_JSON, Order, json_order, make_order

pytestmark = pytest.mark.kafka

EARLIEST = InitialOffsetScheme.EARLIEST


def drain(sub: Subscriber, count: int) -> list[Record]:
    out: list[Record] = []
    while len(out) < count:
        batch = sub.poll(5_000)
        if not batch:
            break
        out.extend(batch)
    return out


@pytest.mark.parametrize("framing", ["prefix", "header"])
def test_protobuf_messages_round_trip_and_plain_consumers_read_them(
    cluster: Any, stream_factory: Any, framing: str
) -> None:
    stream = stream_factory(name_prefix="proto")
    registry = ConfluentSchemaRegistry(f"mock://{uuid.uuid4().hex}")
    serde = ProtobufSerde(Order, registry=registry, framing=framing)
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        for n in range(4):
            pub.publish(make_order(n))
    config = SubscriberConfig(stream=stream, serde=serde, initial_offset_scheme=EARLIEST)
    with Subscriber(cluster, config) as sub:
        records = drain(sub, 4)
    assert [r.value for r in records] == [make_order(n) for n in range(4)]
    has_header = ["__value_schema_id" in dict(r.headers) for r in records]
    assert has_header == [framing == "header"] * 4
    # A plain confluent-kafka consumer and deserializer read the same records.
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"plain-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            **cluster.settings,
        }
    )
    consumer.subscribe([stream.name])
    deserializer = ProtobufDeserializer(Order, None, registry.client)
    seen: list[Any] = []
    try:
        while len(seen) < 4:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            context = SerializationContext(stream.name, MessageField.VALUE, message.headers())
            seen.append(deserializer(message.value(), context))
    finally:
        consumer.close()
    assert seen == [make_order(n) for n in range(4)]


def test_an_invalid_json_value_is_never_published(cluster: Any, stream_factory: Any) -> None:
    stream = stream_factory(name_prefix="json")
    serde = JsonSchemaSerde(
        ORDER_JSON, registry=ConfluentSchemaRegistry(f"mock://{uuid.uuid4().hex}")
    )
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        pub.publish(json_order(1))
        with pytest.raises(Exception, match="field /qty"):
            pub.publish({"id": "x", "qty": "many"})
        pub.publish(json_order(2))
    config = SubscriberConfig(stream=stream, serde=serde, initial_offset_scheme=EARLIEST)
    with Subscriber(cluster, config) as sub:
        records = drain(sub, 2)
    assert [r.value for r in records] == [json_order(1), json_order(2)]
    assert [r.offset for r in records] == [0, 1]


@pytest.mark.parametrize("kind", DATABASES)
def test_the_archiver_fills_typed_tables_of_protobuf_and_json_streams(
    cluster: Any, stream_factory: Any, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    proto_stream = stream_factory(name_prefix="typedproto")
    json_stream = stream_factory(name_prefix="typedjson")
    with SqlStore(make_db_url(kind, tmp_path, request)) as store:
        store.upgrade()
        registry = SqlSchemaRegistry(store)
        proto = ProtobufSerde(Order, registry=registry, framing="header")
        as_json = JsonSchemaSerde(ORDER_JSON, registry=registry)
        with Publisher(cluster, PublisherConfig(stream=proto_stream, serde=proto)) as pub:
            for n in range(3):
                pub.publish(make_order(n))
            pub.publish(Record(b"not protobuf"))
        with Publisher(cluster, PublisherConfig(stream=json_stream, serde=as_json)) as pub:
            for n in range(3):
                pub.publish(json_order(n))
        archiver = Archiver(
            cluster,
            store,
            [proto_stream, json_stream],
            group=f"g-{uuid.uuid4().hex[:8]}",
            consumer_config={"session.timeout.ms": 4000, "heartbeat.interval.ms": 500},
            serdes={proto_stream.name: ProtobufSerde(registry=registry), json_stream.name: as_json},
        )
        assert archiver.run(until_caught_up=True).records == 7
        with store.engine.connect() as conn:
            proto_rows = conn.execute(
                sa.text(
                    "SELECT kafka_offset, id, qty, price__cents, price__currency, status, big, "
                    f"tags, at FROM {typed_table_name(proto_stream.name)} ORDER BY 1"
                )
            ).all()
            json_rows = conn.execute(
                sa.text(
                    "SELECT kafka_offset, id, qty, amount, address__city, paid, tags "
                    f"FROM {typed_table_name(json_stream.name)} ORDER BY 1"
                )
            ).all()
    assert [tuple(r[:7]) for r in proto_rows] == [
        (n, f"o{n}", n, 100 * n, "EUR", ["NEW", "PAID", "SHIPPED"][n], -(n**3)) for n in range(3)
    ]
    assert [json.loads(r[7]) for r in proto_rows] == [[], ["gift"], []]
    assert all(str(r[8]).startswith("2023-11-14 22:13:2") for r in proto_rows)  # a timestamp
    assert [tuple(r[:6]) for r in json_rows] == [
        (n, f"o{n}", n, 2.5 * n, "Lyon" if n % 2 else "Paris", n % 2 == 0) for n in range(3)
    ]


def test_tail_decodes_every_format_with_the_registry(
    cluster: Any, stream_factory: Any, tmp_path: Path
) -> None:
    from tests.ops.conftest import bolide

    stream = stream_factory(name_prefix="tailproto")
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    with SqlStore(db) as store:
        store.upgrade()
        registry = SqlSchemaRegistry(store)
        with Publisher(
            cluster,
            PublisherConfig(
                stream=stream, serde=ProtobufSerde(Order, registry=registry, framing="header")
            ),
        ) as pub:
            pub.publish(make_order(1))
        with Publisher(
            cluster,
            PublisherConfig(
                stream=stream, serde=JsonSchemaSerde(ORDER_JSON, registry=registry, subject="json")
            ),
        ) as pub:
            pub.publish(json_order(2))
    args = ["tail", "--stream", stream.name, "--from-beginning", "-e", "--json"]
    run = bolide(*args, "--decode", "--db", db, cluster=cluster)
    assert run.returncode == 0, run.stderr
    values = [json.loads(line)["value"] for line in run.stdout.splitlines()]
    assert values[0]["price"] == {"cents": 100, "currency": "EUR"} and values[0]["status"] == "PAID"
    assert values[1] == json_order(2)
    undecoded = bolide(*args, cluster=cluster)
    assert "price" not in undecoded.stdout
    refused = bolide(*args, "--decode", cluster=cluster)
    assert refused.returncode == 2 and "--decode needs --db" in refused.stderr


def test_an_undecodable_record_goes_to_the_dead_letter_stream(
    cluster: Any, stream_factory: Any
) -> None:
    stream, dead = stream_factory(name_prefix="protodlq"), stream_factory(name_prefix="dead")
    serde = ProtobufSerde(Order, registry=ConfluentSchemaRegistry(f"mock://{uuid.uuid4().hex}"))
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(serde.encode(make_order(1), stream=stream.name)))
        pub.publish(Record(b"\x00\x00\x00\x00\x09not protobuf"))
        pub.publish(Record(serde.encode(make_order(3), stream=stream.name)))
    config = SubscriberConfig(
        stream=stream, serde=serde, initial_offset_scheme=EARLIEST, dead_letter=dead
    )
    with Subscriber(cluster, config) as sub:
        values = [r.value for r in drain(sub, 2)]
    assert values == [make_order(1), make_order(3)]
    with Subscriber(cluster, SubscriberConfig(stream=dead, initial_offset_scheme=EARLIEST)) as sub:
        letters = drain(sub, 1)
    assert letters[0].data == b"\x00\x00\x00\x00\x09not protobuf"
    reason = dict(letters[0].headers)
    assert any(b"offset 1" in v for v in reason.values()), reason
