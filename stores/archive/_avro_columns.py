"""How Avro schemas become typed-archive columns (``bolide.stores.archive._typed``): the kind of
each field's values, the SQL type that stores a kind, and a decoded value as a column value."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

__all__ = ["SQL_TYPES", "Field", "fields_of", "pick", "storage_kind", "storage_of", "to_column"]

# Kind of value -> SQL type. Kinds sharing a SQL type share columns.
SQL_TYPES: dict[str, Any] = {
    "boolean": sa.Boolean(),
    "integer": sa.BigInteger(),
    "real": sa.Float(53),
    "text": sa.Text(),
    "json": sa.Text(),
    "binary": sa.LargeBinary(),
    "decimal": sa.Numeric(),
    "date": sa.Date(),
    "timestamp": sa.DateTime(timezone=True),
    "local_timestamp": sa.DateTime(),
    "time": sa.Time(),
}
_STORAGE = {kind: ("text" if kind == "json" else kind) for kind in SQL_TYPES}
_PRIMITIVE_KINDS = {
    "boolean": "boolean",
    "int": "integer",
    "long": "integer",
    "float": "real",
    "double": "real",
    "string": "text",
    "bytes": "binary",
}
_LOGICAL_KINDS = {
    "decimal": "decimal",
    "date": "date",
    "time-millis": "time",
    "time-micros": "time",
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "timestamp-nanos": "timestamp",
    "local-timestamp-millis": "local_timestamp",
    "local-timestamp-micros": "local_timestamp",
    "uuid": "text",
}


@dataclass(frozen=True)
class Field:
    """One column's source: ``path`` into the decoded value, and the kind of its values."""

    name: str
    path: tuple[str, ...]
    kind: str


def _resolve(schema: Any, named: dict[str, Any]) -> Any:
    while True:
        if isinstance(schema, str) and schema in named:
            schema = named[schema]
        elif isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
            schema = schema["type"]
        elif isinstance(schema, dict) and schema.get("type") in named:
            schema = named[schema["type"]]
        else:
            return schema


def _kind(schema: Any, named: dict[str, Any]) -> str:
    schema = _resolve(schema, named)
    if isinstance(schema, list):
        branches = [b for b in schema if _resolve(b, named) != "null"]
        return _kind(branches[0], named) if len(branches) == 1 else "json"
    if isinstance(schema, str):
        return _PRIMITIVE_KINDS.get(schema, "json")
    logical = _LOGICAL_KINDS.get(schema.get("logicalType", ""))
    if logical is not None:
        return logical
    kind = schema.get("type")
    if kind == "enum":
        return "text"
    if kind == "fixed":
        return "binary"
    return _PRIMITIVE_KINDS.get(kind, "json")


def _record_of(schema: Any, named: dict[str, Any]) -> dict[str, Any] | None:
    """The record a field holds (alone or as ``[null, record]``), else ``None``."""
    schema = _resolve(schema, named)
    if isinstance(schema, list):
        branches = [_resolve(b, named) for b in schema if _resolve(b, named) != "null"]
        schema = branches[0] if len(branches) == 1 else None
    if isinstance(schema, dict) and schema.get("type") in ("record", "error"):
        return schema
    return None


def fields_of(schema: Any) -> list[Field]:
    named: dict[str, Any] = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}
    top = _record_of(schema, named)
    if top is None:
        return [Field("value", (), _kind(schema, named))]
    out: list[Field] = []
    for field in top["fields"]:
        inner = _record_of(field["type"], named)
        if inner is None:
            out.append(Field(field["name"], (field["name"],), _kind(field["type"], named)))
            continue
        for sub in inner["fields"]:
            out.append(
                Field(
                    f"{field['name']}__{sub['name']}",
                    (field["name"], sub["name"]),
                    _kind(sub["type"], named),
                )
            )
    return out


def storage_of(column_type: Any) -> str:
    """The storage kind of a reflected column type."""
    for sql_type, kind in (
        (sa.Boolean, "boolean"),
        (sa.Integer, "integer"),
        (sa.Float, "real"),
        (sa.Numeric, "decimal"),
        (sa.DateTime, "timestamp"),
        (sa.Date, "date"),
        (sa.Time, "time"),
        (sa.LargeBinary, "binary"),
        (sa.String, "text"),
    ):
        if isinstance(column_type, sql_type):
            return kind
    return "text"


def storage_kind(kind: str) -> str:
    # Reflection tells DATETIME columns apart by zone on PostgreSQL only: one storage for both.
    return "timestamp" if kind == "local_timestamp" else _STORAGE[kind]


# -- values ---------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_column(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "json":
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    if kind == "text" and not isinstance(value, str):
        return str(value)
    return value


def pick(value: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value
