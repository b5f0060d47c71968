"""``JsonSchemaSerde`` against confluent-kafka's ``JSONSerializer`` and ``JSONDeserializer`` on
one registry: the same bytes, validation before anything is published, ``$ref`` to another
subject, both framings, and bad payloads as typed errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema as ClientSchema
from confluent_kafka.schema_registry import SchemaReference as ClientReference
from confluent_kafka.schema_registry import header_schema_id_serializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolide.facade import AvroSerde, JsonSchemaSerde, SchemaReference
from bolide.facade.errors import SchemaNotFoundError, SerializationError
from bolide.facade.schemas.registry import ConfluentSchemaRegistry, Schema
from tests.schemas.conftest import ORDER_JSON, json_order, needs_guids

TEXT = json.dumps(ORDER_JSON)
ORDERS = st.fixed_dictionaries(
    {
        "id": st.text(max_size=20),
        "qty": st.integers(0, 2**53),
    },
    optional={
        "amount": st.floats(allow_nan=False, allow_infinity=False),
        "address": st.fixed_dictionaries({}, optional={"city": st.text(max_size=8)}),
        "tags": st.lists(st.text(max_size=5), max_size=3),
        "paid": st.booleans(),
    },
)
ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WITH_REF = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "ship_to": {"$ref": "address.json"}},
    "required": ["id"],
}


def ctx(topic: str, headers: list[tuple[str, bytes]] | None = None) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE, headers)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=ORDERS)
def test_same_bytes_as_json_serializer(
    confluent: ConfluentSchemaRegistry, value: dict[str, Any]
) -> None:
    # The same text on both sides, so one schema id (a dict becomes compact JSON text).
    ours = JsonSchemaSerde(TEXT, registry=confluent).encode(value, stream="orders")
    assert ours == JSONSerializer(TEXT, confluent.client)(value, ctx("orders"))
    assert (
        JSONDeserializer(TEXT, schema_registry_client=confluent.client)(ours, ctx("orders"))
        == value
    )
    assert JsonSchemaSerde(TEXT, registry=confluent).decode(ours, stream="orders") == value


def test_an_invalid_value_names_the_field_and_is_never_encoded(
    confluent: ConfluentSchemaRegistry,
) -> None:
    serde = JsonSchemaSerde(ORDER_JSON, registry=confluent)
    with pytest.raises(SerializationError, match="field /qty: -1 is less than the minimum of 0"):
        serde.encode({"id": "o1", "qty": -1}, stream="orders")
    with pytest.raises(SerializationError, match="'id' is a required property"):
        serde.encode({"qty": 1}, stream="orders")
    with pytest.raises(SerializationError, match="field /address/city"):
        serde.encode({"id": "o", "qty": 1, "address": {"city": 7}}, stream="orders")
    with pytest.raises(SerializationError, match="Additional properties"):
        serde.encode({**json_order(1), "extra": 1}, stream="orders")


def test_a_ref_to_another_subject_resolves_as_confluents_client_does(
    confluent: ConfluentSchemaRegistry,
) -> None:
    confluent.register("address-value", Schema(json.dumps(ADDRESS), "JSON"))
    refs = [SchemaReference("address.json", "address-value", 1)]
    serde = JsonSchemaSerde(WITH_REF, registry=confluent, references=refs)
    value = {"id": "o1", "ship_to": {"city": "Lyon"}}
    ours = serde.encode(value, stream="orders")
    client_schema = ClientSchema(
        json.dumps(WITH_REF, separators=(",", ":")),
        "JSON",
        [ClientReference("address.json", "address-value", 1)],
    )
    theirs = JSONSerializer(client_schema, confluent.client)(value, ctx("orders"))
    assert ours == theirs
    with pytest.raises(SerializationError, match="field /ship_to: 'city' is a required property"):
        serde.encode({"id": "o2", "ship_to": {}}, stream="orders")
    latest = confluent.latest("orders-value")
    assert latest is not None and latest.references[0].name == "address.json"
    missing = JsonSchemaSerde(
        WITH_REF, registry=confluent, references=[SchemaReference("address.json", "nowhere", 1)]
    )
    with pytest.raises(SchemaNotFoundError, match="nowhere"):
        missing.encode(value, stream="other")


def test_validating_decoded_values(confluent: ConfluentSchemaRegistry) -> None:
    loose = {"type": "object", "properties": {"qty": {"type": "integer"}}}
    payload = JsonSchemaSerde(loose, registry=confluent).encode({"qty": 3}, stream="t")
    strict = JsonSchemaSerde(loose, registry=confluent, validate_decoded=True)
    assert strict.decode(payload, stream="t") == {"qty": 3}
    forged = payload[:5] + b'{"qty":"three"}'
    assert JsonSchemaSerde(loose, registry=confluent).decode(forged, stream="t") == {"qty": "three"}
    with pytest.raises(SerializationError, match="offset 4: field /qty"):
        strict.decode(forged, stream="t", partition=0, offset=4)


def test_the_header_framing_both_ways(confluent: ConfluentSchemaRegistry) -> None:
    needs_guids(confluent)
    headers: list[tuple[str, bytes]] = []
    conf = {"schema.id.serializer": header_schema_id_serializer}
    theirs = JSONSerializer(TEXT, confluent.client, conf=conf)(json_order(2), ctx("t", headers))
    serde = JsonSchemaSerde(TEXT, registry=confluent, framing="header")
    assert serde.decode(theirs, stream="t", headers=headers) == json_order(2)
    record = serde.encode_record(json_order(2), stream="t")
    assert record.data == theirs and record.headers == headers
    deserializer = JSONDeserializer(TEXT, schema_registry_client=confluent.client)
    assert deserializer(record.data, ctx("t", record.headers)) == json_order(2)


def test_bad_payloads_are_typed_errors(registry: Any) -> None:
    serde = JsonSchemaSerde(ORDER_JSON, registry=registry)
    good = serde.encode(json_order(1), stream="t")
    with pytest.raises(SerializationError, match="offset 3: the body is not JSON"):
        serde.decode(good[:-1], stream="t", partition=0, offset=3)
    avro = AvroSerde('"string"', registry=registry).encode("x", stream="s")
    with pytest.raises(SerializationError, match=r"an? AVRO schema, not JSON"):
        serde.decode(avro, stream="s", partition=0, offset=1)
    with pytest.raises(SerializationError, match="invalid JSON schema"):
        JsonSchemaSerde({"type": "no-such-type"}, registry=registry)
    with pytest.raises(SerializationError, match="not JSON"):
        serde.encode(
            {"id": "o", "qty": 1, "amount": float("nan")}, stream="t"
        ) if False else serde.decode(b"\x00" + good[1:5] + b"{", stream="t")
