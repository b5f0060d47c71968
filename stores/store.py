"""SqlStore: the SQL history behind a stream (Hazelcast's RingbufferStore, per partition).

Kafka keeps the hot tail of a stream; this store keeps everything that was archived, keyed by
``(stream, partition, offset)``, so a subscriber can read below Kafka's log start and people can
query the history in plain SQL. SQLite (a file in WAL mode) is the embedded default,
PostgreSQL the production database. The schema comes only from Alembic migrations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import URL, Connection, Engine

from bolide.facade.errors import SchemaOutOfDateError, StoreError
from bolide.facade.ports import Incarnation, TopicIdentity
from bolide.facade.record import Record
from bolide.facade.redaction import redact_text, redact_url, url_secrets
from bolide.facade.support import Closing
from bolide.facade.validate import check_int
from bolide.stores import _migrate, incarnations
from bolide.stores._pages import ESCAPED_NAME_MARK as ESCAPED_NAME_MARK
from bolide.stores._pages import read_page, stored_name
from bolide.stores._rows_cy import insert_rows
from bolide.stores._search import Search, search_records
from bolide.stores.dialects import (
    DIALECTS,
    HeaderRow,
    RecordRow,
    SqlDialect,
    describe_error,
    dialect_of,
    retriable,
)
from bolide.stores.schema import RECORDS, TOPICS

__all__ = ["Search", "SqlStore"]

_T = TypeVar("_T")
_MAX_STREAM = 255


class SqlStore(Closing):
    """History store on SQLAlchemy 2 Core: SQLite (WAL) or PostgreSQL.

    Args:
        url: SQLAlchemy URL: ``sqlite:///bolide.db`` (the default, a file beside the process),
            ``sqlite://`` (in memory, one process), ``postgresql+psycopg://user@host/db``.
        check_schema: Refuse to read or write until the database schema is at the newest
            revision this code knows (``SchemaOutOfDateError`` names the command to run).
        busy_timeout_ms: SQLite only: how long a writer waits for another writer's lock.

    ``engine`` is the SQLAlchemy engine, public for SQL users. Passwords never appear in
    ``repr``, ``url`` or error messages. Use as a context manager, or call ``close()``.

    Raises:
        ValueError: The URL cannot be parsed or names an unsupported database.
        StoreError: The database driver is not installed.
    """

    def __init__(
        self,
        url: str | URL = "sqlite:///bolide.db",
        *,
        check_schema: bool = True,
        busy_timeout_ms: int = 5_000,
    ) -> None:
        self._url = _parse_url(url)
        rendered = self._url.render_as_string(hide_password=False)
        self._secrets = [str(self._url.password or ""), *url_secrets(rendered)]
        check_int("busy_timeout_ms", busy_timeout_ms)
        self._check_schema = check_schema
        self._schema_ok = False
        self._lock = threading.Lock()
        self.engine: Engine = _create_engine(self._url, busy_timeout_ms, self.scrub)

    # -- identity -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with its password (and any secret query value) replaced by ``***``."""
        return redact_url(self._url.render_as_string(hide_password=True))

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.sql_dialect.name

    @property
    def sql_dialect(self) -> SqlDialect:
        """What differs on this store's database (``bolide.stores.dialects``)."""
        return dialect_of(self._url)

    def scrub(self, text: str) -> str:
        """Return ``text`` with this store's database password masked and URLs redacted."""
        return redact_text(text, self._secrets)

    def __repr__(self) -> str:
        return f"SqlStore({self.url!r})"

    # -- schema ---------------------------------------------------------------------------

    def current(self) -> str | None:
        """The database's schema revision, or ``None`` when bolide's tables are absent."""
        return self.guarded("current", lambda: _migrate.current_revision(self.engine))

    def head(self) -> str:
        """The newest schema revision this code knows."""
        return _migrate.head_revision()

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema up to ``revision`` (what ``bolide db upgrade`` does)."""
        self.guarded("upgrade", lambda: _migrate.upgrade(self.engine, revision))
        self._schema_ok = False

    def downgrade(self, revision: str) -> None:
        """Migrate the schema down to ``revision``; ``"base"`` drops every bolide table."""
        self.guarded("downgrade", lambda: _migrate.downgrade(self.engine, revision))
        self._schema_ok = False

    def check_schema(self) -> None:
        """Raise unless the database schema is at this code's head revision.

        Raises:
            SchemaOutOfDateError: The schema is missing or behind; the message names
                ``bolide db upgrade --db URL``.
            StoreError: The schema is newer than this code, or the database cannot be reached.
        """
        current = self.current()
        head = self.head()
        if current == head:
            return
        fix = f"run `bolide db upgrade --db {self.url}`"
        if current is None:
            raise SchemaOutOfDateError(
                f"the database at {self.url} has no bolide schema (head is {head}): {fix}"
            )
        if current in _migrate.known_revisions():
            raise SchemaOutOfDateError(
                f"the database at {self.url} has schema revision {current}, behind head "
                f"{head}: {fix}"
            )
        raise StoreError(
            f"the database at {self.url} has schema revision {current!r}, unknown to this "
            f"version of bolide (head {head}): upgrade bolide"
        )

    def check_schema_once(self) -> None:
        """Check the schema before the first use (``check_schema``), once per store."""
        if self._schema_ok or not self._check_schema:
            return
        with self._lock:
            if not self._schema_ok:
                self.check_schema()
                self._schema_ok = True

    # -- RingbufferStore contract ---------------------------------------------------------

    def store_all(self, stream: str, records: Sequence[Record]) -> int:
        """Store records of one stream in one transaction; idempotent on (partition, offset).
        They go to the stream's current topic incarnation (``identify``).

        Args:
            stream: The stream the records belong to.
            records: Records with ``partition`` and ``offset`` set (as published or polled).

        Returns:
            How many rows were inserted (records already stored are skipped).

        Raises:
            ValueError: A record lacks its partition or offset, or names another stream.
            StoreError: The database failed; ``retriable`` tells whether to try again.
        """
        return self.store_batches({stream: records})

    def store_batches(
        self,
        batches: Mapping[str, Sequence[Record]],
        *,
        also: Callable[[Connection], object] | None = None,
        stored_as: Mapping[str, str] | None = None,
    ) -> int:
        """Store records of several streams in ONE transaction (what the archiver writes).

        Args:
            batches: Records by stream.
            also: Called with the connection before the commit, to write more in the same
                transaction (the archiver's typed Avro tables).
            stored_as: The key of the topic incarnation the records of each stream were read
                from (``Incarnation.stored_as``); a stream left out goes to its current one.

        Returns:
            How many rows were inserted in total.
        """
        records: list[RecordRow] = []
        headers: list[HeaderRow] = []
        self.check_schema_once()
        keys = dict(stored_as or {})
        missing = [s for s in batches if s not in keys]
        if missing:
            keys.update(self._current_keys(missing))
        for stream, recs in batches.items():
            _rows(_check_stream(stream), keys[stream], recs, records, headers)

        def write() -> int:
            with self.engine.begin() as conn:
                inserted = self.sql_dialect.insert_rows(conn, records, headers)
                if also is not None:
                    also(conn)
                return inserted

        return self.guarded("store_all", write, stream=_only(batches))

    def load(self, stream: str, partition: int, offset: int) -> Record | None:
        """Return the record at ``(partition, offset)``, or ``None`` when it is not stored."""
        found = self.read(stream, partition, offset, 1)
        return found[0] if found and found[0].offset == offset else None

    def read(
        self,
        stream: str,
        partition: int,
        from_offset: int,
        limit: int,
        *,
        stored_as: str | None = None,
    ) -> list[Record]:
        """Return up to ``limit`` records at or after ``from_offset``, in offset order, of the
        stream's current topic incarnation (or of the one ``stored_as`` names).

        Keyset paging: pass the last offset read plus one to get the next page.

        Raises:
            ValueError: A negative partition, offset or limit.
            StoreError: The database failed.
        """
        _check_stream(stream)
        check_int("partition", partition)
        check_int("from_offset", from_offset)
        check_int("limit", limit)
        if limit == 0:
            return []
        self.check_schema_once()

        def fetch() -> list[Record]:
            with self.engine.connect() as conn:
                key = stored_as or incarnations.stored_as(conn, stream)
                return read_page(conn, stream, partition, from_offset, limit, stored_as=key)

        return self.guarded("read", fetch, stream=stream, partition=partition)

    def search(
        self, stream: str, search: Search, limit: int = 100, *, timeout_ms: int | None = None
    ) -> list[Record]:
        """Up to ``limit`` archived records of ``stream``'s current topic incarnation that
        match ``search`` (a key, bytes in the payload or a header, times, offsets), in
        (partition, offset) order; ``search.after`` pages on. ``timeout_ms`` stops a search
        that runs longer (bytes in payloads are found by reading them).

        Raises:
            ValueError: A negative limit.
            StoreError: The database failed, or the search ran past ``timeout_ms``.
        """
        _check_stream(stream)
        check_int("limit", limit)
        if limit == 0:
            return []
        self.check_schema_once()
        dialect = self.sql_dialect

        def fetch() -> list[Record]:
            with self.engine.connect() as conn:
                if timeout_ms is not None:
                    dialect.time_limit(conn, timeout_ms)
                try:
                    key = incarnations.stored_as(conn, stream)
                    return search_records(conn, dialect, stream, key, search, limit)
                except exc.DBAPIError as error:
                    if dialect.timed_out(error.orig):
                        raise StoreError(
                            f"the search of {stream} stopped after {timeout_ms} ms (its limit)"
                        ) from None
                    raise
                finally:
                    if timeout_ms is not None:
                        conn.invalidate()  # its time limit never goes back to the pool

        return self.guarded("search", fetch, stream=stream)

    def largest_offset(
        self, stream: str, partition: int, *, stored_as: str | None = None
    ) -> int | None:
        """The largest stored offset of ``partition`` (of the current topic incarnation, or
        of the one ``stored_as`` names), or ``None`` when nothing is stored."""
        return self._edge(sa.func.max, stream, partition, stored_as)

    def smallest_offset(
        self, stream: str, partition: int, *, stored_as: str | None = None
    ) -> int | None:
        """The smallest stored offset of ``partition`` (of the current topic incarnation, or
        of the one ``stored_as`` names), or ``None`` when nothing is stored."""
        return self._edge(sa.func.min, stream, partition, stored_as)

    def _edge(
        self, fn: Any, stream: str, partition: int, stored_as: str | None, *where: Any
    ) -> int | None:
        """``fn`` (min or max) of the stored offsets of ``partition`` meeting ``where``."""
        _check_stream(stream)
        check_int("partition", partition)
        self.check_schema_once()
        r = RECORDS.c

        def fetch() -> int | None:
            with self.engine.connect() as conn:
                key = stored_as or incarnations.stored_as(conn, stream)
                query = sa.select(fn(r.kafka_offset)).where(
                    r.stream == key, r.kafka_partition == partition, *where
                )
                value = conn.execute(query).scalar()
            return None if value is None else int(value)

        return self.guarded("offset lookup", fetch, stream=stream, partition=partition)

    def offset_for_time(
        self,
        stream: str,
        partition: int,
        timestamp_ms: int,
        *,
        before: int | None = None,
        stored_as: str | None = None,
    ) -> int | None:
        """The first stored offset of ``partition`` (below ``before``) whose record's
        timestamp is at or after ``timestamp_ms`` (Kafka's ``offsets_for_times`` over the
        archive), of the current topic incarnation or the one ``stored_as`` names; ``None``
        when there is none."""
        r = RECORDS.c
        where = [r.timestamp_ms >= timestamp_ms]
        if before is not None:
            where.append(r.kafka_offset < before)
        return self._edge(sa.func.min, stream, partition, stored_as, *where)

    def partitions(self, stream: str, *, stored_as: str | None = None) -> list[int]:
        """The partitions of ``stream`` (its current topic incarnation, or the one
        ``stored_as`` names) that have stored records, ascending."""
        _check_stream(stream)
        self.check_schema_once()
        r = RECORDS.c

        def fetch() -> list[int]:
            with self.engine.connect() as conn:
                key = stored_as or incarnations.stored_as(conn, stream)
                query = sa.select(r.kafka_partition).where(r.stream == key).distinct()
                return sorted(int(p) for p in conn.execute(query).scalars())

        return self.guarded("partitions", fetch, stream=stream)

    def streams(self) -> list[str]:
        """The streams that have stored records (of any topic incarnation), sorted."""
        self.check_schema_once()
        t = TOPICS.c
        keys = sa.select(RECORDS.c.stream).distinct().subquery()
        query = sa.select(sa.func.coalesce(t.stream, keys.c.stream)).outerjoin_from(
            keys, TOPICS, t.stored_as == keys.c.stream
        )

        def fetch() -> list[str]:
            with self.engine.connect() as conn:
                return sorted({str(s) for s in conn.execute(query).scalars()})

        return self.guarded("streams", fetch)

    # -- topic incarnations (bolide.stores.incarnations) ----------------------------------

    def identify(
        self, stream: str, identity: TopicIdentity
    ) -> tuple[Incarnation, Incarnation | None]:
        """Record that ``stream`` is the Kafka topic ``identity`` now: its current topic
        incarnation, and the one this call retired (the topic was deleted and created again
        since the store last met it), else ``None``.

        Raises:
            ClusterMismatchError: The store holds the stream of another cluster (``adopt``).
            StoreError: The database failed.
        """
        _check_stream(stream)
        self.check_schema_once()

        def write() -> tuple[Incarnation, Incarnation | None]:
            try:
                with self.engine.begin() as conn:
                    return incarnations.identify(conn, stream, identity)
            except (exc.IntegrityError, incarnations.Conflict):  # another process meanwhile
                with self.engine.begin() as conn:
                    return incarnations.identify(conn, stream, identity)

        return self.guarded("identify", write, stream=stream)

    def incarnations(self, stream: str | None = None) -> list[Incarnation]:
        """The topic incarnations the store has met (of ``stream``), oldest first."""
        self.check_schema_once()

        def fetch() -> list[Incarnation]:
            with self.engine.connect() as conn:
                return incarnations.incarnations(conn, stream)

        return self.guarded("incarnations", fetch, stream=stream)

    def drop_incarnation(self, stream: str, topic_id: str) -> int:
        """Delete a retired topic incarnation of ``stream`` and everything stored of it;
        returns how many records went.

        Raises:
            LookupError: No such incarnation.
            ValueError: It is the current one.
        """
        self.check_schema_once()

        def write() -> int:
            with self.engine.begin() as conn:
                return incarnations.drop(conn, stream, topic_id)

        return self.guarded("drop incarnation", write, stream=stream)

    def adopt(self, stream: str, cluster_id: str) -> Incarnation:
        """Let ``stream``'s history go on from Kafka cluster ``cluster_id`` (after a failover
        to a mirror): its topic there starts a new incarnation when first met.

        Raises:
            LookupError: The store has never met ``stream``.
        """
        _check_stream(stream)
        self.check_schema_once()

        def write() -> Incarnation:
            with self.engine.begin() as conn:
                return incarnations.adopt(conn, stream, cluster_id)

        return self.guarded("adopt", write, stream=stream)

    def stored_as(self, stream: str) -> str:
        """The key the rows of ``stream``'s current topic incarnation carry in the ``stream``
        columns of bolide's tables (its name while the store has met no topic id of it)."""
        _check_stream(stream)
        self.check_schema_once()
        return self._current_keys([stream])[stream]

    def _current_keys(self, streams: Iterable[str]) -> dict[str, str]:
        """The key of each stream's current topic incarnation."""

        def fetch() -> dict[str, str]:
            with self.engine.connect() as conn:
                return {s: incarnations.stored_as(conn, s) for s in streams}

        return self.guarded("incarnations", fetch)

    # -- errors and lifetime --------------------------------------------------------------

    def guarded(
        self,
        what: str,
        fn: Callable[[], _T],
        *,
        stream: str | None = None,
        partition: int | None = None,
    ) -> _T:
        """Run ``fn``; turn database errors into ``StoreError`` without the password (what
        every part of the store that talks to the database runs its work through)."""
        try:
            return fn()
        except exc.SQLAlchemyError as error:
            raise StoreError(
                f"{what} on {self.url} failed: {self.scrub(describe_error(error))}",
                stream=stream,
                partition=partition,
                retriable=retriable(error, self.sql_dialect),
            ) from None

    def same_store(self, other: object) -> bool:
        """True when ``other`` is a ``SqlStore`` on the same database."""
        return other is self or (isinstance(other, SqlStore) and other.url == self.url)

    def close(self) -> None:
        """Release every pooled connection (the store can still reconnect if used again)."""
        self.engine.dispose()


