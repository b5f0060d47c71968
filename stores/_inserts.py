"""Idempotent inserts per dialect: ``ON CONFLICT DO NOTHING``, and PostgreSQL's UNNEST path."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

__all__ = ["_insert_ignoring_duplicates", "insert_postgresql"]


def _insert_ignoring_duplicates(dialect: str, table: sa.Table, keys: list[sa.Column[Any]]) -> Any:
    """``INSERT ... ON CONFLICT (keys) DO NOTHING`` for the dialect (sibling tables use it)."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=keys)
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=keys)


# PostgreSQL: one statement per table with the rows as arrays (UNNEST), sent in binary: a fixed
# text that psycopg prepares once, no escaping of bytes, and an exact rowcount (executemany
# reports -1). Parameters are psycopg's own ``%(name)b`` placeholders: the statement goes to the
# driver as is.
_PG_RECORDS = (
    "INSERT INTO bolide_records"
    " (stream, kafka_partition, kafka_offset, timestamp_ms, key, payload)"
    " SELECT %(stream)s, u.p, u.o, u.t, u.k, u.v FROM unnest("
    "%(p)b::INTEGER[], %(o)b::BIGINT[], %(t)b::BIGINT[], %(k)b::BYTEA[], %(v)b::BYTEA[])"
    " AS u(p, o, t, k, v)"
    " ON CONFLICT (stream, kafka_partition, kafka_offset) DO NOTHING"
)
_PG_HEADERS = (
    "INSERT INTO bolide_record_headers"
    " (stream, kafka_partition, kafka_offset, header_index, name, value)"
    " SELECT %(stream)s, u.p, u.o, u.i, u.n, u.v FROM unnest("
    "%(p)b::INTEGER[], %(o)b::BIGINT[], %(i)b::INTEGER[], %(n)b::TEXT[], %(v)b::BYTEA[])"
    " AS u(p, o, i, n, v)"
    " ON CONFLICT (stream, kafka_partition, kafka_offset, header_index) DO NOTHING"
)


def insert_postgresql(
    conn: Connection,
    stream: str,
    rows: list[tuple[dict[str, Any], list[tuple[str, bytes]]]],
    headers: list[tuple[int, int, int, str, bytes]],
) -> int:
    columns = ("kafka_partition", "kafka_offset", "timestamp_ms", "key", "payload")
    arrays = {
        name: [row[column] for row, _ in rows]
        for name, column in zip("potkv", columns, strict=True)
    }
    inserted = conn.exec_driver_sql(_PG_RECORDS, {"stream": stream, **arrays}).rowcount
    if headers:
        p, o, i, n, v = (list(col) for col in zip(*headers, strict=True))
        params = {"stream": stream, "p": p, "o": o, "i": i, "n": n, "v": v}
        conn.exec_driver_sql(_PG_HEADERS, params)
    return int(inserted)
