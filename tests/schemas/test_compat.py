"""Compatibility of Protobuf and JSON Schema subjects, as Confluent Schema Registry defines it,
enforced by every registry before a schema is registered."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bolide.facade.errors import SchemaIncompatibleError, SerializationError
from bolide.facade.schemas.json_compat import json_incompatibilities
from bolide.facade.schemas.protobuf_compat import protobuf_incompatibilities
from bolide.facade.schemas.registry import Compatibility, Schema
from tests.schemas.conftest import F, proto_files


def proto_text(edit: Any = None) -> str:
    """``shop/orders.proto`` in the registry's form, after ``edit(order_message, file)``."""
    file = proto_files(1)[1]
    if edit is not None:
        edit(file.message_type[0], file)
    return base64.b64encode(file.SerializeToString()).decode()


def field(message: Any, number: int) -> Any:
    return next(f for f in message.field if f.number == number)


def remove(message: Any, number: int) -> None:
    message.field.remove(field(message, number))


BASE = proto_text()
COMPATIBLE_PROTO = {
    "field added": lambda m, f: m.field.add(name="note", number=9, type=F.TYPE_STRING, label=1),
    "field removed": lambda m, f: remove(m, 8),
    "field renamed": lambda m, f: setattr(field(m, 1), "name", "order_id"),
    "int32 to int64": lambda m, f: setattr(field(m, 2), "type", F.TYPE_INT64),
    "string to bytes": lambda m, f: setattr(field(m, 1), "type", F.TYPE_BYTES),
}
INCOMPATIBLE_PROTO = {
    "int32 cannot be read as string": lambda m, f: setattr(field(m, 2), "type", F.TYPE_STRING),
    "sint64 cannot be read as int64": lambda m, f: setattr(field(m, 7), "type", F.TYPE_INT64),
    "scalar int32 became message": lambda m, f: (
        setattr(field(m, 2), "type", F.TYPE_MESSAGE),
        setattr(field(m, 2), "type_name", ".shop.Money"),
    ),
    "message type shop.Money became": lambda m, f: setattr(
        field(m, 3), "type_name", ".shop.Order.Line"
    ),
    "changed between repeated and singular": lambda m, f: setattr(
        field(m, 2), "label", F.LABEL_REPEATED
    ),
    "message shop.Order.Line removed": lambda m, f: m.ClearField("nested_type"),
    "package 'shop' became 'store'": lambda m, f: setattr(f, "package", "store"),
    "a required field added": lambda m, f: m.field.add(
        name="must", number=10, type=F.TYPE_STRING, label=F.LABEL_REQUIRED
    ),
}


@pytest.mark.parametrize("change", list(COMPATIBLE_PROTO))
def test_protobuf_changes_readable_both_ways(change: str) -> None:
    new = proto_text(COMPATIBLE_PROTO[change])
    assert protobuf_incompatibilities(new, BASE) == []
    assert protobuf_incompatibilities(BASE, new) == []


@pytest.mark.parametrize("reason", list(INCOMPATIBLE_PROTO))
def test_protobuf_changes_that_break_a_reader(reason: str) -> None:
    new = proto_text(INCOMPATIBLE_PROTO[reason])
    found = protobuf_incompatibilities(new, BASE) + protobuf_incompatibilities(BASE, new)
    assert any(reason in r for r in found), found


def test_a_message_added_reads_old_data_not_the_reverse() -> None:
    new = proto_text(lambda m, f: f.message_type.add(name="Refund"))
    assert protobuf_incompatibilities(new, BASE) == []  # BACKWARD holds
    assert protobuf_incompatibilities(BASE, new) == ["message shop.Refund removed"]  # as Confluent


def test_fields_moved_into_one_oneof_break_it() -> None:
    def move(message: Any, file: Any) -> None:
        message.oneof_decl.add(name="either")
        for number in (1, 2):
            field(message, number).oneof_index = 0

    assert "fields id, qty moved into oneof either" in " ".join(
        protobuf_incompatibilities(proto_text(move), BASE)
    )


