"""Schema registries: one interface, three homes for schema ids, for Avro, Protobuf and JSON
Schema alike.

* ``MemorySchemaRegistry``: in this process only (tests, single-process tools);
* ``bolide.stores.SqlSchemaRegistry``: the SQL store's schema tables, the default for
  deployments that already run a history store;
* ``ConfluentSchemaRegistry``: Confluent Schema Registry through confluent-kafka's client, for
  interoperating with other Kafka services.

Every registry assigns one global id (and a GUID) per distinct schema, as Confluent does,
numbers versions per subject, keeps each schema's format and references, and refuses a schema
that breaks the subject's compatibility level with ``SchemaIncompatibleError`` carrying the
reasons.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from bolide.facade.errors import SchemaIncompatibleError, SchemaNotFoundError, SerializationError
from bolide.facade.ports import (
    SCHEMA_TYPES,
    Compatibility,
    RegisteredSchema,
    Schema,
    SchemaReference,
    SchemaRegistry,
    TypedSchemaRegistry,
)
from bolide.facade.redaction import config_secrets, redact, redact_text, redact_url, url_secrets
from bolide.facade.schemas.avro_compat import (
    PRIMITIVES,
    load_schema,
    parse_with_names,
    reader_incompatibilities,
)
from bolide.facade.schemas.json_compat import json_incompatibilities, load_json_schema
from bolide.facade.schemas.protobuf_compat import file_proto, protobuf_incompatibilities

__all__ = [
    "Compatibility",
    "ConfluentSchemaRegistry",
    "MemorySchemaRegistry",
    "RegisteredSchema",
    "Schema",
    "SchemaReference",
    "SchemaRegistry",
    "TypedSchemaRegistry",
    "as_schema",
    "check_compatible",
    "fingerprint_of",
    "guid_of",
    "incompatibilities",
    "schema_fingerprint",
    "schema_text",
]

#: Referenced schemas by the name the referring schema uses (what a check needs of them).
Named = Mapping[str, Schema]
_GUIDS = uuid.UUID("6f1c5f4e-52b1-4d3e-9a7c-2d0b8f3c1a10")


def schema_text(schema: Any) -> str:
    """Return the text a registry stores for an Avro ``schema`` (JSON text, dict or list).

    Text is kept as written (stripped), so a registry sees the same string confluent-kafka's
    ``AvroSerializer`` registers; dicts and lists become compact JSON.

    Raises:
        SerializationError: The schema is not valid Avro.
    """
    if isinstance(schema, str):
        text = schema.strip()
        if text in PRIMITIVES:
            text = json.dumps(text)  # a bare type name, as fastavro accepts it
        if text[:1] not in ("{", "["):
            text = '{"type":' + text + "}"  # confluent-kafka's form for primitive schemas
    else:
        text = json.dumps(schema, separators=(",", ":"))
    try:
        parse_with_names(text)
    except Exception as exc:
        raise SerializationError(f"invalid Avro schema: {exc}") from exc
    return text


def as_schema(schema: Any) -> Schema:
    """A registrable ``Schema``: a ``Schema`` checked for its format, or Avro text or data.

    Raises:
        SerializationError: The schema is not valid in its format, or names no known format.
    """
    if not isinstance(schema, Schema):
        return Schema(schema_text(schema))
    kind = schema.schema_type.upper()
    if kind not in SCHEMA_TYPES:
        raise SerializationError(f"schema type {schema.schema_type!r} is not one of {SCHEMA_TYPES}")
    if kind == "AVRO":
        if schema.references:  # named types of other subjects: fastavro checks them at use
            return Schema(schema.text.strip(), kind, tuple(schema.references))
        return Schema(schema_text(schema.text), kind, ())
    try:
        if kind == "PROTOBUF":
            file_proto(schema.text)
        else:
            load_json_schema(schema.text)
    except ValueError as exc:
        raise SerializationError(f"invalid {kind} schema: {exc}") from exc
    return Schema(schema.text.strip(), kind, tuple(schema.references))


def schema_fingerprint(text: str) -> str:
    """SHA-256 of an Avro schema's JSON with sorted keys: equal schemas, equal fingerprints."""
    canonical = json.dumps(load_schema(text), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def fingerprint_of(schema: Schema) -> str:
    """Equal schemas (format, text as data, references), equal fingerprints; an Avro schema
    without references keeps ``schema_fingerprint``'s (the rows stored before other formats)."""
    if schema.schema_type == "AVRO" and not schema.references:
        return schema_fingerprint(schema.text)
    body = json.loads(schema.text) if schema.schema_type != "PROTOBUF" else schema.text
    whole = {
        "type": schema.schema_type,
        "schema": body,
        "references": [[r.name, r.subject, r.version] for r in schema.references],
    }
    canonical = json.dumps(whole, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def guid_of(fingerprint: str) -> str:
    """The GUID bolide's own registries give a schema: one per fingerprint, in every process."""
    return str(uuid.uuid5(_GUIDS, fingerprint))


def incompatibilities(reader: Schema, writer: Schema, named: Named | None = None) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote (empty: it can), for any format."""
    if reader.schema_type != writer.schema_type:
        return [f"schema type {writer.schema_type} became {reader.schema_type}"]
    if reader.schema_type == "PROTOBUF":
        return protobuf_incompatibilities(reader.text, writer.text)
    if reader.schema_type == "JSON":
        documents = {name: json.loads(s.text) for name, s in (named or {}).items()}
        return json_incompatibilities(reader.text, writer.text, documents)
    return reader_incompatibilities(reader.text, writer.text)


def check_compatible(
    subject: str,
    level: Compatibility,
    new: Schema | str,
    versions: Sequence[Schema | str],
    named: Named | None = None,
) -> None:
    """Refuse ``new`` if it breaks ``level`` against the subject's ``versions`` (oldest first).

    Plain text is an Avro schema. ``named`` holds the schemas references resolve to.

    Raises:
        SchemaIncompatibleError: With one reason per incompatibility found.
    """
    if level is Compatibility.NONE or not versions:
        return
    typed = [v if isinstance(v, Schema) else Schema(v) for v in versions]
    fresh = new if isinstance(new, Schema) else Schema(new)
    against = typed if level.value.endswith("_TRANSITIVE") else [typed[-1]]
    base = level.value.removesuffix("_TRANSITIVE")
    reasons: list[str] = []
    for old in against:
        if base in ("BACKWARD", "FULL"):
            found = incompatibilities(fresh, old, named)
            reasons += [f"new schema cannot read old data: {r}" for r in found]
        if base in ("FORWARD", "FULL"):
            found = incompatibilities(old, fresh, named)
            reasons += [f"old schema cannot read new data: {r}" for r in found]
    if reasons:
        raise SchemaIncompatibleError(
            f"schema for subject {subject!r} breaks {level.value} compatibility: "
            + "; ".join(dict.fromkeys(reasons)),
            subject=subject,
            reasons=list(dict.fromkeys(reasons)),
        )


def resolve_named(
    references: Sequence[SchemaReference], version: Callable[[str, int], RegisteredSchema]
) -> dict[str, Schema]:
    """The schemas ``references`` name, and theirs in turn, by the name each is used under.

    Raises:
        SchemaNotFoundError: A reference names a subject version the registry does not have.
    """
    found: dict[str, Schema] = {}
    pending = list(references)
    while pending:
        ref = pending.pop()
        if ref.name in found:
            continue
        schema = version(ref.subject, ref.version).as_schema()
        found[ref.name] = schema
        pending.extend(schema.references)
    return found


class MemorySchemaRegistry:
    """A registry held in this process: ids are not shared with other processes.

    Meant for tests and single-process tools; use ``SqlSchemaRegistry`` or
    ``ConfluentSchemaRegistry`` when other processes decode the records.

    Args:
        schemas: Schemas to know by id from the start (``schemas()`` or ``typed_schemas()``
            of another registry), so a copy in another process decodes what this one
            encoded. Text is Avro.
        subjects: The subjects' versions to know from the start (``subjects()`` of another
            registry): what references resolve through.
    """

    def __init__(
        self,
        schemas: Mapping[int, str | Schema] | None = None,
        *,
        subjects: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}  # fingerprint -> id
        self._schemas: dict[int, Schema] = {}
        self._guids: dict[str, int] = {}
        self._subjects: dict[str, list[int]] = {}
        self._levels: dict[str, Compatibility] = {}
        for schema_id, given in (schemas or {}).items():
            self._keep(int(schema_id), given if isinstance(given, Schema) else Schema(given))
        for subject, ids in (subjects or {}).items():
            self._subjects[subject] = [int(i) for i in ids]

    def _keep(self, schema_id: int, schema: Schema) -> None:
        fingerprint = fingerprint_of(schema)
        self._schemas[schema_id] = schema
        self._ids[fingerprint] = schema_id
        self._guids[guid_of(fingerprint)] = schema_id

    def schemas(self) -> dict[int, str]:
        """Every schema's text registered so far, by id (a copy)."""
        with self._lock:
            return {i: s.text for i, s in self._schemas.items()}

    def typed_schemas(self) -> dict[int, Schema]:
        """Every schema registered so far, with its format and references, by id (a copy)."""
        with self._lock:
            return dict(self._schemas)

    def subjects(self) -> dict[str, list[int]]:
        """Each subject's schema ids, oldest version first (a copy)."""
        with self._lock:
            return {subject: list(ids) for subject, ids in self._subjects.items()}

    def register(self, subject: str, schema: Any) -> int:
        """See ``SchemaRegistry.register``; ``schema`` may be a ``Schema`` of any format."""
        typed = as_schema(schema)
        fingerprint = fingerprint_of(typed)
        with self._lock:
            versions = self._subjects.setdefault(subject, [])
            known = self._ids.get(fingerprint)
            if known is not None and known in versions:
                return known
            named = resolve_named(typed.references, self._version)
            level = self._levels.get(subject, Compatibility.BACKWARD)
            check_compatible(subject, level, typed, [self._schemas[i] for i in versions], named)
            if known is None:
                known = max(self._schemas, default=0) + 1
                self._keep(known, typed)
            versions.append(known)
            return known

    def get_schema(self, schema_id: int) -> str:
        """See ``SchemaRegistry.get_schema``."""
        return self.schema(schema_id).text

    def schema(self, schema_id: int) -> Schema:
        """See ``TypedSchemaRegistry.schema``."""
        try:
            return self._schemas[schema_id]
        except KeyError:
            raise SchemaNotFoundError(f"schema id {schema_id} is not registered") from None

    def _version(self, subject: str, version: int) -> RegisteredSchema:
        versions = self._subjects.get(subject, [])
        if not 1 <= version <= len(versions):
            raise SchemaNotFoundError(f"subject {subject!r} has no version {version}")
        found = self._schemas[versions[version - 1]]
        return RegisteredSchema(
            subject,
            version,
            versions[version - 1],
            found.text,
            found.schema_type,
            found.references,
        )

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """See ``TypedSchemaRegistry.version``."""
        with self._lock:
            return self._version(subject, version)

    def guid(self, schema_id: int) -> str:
        """See ``TypedSchemaRegistry.guid``."""
        return guid_of(fingerprint_of(self.schema(schema_id)))

    def id_of_guid(self, guid: str, subject: str | None = None) -> int:
        """See ``TypedSchemaRegistry.id_of_guid`` (GUIDs are global here: no subject needed)."""
        try:
            return self._guids[guid]
        except KeyError:
            raise SchemaNotFoundError(f"schema GUID {guid} is not registered") from None

    def latest(self, subject: str) -> RegisteredSchema | None:
        """See ``SchemaRegistry.latest``."""
        with self._lock:
            versions = self._subjects.get(subject)
            if not versions:
                return None
            return self._version(subject, len(versions))

    def compatibility(self, subject: str) -> Compatibility:
        """See ``SchemaRegistry.compatibility``."""
        return self._levels.get(subject, Compatibility.BACKWARD)

    def set_compatibility(self, subject: str, level: Compatibility | str) -> None:
        """See ``SchemaRegistry.set_compatibility``."""
        self._levels[subject] = Compatibility.of(level)


class ConfluentSchemaRegistry:
    """Confluent Schema Registry through confluent-kafka's ``SchemaRegistryClient``.

    Args:
        url: The registry's URL (``http(s)://host:8081``). A ``mock://`` URL gives
            confluent-kafka's in-process mock; as the mock does not enforce compatibility,
            this class checks it locally there, with levels kept in this object.
        **conf: Further ``SchemaRegistryClient`` settings by their dotted names
            (``"basic.auth.user.info"``, ``"ssl.ca.location"``...).

    Credentials (in the URL or ``conf``) never appear in ``repr`` or error messages.

    Raises:
        ImportError: The ``registry`` extra is missing (``pip install 'bolide[registry]'``).
        ValueError: confluent-kafka refuses the URL or a setting.
    """

    def __init__(self, url: str, **conf: Any) -> None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                "ConfluentSchemaRegistry needs the registry extra: pip install 'bolide[registry]'"
            ) from exc
        if not isinstance(url, str) or not url:
            raise ValueError("url must be the schema registry's URL")
        self.url = url
        self.conf = dict(conf)
        self._secrets = url_secrets(url) + config_secrets(self.conf)
        try:
            self.client: Any = SchemaRegistryClient.new_client(_client_conf(url, self.conf))
        except ValueError as exc:  # "Invalid url http://user:password@..."
            raise ValueError(f"schema registry {redact_url(url)}: {self._scrub(exc)}") from None
        self._emulated = url.startswith("mock://")
        self._levels: dict[str, Compatibility] = {}
        self._guids: dict[int, str] = {}
        self._ids: dict[str, int] = {}

    def _error(self, exc: Exception, what: str) -> SerializationError:
        # Transport failures and 5xx answers may pass; a 4xx answer will not.
        status = getattr(exc, "http_status_code", None)
        retriable = not isinstance(status, int) or status < 0 or status >= 500
        return SerializationError(
            f"schema registry {redact_url(self.url)}: {what} failed: {self._scrub(exc)}",
            retriable=retriable,
        )

    def _scrub(self, exc: object) -> str:
        """``exc`` as text without this registry's credentials."""
        return redact_text(str(exc), self._secrets)

    def register(self, subject: str, schema: Any) -> int:
        """See ``SchemaRegistry.register``; the server's refusal becomes the typed error."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        typed = as_schema(schema)
        if self._emulated:
            known = self._check_locally(subject, typed)
            if known is not None:
                return known
        try:
            found = self.client.register_schema_full_response(subject, _client_schema(typed))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                reason = self._scrub(exc.error_message)
                raise SchemaIncompatibleError(
                    f"schema registry refused the schema for subject {subject!r}: {reason}",
                    subject=subject,
                    reasons=[reason],
                ) from exc
            raise self._error(exc, f"registering under {subject!r}") from exc
        except Exception as exc:
            raise self._error(exc, f"registering under {subject!r}") from exc
        schema_id = int(found.schema_id)
        if found.guid:
            self._guids[schema_id] = str(found.guid)
            self._ids[str(found.guid)] = schema_id
        return schema_id

    def _check_locally(self, subject: str, typed: Schema) -> int | None:
        """Do what the server does and the mock does not: find equal schemas, check levels."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            numbers = self.client.get_versions(subject)
        except SchemaRegistryError:
            return None
        fingerprint = fingerprint_of(typed)
        versions = []
        for number in sorted(numbers):
            registered = _registered(subject, self.client.get_version(subject, number))
            if fingerprint_of(registered.as_schema()) == fingerprint:
                return registered.schema_id
            versions.append(registered.as_schema())
        named = resolve_named(typed.references, self.version)
        check_compatible(subject, self.compatibility(subject), typed, versions, named)
        return None

    def get_schema(self, schema_id: int) -> str:
        """See ``SchemaRegistry.get_schema``."""
        return self.schema(schema_id).text

    def schema(self, schema_id: int) -> Schema:
        """See ``TypedSchemaRegistry.schema`` (Protobuf in its serialized form)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return _bolide_schema(self.client.get_schema(schema_id, fmt="serialized"))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaNotFoundError(f"schema id {schema_id} is not registered") from exc
            raise self._error(exc, f"fetching schema id {schema_id}") from exc
        except Exception as exc:
            raise self._error(exc, f"fetching schema id {schema_id}") from exc

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """See ``TypedSchemaRegistry.version``."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return _registered(subject, self.client.get_version(subject, version, fmt="serialized"))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaNotFoundError(f"subject {subject!r} has no version {version}") from exc
            raise self._error(exc, f"reading {subject!r} version {version}") from exc
        except Exception as exc:  # the transport: maybe retriable
            raise self._error(exc, f"reading {subject!r} version {version}") from exc

    def guid(self, schema_id: int) -> str:
        """See ``TypedSchemaRegistry.guid``: the server's, learnt when this object registered
        the schema (the header framing is written by a serde that registered first)."""
        try:
            return self._guids[schema_id]
        except KeyError:
            raise SchemaNotFoundError(
                f"schema id {schema_id}: its GUID is known only once registered through this "
                "object (the registry answered none)"
            ) from None

    def id_of_guid(self, guid: str, subject: str | None = None) -> int:
        """See ``TypedSchemaRegistry.id_of_guid``: the server answers a GUID with its schema,
        whose id under ``subject`` a lookup gives (GUIDs this object registered are known)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        known = self._ids.get(guid)
        if known is not None:
            return known
        if subject is None:
            raise SchemaNotFoundError(
                f"schema GUID {guid}: Confluent's API answers its id for a subject only"
            )
        try:
            found = self.client.get_schema_by_guid(guid, fmt="serialized")
            schema_id = int(self.client.lookup_schema(subject, found).schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaNotFoundError(
                    f"schema GUID {guid} is not registered under {subject!r}"
                ) from exc
            raise self._error(exc, f"fetching schema GUID {guid}") from exc
        except Exception as exc:  # the transport: maybe retriable
            raise self._error(exc, f"fetching schema GUID {guid}") from exc
        self._ids[guid] = schema_id
        self._guids[schema_id] = guid
        return schema_id

    def latest(self, subject: str) -> RegisteredSchema | None:
        """See ``SchemaRegistry.latest``."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            found = self.client.get_latest_version(subject, fmt="serialized")
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise self._error(exc, f"reading subject {subject!r}") from exc
        except Exception as exc:  # the transport: maybe retriable
            raise self._error(exc, f"reading subject {subject!r}") from exc
        return _registered(subject, found)

    def compatibility(self, subject: str) -> Compatibility:
        """The subject's level; the registry's global level when the subject has none."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if self._emulated:
            return self._levels.get(subject, Compatibility.BACKWARD)
        try:
            return Compatibility.of(self.client.get_compatibility(subject))
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise self._error(exc, f"reading the level of {subject!r}") from exc
        return Compatibility.of(self.client.get_compatibility())

    def set_compatibility(self, subject: str, level: Compatibility | str) -> None:
        """See ``SchemaRegistry.set_compatibility``."""
        checked = Compatibility.of(level)
        if self._emulated:
            self._levels[subject] = checked
            return
        self.client.set_compatibility(subject_name=subject, level=checked.value)

    def close(self) -> None:
        """Close the client's HTTP connections (the registry is unusable afterwards)."""
        close = getattr(self.client, "close", None)  # the mock has none: it holds no sockets
        if close is not None:
            close()

    def __repr__(self) -> str:
        conf = f", {redact(self.conf)!r}" if self.conf else ""
        return f"ConfluentSchemaRegistry({redact_url(self.url)!r}{conf})"


