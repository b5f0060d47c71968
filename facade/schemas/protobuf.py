"""Protobuf serde in Confluent's wire format: the bytes confluent-kafka's ``ProtobufSerializer``
writes and its ``ProtobufDeserializer`` reads.

A payload is the magic byte, the schema id, the message indexes (where the message sits in its
``.proto`` file), then the message's binary encoding. The schema registered is the message's
file as a serialized ``FileDescriptorProto`` in base64, as confluent-kafka registers it; each
file it imports is registered first under its own name (confluent-kafka's reference subject
strategy) and referenced, except ``google/protobuf/*`` and ``confluent/*`` files, which every
reader knows.

Without a message class the serde decodes only, with classes built from the registered schemas
(references resolved): ``bolide tail``, the typed archive and Spark read any Protobuf stream so.
"""

from __future__ import annotations

import base64
import importlib
import threading
from collections.abc import Sequence
from typing import Any

from bolide.facade.errors import SerializationError
from bolide.facade.schemas.base import SchemaSerde
from bolide.facade.schemas.framing import decode_failure
from bolide.facade.schemas.plain import message_to_plain, plain_schema
from bolide.facade.schemas.registry import RegisteredSchema, Schema, SchemaReference

__all__ = ["ProtobufSerde", "index_path"]

_VALUE_AS = ("message", "dict")
_BUILTIN = ("google/protobuf/", "google/type/", "confluent/")


def _protobuf() -> Any:
    try:
        from google.protobuf import descriptor_pool, json_format, message_factory
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "ProtobufSerde needs the protobuf extra: pip install 'bolide[protobuf]'"
        ) from exc
    return descriptor_pool, json_format, message_factory


def index_path(descriptor: Any) -> tuple[int, ...]:
    """The message indexes of a message descriptor in its file (Confluent's framing)."""
    path: list[int] = []
    current = descriptor
    while current.containing_type is not None:
        parent = current.containing_type
        path.append(list(parent.nested_types).index(current))
        current = parent
    path.append(list(current.file.message_types_by_name.values()).index(current))
    return tuple(reversed(path))


def _builtin(name: str) -> bool:
    return name.startswith(_BUILTIN)


