"""``SchemaReader``: decode a payload of any Confluent-framed format to plain data, the format
and schema found in the registry (``bolide tail --decode``, the console).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from bolide.facade.errors import SerializationError
from bolide.facade.record import Record
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.base import as_registry, header_schema, registered_schema
from bolide.facade.schemas.framing import placed, split_header
from bolide.facade.schemas.json_schema import JsonSchemaSerde
from bolide.facade.schemas.protobuf import ProtobufSerde

__all__ = ["SchemaReader"]


class SchemaReader:
    """Decodes Avro, Protobuf and JSON Schema payloads alike, to dicts, lists and scalars.

    Args:
        registry: As a serde's (a registry, a URL, a ``SqlStore``).
    """

    def __init__(self, registry: Any) -> None:
        self.registry = as_registry(registry)
        self._serdes: dict[int, Any] = {}  # schema id -> the serde of its format
        self._formats: dict[str, Any] = {}  # one serde per format: each decodes every id
        self._lock = threading.Lock()

    def decode(
        self,
        data: bytes,
        *,
        stream: str,
        partition: int | None = None,
        offset: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> Any:
        """The plain value of ``data`` (its schema id in ``headers`` first, then its prefix).

        Raises:
            SerializationError: It has no framing, names an unknown schema, or does not
                decode; naming the record's place.
        """
        try:
            found = header_schema(self.registry, headers, f"{stream}-value", indexes=False)
            schema_id = found[0] if found is not None else split_header(data)
        except SerializationError as exc:
            raise placed(exc, stream, partition, offset) from exc
        serde = self._serdes.get(schema_id) or self._serde(schema_id, stream, partition, offset)
        value = serde.decode(
            data, stream=stream, partition=partition, offset=offset, headers=headers
        )
        return serde.plain(value)

    def decode_record(self, record: Record, stream: str) -> Any:
        """``record``'s plain value (``RecordDecoder``: its headers are read too)."""
        return self.decode(
            record.data,  # type: ignore[arg-type]  # tombstones are never decoded
            stream=stream,
            partition=record.partition,
            offset=record.offset,
            headers=record.headers,
        )

    def _serde(self, schema_id: int, stream: str, partition: int | None, offset: int | None) -> Any:
        try:
            kind = registered_schema(self.registry, schema_id, "AVRO").schema_type
        except SerializationError as exc:
            raise placed(exc, stream, partition, offset) from exc
        with self._lock:
            serde = self._formats.get(kind)
            if serde is None:
                serde = self._formats[kind] = _decoder(kind, self.registry)
            self._serdes[schema_id] = serde
        return serde


def _decoder(kind: str, registry: Any) -> Any:
    """A serde of format ``kind`` that only decodes: each payload's writer schema comes from
    the registry by its id, never from the serde's own."""
    if kind == "PROTOBUF":
        return ProtobufSerde(registry=registry)
    if kind == "JSON":
        return JsonSchemaSerde(True, registry=registry)  # accepts anything; never encodes
    return AvroSerde('"null"', registry=registry)
