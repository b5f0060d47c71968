"""Avro serde in Confluent's wire format, on fastavro.

A payload is ``0x00`` (magic byte), the schema id as 4 big-endian bytes, then the Avro binary
body: the same bytes confluent-kafka's ``AvroSerializer`` writes and its ``AvroDeserializer``
reads, so bolide streams interoperate with other Kafka services.

Everything that can be cached is: the writer schema is parsed once, the 5-byte prefix is built
once per stream, writer schemas met while decoding are fetched and parsed once per id, and
records go through fastavro's prepared encode/decode (``bolide.facade.avro.codec``) with no
per-record schema work.
"""

from __future__ import annotations

import struct
import threading
from io import BytesIO
from typing import Any

from bolide.facade.avro.codec import READ_OPTIONS, WRITE_OPTIONS, prepare, read_data, write_data
from bolide.facade.avro.compat import load_schema, reader_incompatibilities
from bolide.facade.avro.registry import (
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    SchemaRegistry,
    schema_fingerprint,
    schema_text,
)
from bolide.facade.errors import SchemaNotFoundError, SerializationError
from bolide.facade.ports import SCHEMA_REGISTRIES, open_plugin

__all__ = ["MAGIC_BYTE", "AvroSerde", "default_registry", "split_header"]

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")
_HEADER_SIZE = _HEADER.size
_DEFAULT_REGISTRY = MemorySchemaRegistry()
# A writer schema ready for fastavro: (parsed writer, named types, parsed reader or None).
_Prepared = tuple[Any, dict[str, Any], Any]


def default_registry() -> MemorySchemaRegistry:
    """The process-wide registry ``AvroSerde`` uses when given none."""
    return _DEFAULT_REGISTRY


def split_header(data: bytes) -> int:
    """Return the schema id of a Confluent-framed payload.

    Raises:
        SerializationError: ``data`` is shorter than the 5-byte header or its magic byte is
            not 0.
    """
    try:
        magic, schema_id = _HEADER.unpack_from(data, 0)
    except (struct.error, TypeError) as exc:
        size = len(data) if isinstance(data, bytes | bytearray | memoryview) else None
        raise SerializationError(
            f"payload of {size} bytes is too short for the 5-byte Confluent header"
        ) from exc
    if magic != MAGIC_BYTE:
        raise SerializationError(f"unknown magic byte {magic & 0xFF}: not Confluent framing")
    return int(schema_id)


def _as_registry(registry: Any) -> SchemaRegistry:
    if registry is None:
        return _DEFAULT_REGISTRY
    if isinstance(registry, SchemaRegistry):
        return registry
    if isinstance(registry, str) and registry.startswith(("http://", "https://", "mock://")):
        return ConfluentSchemaRegistry(registry)
    try:
        # A database URL or a SqlStore: its database holds the schema tables.
        registry_: SchemaRegistry = open_plugin(SCHEMA_REGISTRIES, registry)
    except TypeError:
        raise TypeError(
            "registry must be a SchemaRegistry, a registry URL, a SqlStore or None, "
            f"not {type(registry).__name__}"
        ) from None
    return registry_