class ProtobufSerde(SchemaSerde):
    """Encodes Protobuf messages to, and decodes them from, Confluent-framed payloads.

    Args:
        message_class: The generated message class ``encode`` takes and ``decode`` returns;
            ``None`` for a serde that only decodes, with classes built from the registry.
        registry: See ``AvroSerde``.
        subject: See ``AvroSerde``.
        value_as: ``"message"`` (the default) or ``"dict"``: what ``decode`` returns; a dict
            is protobuf's JSON mapping with the ``.proto`` field names.
        subject_name_strategy: See ``SchemaSerde``; the record name is the message's full name.
        framing: See ``SchemaSerde``.

    ``encode`` takes an instance of ``message_class`` or a dict in its JSON mapping.

    Raises:
        ImportError: The ``protobuf`` extra is missing.
        TypeError: ``message_class`` is not a generated message class.
    """

    schema_type = "PROTOBUF"
    _indexed = True

    def __init__(
        self,
        message_class: Any = None,
        *,
        registry: Any = None,
        subject: str | None = None,
        value_as: str = "message",
        subject_name_strategy: str = "TopicNameStrategy",
        framing: str = "prefix",
    ) -> None:
        _protobuf()
        if message_class is not None and not hasattr(message_class, "DESCRIPTOR"):
            raise TypeError(
                f"message_class must be a generated message class, not {message_class!r}"
            )
        if value_as not in _VALUE_AS:
            raise ValueError(f"value_as must be one of {_VALUE_AS}")
        super().__init__(
            registry=registry,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
            framing=framing,
        )
        self.message_class = message_class
        self.value_as = value_as
        # (schema id, message indexes) -> (message class, error or None)
        self._classes: dict[tuple[int, tuple[int, ...]], tuple[Any, str | None]] = {}
        self._build_lock = threading.Lock()
        self._seen: dict[int, tuple[int, ...]] = {}  # schema id -> message indexes last read

    def record_name(self) -> str | None:
        """The message's full name."""
        return None if self.message_class is None else str(self.message_class.DESCRIPTOR.full_name)

    def _indexes(self) -> tuple[int, ...] | None:
        return index_path(self._class().DESCRIPTOR)

    def _class(self) -> Any:
        if self.message_class is None:
            raise SerializationError("this ProtobufSerde decodes only: give it a message_class")
        return self.message_class

    def _registrable(self, stream: str) -> Schema:
        file = self._class().DESCRIPTOR.file
        return Schema(_file_text(file), "PROTOBUF", self._register_imports(file))

    def _register_imports(self, file: Any) -> tuple[SchemaReference, ...]:
        """Register each file ``file`` imports (theirs first); return the references."""
        references = []
        for dependency in file.dependencies:
            if _builtin(dependency.name):
                continue
            schema = Schema(_file_text(dependency), "PROTOBUF", self._register_imports(dependency))
            schema_id = self.registry.register(dependency.name, schema)
            version = _version_of(self.registry, dependency.name, schema_id)
            references.append(SchemaReference(dependency.name, dependency.name, version))
        return tuple(references)

    # -- encode -------------------------------------------------------------------------------

    def encode(self, value: Any, *, stream: str) -> bytes:
        """The payload of ``value`` (a message of ``message_class``, or a dict of its JSON
        mapping), registering the schema on first use per stream.

        Raises:
            SerializationError: ``value`` is another message type or a dict that does not
                fit, or the registry refused the schema (``SchemaIncompatibleError``).
        """
        cls = self._class()
        prefix = self._prefixes.get(stream)
        if prefix is None:
            prefix = self.framed_prefix(stream)
        if isinstance(value, dict):
            value = self._from_dict(value, cls, stream)
        elif not isinstance(value, cls):
            raise SerializationError(
                f"cannot encode {type(value).__name__} for stream {stream!r}: this serde "
                f"writes {cls.DESCRIPTOR.full_name}",
                stream=stream,
            )
        body: bytes = value.SerializeToString()
        return prefix + body

    @staticmethod
    def _from_dict(value: dict[str, Any], cls: Any, stream: str) -> Any:
        _, json_format, _ = _protobuf()
        try:
            return json_format.ParseDict(value, cls())
        except json_format.ParseError as exc:
            raise SerializationError(
                f"cannot encode a dict as {cls.DESCRIPTOR.full_name} for stream {stream!r}: {exc}",
                stream=stream,
            ) from exc

    # -- decode -------------------------------------------------------------------------------

    def decode(
        self,
        data: bytes,
        *,
        stream: str,
        partition: int | None = None,
        offset: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> Any:
        """Decode one payload (the schema id in ``headers`` or its prefix).

        Raises:
            SerializationError: No framing, an unknown schema id (``SchemaNotFoundError``), a
                schema that is not Protobuf or whose message is not ``message_class``'s, or a
                body that does not parse. The error names the stream, partition and offset.
        """
        message = self._message(data, headers, stream, partition, offset)
        if self.value_as == "dict":
            _, json_format, _ = _protobuf()
            return json_format.MessageToDict(message, preserving_proto_field_name=True)
        return message

    def _message(
        self,
        data: bytes,
        headers: Sequence[tuple[str, bytes | None]] | None,
        stream: str | None,
        partition: int | None,
        offset: int | None,
    ) -> Any:
        schema_id, ref = self.locate(data, headers, stream, partition, offset)
        assert ref.indexes is not None
        self._seen[schema_id] = ref.indexes
        cls, error = self._classes.get((schema_id, ref.indexes)) or self._load(
            schema_id, ref.indexes, stream, partition, offset
        )
        if error is not None:
            raise decode_failure(error, stream, partition, offset)
        message = cls()
        try:
            message.ParseFromString(bytes(data[ref.body_at :]))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise decode_failure(reason, stream, partition, offset) from exc
        return message

    def _load(
        self,
        schema_id: int,
        indexes: tuple[int, ...],
        stream: str | None,
        partition: int | None,
        offset: int | None,
    ) -> tuple[Any, str | None]:
        schema = self.fetch_schema(schema_id, stream, partition, offset)
        with self._build_lock:
            entry = self._classes.get((schema_id, indexes))
            if entry is None:
                entry = self._build(schema_id, schema, indexes)
                self._classes[(schema_id, indexes)] = entry
        return entry

    def _build(
        self, schema_id: int, schema: Schema, indexes: tuple[int, ...]
    ) -> tuple[Any, str | None]:
        if schema.schema_type != "PROTOBUF":
            return None, f"schema id {schema_id} is a {schema.schema_type} schema, not PROTOBUF"
        try:
            descriptor = _writer_descriptor(self._typed_registry(), schema, indexes)
        except SerializationError as exc:
            if exc.retriable:  # the registry is away: ask again, never cache it
                raise
            return None, f"schema id {schema_id} does not resolve: {exc}"
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return None, f"schema id {schema_id} does not resolve: {exc}"
        if self.message_class is None:
            _, _, message_factory = _protobuf()
            return message_factory.GetMessageClass(descriptor), None
        mine = self.message_class.DESCRIPTOR.full_name
        if descriptor.full_name != mine:
            return None, (
                f"schema id {schema_id} wrote {descriptor.full_name}; this serde reads {mine}"
            )
        return self.message_class, None

    def plain(self, value: Any) -> Any:
        """A decoded value as plain data (``message_to_plain``; a dict passes through)."""
        return value if isinstance(value, dict) else message_to_plain(value)

    def value_schema(self, schema_id: int) -> Any:
        """The Avro-shaped schema of the values ``plain`` gives for ``schema_id`` (the
        message class's, else the message its payloads were last decoded as): what the typed
        archive makes columns of.

        Raises:
            SerializationError: The id is unknown or is not a Protobuf message this reads.
        """
        if self.message_class is not None:
            return plain_schema(self.message_class.DESCRIPTOR)
        indexes = self._seen.get(schema_id, (0,))  # the message its payloads were decoded as
        cls, error = self._classes.get((schema_id, indexes)) or self._load(
            schema_id, indexes, None, None, None
        )
        if error is not None:
            raise SerializationError(error)
        return plain_schema(cls.DESCRIPTOR)

    def __repr__(self) -> str:
        name = "None" if self.message_class is None else self.message_class.DESCRIPTOR.full_name
        return f"ProtobufSerde({name}, registry={self.registry!r})"


def _file_text(file: Any) -> str:
    return base64.standard_b64encode(file.serialized_pb).decode("ascii")


def _version_of(registry: Any, subject: str, schema_id: int) -> int:
    """The version of ``subject`` that holds ``schema_id`` (the newest first)."""
    latest: RegisteredSchema | None = registry.latest(subject)
    number = latest.version if latest is not None else 0
    while number > 0:
        found = (
            latest
            if latest is not None and latest.version == number
            else registry.version(subject, number)
        )
        if found.schema_id == schema_id:
            return number
        number -= 1
    raise SerializationError(f"subject {subject!r} holds no version of schema id {schema_id}")


def _builtin_module(name: str) -> str:
    """The module that ships a file every reader knows: protobuf's well-known types
    (``google/protobuf``), Google's common types (``google/type``, googleapis-common-protos)
    and confluent-kafka's own (``confluent/``), as confluent-kafka's readers find them."""
    dotted = name.removesuffix(".proto").replace("/", ".") + "_pb2"
    return f"confluent_kafka.schema_registry.{dotted}" if name.startswith("confluent/") else dotted


def _add_builtin(pool: Any, name: str) -> None:
    try:
        file = importlib.import_module(_builtin_module(name)).DESCRIPTOR
    except ImportError as exc:
        raise ValueError(
            f"{name} is not a file this Python environment ships (google/type needs "
            "googleapis-common-protos, confluent/ needs confluent-kafka's schema registry)"
        ) from exc
    _add_file(pool, file.serialized_pb, name)


def _add_file(pool: Any, serialized: bytes, name: str) -> None:
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    proto.ParseFromString(serialized)
    proto.name = name
    try:
        pool.FindFileByName(name)
        return
    except KeyError:
        pass
    for dependency in proto.dependency:
        if _builtin(dependency):
            try:
                pool.FindFileByName(dependency)
            except KeyError:
                _add_builtin(pool, dependency)
    pool.Add(proto)


def _writer_descriptor(registry: Any, schema: Schema, indexes: tuple[int, ...]) -> Any:
    """The descriptor of the message at ``indexes`` of ``schema``, its imports resolved in a
    pool of its own."""
    descriptor_pool, _, _ = _protobuf()
    pool = descriptor_pool.DescriptorPool()

    def add(found: Schema, name: str, seen: set[str]) -> None:
        for ref in found.references:
            if ref.name not in seen:
                seen.add(ref.name)
                add(registry.version(ref.subject, ref.version).as_schema(), ref.name, seen)
        _add_file(pool, base64.b64decode(found.text), name)

    from google.protobuf import descriptor_pb2

    root = descriptor_pb2.FileDescriptorProto()
    root.ParseFromString(base64.b64decode(schema.text))
    add(schema, root.name or "default", set())
    file = pool.FindFileByName(root.name or "default")
    messages = list(file.message_types_by_name.values())
    descriptor = messages[indexes[0]]
    for index in indexes[1:]:
        descriptor = descriptor.nested_types[index]
    return descriptor
