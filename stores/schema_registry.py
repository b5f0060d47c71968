"""SqlSchemaRegistry: schema ids (Avro, Protobuf, JSON Schema) kept in the history store's
database.

A deployment that already runs a ``SqlStore`` needs no other service for schema ids: the
tables of revisions ``0002`` and ``0012`` hold each distinct schema once (a global id and a
GUID, as Confluent Schema Registry assigns, its format and references), the versions of each
subject, and each subject's compatibility level.
Registration runs in one transaction; a concurrent registration of the same schema or subject
version is retried, so every process agrees on one id.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from bolide.facade.errors import SchemaNotFoundError
from bolide.facade.schemas.registry import (
    Compatibility,
    RegisteredSchema,
    Schema,
    SchemaReference,
    as_schema,
    check_compatible,
    fingerprint_of,
    guid_of,
    resolve_named,
)
from bolide.stores.dialects import dialect_of
from bolide.stores.schema import SCHEMA_SUBJECTS, SCHEMA_VERSIONS, SCHEMAS
from bolide.stores.store import SqlStore

__all__ = ["SqlSchemaRegistry"]

_ATTEMPTS = 5


class SqlSchemaRegistry:
    """A schema registry on the SQL store's database (SQLite or PostgreSQL).

    Args:
        store_or_url: A ``SqlStore``, or a database URL for which one is created.

    The database must be at the newest schema revision (``bolide db upgrade --db URL``).
    ``close()`` releases a store created from a URL; a given store stays its owner's.

    Raises:
        SchemaOutOfDateError: On first use, when the registry tables are missing.
    """

    def __init__(self, store_or_url: SqlStore | str) -> None:
        self._owns_store = isinstance(store_or_url, str)
        if isinstance(store_or_url, SqlStore):
            self.store = store_or_url
        elif isinstance(store_or_url, str):
            self.store = SqlStore(store_or_url)
        else:
            raise TypeError(
                f"store_or_url must be a SqlStore or a URL, not {type(store_or_url).__name__}"
            )
        self._schemas: dict[int, Schema] = {}  # ids never change: cache them forever
        self._guids_written: set[int] = set()
        self._ids_of_guids: dict[str, int] = {}
        self._checked = False
        self._lock = threading.Lock()

    def check_schema_once(self) -> None:
        if not self._checked:
            self.store.check_schema()
            self._checked = True

    def register(self, subject: str, schema: Any) -> int:
        """See ``SchemaRegistry.register``; ``schema`` may be a ``Schema`` of any format.

        Raises:
            SchemaIncompatibleError: The schema breaks the subject's compatibility level.
            StoreError: The database failed.
        """
        _check_subject(subject)
        typed = as_schema(schema)
        fingerprint = fingerprint_of(typed)
        self.check_schema_once()
        named = resolve_named(typed.references, self.version)

        def attempts() -> int:
            for attempt in range(_ATTEMPTS):
                try:
                    with self.store.engine.begin() as conn:
                        return self._register(conn, subject, typed, fingerprint, named)
                except exc.IntegrityError:
                    # Another process registered the same schema or version first: look again.
                    if attempt == _ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")  # pragma: no cover

        return self.store.guarded("register", attempts)

    def _register(
        self,
        conn: Connection,
        subject: str,
        typed: Schema,
        fingerprint: str,
        named: dict[str, Schema],
    ) -> int:
        s, v = SCHEMAS.c, SCHEMA_VERSIONS.c
        known = conn.execute(
            sa.select(s.schema_id).where(s.fingerprint == fingerprint)
        ).scalar_one_or_none()
        versions = conn.execute(
            sa.select(v.version, v.schema_id, *_SCHEMA_COLUMNS)
            .join(SCHEMAS, s.schema_id == v.schema_id)
            .where(v.subject == subject)
            .order_by(v.version)
        ).all()
        if known is not None and any(row.schema_id == known for row in versions):
            return int(known)
        level = self._level(conn, subject)
        check_compatible(subject, level, typed, [_schema_of(row) for row in versions], named)
        if known is None:
            conn.execute(
                dialect_of(conn).insert_ignoring(SCHEMAS, [s.fingerprint]),
                {
                    "fingerprint": fingerprint,
                    "schema": typed.text,
                    "schema_type": typed.schema_type,
                    "schema_references": _references_text(typed.references),
                    "guid": guid_of(fingerprint),
                },
            )
            known = conn.execute(
                sa.select(s.schema_id).where(s.fingerprint == fingerprint)
            ).scalar_one()
        version = (versions[-1].version if versions else 0) + 1
        conn.execute(
            sa.insert(SCHEMA_VERSIONS),
            {"subject": subject, "version": version, "schema_id": known},
        )
        return int(known)

    def get_schema(self, schema_id: int) -> str:
        """See ``SchemaRegistry.get_schema``."""
        return self.schema(schema_id).text

    def schema(self, schema_id: int) -> Schema:
        """See ``TypedSchemaRegistry.schema``."""
        found = self._schemas.get(schema_id)
        if found is not None:
            return found
        row = self._fetch_one("schema lookup", SCHEMAS.c.schema_id == schema_id)
        if row is None:
            raise SchemaNotFoundError(f"schema id {schema_id} is not registered")
        self._schemas[schema_id] = found = _schema_of(row)
        return found

    def guid(self, schema_id: int) -> str:
        """See ``TypedSchemaRegistry.guid`` (written to a row that lacks it: one upgraded
        offline)."""
        guid = guid_of(fingerprint_of(self.schema(schema_id)))
        if schema_id not in self._guids_written:
            s = SCHEMAS.c

            def write() -> None:
                with self.store.engine.begin() as conn:
                    conn.execute(
                        sa.update(SCHEMAS)
                        .where(s.schema_id == schema_id, s.guid.is_(None))
                        .values(guid=guid)
                    )

            self.store.guarded("schema GUID", write)
            self._guids_written.add(schema_id)
        return guid

    def id_of_guid(self, guid: str, subject: str | None = None) -> int:
        """See ``TypedSchemaRegistry.id_of_guid`` (GUIDs are global here: no subject needed;
        an answer is kept, as ids are)."""
        known = self._ids_of_guids.get(guid)
        if known is not None:
            return known
        row = self._fetch_one("schema GUID lookup", SCHEMAS.c.guid == guid)
        if row is None:
            raise SchemaNotFoundError(f"schema GUID {guid} is not registered")
        self._ids_of_guids[guid] = int(row.schema_id)
        return int(row.schema_id)

    def _fetch_one(self, what: str, where: Any) -> Any:
        self.check_schema_once()
        query = sa.select(SCHEMAS.c.schema_id, *_SCHEMA_COLUMNS).where(where)

        def fetch() -> Any:
            with self.store.engine.connect() as conn:
                return conn.execute(query).one_or_none()

        return self.store.guarded(what, fetch)

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """See ``TypedSchemaRegistry.version``."""
        found = self._versions(subject, version)
        if found is None:
            raise SchemaNotFoundError(f"subject {subject!r} has no version {version}")
        return found

    def latest(self, subject: str) -> RegisteredSchema | None:
        """See ``SchemaRegistry.latest``."""
        return self._versions(subject, None)

    def _versions(self, subject: str, version: int | None) -> RegisteredSchema | None:
        """One version of ``subject`` (the latest for ``None``)."""
        self.check_schema_once()
        s, v = SCHEMAS.c, SCHEMA_VERSIONS.c
        query = (
            sa.select(v.version, v.schema_id, *_SCHEMA_COLUMNS)
            .join(SCHEMAS, s.schema_id == v.schema_id)
            .where(v.subject == subject)
            .order_by(v.version.desc())
            .limit(1)
        )
        if version is not None:
            query = query.where(v.version == version)

        def fetch() -> Any:
            with self.store.engine.connect() as conn:
                return conn.execute(query).one_or_none()

        row = self.store.guarded("subject lookup", fetch)
        if row is None:
            return None
        found = _schema_of(row)
        return RegisteredSchema(
            subject,
            int(row.version),
            int(row.schema_id),
            found.text,
            found.schema_type,
            found.references,
        )

    def compatibility(self, subject: str) -> Compatibility:
        """See ``SchemaRegistry.compatibility``."""
        self.check_schema_once()

        def fetch() -> Compatibility:
            with self.store.engine.connect() as conn:
                return self._level(conn, subject)

        return self.store.guarded("compatibility lookup", fetch)

    def set_compatibility(self, subject: str, level: Compatibility | str) -> None:
        """See ``SchemaRegistry.set_compatibility``."""
        _check_subject(subject)
        checked = Compatibility.of(level)
        self.check_schema_once()

        def write() -> None:
            with self.store.engine.begin() as conn:
                updated = conn.execute(
                    sa.update(SCHEMA_SUBJECTS)
                    .where(SCHEMA_SUBJECTS.c.subject == subject)
                    .values(compatibility=checked.value)
                )
                if not updated.rowcount:
                    conn.execute(
                        dialect_of(conn).insert_ignoring(
                            SCHEMA_SUBJECTS, [SCHEMA_SUBJECTS.c.subject]
                        ),
                        {"subject": subject, "compatibility": checked.value},
                    )

        self.store.guarded("set compatibility", write)

    @staticmethod
    def _level(conn: Connection, subject: str) -> Compatibility:
        c = SCHEMA_SUBJECTS.c
        found = conn.execute(
            sa.select(c.compatibility).where(c.subject == subject)
        ).scalar_one_or_none()
        return Compatibility.BACKWARD if found is None else Compatibility.of(found)

    def close(self) -> None:
        """Release the database connections of a store this registry created from a URL."""
        if self._owns_store:
            self.store.close()

    def __repr__(self) -> str:
        return f"SqlSchemaRegistry({self.store.url!r})"


_SCHEMA_COLUMNS = (SCHEMAS.c.schema, SCHEMAS.c.schema_type, SCHEMAS.c.schema_references)


def _schema_of(row: Any) -> Schema:
    """The ``Schema`` of a row with ``_SCHEMA_COLUMNS``."""
    references = tuple(
        SchemaReference(str(name), str(subject), int(version))
        for name, subject, version in json.loads(row.schema_references or "[]")
    )
    return Schema(str(row.schema), str(row.schema_type), references)


def _references_text(references: tuple[SchemaReference, ...]) -> str | None:
    if not references:
        return None
    return json.dumps([[r.name, r.subject, r.version] for r in references])


def _check_subject(subject: object) -> None:
    if not isinstance(subject, str) or not subject or len(subject) > 255:
        raise ValueError("subject must be a string of 1-255 characters")
