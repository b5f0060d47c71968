"""Confluent's two framings of a payload's schema, shared by every format.

* **Prefix** (the classic one): magic byte ``0x00``, the schema id as 4 big-endian bytes, for
  Protobuf the message indexes, then the body.
* **Header** (confluent-kafka 2.16's ``header_schema_id_serializer``): the payload is the bare
  body and a header, ``__value_schema_id`` (``__key_schema_id`` for keys), holds magic byte
  ``0x01``, the schema's 16-byte GUID and, for Protobuf, the message indexes.

Message indexes locate a message type in its ``.proto`` file: a zigzag varint count, then one
zigzag varint per level; the first message of the file is written as the single byte ``0x00``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from bolide.facade.errors import SchemaNotFoundError, SerializationError

__all__ = [
    "KEY_SCHEMA_ID_HEADER",
    "MAGIC_BYTE",
    "MAGIC_BYTE_GUID",
    "VALUE_SCHEMA_ID_HEADER",
    "SchemaRef",
    "decode_failure",
    "encode_indexes",
    "header_value",
    "placed",
    "read_header",
    "read_prefix",
    "split_header",
]

MAGIC_BYTE = 0
MAGIC_BYTE_GUID = 1
VALUE_SCHEMA_ID_HEADER = "__value_schema_id"
KEY_SCHEMA_ID_HEADER = "__key_schema_id"
PREFIX = struct.Struct(">bI")
_MAX_INDEXES = 100_000


@dataclass(frozen=True)
class SchemaRef:
    """Where a payload says its schema is: an id (prefix) or a GUID (header), the message
    indexes (Protobuf; ``None`` for the other formats) and where the body starts."""

    schema_id: int | None
    guid: str | None
    indexes: tuple[int, ...] | None
    body_at: int


def decode_failure(
    reason: str, stream: str | None, partition: int | None, offset: int | None
) -> SerializationError:
    """The error for a record that does not decode, naming its place."""
    return SerializationError(
        f"cannot decode the record of stream {stream!r} at partition {partition}, "
        f"offset {offset}: {reason}",
        stream=stream,
        partition=partition,
        offset=offset,
    )


def placed(
    error: SerializationError, stream: str | None, partition: int | None, offset: int | None
) -> SerializationError:
    """``error`` again, naming the record's place, of the same kind (``SchemaNotFoundError``
    stays one) and as retriable."""
    message = str(decode_failure(str(error), stream, partition, offset))
    if isinstance(error, SchemaNotFoundError):
        return SchemaNotFoundError(message, stream=stream, partition=partition, offset=offset)
    again = SerializationError(message, stream=stream, partition=partition, offset=offset)
    again.retriable = error.retriable
    return again


def split_header(data: bytes) -> int:
    """Return the schema id of a prefix-framed payload.

    Raises:
        SerializationError: ``data`` is shorter than the 5-byte prefix or its magic byte is
            not 0.
    """
    try:
        magic, schema_id = PREFIX.unpack_from(data, 0)
    except (struct.error, TypeError) as exc:
        size = len(data) if isinstance(data, bytes | bytearray | memoryview) else None
        raise SerializationError(
            f"payload of {size} bytes is too short for the 5-byte Confluent header"
        ) from exc
    if magic != MAGIC_BYTE:
        raise SerializationError(f"unknown magic byte {magic & 0xFF}: not Confluent framing")
    return int(schema_id)


def encode_indexes(indexes: Iterable[int]) -> bytes:
    """Protobuf message indexes as Confluent writes them (``[0]`` is the one byte ``0x00``)."""
    values = list(indexes)
    if values == [0]:
        return b"\x00"
    out = bytearray()
    for value in (len(values), *values):
        _varint(out, (value << 1) ^ (value >> 63))
    return bytes(out)


def _varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise SerializationError("the message indexes are cut short")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at


def _read_indexes(data: bytes, at: int) -> tuple[tuple[int, ...], int]:
    count, at = _read_varint(data, at)
    if count < 0 or count > _MAX_INDEXES:
        raise SerializationError(f"invalid message index count {count}")
    if count == 0:
        return (0,), at
    indexes = []
    for _ in range(count):
        index, at = _read_varint(data, at)
        if index < 0:
            raise SerializationError(f"invalid message index {index}")
        indexes.append(index)
    return tuple(indexes), at


def read_prefix(data: bytes, *, indexes: bool) -> SchemaRef:
    """The schema a prefix-framed payload names (with its message indexes if ``indexes``).

    Raises:
        SerializationError: No valid prefix.
    """
    schema_id = split_header(data)
    if not indexes:
        return SchemaRef(schema_id, None, None, PREFIX.size)
    found, at = _read_indexes(data, PREFIX.size)
    return SchemaRef(schema_id, None, found, at)


def read_header(value: bytes, *, indexes: bool) -> SchemaRef:
    """The schema a ``__value_schema_id`` header names (the body is the whole payload).

    Raises:
        SerializationError: The header is not magic byte 1 and a GUID.
    """
    if len(value) < 17 or value[0] != MAGIC_BYTE_GUID:
        raise SerializationError("the schema id header is not magic byte 1 and a 16-byte GUID")
    guid = str(uuid.UUID(bytes=bytes(value[1:17])))
    if not indexes:
        return SchemaRef(None, guid, None, 0)
    found, _ = _read_indexes(value, 17)
    return SchemaRef(None, guid, found, 0)


def header_value(guid: str, indexes: Iterable[int] | None) -> bytes:
    """The ``__value_schema_id`` header of a schema GUID (and Protobuf message indexes)."""
    tail = encode_indexes(indexes) if indexes is not None else b""
    return bytes([MAGIC_BYTE_GUID]) + uuid.UUID(guid).bytes + tail