# -- helpers ---------------------------------------------------------------------------------


def _parse_url(url: str | URL) -> URL:
    if not isinstance(url, str | URL):
        raise TypeError(f"url must be a str or sqlalchemy URL, not {type(url).__name__}")
    try:
        parsed = sa.make_url(url)
    except exc.ArgumentError:
        raise ValueError("url is not a database URL (e.g. sqlite:///bolide.db)") from None
    backend = parsed.get_backend_name()
    if backend not in DIALECTS:
        raise ValueError(
            f"url: database {backend!r} is not supported; use sqlite:///FILE or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    if "@" in (parsed.host or ""):  # "user:p@ss@host": the password's rest would be the host
        raise ValueError("url: the host name holds '@'; write an '@' in a password as %40")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "postgresql" and parsed.get_driver_name() != "psycopg":
        raise ValueError(
            f"url: driver {parsed.get_driver_name()!r} is not supported; use postgresql+psycopg://"
        )
    return parsed


def _create_engine(url: URL, busy_timeout_ms: int, scrub: Any) -> Engine:
    dialect = dialect_of(url)
    try:
        engine = sa.create_engine(url, **dialect.engine_options(url))
    except ModuleNotFoundError as error:
        raise StoreError(
            f"the driver for {url.drivername} is not installed ({error.name}): "
            "pip install 'bolide[postgres]'"
        ) from None
    except exc.ArgumentError as error:
        raise ValueError(f"url: {scrub(str(error))}") from None
    dialect.prepare(engine, url, busy_timeout_ms=busy_timeout_ms)
    return engine


def _check_stream(stream: object) -> str:
    if not isinstance(stream, str):
        raise TypeError(f"stream must be a str, not {type(stream).__name__}")
    if not stream or len(stream) > _MAX_STREAM:
        raise ValueError(f"stream must be 1-{_MAX_STREAM} characters, got {len(stream)}")
    return stream


def _rows(
    stream: str,
    key: str,
    records: Iterable[Record],
    rows: list[RecordRow],
    headers: list[HeaderRow],
) -> None:
    """Append the insert rows of ``records`` to ``rows`` and ``headers``, under the topic
    incarnation's ``key``.

    The first occurrence of a (partition, offset) wins; header names are stored escaped where
    they must be (``stored_name``).
    """
    if isinstance(records, Record) or not isinstance(records, Iterable):
        raise TypeError("records must be a sequence of Record")
    insert_rows(stream, key, records, rows, headers, ESCAPED_NAME_MARK, stored_name, check_int)


def _only(batches: Mapping[str, Sequence[Record]]) -> str | None:
    return next(iter(batches)) if len(batches) == 1 else None
