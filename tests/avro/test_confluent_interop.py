"""Byte-for-byte interop with confluent-kafka's ``AvroSerializer`` and ``AvroDeserializer``.

Both sides share one registry: confluent-kafka's own ``MockSchemaRegistryClient`` (the client
``SchemaRegistryClient.new_client`` returns for a ``mock://`` URL), and a real server speaking
Confluent's API (Apicurio Registry, ``tests/schemas/apicurio.py``). Both serializers and all
bytes are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from bolide.facade.errors import SchemaIncompatibleError
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import ConfluentSchemaRegistry
from tests.avro.conftest import ORDER_V1, ORDER_V2, order

ORDER_V1_TEXT = json.dumps(ORDER_V1)
ORDER_V2_TEXT = json.dumps(ORDER_V2)

MIXED = {
    "type": "record",
    "name": "Mixed",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}


@pytest.fixture
def registry(confluent_url: str) -> Iterator[ConfluentSchemaRegistry]:
    registry = ConfluentSchemaRegistry(confluent_url)
    yield registry
    registry.close()


def ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_same_bytes_as_avro_serializer(registry: ConfluentSchemaRegistry) -> None:
    ours = AvroSerde(ORDER_V1_TEXT, registry=registry)
    theirs = AvroSerializer(registry.client, ORDER_V1_TEXT)
    for n in range(20):
        assert ours.encode(order(n), stream="orders") == theirs(order(n), ctx("orders"))
    assert registry.latest("orders-value").version == 1  # type: ignore[union-attr]


def test_each_side_decodes_the_other(registry: ConfluentSchemaRegistry) -> None:
    ours = AvroSerde(ORDER_V1_TEXT, registry=registry)
    serializer = AvroSerializer(registry.client, ORDER_V1_TEXT)
    deserializer = AvroDeserializer(registry.client)
    assert deserializer(ours.encode(order(3), stream="t"), ctx("t")) == order(3)
    theirs = serializer(order(4), ctx("t"))
    assert ours.decode(theirs, stream="t", partition=0, offset=0) == order(4)


def test_evolution_across_both_sides(registry: ConfluentSchemaRegistry) -> None:
    """A v1 Confluent producer and a v2 bolide producer; readers on both sides resolve to v2."""
    v1_bytes = AvroSerializer(registry.client, ORDER_V1_TEXT)(order(1), ctx("t"))
    v2_bytes = AvroSerde(ORDER_V2_TEXT, registry=registry).encode(
        order(2, country="DE"), stream="t"
    )
    ours = AvroSerde(ORDER_V2_TEXT, registry=registry, reader_schema=ORDER_V2_TEXT)
    assert ours.decode(v1_bytes, stream="t") == order(1, country="FR")
    theirs = AvroDeserializer(registry.client, ORDER_V2_TEXT)
    assert theirs(v2_bytes, ctx("t")) == order(2, country="DE")
    assert theirs(v1_bytes, ctx("t")) == order(1, country="FR")


def test_incompatible_schema_refused_before_the_registry_registers(
    registry: ConfluentSchemaRegistry,
) -> None:
    registry.set_compatibility("t-value", "BACKWARD")  # a server's default may be another
    registry.register("t-value", ORDER_V1_TEXT)
    broken = json.dumps({**ORDER_V1, "fields": [{"name": "id", "type": "string"}]})
    # The mock's refusal is bolide's check (it checks nothing); a server's is its own.
    reason = "/id: long cannot be read as string" if registry.url.startswith("mock") else None
    with pytest.raises(SchemaIncompatibleError, match=reason):
        registry.register("t-value", broken)
    assert registry.latest("t-value").version == 1  # type: ignore[union-attr]


mixed_values = st.fixed_dictionaries(
    {
        "b": st.booleans(),
        "i": st.integers(-(2**31), 2**31 - 1),
        "l": st.integers(-(2**63), 2**63 - 1),
        "f": st.floats(width=32, allow_nan=False),
        "d": st.floats(allow_nan=False),
        "s": st.text(max_size=20),
        "raw": st.binary(max_size=20),
        "opt": st.none() | st.text(max_size=5),
        "e": st.sampled_from(["X", "Y"]),
        "m": st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1), max_size=3),
        "fx": st.binary(min_size=3, max_size=3),
        "day": st.dates(),
    }
)


@settings(max_examples=100, deadline=None)
@given(mixed_values)
def test_every_avro_type_encodes_identically(value: dict[str, Any]) -> None:
    registry = ConfluentSchemaRegistry("mock://mixed")
    text = json.dumps(MIXED)
    ours = AvroSerde(text, registry=registry).encode(value, stream="m")
    assert ours == AvroSerializer(registry.client, text)(value, ctx("m"))
    decoded = AvroSerde(text, registry=registry).decode(ours, stream="m")
    assert AvroDeserializer(registry.client)(ours, ctx("m")) == decoded
