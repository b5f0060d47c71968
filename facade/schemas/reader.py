"""``SchemaReader``: decode a payload of any Confluent-framed format to plain data, the format
and schema found in the registry (``bolide tail --decode``, the console).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from bolide.facade.errors import SerializationError
from bolide.facade.ports import Schema, TypedSchemaRegistry
from bolide.facade.record import Record
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.base import as_registry, header_schema_id
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
        self._serdes: dict[int, Any] = {}
        self._protobuf: ProtobufSerde | None = None
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
            schema_id = header_schema_id(self.registry, headers, f"{stream}-value")
            if schema_id is None:
                schema_id = split_header(data)
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
        registry = self.registry
        try:
            if isinstance(registry, TypedSchemaRegistry):
                schema = registry.schema(schema_id)
            else:
                schema = Schema(registry.get_schema(schema_id))
        except SerializationError as exc:
            raise placed(exc, stream, partition, offset) from exc
        try:
            return self._build(schema_id, schema)
        except SerializationError as exc:  # a schema no serde takes
            raise placed(exc, stream, partition, offset) from exc

    def _build(self, schema_id: int, schema: Schema) -> Any:
        registry = self.registry
        with self._lock:
            serde: Any
            if schema.schema_type == "PROTOBUF":
                if self._protobuf is None:
                    self._protobuf = ProtobufSerde(registry=registry)
                serde = self._protobuf
            elif schema.schema_type == "JSON":
                serde = JsonSchemaSerde(
                    schema.text, registry=registry, references=schema.references
                )
            else:  # its own schema is never used: each writer's comes from the registry
                serde = AvroSerde('"null"', registry=registry)
            self._serdes[schema_id] = serde
        return serde
