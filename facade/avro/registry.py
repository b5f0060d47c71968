"""Schema registries: one interface, three homes for Avro schema ids.

* ``MemorySchemaRegistry``: in this process only (tests, single-process tools);
* ``bolide.stores.SqlSchemaRegistry``: the SQL store's schema tables, the default for
  deployments that already run a history store;
* ``ConfluentSchemaRegistry``: Confluent Schema Registry through confluent-kafka's client, for
  interoperating with other Kafka services.

Every registry assigns one global id per distinct schema (as Confluent does), numbers versions
per subject, and refuses a schema that breaks the subject's compatibility level with
``SchemaIncompatibleError`` carrying the reasons.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from bolide.facade.avro.compat import (
    PRIMITIVES,
    load_schema,
    parse_with_names,
    reader_incompatibilities,
)
from bolide.facade.errors import SchemaIncompatibleError, SchemaNotFoundError, SerializationError
from bolide.facade.ports import Compatibility, RegisteredSchema, SchemaRegistry
from bolide.facade.redaction import config_secrets, redact, redact_text, redact_url, url_secrets

__all__ = [
    "Compatibility",
    "ConfluentSchemaRegistry",
    "MemorySchemaRegistry",
    "RegisteredSchema",
    "SchemaRegistry",
    "check_compatible",
    "schema_fingerprint",
    "schema_text",
]


def schema_text(schema: Any) -> str:
    """Return the text a registry stores for ``schema`` (JSON text, dict or list).

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


def schema_fingerprint(text: str) -> str:
    """SHA-256 of the schema's JSON with sorted keys: equal schemas, equal fingerprints."""
    canonical = json.dumps(load_schema(text), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_compatible(subject: str, level: Compatibility, new: str, versions: Sequence[str]) -> None:
    """Refuse ``new`` if it breaks ``level`` against the subject's ``versions`` (oldest first).

    Raises:
        SchemaIncompatibleError: With one reason per incompatibility found.
    """
    if level is Compatibility.NONE or not versions:
        return
    against = list(versions) if level.value.endswith("_TRANSITIVE") else [versions[-1]]
    base = level.value.removesuffix("_TRANSITIVE")
    reasons: list[str] = []
    for old in against:
        if base in ("BACKWARD", "FULL"):
            reasons += [f"new schema cannot read old data: {r}" for r in _reasons(new, old)]
        if base in ("FORWARD", "FULL"):
            reasons += [f"old schema cannot read new data: {r}" for r in _reasons(old, new)]
    if reasons:
        raise SchemaIncompatibleError(
            f"schema for subject {subject!r} breaks {level.value} compatibility: "
            + "; ".join(reasons),
            subject=subject,
            reasons=reasons,
        )


def _reasons(reader: str, writer: str) -> list[str]:
    return reader_incompatibilities(reader, writer)


class MemorySchemaRegistry:
    """A registry held in this process: ids are not shared with other processes.

    Meant for tests and single-process tools; use ``SqlSchemaRegistry`` or
    ``ConfluentSchemaRegistry`` when other processes decode the records.

    Args:
        schemas: Schemas to know by id from the start (``schemas()`` of another registry), so
            a copy in another process decodes what this one encoded.
    """

    def __init__(self, schemas: Mapping[int, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}  # fingerprint -> id
        self._texts: dict[int, str] = {}
        self._subjects: dict[str, list[int]] = {}
        self._levels: dict[str, Compatibility] = {}
        for schema_id, text in (schemas or {}).items():
            self._texts[int(schema_id)] = text
            self._ids[schema_fingerprint(text)] = int(schema_id)

    def schemas(self) -> dict[int, str]:
        """Every schema registered so far, by id (a copy)."""
        with self._lock:
            return dict(self._texts)

    def register(self, subject: str, schema: Any) -> int:
        """See ``SchemaRegistry.register``."""
        text = schema_text(schema)
        fingerprint = schema_fingerprint(text)
        with self._lock:
            versions = self._subjects.setdefault(subject, [])
            known = self._ids.get(fingerprint)
            if known is not None and known in versions:
                return known
            level = self._levels.get(subject, Compatibility.BACKWARD)
            check_compatible(subject, level, text, [self._texts[i] for i in versions])
            if known is None:
                known = max(self._texts, default=0) + 1
                self._ids[fingerprint] = known
                self._texts[known] = text
            versions.append(known)
            return known

    def get_schema(self, schema_id: int) -> str:
        """See ``SchemaRegistry.get_schema``."""
        try:
            return self._texts[schema_id]
        except KeyError:
            raise SchemaNotFoundError(f"schema id {schema_id} is not registered") from None

    def latest(self, subject: str) -> RegisteredSchema | None:
        """See ``SchemaRegistry.latest``."""
        with self._lock:
            versions = self._subjects.get(subject)
            if not versions:
                return None
            last = versions[-1]
            return RegisteredSchema(subject, len(versions), last, self._texts[last])

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
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = schema_text(schema)
        if self._emulated:
            known = self._check_locally(subject, text)
            if known is not None:
                return known
        try:
            return int(self.client.register_schema(subject, Schema(text, "AVRO")))
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

    def _check_locally(self, subject: str, text: str) -> int | None:
        """Do what the server does and the mock does not: find equal schemas, check levels."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            numbers = self.client.get_versions(subject)
        except SchemaRegistryError:
            return None
        fingerprint = schema_fingerprint(text)
        texts = []
        for number in sorted(numbers):
            registered = self.client.get_version(subject, number)
            if schema_fingerprint(registered.schema.schema_str) == fingerprint:
                return int(registered.schema_id)
            texts.append(registered.schema.schema_str)
        check_compatible(subject, self.compatibility(subject), text, texts)
        return None

    def get_schema(self, schema_id: int) -> str:
        """See ``SchemaRegistry.get_schema``."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return str(self.client.get_schema(schema_id).schema_str)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaNotFoundError(f"schema id {schema_id} is not registered") from exc
            raise self._error(exc, f"fetching schema id {schema_id}") from exc
        except Exception as exc:
            raise self._error(exc, f"fetching schema id {schema_id}") from exc

    def latest(self, subject: str) -> RegisteredSchema | None:
        """See ``SchemaRegistry.latest``."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            found = self.client.get_latest_version(subject)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise self._error(exc, f"reading subject {subject!r}") from exc
        return RegisteredSchema(
            subject, int(found.version), int(found.schema_id), str(found.schema.schema_str)
        )

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

    def __repr__(self) -> str:
        conf = f", {redact(self.conf)!r}" if self.conf else ""
        return f"ConfluentSchemaRegistry({redact_url(self.url)!r}{conf})"


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
