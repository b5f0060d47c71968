"""Avro serde in Confluent's wire format, on fastavro.

A payload is ``0x00`` (magic byte), the schema id as 4 big-endian bytes, then the Avro binary
body: the same bytes confluent-kafka's ``AvroSerializer`` writes and its ``AvroDeserializer``
reads, so bolide streams interoperate with other Kafka services. With the header framing the
payload is the bare body and the schema's GUID travels in a header (``SchemaSerde``).

Everything that can be cached is: the writer schema is parsed once, the 5-byte prefix is built
once per stream, writer schemas met while decoding are fetched and parsed once per id, and
records go through fastavro's prepared encode/decode (``bolide.facade.schemas.avro_codec``) with no
per-record schema work.
"""

from __future__ import annotations

from collections.abc import Sequence
from io import BytesIO
from typing import Any

from fastavro import parse_schema
from fastavro.schema import UnknownType

from bolide.facade.errors import SerializationError
from bolide.facade.schemas.avro_codec import (
    READ_OPTIONS,
    WRITE_OPTIONS,
    prepare,
    read_data,
    write_data,
)
from bolide.facade.schemas.avro_compat import load_schema, reader_incompatibilities
from bolide.facade.schemas.base import SchemaSerde, default_registry
from bolide.facade.schemas.framing import MAGIC_BYTE, PREFIX, decode_failure, split_header
from bolide.facade.schemas.registry import Schema, resolve_named, schema_fingerprint, schema_text

__all__ = ["MAGIC_BYTE", "AvroSerde", "default_registry", "split_header"]

_HEADER_SIZE = PREFIX.size
# A writer schema ready for fastavro: (parsed writer, named types, parsed reader or None).
_Prepared = tuple[Any, dict[str, Any], Any]