def _client_schema(schema: Schema) -> Any:
    """confluent-kafka's ``Schema`` of ``schema``."""
    from confluent_kafka.schema_registry import Schema as ClientSchema
    from confluent_kafka.schema_registry import SchemaReference as ClientReference

    references = [ClientReference(r.name, r.subject, r.version) for r in schema.references]
    return ClientSchema(schema.text, schema.schema_type, references)


def _bolide_schema(found: Any) -> Schema:
    """bolide's ``Schema`` of confluent-kafka's."""
    references = tuple(
        SchemaReference(str(r.name), str(r.subject), int(r.version))
        for r in (found.references or ())
    )
    return Schema(str(found.schema_str), str(found.schema_type or "AVRO"), references)


def _registered(subject: str, found: Any) -> RegisteredSchema:
    """bolide's ``RegisteredSchema`` of confluent-kafka's."""
    schema = _bolide_schema(found.schema)
    return RegisteredSchema(
        subject,
        int(found.version),
        int(found.schema_id),
        schema.text,
        schema.schema_type,
        schema.references,
    )


def _client_conf(url: str, conf: Mapping[str, Any]) -> dict[str, Any]:
    """``SchemaRegistryClient`` settings, with the URL's credentials in ``basic.auth.user.info``.

    The client takes them from the first URL, as here, but also keeps them in every request
    URL, which its HTTP library logs.
    """
    try:
        urls = [urlsplit(part.strip()) for part in url.split(",")]
        password = urls[0].password
    except ValueError:
        password = None  # the client rejects the URL with its own message
    if password is None or "basic.auth.user.info" in conf:
        return {"url": url, **conf}
    bare = ",".join(urlunsplit(u._replace(netloc=u.netloc.rpartition("@")[2])) for u in urls)
    user_info = f"{unquote(urls[0].username or '')}:{unquote(password)}"
    return {"url": bare, "basic.auth.user.info": user_info, **conf}
