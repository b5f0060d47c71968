"""What differs between the databases the history store supports: one object per database.

Everything that depends on the database (its insert-or-ignore, its bulk path, how it names
columns, its locks, its read-only mode, its JDBC URL for Spark) is a method of ``SQLite`` or
``PostgreSQL``; the rest of ``bolide.stores`` (and the command line and Spark above it) asks
``dialect_of(...)`` and never compares database names. Any other database is refused at once.

The per-database parts that the objects pick between live beside them: the bulk inserts
(``_inserts``), what a dead-letter filter may do (``_filter_guards``), how an outbox relay holds
its rows (``_relay_scopes``) and marks them sent (``_outbox_marks``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import StaticPool

from bolide.facade.errors import StoreError
from bolide.stores.dialects import _inserts
from bolide.stores.dialects._filter_guards import (
    FILTER_ROLE,
    FilterGuard,
    PostgreSQLGuard,
    SQLiteGuard,
)
from bolide.stores.dialects._inserts import HeaderRow, RecordRow, on_driver
from bolide.stores.dialects._outbox_marks import Sent, mark_each, mark_unnest
from bolide.stores.dialects._relay_scopes import (
    EachStep,
    FileGuard,
    NoGuard,
    OneTransaction,
    RelayGuard,
    RelayScope,
)

__all__ = [
    "DIALECTS",
    "FILTER_ROLE",
    "FilterGuard",
    "HeaderRow",
    "PostgreSQL",
    "RecordRow",
    "RelayGuard",
    "RelayScope",
    "SQLite",
    "Sent",
    "SqlDialect",
    "describe_error",
    "dialect_of",
    "on_driver",
    "retriable",
]

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class SqlDialect:
    """The operations whose SQL differs per database (subclasses: ``SQLite``, ``PostgreSQL``)."""

    #: SQLAlchemy's backend name.
    name: str
    #: The JDBC driver class Spark loads to read the store.
    jdbc_driver: str

    def __init__(
        self,
        insert: Callable[[sa.Table], Any],
        bulk_statement: str,
        bulk: Callable[[Any, list[RecordRow], list[HeaderRow]], int],
    ) -> None:
        """``insert``: SQLAlchemy's insert of this database (it has ``on_conflict_do_nothing``);
        ``bulk``: the driver-level bulk path, which runs ``bulk_statement`` for the records."""
        self._insert = insert
        self._bulk_statement = bulk_statement
        self._bulk = bulk

    def insert_ignoring(self, table: sa.Table, keys: list[sa.Column[Any]]) -> Any:
        """``INSERT ... ON CONFLICT (keys) DO NOTHING``: stored rows are skipped, not errors."""
        return self._insert(table).on_conflict_do_nothing(index_elements=keys)

    def insert_rows(
        self, conn: Connection, records: list[RecordRow], headers: list[HeaderRow]
    ) -> int:
        """The archiver's bulk path: insert ``records`` and their ``headers`` in the caller's
        transaction, skipping stored records; returns how many were new."""
        if not records:
            return 0
        bulk = self._bulk
        return _inserts.on_driver(
            conn, self._bulk_statement, lambda raw: bulk(raw, records, headers)
        )

    def engine_options(self, url: URL) -> dict[str, Any]:
        """``create_engine`` options for ``url``."""
        return {}

    def prepare(self, engine: Engine, url: URL, *, busy_timeout_ms: int) -> None:
        """Settings every new connection of ``engine`` gets."""

    def fold(self, column: str) -> str:
        """How the database tells column names apart: equal folds name one column."""
        return column

    def lock_for_ddl(self, conn: Connection, table: str) -> bool:
        """Serialize schema changes of ``table`` with other writers until the transaction
        ends; True when it waited for a lock, so what was read of the catalog is stale."""
        return False

    def begin(self, conn: Connection) -> None:
        """Open the transaction now, so that savepoints nest inside it."""

    def check_exists(self, url: URL) -> None:
        """Raise ``StoreError`` when the database at ``url`` is known not to exist (a missing
        SQLite file), rather than creating it."""

    def one_statement(self, conn: Connection) -> None:
        """Make ``conn`` refuse a query of several statements (``sqlite3`` always does)."""

    def read_only(self, conn: Connection) -> None:
        """Make ``conn`` refuse every change, whatever the statement does to its transaction,
        and refuse a query of several statements."""
        raise NotImplementedError

    def contains(self, column: Any, needle: bytes) -> sa.ColumnElement[bool]:
        """Whether the bytes of ``column`` contain ``needle`` (byte for byte)."""
        raise NotImplementedError

    def time_limit(self, conn: Connection, timeout_ms: int) -> None:
        """Make ``conn`` stop a statement that runs longer than ``timeout_ms`` (a session
        that goes back to no pool: the caller invalidates it)."""
        raise NotImplementedError

    def timed_out(self, error: object) -> bool:
        """Whether ``error`` (a driver error) is a statement stopped by ``time_limit``."""
        raise NotImplementedError

    def filter_guard(self, functions: frozenset[str], timeout_ms: int) -> FilterGuard:
        """What this database enforces on a dead-letter filter (``_filter_guards``): it reads
        only the dead letters' columns, calls only ``functions``, and stops after
        ``timeout_ms``."""
        raise NotImplementedError

    def refused_change(self, error: object) -> bool:
        """Whether ``error`` (a driver error) is the refusal of a change on a read-only
        connection."""
        raise NotImplementedError

    def refused_several(self, error: object) -> bool:
        """Whether ``error`` (a driver error) is the refusal of several statements in one."""
        raise NotImplementedError

    def final(self, error: object) -> bool:
        """Whether ``error`` (a driver's operational error) can never succeed on a retry."""
        raise NotImplementedError

    def jdbc_options(self, url: URL) -> dict[str, str]:
        """Spark JDBC options (url, driver, user, password) for the store at ``url``."""
        raise NotImplementedError

    # -- the transactional outbox (bolide.stores.Outbox) ----------------------------------

    def lock_lane(self, conn: Connection, lane: int) -> None:
        """Hold outbox lane ``lane`` until ``conn``'s transaction ends, so that the rows of one
        key are numbered in commit order (a second writer of the key waits for the first)."""
        raise NotImplementedError

    def skip_locked(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """``query`` locking the rows it returns until the transaction ends, skipping rows
        another transaction holds: how relays share the outbox."""
        raise NotImplementedError

    def relay_scope(self, engine: Engine) -> RelayScope:
        """The transactions of one claim-publish-mark round of an outbox relay."""
        raise NotImplementedError

    def relay_guard(self, url: URL) -> RelayGuard:
        """What keeps outbox relays apart that must not share the database."""
        raise NotImplementedError

    def one_connection(self, url: URL) -> bool:
        """Whether every user of a store at ``url`` shares one connection (an in-memory
        SQLite database), so that their transactions would mix."""
        return False

    def database_identity(self, conn: Connection) -> str:
        """What tells the database (and schema) ``conn`` writes to from any other."""
        raise NotImplementedError

    def mark_outbox_sent(self, conn: Connection, sent: Sequence[Sent], sent_ms: int) -> None:
        """Mark a relay's batch of outbox rows sent, with where each went."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SQLite(SqlDialect):
    """SQLite, through Python's ``sqlite3``."""

    name = "sqlite"
    jdbc_driver = "org.sqlite.JDBC"

    def __init__(self) -> None:
        super().__init__(sqlite.insert, _inserts.SQLITE_RECORDS, _inserts.insert_sqlite)

    @staticmethod
    def _memory(url: URL) -> bool:
        return url.database in (None, "", ":memory:")

    def engine_options(self, url: URL) -> dict[str, Any]:
        if self._memory(url):
            # One shared connection: every user of the store sees the same in-memory database.
            return {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        return {}

    def prepare(self, engine: Engine, url: URL, *, busy_timeout_ms: int) -> None:
        memory = self._memory(url)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if not memory:
                # WAL: readers (subscribers splicing history) never block the archiver's writes.
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

    def check_exists(self, url: URL) -> None:
        if not self._memory(url) and not os.path.exists(str(url.database)):
            raise StoreError(f"no database file at {url.database}")

    def fold(self, column: str) -> str:
        return column.translate(_ASCII_LOWER)  # SQLite ignores ASCII case in names

    def begin(self, conn: Connection) -> None:
        # sqlite3 begins a transaction only before its first change; a savepoint taken before
        # then would itself be the outermost transaction, and releasing it would commit.
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None and not getattr(dbapi, "in_transaction", True):
            conn.exec_driver_sql("BEGIN")

    def read_only(self, conn: Connection) -> None:
        # sqlite3 runs one statement per execute; query_only refuses every change to this
        # database, and the authorizer what would write elsewhere or change the session:
        # ATTACH (and VACUUM INTO, which attaches), DETACH, a PRAGMA that sets something.
        conn.exec_driver_sql("PRAGMA query_only = ON")
        raw: Any = conn.connection.dbapi_connection
        raw.set_authorizer(_read_only_authorizer)

    def contains(self, column: Any, needle: bytes) -> sa.ColumnElement[bool]:
        return sa.func.instr(column, sa.literal(needle, sa.LargeBinary)) > 0

    def time_limit(self, conn: Connection, timeout_ms: int) -> None:
        # The progress handler runs every _STEPS virtual machine steps: true interrupts.
        deadline = time.monotonic() + timeout_ms / 1000
        raw: Any = conn.connection.dbapi_connection
        raw.set_progress_handler(lambda: time.monotonic() > deadline, 1_000)

    def timed_out(self, error: object) -> bool:
        return isinstance(error, sqlite3.OperationalError) and "interrupted" in str(error)

    def filter_guard(self, functions: frozenset[str], timeout_ms: int) -> FilterGuard:
        return SQLiteGuard(functions, timeout_ms)

    def refused_change(self, error: object) -> bool:
        code = getattr(error, "sqlite_errorcode", None)
        # SQLITE_READONLY, or SQLITE_AUTH: the read-only authorizer's refusal
        return isinstance(code, int) and code & 0xFF in (8, 23)

    def refused_several(self, error: object) -> bool:
        return isinstance(error, sqlite3.ProgrammingError) and "one statement" in str(error)

    def final(self, error: object) -> bool:
        # Nearly every failure is an OperationalError, statements that can never succeed
        # included (a duplicate column, too many columns): those carry SQLITE_ERROR.
        code = getattr(error, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_ERROR  # extended codes

    def jdbc_options(self, url: URL) -> dict[str, str]:
        if self._memory(url):
            raise ValueError("an in-memory SQLite store cannot be read through JDBC")
        path = os.path.abspath(str(url.database))
        return {"url": f"jdbc:sqlite:{path}", "driver": self.jdbc_driver}

    def lock_lane(self, conn: Connection, lane: int) -> None:
        # One writer at a time: the insert holds the database's write lock until the commit.
        return None

    def skip_locked(self, query: sa.Select[Any]) -> sa.Select[Any]:
        return query  # no row locks: relay_guard lets one relay in at a time

    def relay_scope(self, engine: Engine) -> RelayScope:
        return EachStep(engine)  # a write transaction held while publishing stops the app

    def relay_guard(self, url: URL) -> RelayGuard:
        return FileGuard(str(url.database))

    def one_connection(self, url: URL) -> bool:
        return self._memory(url)

    def database_identity(self, conn: Connection) -> str:
        files = {str(row[1]): str(row[2]) for row in conn.exec_driver_sql("PRAGMA database_list")}
        if not files.get("main"):  # in memory: the connection is the database
            return f"sqlite:memory:{id(conn.connection.dbapi_connection)}"
        return f"sqlite:{files['main']}"

    def mark_outbox_sent(self, conn: Connection, sent: Sequence[Sent], sent_ms: int) -> None:
        mark_each(conn, sent, sent_ms)  # in-process calls: a statement per row costs little


#: PRAGMAs that take an argument and only read (the schema's description).
_READING_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)


def _read_only_authorizer(
    action: int, first: str | None, second: str | None, db: str | None, trigger: str | None
) -> int:
    """A read-only session's ``sqlite3`` authorizer (``SQLite.read_only``)."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and second is not None:
        return sqlite3.SQLITE_OK if first in _READING_PRAGMAS else sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class PostgreSQL(SqlDialect):
    """PostgreSQL, through psycopg 3."""

    name = "postgresql"
    jdbc_driver = "org.postgresql.Driver"

    def __init__(self) -> None:
        super().__init__(postgresql.insert, _inserts.PG_INSERT, _inserts.insert_postgresql)

    def engine_options(self, url: URL) -> dict[str, Any]:
        return {"pool_pre_ping": True}

    def lock_for_ddl(self, conn: Connection, table: str) -> bool:
        # Two archivers widening one table at once: the second waits here for the first
        # transaction, then plans again against the committed catalog (no "already exists").
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:t))"), {"t": table})
        return True

    def read_only(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")
        # A COMMIT inside the statement would end that transaction: the next ones are read-only.
        conn.exec_driver_sql("SET SESSION default_transaction_read_only = on")
        # The server refuses "...; COMMIT; ..." as several statements.
        self.one_statement(conn)

    def contains(self, column: Any, needle: bytes) -> sa.ColumnElement[bool]:
        return sa.func.position(sa.literal(needle, sa.LargeBinary).op("IN")(column)) > 0

    def time_limit(self, conn: Connection, timeout_ms: int) -> None:
        conn.exec_driver_sql(f"SET statement_timeout = {int(timeout_ms)}")

    def timed_out(self, error: object) -> bool:
        return getattr(error, "sqlstate", None) == "57014"  # query_canceled

    def filter_guard(self, functions: frozenset[str], timeout_ms: int) -> FilterGuard:
        return PostgreSQLGuard(functions, timeout_ms)

    def one_statement(self, conn: Connection) -> None:
        # Every query prepared: a prepared statement holds one command.
        driver: Any = conn.connection.dbapi_connection
        driver.prepare_threshold = 0

    def refused_change(self, error: object) -> bool:
        return getattr(error, "sqlstate", None) == "25006"  # read_only_sql_transaction

    def refused_several(self, error: object) -> bool:
        return getattr(error, "sqlstate", None) == "42601" and "multiple commands" in str(error)

    def final(self, error: object) -> bool:
        state = getattr(error, "sqlstate", None)  # class 54: program limits (too many columns)
        return isinstance(state, str) and state.startswith("54")

    def jdbc_options(self, url: URL) -> dict[str, str]:
        host = url.host or "localhost"
        port = f":{url.port}" if url.port else ""
        options = {
            "url": f"jdbc:postgresql://{host}{port}/{url.database or ''}",
            "driver": self.jdbc_driver,
        }
        if url.username:
            options["user"] = url.username
        if url.password:
            options["password"] = str(url.password)
        if "options" in url.query:  # e.g. -csearch_path=...: pgjdbc takes the same
            raw = url.query["options"]
            options["options"] = raw if isinstance(raw, str) else raw[-1]
        return options

    def lock_lane(self, conn: Connection, lane: int) -> None:
        # The two-key form: a lock space of its own, apart from lock_for_ddl's.
        key = (lane & 0xFFFFFFFF) - ((lane & 0x80000000) << 1)  # the low 32 bits, signed
        lock = sa.text("SELECT pg_advisory_xact_lock(:space, :key)")
        conn.execute(lock, {"space": _OUTBOX_LOCKS, "key": key})

    def skip_locked(self, query: sa.Select[Any]) -> sa.Select[Any]:
        return query.with_for_update(skip_locked=True)

    def relay_scope(self, engine: Engine) -> RelayScope:
        return OneTransaction(engine)  # row locks held while publishing block no insert

    def relay_guard(self, url: URL) -> RelayGuard:
        return NoGuard()

    def database_identity(self, conn: Connection) -> str:
        # The server (its start time), the database, and the outbox table the search path finds.
        query = sa.text(
            "SELECT current_database(), pg_postmaster_start_time()::text, "
            "to_regclass('bolide_outbox')::oid::text"
        )
        row = conn.execute(query).one()
        return "postgresql:" + "/".join(str(value) for value in row)

    def mark_outbox_sent(self, conn: Connection, sent: Sequence[Sent], sent_ms: int) -> None:
        mark_unnest(conn, sent, sent_ms)  # one statement: a round trip per row costs more


#: The first key of the outbox's advisory locks ("bolo").
_OUTBOX_LOCKS = 0x626F6C6F

DIALECTS: dict[str, SqlDialect] = {d.name: d for d in (SQLite(), PostgreSQL())}


def dialect_of(where: str | URL | Connection | Engine) -> SqlDialect:
    """The dialect of a backend name, a URL, a connection or an engine.

    Raises:
        StoreError: A database the store does not support.
    """
    if isinstance(where, Connection | Engine):
        name = where.dialect.name
    elif isinstance(where, URL):
        name = where.get_backend_name()
    elif "://" in where:
        name = sa.make_url(where).get_backend_name()
    else:
        name = where
    found = DIALECTS.get(name)
    if found is None:
        raise StoreError(
            f"database {name!r} is not supported; use sqlite:///FILE or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    return found


def describe_error(error: exc.SQLAlchemyError) -> str:
    """``Type: first line of the database's message`` (no SQL, no parameters)."""
    detail = error.orig if isinstance(error, exc.DBAPIError) else error
    text = str(detail).strip().splitlines()[0] if str(detail) else repr(detail)
    return f"{type(detail).__name__}: {text[:500]}"


def retriable(error: exc.SQLAlchemyError, dialect: SqlDialect) -> bool:
    """True when the same write may succeed later: the database is away, busy or locked,
    and ``dialect`` does not call the failure final."""
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, exc.TimeoutError):  # the pool had no connection to give
        return True
    if not isinstance(error, exc.OperationalError):
        return False
    return not dialect.final(error.orig)
