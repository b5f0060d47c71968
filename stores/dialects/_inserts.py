"""Idempotent bulk inserts per database, on the driver connection under SQLAlchemy's
transaction; ``bolide.stores.dialects`` picks the one of the connection's database.

The archiver's write path: thousands of rows per transaction, duplicates of stored rows
skipped, the count of new rows exact. SQLAlchemy's per-row parameter processing costs more
than the database's own work, so both dialects talk to the driver directly, inside the
caller's transaction (SQLAlchemy commits or rolls back the same connection):

- PostgreSQL: binary ``COPY`` straight into the tables, in a savepoint: the archiver's rows are
  nearly always new, and then this is the database's own bulk path. When a row is already
  stored (a re-read after a crash, a concurrent writer), the unique key stops the ``COPY``;
  the savepoint is rolled back and the rows go through session-local staging tables
  (temporary, ``ON COMMIT DELETE ROWS``): a binary ``COPY`` into them, then one statement that
  inserts the new records (``ON CONFLICT DO NOTHING ... RETURNING``) and the headers of those
  records only.
- SQLite: ``executemany`` of ``INSERT ... ON CONFLICT DO NOTHING`` on the ``sqlite3``
  connection; the new records are the ``total_changes`` delta. (``ON CONFLICT`` and not
  ``INSERT OR IGNORE``: the latter would also skip rows that violate NOT NULL.)

Driver errors are raised as SQLAlchemy's ``DBAPIError`` subclasses, as SQLAlchemy would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import exc
from sqlalchemy.engine import Connection

__all__ = [
    "PG_INSERT",
    "SQLITE_RECORDS",
    "HeaderRow",
    "RecordRow",
    "insert_postgresql",
    "insert_sqlite",
    "on_driver",
]

_T = TypeVar("_T")
#: ``(stream, partition, offset, timestamp_ms, key, payload)``: one ``bolide_records`` row.
RecordRow = tuple[str, int, int, int | None, bytes | None, bytes | None]
#: ``(stream, partition, offset, header_index, stored name, value)``: one header row.
HeaderRow = tuple[str, int, int, int, str, bytes]


def on_driver(conn: Connection, statement: str, fn: Callable[[Any], _T]) -> _T:
    """Run ``fn`` on the driver connection; raise its errors as SQLAlchemy would."""
    pooled = conn.connection
    dbapi = conn.dialect.loaded_dbapi
    try:
        return fn(pooled.driver_connection)
    except dbapi.Error as error:
        invalidated = conn.dialect.is_disconnect(error, pooled.dbapi_connection, None)
        if invalidated:
            conn.invalidate(error)
        raise exc.DBAPIError.instance(
            statement,
            None,
            error,
            dbapi.Error,
            connection_invalidated=invalidated,
            dialect=conn.dialect,
        ) from error


# -- SQLite ----------------------------------------------------------------------------------

SQLITE_RECORDS = (
    "INSERT INTO bolide_records"
    " (stream, kafka_partition, kafka_offset, timestamp_ms, key, payload)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
# A stored record's headers conflict on their own key and are skipped the same way.
_SQLITE_HEADERS = (
    "INSERT INTO bolide_record_headers"
    " (stream, kafka_partition, kafka_offset, header_index, name, value)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def insert_sqlite(raw: Any, records: list[RecordRow], headers: list[HeaderRow]) -> int:
    # sqlite3 opens the transaction before the first INSERT; SQLAlchemy commits it.
    before = raw.total_changes
    raw.executemany(SQLITE_RECORDS, records)
    inserted = int(raw.total_changes - before)
    if headers:
        raw.executemany(_SQLITE_HEADERS, headers)
    return inserted


# -- PostgreSQL ------------------------------------------------------------------------------

# Temporary tables live in the session's own schema (first on the search path), so the names
# cannot meet an application's tables; created once per session, emptied at each commit.
_PG_STAGE = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS bolide_stage_records"
    " (stream TEXT, p INTEGER, o BIGINT, t BIGINT, k BYTEA, v BYTEA) ON COMMIT DELETE ROWS;"
    "CREATE TEMPORARY TABLE IF NOT EXISTS bolide_stage_headers"
    " (stream TEXT, p INTEGER, o BIGINT, i INTEGER, n TEXT, v BYTEA) ON COMMIT DELETE ROWS"
)
_PG_COPY_RECORDS = "COPY bolide_stage_records (stream, p, o, t, k, v) FROM STDIN (FORMAT BINARY)"
_PG_COPY_HEADERS = "COPY bolide_stage_headers (stream, p, o, i, n, v) FROM STDIN (FORMAT BINARY)"
_PG_RECORD_TYPES = ("text", "int4", "int8", "int8", "bytea", "bytea")
_PG_HEADER_TYPES = ("text", "int4", "int8", "int4", "text", "bytea")
# One statement: the records that are new, then the headers of exactly those records (a new
# record has no stored headers, so they need no conflict clause), then the count of new records.
PG_INSERT = (
    "WITH new AS ("
    " INSERT INTO bolide_records"
    " (stream, kafka_partition, kafka_offset, timestamp_ms, key, payload)"
    " SELECT stream, p, o, t, k, v FROM bolide_stage_records"
    " ON CONFLICT (stream, kafka_partition, kafka_offset) DO NOTHING"
    " RETURNING stream, kafka_partition, kafka_offset"
    "), new_headers AS ("
    " INSERT INTO bolide_record_headers"
    " (stream, kafka_partition, kafka_offset, header_index, name, value)"
    " SELECT h.stream, h.p, h.o, h.i, h.n, h.v FROM bolide_stage_headers AS h JOIN new"
    " ON new.stream = h.stream AND new.kafka_partition = h.p AND new.kafka_offset = h.o"
    ") SELECT count(*) FROM new"
)


_UNIQUE_VIOLATION = "23505"  # SQLSTATE
_PG_COLUMNS = "stream, kafka_partition, kafka_offset"
_PG_DIRECT_RECORDS = (
    f"COPY bolide_records ({_PG_COLUMNS}, timestamp_ms, key, payload) FROM STDIN (FORMAT BINARY)"
)
_PG_DIRECT_HEADERS = (
    f"COPY bolide_record_headers ({_PG_COLUMNS}, header_index, name, value)"
    " FROM STDIN (FORMAT BINARY)"
)


def insert_postgresql(raw: Any, records: list[RecordRow], headers: list[HeaderRow]) -> int:
    with raw.cursor() as cursor:
        cursor.execute("SAVEPOINT bolide_copy")
        try:
            _copy(cursor, _PG_DIRECT_RECORDS, _PG_RECORD_TYPES, records)
        except Exception as error:
            if getattr(error, "sqlstate", None) != _UNIQUE_VIOLATION:
                raise
            cursor.execute("ROLLBACK TO SAVEPOINT bolide_copy")
        else:
            if headers:  # every record is new, so are its headers
                _copy(cursor, _PG_DIRECT_HEADERS, _PG_HEADER_TYPES, headers)
            cursor.execute("RELEASE SAVEPOINT bolide_copy")
            return len(records)
        cursor.execute("RELEASE SAVEPOINT bolide_copy")
        cursor.execute(_PG_STAGE)
        _copy(cursor, _PG_COPY_RECORDS, _PG_RECORD_TYPES, records)
        if headers:
            _copy(cursor, _PG_COPY_HEADERS, _PG_HEADER_TYPES, headers)
        cursor.execute(PG_INSERT)
        found = cursor.fetchone()
        return int(found[0]) if found else 0


def _copy(cursor: Any, statement: str, types: Sequence[str], rows: list[Any]) -> None:
    """Binary ``COPY`` of ``rows`` (psycopg 3)."""
    with cursor.copy(statement) as copy:
        copy.set_types(types)
        write = copy.write_row
        for row in rows:
            write(row)
