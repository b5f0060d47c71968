"""Keyset pages of archived records, read on the driver connection; header-name escaping.

``SqlStore.read`` is the history half of every spliced read and durable replay, so it is hot.
Its two statements (the page of records, then the headers of exactly that offset range) run
on the DB-API cursor of the pooled connection: SQLAlchemy's result rows and their processing
cost more than the database's own work here (measured: 1.6x to 1.8x the rows per second on
SQLite and PostgreSQL). One statement per page (the headers joined or aggregated in) was
measured too and lost: on PostgreSQL a correlated aggregate per row is slower than the second
range scan, and a join is planned as a full scan per row while the freshly archived tables have
no statistics yet; on SQLite it gained nothing over the two range scans.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import Connection

from bolide.facade.record import Record
from bolide.stores._rows_cy import group_headers, records_from_rows
from bolide.stores.dialects import on_driver

__all__ = ["ESCAPED_NAME_MARK", "header_name", "read_page", "stored_name"]

#: Leads a header name stored escaped (see ``stored_name``): U+2400, SYMBOL FOR NULL.
ESCAPED_NAME_MARK = "\u2400"
_ESCAPES = re.compile("%(00|25)")

_RECORDS = (
    "SELECT kafka_offset, timestamp_ms, key, payload FROM bolide_records"
    " WHERE stream = {p} AND kafka_partition = {p} AND kafka_offset >= {p}"
    " ORDER BY kafka_offset LIMIT {p}"
)
_HEADERS = (
    "SELECT kafka_offset, name, value FROM bolide_record_headers"
    " WHERE stream = {p} AND kafka_partition = {p} AND kafka_offset BETWEEN {p} AND {p}"
    " ORDER BY kafka_offset, header_index"
)
#: The statements in each driver's parameter style (sqlite3: qmark; psycopg: format).
_STATEMENTS = {
    style: (_RECORDS.format(p=mark), _HEADERS.format(p=mark))
    for style, mark in (("qmark", "?"), ("format", "%s"), ("pyformat", "%s"))
}


def stored_name(name: str) -> str:
    """A header name as ``bolide_record_headers.name`` holds it.

    PostgreSQL text cannot hold U+0000, which Kafka header names may: a name holding it (or
    starting with ``ESCAPED_NAME_MARK``) is stored as the mark followed by the name with ``%``
    written ``%25`` and U+0000 written ``%00``. Every other name is stored as it is.
    """
    if "\x00" not in name and not name.startswith(ESCAPED_NAME_MARK):
        return name
    return ESCAPED_NAME_MARK + name.replace("%", "%25").replace("\x00", "%00")


def header_name(stored: str) -> str:
    """The header name ``stored_name`` stored as ``stored``."""
    if not stored.startswith(ESCAPED_NAME_MARK):
        return stored
    return _ESCAPES.sub(lambda m: "\x00" if m[1] == "00" else "%", stored[1:])


def read_page(
    conn: Connection,
    stream: str,
    partition: int,
    from_offset: int,
    limit: int,
    *,
    stored_as: str | None = None,
) -> list[Record]:
    """Up to ``limit`` records of ``stream``'s ``partition`` at or after ``from_offset``, of
    the topic incarnation whose rows carry ``stored_as`` (by default the stream's name).

    Raises:
        sqlalchemy.exc.DBAPIError: The database failed (as SQLAlchemy raises it).
    """
    records_sql, headers_sql = _STATEMENTS[conn.dialect.paramstyle]
    key = stored_as or stream

    def fetch(raw: Any) -> list[Record]:
        cursor = raw.cursor()
        try:
            cursor.execute(records_sql, (key, partition, from_offset, limit))
            rows = cursor.fetchall()
            if not rows:
                return []
            cursor.execute(headers_sql, (key, partition, rows[0][0], rows[-1][0]))
            headers = group_headers(cursor.fetchall(), ESCAPED_NAME_MARK, header_name)
        finally:
            cursor.close()
        return records_from_rows(rows, headers, stream, partition)

    return on_driver(conn, records_sql, fetch)