class AvroSerde(SchemaSerde):
    """Encodes values to, and decodes them from, Confluent-framed Avro.

    Args:
        schema: The writer schema (JSON text, dict or list) used by ``encode``.
        registry: Where schema ids come from: a ``SchemaRegistry``; a URL (``http(s)://`` or
            ``mock://`` for Confluent Schema Registry, a database URL for the SQL registry);
            a ``SqlStore``; or ``None`` for a registry held in this process
            (``default_registry()``), whose ids other processes cannot resolve.
        subject: The subject to register under; by default ``subject_name_strategy`` names it
            (``"<stream>-value"``, Confluent's TopicNameStrategy), so one serde can serve
            several streams.
        reader_schema: Decode into this schema's shape by Avro schema resolution, whatever
            compatible schema the record was written with. ``None`` decodes each record in its
            writer's shape, as confluent-kafka's ``AvroDeserializer`` does.
        subject_name_strategy: ``"TopicNameStrategy"``, ``"RecordNameStrategy"`` or
            ``"TopicRecordNameStrategy"``, as confluent-kafka names them.
        framing: ``"prefix"`` (the default) or ``"header"``: where a publisher's records carry
            the schema id (``SchemaSerde``); ``decode`` reads both.

    Raises:
        SerializationError: ``schema`` or ``reader_schema`` is not valid Avro.
        TypeError: ``registry`` has an unsupported type.
    """

    schema_type = "AVRO"

    def __init__(
        self,
        schema: Any,
        *,
        registry: Any = None,
        subject: str | None = None,
        reader_schema: Any = None,
        subject_name_strategy: str = "TopicNameStrategy",
        framing: str = "prefix",
    ) -> None:
        super().__init__(
            registry=registry,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
            framing=framing,
        )
        self.schema = schema_text(schema)
        self._parsed, self._named = prepare(load_schema(self.schema))
        self.reader_schema = schema_text(reader_schema) if reader_schema is not None else None
        self._reader: tuple[Any, dict[str, Any]] | None = (
            prepare(load_schema(self.reader_schema)) if self.reader_schema else None
        )
        # schema id -> ((parsed writer, named types, parsed reader or None), error or None)
        self._writers: dict[int, tuple[_Prepared, str | None]] = {}
        self._ready: dict[bytes, _Prepared] = {}  # decode's fast path, by 5-byte header

    def record_name(self) -> str | None:
        """The writer schema's full name (a record, enum or fixed), for the name strategies."""
        parsed = self._parsed
        return str(parsed["name"]) if isinstance(parsed, dict) and "name" in parsed else None

    def _registrable(self, stream: str) -> Schema:
        return Schema(self.schema)

    def encode(self, value: Any, *, stream: str) -> bytes:
        """Encode ``value`` with the writer schema, registering it on first use per stream.

        Raises:
            SerializationError: ``value`` does not fit the schema (or the registry refused
                the schema: ``SchemaIncompatibleError``).
        """
        prefix = self._prefixes.get(stream)
        if prefix is None:
            prefix = self.framed_prefix(stream)
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
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> Any:
        """Decode one Confluent-framed payload (the schema id in ``headers`` or its prefix).

        Raises:
            SerializationError: The payload is short, has another magic byte, names an unknown
                schema id (``SchemaNotFoundError``), does not decode, carries trailing bytes,
                or was written with a schema the reader schema cannot read. The error names
                the stream, partition and offset.
        """
        start = _HEADER_SIZE
        ready = None
        if not headers:  # with headers the header framing may be in use: the slow path looks
            try:
                ready = self._ready.get(data[:_HEADER_SIZE])
            except TypeError:  # not bytes: the slow path says what is wrong
                ready = None
        if ready is None:
            ready, start = self._entry(data, headers, stream, partition, offset)
        writer, named, reader = ready
        body = BytesIO(data)
        body.seek(start)
        try:
            value = read_data(body, writer, named, reader, READ_OPTIONS)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise decode_failure(reason, stream, partition, offset) from exc
        if body.read(1):
            raise decode_failure("trailing bytes after the Avro body", stream, partition, offset)
        return value

    def _entry(
        self,
        data: bytes,
        headers: Sequence[tuple[str, bytes | None]] | None,
        stream: str,
        partition: int | None,
        offset: int | None,
    ) -> tuple[_Prepared, int]:
        """The slow path of ``decode``: read the framing, fetch and cache the writer schema."""
        schema_id, ref = self.locate(data, headers, stream, partition, offset)
        prepared, error = self._writers.get(schema_id) or self._load(
            schema_id, stream, partition, offset
        )
        if error is not None:
            raise decode_failure(error, stream, partition, offset)
        if ref.guid is None:
            self._ready[bytes(data[:_HEADER_SIZE])] = prepared
        return prepared, ref.body_at

    def plain(self, value: Any) -> Any:
        """``value`` as plain data: Avro values already are."""
        return value

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
        schema = self.fetch_schema(schema_id, stream, partition, offset)
        if schema.schema_type != "AVRO":
            return self._remember(
                schema_id, f"schema id {schema_id} is a {schema.schema_type} schema, not AVRO"
            )
        text = schema.text
        try:
            writer, writer_named = self._prepare_writer(schema)
        except SerializationError as exc:
            if exc.retriable:  # the registry is away: ask again, never cache it
                raise
            return self._remember(schema_id, f"schema id {schema_id} does not resolve: {exc}")
        except Exception as exc:  # fastavro refused it: a permanent failure, typed
            reason = f"schema id {schema_id} is not usable Avro: {type(exc).__name__}: {exc}"
            return self._remember(schema_id, reason)
        named: dict[str, Any] = {"writer": writer_named, "reader": {}}
        reader, error = None, None
        if self._reader is not None and self.reader_schema is not None and schema.references:
            error = (
                f"schema id {schema_id} references other subjects: read it without a reader schema"
            )
        elif self._reader is not None and self.reader_schema is not None:
            reasons = reader_incompatibilities(self.reader_schema, text)
            if reasons:
                error = f"reader schema cannot read schema id {schema_id}: " + "; ".join(reasons)
            elif schema_fingerprint(text) != schema_fingerprint(self.reader_schema):
                reader, named["reader"] = self._reader
        entry: tuple[_Prepared, str | None] = ((writer, named, reader), error)
        self._writers[schema_id] = entry
        return entry

    def _remember(self, schema_id: int, error: str) -> tuple[_Prepared, str | None]:
        entry: tuple[_Prepared, str | None] = ((None, {}, None), error)
        self._writers[schema_id] = entry
        return entry

    def _prepare_writer(self, schema: Schema) -> tuple[Any, dict[str, Any]]:
        """The writer schema parsed, the named types of the schemas it references (Confluent's
        Avro references: other subjects' records, enums and fixed types) known first."""
        if not schema.references:
            return prepare(load_schema(schema.text))
        referenced = list(resolve_named(schema.references, self._typed_registry().version).values())
        named: dict[str, Any] = {}
        for _ in range(len(referenced)):  # a referenced type may use another: parse until done
            waiting = []
            for one in referenced:
                try:
                    parse_schema(load_schema(one.text), named)
                except UnknownType:
                    waiting.append(one)
            if not waiting:
                break
            referenced = waiting
        return parse_schema(load_schema(schema.text), named), named

    def __repr__(self) -> str:
        subject = f", subject={self.subject!r}" if self.subject else ""
        return f"AvroSerde(registry={self.registry!r}{subject})"