OPEN = {"type": "object", "properties": {"id": {"type": "string"}}}
CLOSED = {**OPEN, "additionalProperties": False}


def with_props(base: dict[str, Any], **props: Any) -> dict[str, Any]:
    return {**base, "properties": {**base["properties"], **props}}


@pytest.mark.parametrize(
    ("reader", "writer", "reason"),
    [
        (
            with_props(OPEN, qty={"type": "integer"}),
            OPEN,
            "property added to an open content model",
        ),
        (
            CLOSED,
            with_props(CLOSED, qty={"type": "integer"}),
            "property removed from a closed content model",
        ),
        ({**OPEN, "required": ["id"]}, OPEN, "properties ['id'] became required"),
        (with_props(OPEN, id={"type": "integer"}), OPEN, "type ['string'] is no longer accepted"),
        (with_props(OPEN, id={"type": "string", "maxLength": 4}), OPEN, "maxLength narrowed to 4"),
        (
            with_props(OPEN, id={"enum": ["a"]}),
            with_props(OPEN, id={"enum": ["a", "b"]}),
            "enum lost values ['b']",
        ),
        (CLOSED, OPEN, "the reader's content model is closed, the writer's open"),
    ],
)
def test_json_schema_changes_that_break_a_reader(reader: Any, writer: Any, reason: str) -> None:
    found = json_incompatibilities(json.dumps(reader), json.dumps(writer))
    assert any(reason in r for r in found), found


@pytest.mark.parametrize(
    ("reader", "writer"),
    [
        (with_props(CLOSED, qty={"type": "integer"}), CLOSED),  # added to a closed writer
        (OPEN, with_props(OPEN, qty={"type": "integer"})),  # removed into an open reader
        (with_props(OPEN, id={"type": ["string", "null"]}), OPEN),  # widened
        (with_props(OPEN, id={"type": "number"}), with_props(OPEN, id={"type": "integer"})),
        (
            {
                **OPEN,
                "definitions": {"s": {"type": "string"}},
                "properties": {"id": {"$ref": "#/definitions/s"}},
            },
            OPEN,
        ),
    ],
)
def test_json_schema_changes_a_reader_accepts(reader: Any, writer: Any) -> None:
    assert json_incompatibilities(json.dumps(reader), json.dumps(writer)) == []


def test_every_registry_refuses_an_incompatible_schema_before_registering(registry: Any) -> None:
    subject = "orders-value"
    registry.register(subject, Schema(BASE, "PROTOBUF"))
    breaking = Schema(proto_text(INCOMPATIBLE_PROTO["int32 cannot be read as string"]), "PROTOBUF")
    with pytest.raises(SchemaIncompatibleError, match="int32 cannot be read as string") as caught:
        registry.register(subject, breaking)
    assert caught.value.subject == subject
    assert registry.latest(subject).version == 1
    added = Schema(proto_text(COMPATIBLE_PROTO["field added"]), "PROTOBUF")
    registry.register(subject, added)
    assert registry.latest(subject).version == 2
    registry.register("j-value", Schema(json.dumps(CLOSED), "JSON"))
    with pytest.raises(SchemaIncompatibleError, match="schema type JSON became PROTOBUF"):
        registry.register("j-value", Schema(BASE, "PROTOBUF"))
    registry.set_compatibility("j-value", Compatibility.FORWARD)
    with pytest.raises(SchemaIncompatibleError, match="old schema cannot read new data"):
        registry.register(
            "j-value", Schema(json.dumps(with_props(OPEN, qty={"type": "integer"})), "JSON")
        )
    registry.set_compatibility("j-value", "NONE")
    registry.register("j-value", Schema(json.dumps(OPEN), "JSON"))
    assert registry.latest("j-value").version == 2


