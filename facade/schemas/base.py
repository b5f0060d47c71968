"""What every schema serde shares: the registry, the subject of each stream, Confluent's two
framings of the schema id, and errors that name a record's place.

A subclass says how its format registers (``_registrable``), encodes a body (``_body``) and
decodes one (``_decode_body``); this class frames, caches and looks schemas up.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from bolide.facade.errors import SerializationError
from bolide.facade.ports import SCHEMA_REGISTRIES, Schema, TypedSchemaRegistry, open_plugin
from bolide.facade.record import Record
from bolide.facade.schemas.framing import (
    PREFIX,
    VALUE_SCHEMA_ID_HEADER,
    SchemaRef,
    encode_indexes,
    header_value,
    placed,
    read_header,
    read_prefix,
)
from bolide.facade.schemas.registry import (
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    SchemaRegistry,
)

__all__ = [
    "FRAMINGS",
    "STRATEGIES",
    "SchemaSerde",
    "as_registry",
    "default_registry",
    "header_schema",
    "registered_schema",
    "typed",
]

#: Confluent's subject name strategies, by the names its clients' settings use.
STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
#: Where ``encode_record`` writes the schema id: the payload's prefix or a header.
FRAMINGS = ("prefix", "header")
_DEFAULT_REGISTRY = MemorySchemaRegistry()


def default_registry() -> MemorySchemaRegistry:
    """The process-wide registry a serde uses when given none."""
    return _DEFAULT_REGISTRY


def as_registry(registry: Any) -> SchemaRegistry:
    """A registry from what a serde is given: a registry, a URL, a ``SqlStore`` or ``None``.

    Raises:
        TypeError: ``registry`` is none of those.
    """
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


def _header(headers: Sequence[tuple[str, bytes | None]] | None) -> bytes | None:
    """The value of the first ``__value_schema_id`` header, if any (as confluent-kafka's
    ``dual_schema_id_deserializer`` reads it)."""
    for name, value in headers or ():
        if name == VALUE_SCHEMA_ID_HEADER and value is not None:
            return value
    return None


def typed(registry: SchemaRegistry) -> TypedSchemaRegistry:
    """``registry`` as one that keeps formats, references and GUIDs.

    Raises:
        SerializationError: It keeps Avro text only (a third-party ``SchemaRegistry``).
    """
    if not isinstance(registry, TypedSchemaRegistry):
        raise SerializationError(
            f"{type(registry).__name__} keeps neither formats nor GUIDs: use "
            "MemorySchemaRegistry, SqlSchemaRegistry or ConfluentSchemaRegistry"
        )
    return registry


def header_schema(
    registry: SchemaRegistry,
    headers: Sequence[tuple[str, bytes | None]] | None,
    subject: str | None,
    *,
    indexes: bool,
) -> tuple[int, SchemaRef] | None:
    """The schema id a ``__value_schema_id`` header names, and the header's framing (with
    Protobuf message indexes if ``indexes``); ``None`` when the record has no such header.

    Raises:
        SerializationError: The header is malformed, its GUID unknown (``SchemaNotFoundError``)
            or ``registry`` cannot look GUIDs up.
    """
    value = _header(headers)
    if value is None:
        return None
    ref = read_header(value, indexes=indexes)
    assert ref.guid is not None
    return typed(registry).id_of_guid(ref.guid, subject), ref


def registered_schema(registry: SchemaRegistry, schema_id: int, schema_type: str) -> Schema:
    """The schema of ``schema_id``: with its format and references from a registry that keeps
    them, else ``registry``'s text taken as ``schema_type``.

    Raises:
        SchemaNotFoundError: The id is unknown.
        SerializationError: The registry failed (``retriable`` when it may pass).
    """
    if isinstance(registry, TypedSchemaRegistry):
        return registry.schema(schema_id)
    return Schema(registry.get_schema(schema_id), schema_type)


class SchemaSerde:
    """The framing half of a Confluent-style serde (see the module's docstring).

    Args:
        registry: See ``AvroSerde``.
        subject: A fixed subject; by default the strategy names it per stream.
        subject_name_strategy: ``"TopicNameStrategy"`` (``<stream>-value``, the default),
            ``"RecordNameStrategy"`` (the record's full name) or ``"TopicRecordNameStrategy"``
            (``<stream>-<record name>``), as confluent-kafka's serializers name them.
        framing: Where ``encode_record`` (what a publisher calls) puts the schema id:
            ``"prefix"`` (magic byte 0 and the id, the default) or ``"header"`` (a
            ``__value_schema_id`` header with the schema's GUID, confluent-kafka 2.16's
            ``header_schema_id_serializer``). ``decode`` reads both, the header first.
    """

    #: Confluent's name of the format (``schemaType``).
    schema_type: ClassVar[str] = "AVRO"
    #: True when the framing carries Protobuf message indexes.
    _indexed: ClassVar[bool] = False

    def __init__(
        self,
        *,
        registry: Any,
        subject: str | None,
        subject_name_strategy: str,
        framing: str,
    ) -> None:
        if subject is not None and (not isinstance(subject, str) or not subject):
            raise ValueError("subject must be a non-empty string or None")
        if subject_name_strategy not in STRATEGIES:
            raise ValueError(f"subject_name_strategy must be one of {STRATEGIES}")
        if framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {FRAMINGS}")
        self.registry = as_registry(registry)
        self.subject = subject
        self.subject_name_strategy = subject_name_strategy
        self.framing = framing
        self._prefixes: dict[str, bytes] = {}
        self._headers: dict[str, list[tuple[str, bytes]]] = {}
        self._lock = threading.Lock()

    # -- what a format provides ---------------------------------------------------------------

    def record_name(self) -> str | None:
        """The full name of what this serde writes (for the record name strategies)."""
        return None

    def _registrable(self, stream: str) -> Schema:
        """The writer schema to register (its references registered first)."""
        raise NotImplementedError

    def _indexes(self) -> tuple[int, ...] | None:
        """The message indexes this serde writes (Protobuf), else ``None``."""
        return None

    # -- subjects and ids ---------------------------------------------------------------------

    def subject_for(self, stream: str) -> str:
        """The subject this serde registers under for ``stream``."""
        if self.subject is not None:
            return self.subject
        if self.subject_name_strategy == "TopicNameStrategy":
            return f"{stream}-value"
        name = self.record_name()
        if not name:
            raise SerializationError(
                f"{self.subject_name_strategy} needs a record name, and this schema has none"
            )
        return name if self.subject_name_strategy == "RecordNameStrategy" else f"{stream}-{name}"

    def schema_id(self, stream: str) -> int:
        """Register the writer schema for ``stream`` (once) and return its id.

        Raises:
            SchemaIncompatibleError: The registry refused the schema.
        """
        return int(PREFIX.unpack_from(self._prefix(stream))[1])

    def _prefix(self, stream: str) -> bytes:
        prefix = self._prefixes.get(stream)
        if prefix is None:
            with self._lock:
                prefix = self._prefixes.get(stream)
                if prefix is None:
                    schema_id = self.registry.register(
                        self.subject_for(stream), self._registrable(stream)
                    )
                    indexes = self._indexes()
                    tail = encode_indexes(indexes) if indexes is not None else b""
                    prefix = PREFIX.pack(0, schema_id) + tail
                    self._prefixes[stream] = prefix
        return prefix

    def _schema_header(self, stream: str) -> list[tuple[str, bytes]]:
        found = self._headers.get(stream)
        if found is None:
            guid = self._typed_registry().guid(self.schema_id(stream))
            found = [(VALUE_SCHEMA_ID_HEADER, header_value(guid, self._indexes()))]
            self._headers[stream] = found
        return found

    def _typed_registry(self) -> TypedSchemaRegistry:
        return typed(self.registry)

    def framed_prefix(self, stream: str) -> bytes:
        """The prefix framing of ``stream``'s payloads (registering on first use), with the
        stream named on a failure."""
        prefix = self._prefixes.get(stream)
        if prefix is None:
            try:
                prefix = self._prefix(stream)
            except SerializationError as exc:
                exc.stream = stream
                raise
        return prefix

    def encode_record(self, value: Any, *, stream: str) -> Record:
        """The record a publisher sends for ``value``: the payload framed as ``framing``
        says (the header framing puts the schema's GUID in ``__value_schema_id``).

        Raises:
            SerializationError: As ``encode``.
        """
        if self.framing == "prefix":
            return Record(self.encode(value, stream=stream))  # type: ignore[attr-defined]
        try:
            headers = self._schema_header(stream)
        except SerializationError as exc:
            exc.stream = stream
            raise
        prefix = self.framed_prefix(stream)
        data = self.encode(value, stream=stream)  # type: ignore[attr-defined]
        return Record(data[len(prefix) :], headers=list(headers))

    # -- reading the framing ------------------------------------------------------------------

    def decode(
        self,
        data: bytes,
        *,
        stream: str,
        partition: int | None = None,
        offset: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> Any:
        """Decode one payload (each format's)."""
        raise NotImplementedError

    def decode_record(self, record: Record, stream: str) -> Any:
        """``record``'s value, its schema id in its headers or its payload
        (``RecordDecoder``)."""
        return self.decode(
            record.data,  # type: ignore[arg-type]  # tombstones are never decoded
            stream=stream,
            partition=record.partition,
            offset=record.offset,
            headers=record.headers,
        )

    def locate(
        self,
        data: bytes,
        headers: Sequence[tuple[str, bytes | None]] | None,
        stream: str | None,
        partition: int | None,
        offset: int | None,
    ) -> tuple[int, SchemaRef]:
        """The schema id of a payload (its header first, then its prefix) and the framing.

        Raises:
            SerializationError: Neither framing is there, or the GUID is unknown; the error
                names the record's place.
        """
        try:
            subject = self._reading_subject(stream) if headers else None
            found = header_schema(self.registry, headers, subject, indexes=self._indexed)
            if found is not None:
                return found
            ref = self._read_prefix(data)
        except SerializationError as exc:
            raise placed(exc, stream, partition, offset) from exc
        assert ref.schema_id is not None
        return ref.schema_id, ref

    def _reading_subject(self, stream: str | None) -> str | None:
        """The subject a payload of ``stream`` is registered under, when this serde knows it
        (what a registry that looks GUIDs up per subject needs)."""
        if stream is None:
            return self.subject
        try:
            return self.subject_for(stream)
        except SerializationError:  # a record strategy without a record name
            return None

    def _read_prefix(self, data: bytes) -> SchemaRef:
        """The prefix framing; for Protobuf, message indexes that do not read are explained by
        the schema when it is of another format."""
        try:
            return read_prefix(data, indexes=self._indexed)
        except SerializationError:
            if not self._indexed:
                raise
            bare = read_prefix(data, indexes=False)
            assert bare.schema_id is not None
            found = self.fetch_schema(bare.schema_id, None, None, None).schema_type
            if found != self.schema_type:
                raise SerializationError(
                    f"schema id {bare.schema_id} is a {found} schema, not {self.schema_type}"
                ) from None
            raise

    def payload_schema_id(
        self,
        data: bytes,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        stream: str | None = None,
    ) -> int:
        """The schema id a payload of ``stream`` was written with (its header, else its
        prefix).

        Raises:
            SerializationError: It names none.
        """
        return self.locate(data, headers, stream, None, None)[0]

    def fetch_schema(
        self, schema_id: int, stream: str | None, partition: int | None, offset: int | None
    ) -> Schema:
        """The registered schema of ``schema_id``, with failures naming the record's place.

        Raises:
            SchemaNotFoundError: The id is unknown.
            SerializationError: The registry failed (``retriable`` when it may pass).
        """
        try:
            return registered_schema(self.registry, schema_id, self.schema_type)
        except SerializationError as exc:  # unknown (SchemaNotFoundError), or maybe retriable
            raise placed(exc, stream, partition, offset) from exc
