"""JSON Schema serde in Confluent's wire format: the bytes confluent-kafka's ``JSONSerializer``
writes and its ``JSONDeserializer`` reads.

A payload is the magic byte, the schema id, then the value as compact UTF-8 JSON (orjson's
output when orjson is installed, else ``json.dumps`` with ``(",", ":")`` separators, as
confluent-kafka does). Values are validated on encode, so a value the schema refuses is never
published; ``$ref`` to other subjects resolves through the schema's references.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from bolide.facade.errors import SerializationError
from bolide.facade.schemas.base import SchemaSerde
from bolide.facade.schemas.framing import decode_failure
from bolide.facade.schemas.json_compat import load_json_schema
from bolide.facade.schemas.plain import json_plain_schema
from bolide.facade.schemas.registry import Schema, SchemaReference, as_schema, resolve_named

__all__ = ["JsonSchemaSerde", "dumps"]


def _dumps() -> Callable[[Any], bytes]:
    try:
        import orjson
    except ImportError:
        return lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return orjson.dumps  # type: ignore[no-any-return]


#: A value as confluent-kafka's ``JSONSerializer`` writes it.
dumps = _dumps()


def _where(error: Any) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f"field /{path}" if path else "the value"


class JsonSchemaSerde(SchemaSerde):
    """Encodes values to, and decodes them from, Confluent-framed JSON validated by a schema.

    Args:
        schema: The JSON Schema (text, dict or ``True``).
        registry: See ``AvroSerde``.
        subject: See ``AvroSerde``.
        references: The schemas a ``$ref`` names, registered under other subjects
            (``SchemaReference(name, subject, version)``; ``name`` is what ``$ref`` says).
        validate_decoded: Check decoded values against their writer's schema as well.
        subject_name_strategy: See ``SchemaSerde``; the record name is the schema's ``title``.
        framing: See ``SchemaSerde``.

    Raises:
        SerializationError: ``schema`` is not a valid JSON Schema.
        ImportError: The ``jsonschema`` extra is missing.
    """

    schema_type = "JSON"

    def __init__(
        self,
        schema: Any,
        *,
        registry: Any = None,
        subject: str | None = None,
        references: Sequence[SchemaReference] = (),
        validate_decoded: bool = False,
        subject_name_strategy: str = "TopicNameStrategy",
        framing: str = "prefix",
    ) -> None:
        try:
            import jsonschema  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                "JsonSchemaSerde needs the jsonschema extra: pip install 'bolide[jsonschema]'"
            ) from exc
        super().__init__(
            registry=registry,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
            framing=framing,
        )
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
        self.schema = as_schema(Schema(text, "JSON", tuple(references)))
        self.validate_decoded = validate_decoded
        self._document = json.loads(self.schema.text)
        self._validator: Any = None
        # schema id -> (validator or None, document, error or None)
        self._writers: dict[int, tuple[Any, Any, str | None]] = {}

    def record_name(self) -> str | None:
        """The schema's ``title``."""
        title = self._document.get("title") if isinstance(self._document, dict) else None
        return str(title) if title else None

    def _registrable(self, stream: str) -> Schema:
        return self.schema

    def _validator_for(self, document: Any, references: Sequence[SchemaReference]) -> Any:
        """A validator of ``document`` whose ``$ref``\\s resolve to the referenced schemas."""
        from jsonschema.validators import validator_for
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        named = resolve_named(references, self._typed_registry().version) if references else {}
        resources = [
            (name, Resource.from_contents(json.loads(s.text), default_specification=DRAFT202012))
            for name, s in named.items()
        ]
        cls = validator_for(document)
        return cls(document, registry=Registry().with_resources(resources))

    def encode(self, value: Any, *, stream: str) -> bytes:
        """The payload of ``value`` after checking it against the schema.

        Raises:
            SerializationError: ``value`` breaks the schema (the error names the field) or
                is not JSON, or the registry refused the schema (``SchemaIncompatibleError``).
        """
        if self._validator is None:  # its references resolve before anything is registered
            self._validator = self._validator_for(self._document, self.schema.references)
        prefix = self._prefixes.get(stream)
        if prefix is None:
            prefix = self.framed_prefix(stream)
        error = _first_error(self._validator, value)
        if error is not None:
            raise SerializationError(
                f"cannot encode for stream {stream!r}: {_where(error)}: {error.message}",
                stream=stream,
            )
        try:
            return prefix + dumps(value)
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"cannot encode {type(value).__name__} for stream {stream!r} as JSON: {exc}",
                stream=stream,
            ) from exc

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
                schema that is not JSON Schema, a body that is not JSON, or (with
                ``validate_decoded``) a value its schema refuses; naming the record's place.
        """
        schema_id, ref = self.locate(data, headers, stream, partition, offset)
        validator, _document, error = self._writers.get(schema_id) or self._load(
            schema_id, stream, partition, offset
        )
        if error is not None:
            raise decode_failure(error, stream, partition, offset)
        try:
            value = json.loads(bytes(data[ref.body_at :]))
        except ValueError as exc:
            raise decode_failure(f"the body is not JSON: {exc}", stream, partition, offset) from exc
        if validator is not None:
            invalid = _first_error(validator, value)
            if invalid is not None:
                reason = f"{_where(invalid)}: {invalid.message}"
                raise decode_failure(reason, stream, partition, offset)
        return value

    def _load(
        self, schema_id: int, stream: str | None, partition: int | None, offset: int | None
    ) -> tuple[Any, Any, str | None]:
        schema = self.fetch_schema(schema_id, stream, partition, offset)
        entry: tuple[Any, Any, str | None]
        if schema.schema_type != "JSON":
            entry = (
                None,
                None,
                f"schema id {schema_id} is a {schema.schema_type} schema, not JSON",
            )
        else:
            document = load_json_schema(schema.text)
            validator = (
                self._validator_for(document, schema.references) if self.validate_decoded else None
            )
            entry = (validator, document, None)
        self._writers[schema_id] = entry
        return entry

    def plain(self, value: Any) -> Any:
        """JSON values already are plain data."""
        return value

    def value_schema(self, schema_id: int) -> Any:
        """The Avro-shaped schema of values written with ``schema_id`` (for the typed
        archive's columns).

        Raises:
            SerializationError: The id is unknown or not a JSON Schema.
        """
        _validator, document, error = self._writers.get(schema_id) or self._load(
            schema_id, None, None, None
        )
        if error is not None:
            raise SerializationError(error)
        return json_plain_schema(document)

    def __repr__(self) -> str:
        subject = f", subject={self.subject!r}" if self.subject else ""
        return f"JsonSchemaSerde(registry={self.registry!r}{subject})"


def _first_error(validator: Any, value: Any) -> Any:
    """The most relevant error of an invalid ``value``, else ``None`` (valid values are
    checked without collecting errors)."""
    if validator.is_valid(value):
        return None
    from jsonschema.exceptions import best_match

    return best_match(validator.iter_errors(value))
