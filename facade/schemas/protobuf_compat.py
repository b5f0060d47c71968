"""Protobuf compatibility: can a reader's ``.proto`` read what a writer's wrote?

Protobuf pairs fields by number on the wire, so names may change freely; what breaks a reader
is what Confluent Schema Registry's Protobuf checker refuses:

* the file's package changed, or a message the writer has is gone from the reader;
* a field (by number) changed kind (scalar, message, enum), or its scalar type changed outside
  the groups that share a wire encoding (``int32 uint32 int64 uint64 bool``, ``sint32 sint64``,
  ``fixed32 sfixed32``, ``fixed64 sfixed64``, ``string bytes``), or its message or enum type
  changed name, or it became repeated or stopped being;
* a ``required`` field (proto2) added or removed;
* two or more existing fields moved into one ``oneof``.

Added and removed optional fields, renamed fields and new enum values are readable both ways;
a ``string`` or ``bytes`` field may also become repeated or stop being (the wire is the same).
Map fields compare by their key and value types (their synthetic entry messages are not
messages of the schema). BACKWARD asks whether the new file reads the old one's data, FORWARD
the reverse: so a message added passes BACKWARD and, as in Confluent, fails FORWARD (to the
old file it is a message removed).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

__all__ = ["file_proto", "protobuf_incompatibilities"]

_GROUPS = (
    frozenset({"int32", "uint32", "int64", "uint64", "bool"}),
    frozenset({"sint32", "sint64"}),
    frozenset({"fixed32", "sfixed32"}),
    frozenset({"fixed64", "sfixed64"}),
    frozenset({"string", "bytes"}),
)


def file_proto(text: str) -> Any:
    """Parse a registered Protobuf schema (base64 of a ``FileDescriptorProto``).

    Raises:
        ValueError: ``text`` is not one (``.proto`` source is not accepted: register the
            serialized form, as confluent-kafka's ``ProtobufSerializer`` does).
    """
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(raw)
    except (ValueError, DecodeError, UnicodeEncodeError) as exc:
        raise ValueError(
            "a Protobuf schema is the base64 of a serialized FileDescriptorProto "
            f"(as confluent-kafka's ProtobufSerializer registers it): {exc}"
        ) from exc
    return proto


def _messages(proto: Any) -> dict[str, Any]:
    """Every message of a file by full name (nested ones included)."""
    found: dict[str, Any] = {}

    def walk(prefix: str, messages: Any) -> None:
        for message in messages:
            if message.options.map_entry:
                continue  # a map field's entry: compared with its field
            name = f"{prefix}.{message.name}" if prefix else message.name
            found[name] = message
            walk(name, message.nested_type)

    walk(proto.package, proto.message_type)
    return found


def _kind(field: Any, entries: dict[str, Any]) -> tuple[str, str]:
    """``("scalar", type)``, ``("message", name)``, ``("enum", name)`` or, for a map field
    (``entries``: its message's map entry types by full name), ``("map", "key -> value")``."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    entry = entries.get(field.type_name.lstrip("."))
    if entry is not None:
        key, value = (_kind(f, entries) for f in sorted(entry.field, key=lambda f: f.number))
        return "map", f"{key[1]} -> {value[1]}"
    if field.type in (fdp.TYPE_MESSAGE, fdp.TYPE_GROUP):
        return "message", field.type_name.lstrip(".")
    if field.type == fdp.TYPE_ENUM:
        return "enum", field.type_name.lstrip(".")
    return "scalar", fdp.Type.Name(field.type).removeprefix("TYPE_").lower()


def _scalars_agree(a: str, b: str) -> bool:
    return a == b or any(a in group and b in group for group in _GROUPS)


def _entries(name: str, message: Any) -> dict[str, Any]:
    """The map entry types nested in ``message`` (named ``name``), by full name."""
    return {f"{name}.{n.name}": n for n in message.nested_type if n.options.map_entry}


def _field_changes(name: str, reader: Any, writer: Any) -> Iterator[str]:
    from google.protobuf import descriptor_pb2

    labels = descriptor_pb2.FieldDescriptorProto
    old_entries, new_entries = _entries(name, writer), _entries(name, reader)
    old = {f.number: f for f in writer.field}
    new = {f.number: f for f in reader.field}
    for number in sorted(old.keys() | new.keys()):
        was, now = old.get(number), new.get(number)
        where = f"{name} field {number}"
        if was is None or now is None:
            present = now if was is None else was
            assert present is not None
            if present.label == labels.LABEL_REQUIRED:
                verb = "added" if was is None else "removed"
                yield f"{where} ({present.name}): a required field {verb}"
            continue
        (kind_was, type_was) = _kind(was, old_entries)
        (kind_now, type_now) = _kind(now, new_entries)
        if kind_was != kind_now:
            yield f"{where} ({now.name}): {kind_was} {type_was} became {kind_now} {type_now}"
        elif kind_now == "scalar" and not _scalars_agree(type_was, type_now):
            yield f"{where} ({now.name}): {type_was} cannot be read as {type_now}"
        elif kind_now != "scalar" and type_was != type_now:
            yield f"{where} ({now.name}): {kind_now} type {type_was} became {type_now}"
        textual = {type_was, type_now} <= {"string", "bytes"}  # one wire form either way
        repeated = (was.label == labels.LABEL_REPEATED) != (now.label == labels.LABEL_REPEATED)
        if repeated and not textual and kind_now != "map":
            yield f"{where} ({now.name}): changed between repeated and singular"
    yield from _oneof_moves(name, reader, old)


def _oneof_moves(name: str, reader: Any, old: dict[int, Any]) -> Iterator[str]:
    moved: dict[int, list[str]] = {}
    for field in reader.field:
        was = old.get(field.number)
        in_oneof = field.HasField("oneof_index") and not field.proto3_optional
        was_in = was is not None and was.HasField("oneof_index") and not was.proto3_optional
        if was is not None and in_oneof and not was_in:
            moved.setdefault(field.oneof_index, []).append(field.name)
    for index, names in moved.items():
        if len(names) > 1:
            oneof = reader.oneof_decl[index].name
            yield f"{name}: fields {', '.join(names)} moved into oneof {oneof}"


def protobuf_incompatibilities(reader: str, writer: str) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote (empty: it can)."""
    new, old = file_proto(reader), file_proto(writer)
    if new.package != old.package:
        return [f"package {old.package!r} became {new.package!r}"]
    reasons: list[str] = []
    new_messages = _messages(new)
    for name, message in _messages(old).items():
        found = new_messages.get(name)
        if found is None:
            reasons.append(f"message {name} removed")
            continue
        reasons.extend(_field_changes(name, found, message))
    return reasons
