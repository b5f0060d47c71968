"""``ProtobufSerde`` against confluent-kafka's ``ProtobufSerializer`` and ``ProtobufDeserializer``
on one registry: the same bytes (message indexes and references included), each side decoding
the other, both framings of the schema id, and every bad payload a typed error."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry import (
    header_schema_id_serializer,
    record_subject_name_strategy,
)
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolide.facade import JsonSchemaSerde, ProtobufSerde
from bolide.facade.errors import SchemaNotFoundError, SerializationError
from bolide.facade.schemas.registry import ConfluentSchemaRegistry, MemorySchemaRegistry
from tests.schemas.conftest import (
    CLASSES,
    ORDER_JSON,
    Line,
    Order,
    json_order,
    make_order,
    needs_guids,
)

INT64 = st.integers(-(2**63), 2**63 - 1)


def ctx(topic: str, headers: list[tuple[str, bytes]] | None = None) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE, headers)


def serializer(registry: ConfluentSchemaRegistry, cls: Any = Order, **conf: Any) -> Any:
    return ProtobufSerializer(cls, registry.client, conf or None)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(0, 10_000),
    big=INT64,
    text=st.text(max_size=30),
    tags=st.lists(st.text(max_size=5), max_size=4),
    ok=st.booleans(),
)
def test_same_bytes_as_protobuf_serializer(
    confluent: ConfluentSchemaRegistry, n: int, big: int, text: str, tags: list[str], ok: bool
) -> None:
    message = make_order(n, big=big, id=text, ok=ok)
    message.tags[:] = tags
    ours = ProtobufSerde(Order, registry=confluent).encode(message, stream="orders")
    assert ours == serializer(confluent)(message, ctx("orders"))
    assert ProtobufDeserializer(Order, None, confluent.client)(ours, ctx("orders")) == message


def test_each_side_decodes_the_other_and_imports_are_references(
    confluent: ConfluentSchemaRegistry,
) -> None:
    theirs = serializer(confluent)(make_order(3), ctx("t"))
    serde = ProtobufSerde(Order, registry=confluent)
    assert serde.decode(theirs, stream="t", partition=0, offset=9) == make_order(3)
    latest = confluent.latest("t-value")
    assert latest is not None and latest.schema_type == "PROTOBUF"
    assert [r.name for r in latest.references] == ["shop/common.proto"]  # not timestamp.proto
    assert confluent.latest("shop/common.proto") is not None


def test_a_nested_message_carries_its_indexes(confluent: ConfluentSchemaRegistry) -> None:
    line = Line(sku="s1", count=4)
    theirs = serializer(confluent, Line, **{"subject.name.strategy": record_subject_name_strategy})(
        line, ctx("t")
    )
    serde = ProtobufSerde(Line, registry=confluent, subject_name_strategy="RecordNameStrategy")
    ours = serde.encode(line, stream="t")
    assert ours == theirs and ours[5:8] == b"\x04\x00\x00"  # [0, 0]: Order's first nested
    assert serde.subject_for("t") == "shop.Order.Line"
    assert serde.decode(theirs, stream="t") == line


def test_decode_only_builds_classes_from_the_registry(confluent: ConfluentSchemaRegistry) -> None:
    payload = serializer(confluent)(make_order(2), ctx("t"))
    generic = ProtobufSerde(registry=confluent)
    decoded = generic.decode(payload, stream="t")
    assert decoded.DESCRIPTOR.full_name == "shop.Order" and decoded.qty == 2
    plain = generic.plain(decoded)
    assert plain["price"] == {"cents": 200, "currency": "EUR"}
    assert plain["status"] == "SHIPPED" and plain["at"].year == 2023 and plain["big"] == -8
    as_dict = ProtobufSerde(Order, registry=confluent, value_as="dict")
    assert as_dict.decode(payload, stream="t")["price"] == {"cents": "200", "currency": "EUR"}
    with pytest.raises(SerializationError, match="decodes only"):
        generic.encode(make_order(1), stream="t")


def test_a_dict_in_the_json_mapping_encodes_like_the_message(
    confluent: ConfluentSchemaRegistry,
) -> None:
    serde = ProtobufSerde(Order, registry=confluent)
    as_dict = {"id": "o1", "qty": 1, "price": {"cents": "100", "currency": "EUR"}}
    expected = Order(id="o1", qty=1)
    expected.price.cents, expected.price.currency = 100, "EUR"
    assert serde.encode(as_dict, stream="t") == serde.encode(expected, stream="t")
    with pytest.raises(SerializationError, match=r"shop\.Order"):
        serde.encode({"qty": "many"}, stream="t")


def test_the_header_framing_both_ways(confluent: ConfluentSchemaRegistry) -> None:
    needs_guids(confluent)
    headers: list[tuple[str, bytes]] = []
    theirs = serializer(confluent, **{"schema.id.serializer": header_schema_id_serializer})(
        make_order(5), ctx("t", headers)
    )
    assert theirs == make_order(5).SerializeToString()  # the bare body
    serde = ProtobufSerde(Order, registry=confluent, framing="header")
    assert serde.decode(theirs, stream="t", headers=headers) == make_order(5)
    record = serde.encode_record(make_order(5), stream="t")
    assert record.data == theirs and record.headers == headers
    deserializer = ProtobufDeserializer(Order, None, confluent.client)
    assert deserializer(record.data, ctx("t", record.headers)) == make_order(5)
    # confluent-kafka registered it: its GUID is looked up under the stream's subject.
    assert serde.payload_schema_id(theirs, headers, "t") == (
        confluent.latest("t-value").schema_id  # type: ignore[union-attr]
    )
    # The classic framing still decodes with the same serde; the header wins when both exist.
    assert serde.decode(serde.encode(make_order(6), stream="t"), stream="t") == make_order(6)


def test_bad_payloads_are_typed_errors_naming_the_record(
    confluent: ConfluentSchemaRegistry,
) -> None:
    serde = ProtobufSerde(Order, registry=confluent)
    good = serde.encode(make_order(1), stream="t")
    place = "stream 't' at partition 2, offset 7"
    with pytest.raises(SerializationError, match=f"{place}.*magic byte"):
        serde.decode(b"\x07" + good[1:], stream="t", partition=2, offset=7)
    with pytest.raises(SchemaNotFoundError, match=place):
        serde.decode(b"\x00\x00\x00\x99\x99" + good[5:], stream="t", partition=2, offset=7)
    with pytest.raises(SerializationError, match=f"{place}.*a JSON schema, not PROTOBUF"):
        json_payload = JsonSchemaSerde(ORDER_JSON, registry=confluent).encode(
            json_order(1), stream="j"
        )
        serde.decode(json_payload, stream="t", partition=2, offset=7)
    lines = ProtobufSerde(Line, registry=confluent, subject="lines")
    with pytest.raises(
        SerializationError, match=r"wrote shop\.Order; this serde reads shop\.Order\.Line"
    ):
        lines.decode(good, stream="t", partition=2, offset=7)
    with pytest.raises(SerializationError, match=place):
        serde.decode(good[:7] + b"\xff\xff", stream="t", partition=2, offset=7)
    with pytest.raises(SerializationError, match=r"writes shop\.Order"):
        serde.encode(Line(sku="x"), stream="t")
    assert set(CLASSES) == {"shop.Order", "shop.Order.Line", "shop.Money"}


def test_every_registry_keeps_the_references_and_the_guids(registry: Any) -> None:
    serde = ProtobufSerde(Order, registry=registry, framing="header")
    payload = serde.encode(make_order(4), stream="orders")
    generic = ProtobufSerde(registry=registry)
    decoded = generic.decode(payload, stream="orders")
    assert decoded.SerializeToString() == make_order(4).SerializeToString()
    latest = registry.latest("orders-value")
    assert latest.references[0].subject == "shop/common.proto"
    imported = registry.version("shop/common.proto", latest.references[0].version)
    assert imported.schema_type == "PROTOBUF"
    record = serde.encode_record(make_order(4), stream="orders")
    assert record.data == make_order(4).SerializeToString()
    again = generic.decode(record.data, stream="orders", headers=record.headers)
    assert again.SerializeToString() == record.data
    assert generic.payload_schema_id(record.data, record.headers) == latest.schema_id


def test_the_subject_name_strategies() -> None:
    registry = MemorySchemaRegistry()
    assert ProtobufSerde(Order, registry=registry).subject_for("s") == "s-value"
    record = ProtobufSerde(Order, registry=registry, subject_name_strategy="RecordNameStrategy")
    assert record.subject_for("s") == "shop.Order"
    both = ProtobufSerde(Line, registry=registry, subject_name_strategy="TopicRecordNameStrategy")
    assert both.subject_for("s") == "s-shop.Order.Line"
    assert (
        JsonSchemaSerde(ORDER_JSON, subject_name_strategy="TopicRecordNameStrategy").subject_for(
            "s"
        )
        == "s-Order"
    )
    with pytest.raises(SerializationError, match="needs a record name"):
        JsonSchemaSerde({"type": "object"}, subject_name_strategy="RecordNameStrategy").subject_for(
            "s"
        )
    with pytest.raises(ValueError, match="subject_name_strategy"):
        ProtobufSerde(Order, subject_name_strategy="topic")
    both.encode(Line(sku="x"), stream="s")
    assert registry.latest("s-shop.Order.Line") is not None


def test_imports_of_google_and_confluent_types_resolve_on_decode() -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.type import date_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(date_pb2.DESCRIPTOR.serialized_pb)
    file = descriptor_pb2.FileDescriptorProto(
        name="shop/shipping.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/type/date.proto"],
    )
    shipping = file.message_type.add(name="Shipping")
    shipping.field.add(name="on", number=1, type=11, type_name=".google.type.Date", label=1)
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Shipping"))
    registry = MemorySchemaRegistry()
    message = cls()
    message.on.year, message.on.month, message.on.day = 2026, 11, 29
    payload = ProtobufSerde(cls, registry=registry).encode(message, stream="s")
    assert ProtobufSerde(cls, registry=registry).decode(payload, stream="s") == message
    generic = ProtobufSerde(registry=registry).decode(payload, stream="s")
    assert generic.on.year == 2026
    assert registry.latest("google/type/date.proto") is None  # known to every reader


def test_a_negative_message_index_is_refused(confluent: ConfluentSchemaRegistry) -> None:
    payload = ProtobufSerde(Order, registry=confluent).encode(make_order(1), stream="t")
    forged = payload[:5] + b"\x02\x01" + payload[6:]  # one index, zigzag -1
    with pytest.raises(SerializationError, match="invalid message index -1"):
        ProtobufSerde(Order, registry=confluent).decode(forged, stream="t")
