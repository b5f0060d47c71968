"""Decoded values as plain data, and their shape in Avro's terms.

The typed archive and Spark know one way to describe values: an Avro schema. A Protobuf
message or a JSON document becomes plain data (dicts, lists, scalars; ``message_to_plain``),
and its schema becomes an Avro-shaped one (``plain_schema``, ``json_plain_schema``): records
for messages and objects (two levels), Avro primitives for scalars, and ``JSON_TEXT`` for
what a column keeps as JSON text (maps, deeper objects, values of several types).
"""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["JSON_TEXT", "json_plain_schema", "message_to_plain", "plain_schema"]

#: An Avro union of several types: the typed archive stores such values as JSON text, and
#: Spark reads them as a JSON string.
JSON_TEXT: list[str] = ["null", "string", "long", "double", "boolean"]

_TIMESTAMP = "google.protobuf.Timestamp"


def _is_map(field: Any) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def _repeated(field: Any) -> bool:
    return bool(
        getattr(field, "is_repeated", None) if hasattr(field, "is_repeated") else field.label == 3
    )


def _scalar(field: Any, value: Any) -> Any:
    if field.enum_type is not None:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found is not None else value
    if field.message_type is not None:
        return message_to_plain(value)
    return value


def message_to_plain(message: Any) -> Any:
    """A message as dicts, lists and scalars: integers stay integers, enums become their names,
    ``google.protobuf.Timestamp`` a UTC ``datetime``, unset message fields ``None``."""
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == _TIMESTAMP:
        return message.ToDatetime(tzinfo=datetime.UTC)
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


_AVRO_SCALARS = {
    1: "double",  # TYPE_DOUBLE
    2: "double",  # TYPE_FLOAT
    3: "long",  # TYPE_INT64
    4: "long",  # TYPE_UINT64 (values past 2**63 do not fit a column: the row is refused)
    5: "int",  # TYPE_INT32
    6: "long",  # TYPE_FIXED64
    7: "long",  # TYPE_FIXED32
    8: "boolean",  # TYPE_BOOL
    9: "string",  # TYPE_STRING
    12: "bytes",  # TYPE_BYTES
    13: "long",  # TYPE_UINT32
    15: "int",  # TYPE_SFIXED32
    16: "long",  # TYPE_SFIXED64
    17: "int",  # TYPE_SINT32
    18: "long",  # TYPE_SINT64
}


def _field_schema(field: Any, depth: int) -> Any:
    if _is_map(field):
        return JSON_TEXT
    if field.enum_type is not None:
        single: Any = {
            "type": "enum",
            "name": field.enum_type.name,
            "symbols": list(field.enum_type.values_by_name),
        }
    elif field.message_type is not None:
        single = plain_schema(field.message_type, depth + 1)
    else:
        single = _AVRO_SCALARS.get(field.type, "string")
    if _repeated(field):
        return {"type": "array", "items": single}
    if field.has_presence and not isinstance(single, list):
        return ["null", single]
    return single


def plain_schema(descriptor: Any, depth: int = 0) -> Any:
    """The Avro-shaped schema of ``message_to_plain``'s values (two levels of records, then
    JSON), which the typed archive turns into columns."""
    if descriptor.full_name == _TIMESTAMP:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if depth > 1:
        return JSON_TEXT
    return {
        "type": "record",
        "name": descriptor.full_name.replace(".", "_"),
        "fields": [{"name": f.name, "type": _field_schema(f, depth)} for f in descriptor.fields],
    }


_SCALARS = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}


def _follow(node: Any, root: Any) -> Any:
    for _ in range(32):
        if not isinstance(node, dict) or not str(node.get("$ref", "")).startswith("#"):
            return node
        target = root
        for part in node["$ref"].lstrip("#").split("/"):
            if part:
                target = target.get(part, {}) if isinstance(target, dict) else {}
        node = target
    return node


def _node_schema(node: Any, root: Any, depth: int, name: str) -> Any:
    node = _follow(node, root)
    if not isinstance(node, dict):
        return JSON_TEXT
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    nullable = "null" in kinds
    kinds = [k for k in kinds if k != "null"]
    if len(kinds) != 1 or any(word in node for word in ("anyOf", "oneOf", "allOf")):
        return JSON_TEXT
    kind = kinds[0]
    if kind == "object" and "properties" in node and depth < 2:
        fields = [
            {"name": key, "type": _node_schema(value, root, depth + 1, f"{name}_{key}")}
            for key, value in node["properties"].items()
        ]
        single: Any = {"type": "record", "name": name, "fields": fields}
    elif kind == "array":
        single = {"type": "array", "items": "string"}
    else:
        single = _SCALARS.get(kind, JSON_TEXT)
    return ["null", single] if nullable and not isinstance(single, list) else single


def json_plain_schema(document: Any) -> Any:
    """The Avro-shaped schema of the values ``document`` describes (an object's properties as
    fields, one nested object level, the rest JSON text), for the typed archive's columns.
    Properties are nullable: JSON Schema makes them optional unless ``required``."""
    found = _node_schema(document, document, 0, "json_value")
    if isinstance(found, dict) and found.get("type") == "record":
        required = set(document.get("required", ())) if isinstance(document, dict) else set()
        for field in found["fields"]:
            if field["name"] not in required and not isinstance(field["type"], list):
                field["type"] = ["null", field["type"]]
    return found