class AvroSerde:
    """Encodes values to, and decodes them from, Confluent-framed Avro.

    Args:
        schema: The writer schema (JSON text, dict or list) used by ``encode``.
        registry: Where schema ids come from: a ``SchemaRegistry``; a URL (``http(s)://`` or
            ``mock://`` for Confluent Schema Registry, a database URL for the SQL registry);
            a ``SqlStore``; or ``None`` for a registry held in this process
            (``default_registry()``), whose ids other processes cannot resolve.
        subject: The subject to register under; default ``"<stream>-value"`` (Confluent's
            TopicNameStrategy), so one serde can serve several streams.
        reader_schema: Decode into this schema's shape by Avro schema resolution, whatever
            compatible schema the record was written with. ``None`` decodes each record in its
            writer's shape, as confluent-kafka's ``AvroDeserializer`` does.

    Raises:
        SerializationError: ``schema`` or ``reader_schema`` is not valid Avro.
        TypeError: ``registry`` has an unsupported type.
    """

    def __init__(
        self,
        schema: Any,
        *,
        registry: Any = None,
        subject: str | None = None,
        reader_schema: Any = None,
    ) -> None:
        if subject is not None and (not isinstance(subject, str) or not subject):
            raise ValueError("subject must be a non-empty string or None")
        self.schema = schema_text(schema)
        self.registry = _as_registry(registry)
        self.subject = subject
        self._parsed, self._named = prepare(load_schema(self.schema))
        self.reader_schema = schema_text(reader_schema) if reader_schema is not None else None
        self._reader: tuple[Any, dict[str, Any]] | None = (
            prepare(load_schema(self.reader_schema)) if self.reader_schema else None
        )
        self._prefixes: dict[str, bytes] = {}
        # schema id -> ((parsed writer, named types, parsed reader or None), error or None)
        self._writers: dict[int, tuple[_Prepared, str | None]] = {}
        self._ready: dict[bytes, _Prepared] = {}  # decode's fast path, by 5-byte header
        self._lock = threading.Lock()

    def subject_for(self, stream: str) -> str:
        """The subject this serde registers under for ``stream``."""
        return self.subject if self.subject is not None else f"{stream}-value"

    def schema_id(self, stream: str) -> int:
        """Register the writer schema for ``stream`` (once) and return its id.

        Raises:
            SchemaIncompatibleError: The registry refused the schema.
        """
        return int(_HEADER.unpack(self._prefix(stream))[1])

    def _prefix(self, stream: str) -> bytes:
        prefix = self._prefixes.get(stream)
        if prefix is None:
            with self._lock:
                prefix = self._prefixes.get(stream)
                if prefix is None:
                    schema_id = self.registry.register(self.subject_for(stream), self.schema)
                    prefix = _HEADER.pack(MAGIC_BYTE, schema_id)
                    self._prefixes[stream] = prefix
        return prefix

    def encode(self, value: Any, *, stream: str) -> bytes:
        """Encode ``value`` with the writer schema, registering it on first use per stream.

        Raises:
            SerializationError: ``value`` does not fit the schema (or the registry refused
                the schema: ``SchemaIncompatibleError``).
        """
        prefix = self._prefixes.get(stream)
        if prefix is None:
            try:
                prefix = self._prefix(stream)
            except SerializationError as exc:
                exc.stream = stream
                raise
        out = bytearray(prefix)
        try:
            write_data(out, value, self._parsed, self._named, "", WRITE_OPTIONS)
        except Exception as exc:
            raise SerializationError(
                f"cannot encode {type(value).__name__} for stream {stream!r}: "
                f"{type(exc).__name__}: {exc}",
                stream=stream,
            ) from exc
        return bytes(out)

    def decode(
        self,
        data: bytes,
        *,
        stream: str,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Any:
        """Decode one Confluent-framed payload.

        Raises:
            SerializationError: The payload is short, has another magic byte, names an unknown
                schema id (``SchemaNotFoundError``), does not decode, carries trailing bytes,
                or was written with a schema the reader schema cannot read. The error names
                the stream, partition and offset.
        """
        try:
            writer, named, reader = self._ready[data[:_HEADER_SIZE]]
        except (KeyError, TypeError):
            writer, named, reader = self._entry(data, stream, partition, offset)
        body = BytesIO(data)
        body.seek(_HEADER_SIZE)
        try:
            value = read_data(body, writer, named, reader, READ_OPTIONS)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise self._fail(reason, stream, partition, offset) from exc
        if body.read(1):
            raise self._fail("trailing bytes after the Avro body", stream, partition, offset)
        return value

    def _entry(
        self, data: bytes, stream: str, partition: int | None, offset: int | None
    ) -> _Prepared:
        """The slow path of ``decode``: check the header, fetch and cache the writer schema."""
        try:
            schema_id = split_header(data)
        except SerializationError as exc:
            raise self._fail(str(exc), stream, partition, offset) from exc
        prepared, error = self._writers.get(schema_id) or self._load(
            schema_id, stream, partition, offset
        )
        if error is not None:
            raise self._fail(error, stream, partition, offset)
        self._ready[bytes(data[:_HEADER_SIZE])] = prepared
        return prepared

    def payload_schema_id(self, data: bytes) -> int:
        """The schema id a payload was written with (its Confluent header).

        Raises:
            SerializationError: ``data`` has no Confluent header.
        """
        return split_header(data)

    def value_schema(self, schema_id: int) -> Any:
        """The parsed schema that values decoded from ``schema_id`` follow.

        Raises:
            SerializationError: The id is unknown or the reader schema cannot read it.
        """
        prepared, error = self._writers.get(schema_id) or self._load(schema_id, None, None, None)
        if error is not None:
            raise SerializationError(error)
        writer, _named, reader = prepared
        return writer if reader is None else reader

    def _load(
        self, schema_id: int, stream: str | None, partition: int | None, offset: int | None
    ) -> tuple[_Prepared, str | None]:
        try:
            text = self.registry.get_schema(schema_id)
        except SchemaNotFoundError as exc:
            raise SchemaNotFoundError(
                _where(f"schema id {schema_id} is not registered", stream, partition, offset),
                stream=stream,
                partition=partition,
                offset=offset,
            ) from exc
        except SerializationError as exc:  # the registry failed: maybe retriable
            failure = self._fail(str(exc), stream, partition, offset)
            failure.retriable = exc.retriable
            raise failure from exc
        writer, writer_named = prepare(load_schema(text))
        named: dict[str, Any] = {"writer": writer_named, "reader": {}}
        reader, error = None, None
        if self._reader is not None and self.reader_schema is not None:
            reasons = reader_incompatibilities(self.reader_schema, text)
            if reasons:
                error = f"reader schema cannot read schema id {schema_id}: " + "; ".join(reasons)
            elif schema_fingerprint(text) != schema_fingerprint(self.reader_schema):
                reader, named["reader"] = self._reader
        entry: tuple[_Prepared, str | None] = ((writer, named, reader), error)
        self._writers[schema_id] = entry
        return entry

    @staticmethod
    def _fail(
        reason: str, stream: str | None, partition: int | None, offset: int | None
    ) -> SerializationError:
        return SerializationError(
            _where(reason, stream, partition, offset),
            stream=stream,
            partition=partition,
            offset=offset,
        )

    def __repr__(self) -> str:
        subject = f", subject={self.subject!r}" if self.subject else ""
        return f"AvroSerde(registry={self.registry!r}{subject})"


def _where(reason: str, stream: str | None, partition: int | None, offset: int | None) -> str:
    return (
        f"cannot decode the record of stream {stream!r} at partition {partition}, "
        f"offset {offset}: {reason}"
    )