def test_transitive_levels_check_every_version(registry: Any) -> None:
    def as_string(message: Any, file: Any) -> None:
        field(message, 2).type = F.TYPE_STRING

    v1, v2 = proto_text(), proto_text(lambda m, f: remove(m, 2))
    v3 = proto_text(as_string)  # reads v2's data (no field 2), not v1's (an int32 there)
    registry.set_compatibility("t-value", "BACKWARD_TRANSITIVE")
    registry.register("t-value", Schema(v1, "PROTOBUF"))
    registry.register("t-value", Schema(v2, "PROTOBUF"))
    with pytest.raises(SchemaIncompatibleError, match="int32 cannot be read as string"):
        registry.register("t-value", Schema(v3, "PROTOBUF"))
    registry.set_compatibility("t-value", "BACKWARD")
    registry.register("t-value", Schema(v3, "PROTOBUF"))
    assert registry.latest("t-value").version == 3
    with pytest.raises(SerializationError, match="invalid PROTOBUF schema"):
        registry.register("p-value", Schema("syntax = 'proto3';", "PROTOBUF"))


def common_text(edit: Any = None) -> str:
    """``shop/common.proto`` (no imports: what a server parses on its own), after ``edit``."""
    file = proto_files(1)[0]
    if edit is not None:
        edit(file.message_type[0])
    return base64.b64encode(file.SerializeToString()).decode()


def test_a_registry_server_refuses_a_protobuf_change_its_level_forbids(confluent: Any) -> None:
    """Through a Confluent client: checked by bolide for the mock (which checks nothing), by
    the server itself otherwise."""
    if confluent.url.startswith("http"):
        pytest.skip(
            "Apicurio 3.0 keeps the serialized descriptor confluent-kafka registers but its "
            "checker parses .proto text only (HTTP 500 on a second version)"
        )
    confluent.set_compatibility("p-value", "BACKWARD")
    confluent.register("p-value", Schema(common_text(), "PROTOBUF"))
    breaking = Schema(
        common_text(lambda m: setattr(field(m, 1), "type", F.TYPE_STRING)), "PROTOBUF"
    )
    with pytest.raises(SchemaIncompatibleError):
        confluent.register("p-value", breaking)
    added = common_text(lambda m: m.field.add(name="note", number=3, type=F.TYPE_STRING, label=1))
    confluent.register("p-value", Schema(added, "PROTOBUF"))
    assert confluent.latest("p-value").version == 2


def test_a_registry_server_refuses_a_json_schema_change_its_level_forbids(confluent: Any) -> None:
    confluent.set_compatibility("j-value", "BACKWARD")
    confluent.register(
        "j-value", Schema(json.dumps(with_props(OPEN, n={"type": "integer"})), "JSON")
    )
    narrowed = with_props(OPEN, n={"type": "integer"}, id={"type": "integer"})
    with pytest.raises(SchemaIncompatibleError):
        confluent.register("j-value", Schema(json.dumps(narrowed), "JSON"))
    assert confluent.latest("j-value").version == 1


def with_map(value_type: int) -> Any:
    def edit(message: Any, file: Any) -> None:
        entry = message.nested_type.add(name="AttrsEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=1)
        entry.field.add(name="value", number=2, type=value_type, label=1)
        message.field.add(
            name="attrs",
            number=20,
            type=F.TYPE_MESSAGE,
            type_name=".shop.Order.AttrsEntry",
            label=3,
        )

    return edit


def test_map_fields_compare_by_key_and_value() -> None:
    strings = proto_text(with_map(F.TYPE_STRING))
    assert protobuf_incompatibilities(strings, BASE) == []  # added
    assert protobuf_incompatibilities(BASE, strings) == []  # removed
    numbers = proto_text(with_map(F.TYPE_INT64))
    assert protobuf_incompatibilities(numbers, strings) == [
        "shop.Order field 20 (attrs): map type string -> string became string -> int64"
    ]


def test_a_string_field_may_become_repeated() -> None:
    def repeat(message: Any, file: Any) -> None:
        field(message, 1).label = F.LABEL_REPEATED

    assert protobuf_incompatibilities(proto_text(repeat), BASE) == []
