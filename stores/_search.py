"""Finding archived records by key, bytes in the payload or a header, time and offset: the
archive's answer to a search that Kafka could give only by reading a whole topic.

A key is found through the key index, a time range through the (stream, time) index; bytes
in a payload or header value are matched by the database (``SqlDialect.contains``), within
what the indexed conditions leave. Results come in (partition, offset) order, a page at a
time (``after``: the last (partition, offset) of the page before).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.facade.record import Record
from bolide.stores._pages import ESCAPED_NAME_MARK, header_name
from bolide.stores._rows_cy import group_headers, records_from_rows
from bolide.stores.dialects import SqlDialect
from bolide.stores.schema import HEADERS, RECORDS

__all__ = ["Search", "search_records"]


@dataclass(frozen=True)
class Search:
    """What to look for; every condition given must hold.

    Attributes:
        key: The record's key, exactly.
        contains: Bytes found in the payload or in a header's value.
        from_ms: Timestamps at or after this (epoch milliseconds).
        to_ms: Timestamps before this.
        partition: Only this partition.
        from_offset: Offsets at or after this (with ``partition``, or in every partition).
        to_offset: Offsets before this.
        after: Only records after this (partition, offset): the next page.
    """

    key: bytes | None = None
    contains: bytes | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    after: tuple[int, int] | None = None


def search_records(
    conn: Connection,
    dialect: SqlDialect,
    stream: str,
    stored_as: str,
    search: Search,
    limit: int,
) -> list[Record]:
    """Up to ``limit`` archived records of ``stream`` (rows carrying ``stored_as``) that
    match ``search``, in (partition, offset) order.

    Raises:
        sqlalchemy.exc.DBAPIError: The database failed.
    """
    r = RECORDS.c
    query = (
        sa.select(r.kafka_partition, r.kafka_offset, r.timestamp_ms, r.key, r.payload)
        .where(r.stream == stored_as, *_conditions(dialect, search))
        .order_by(r.kafka_partition, r.kafka_offset)
        .limit(limit)
    )
    rows = conn.execute(query).all()
    out: list[Record] = []
    for partition in sorted({int(row[0]) for row in rows}):
        mine = [tuple(row[1:]) for row in rows if row[0] == partition]
        headers = _headers(conn, stored_as, partition, [int(row[0]) for row in mine])
        out.extend(records_from_rows(mine, headers, stream, partition))
    return out


def _conditions(dialect: SqlDialect, search: Search) -> list[sa.ColumnElement[bool]]:
    r, h = RECORDS.c, HEADERS.c
    where: list[sa.ColumnElement[bool]] = []
    if search.key is not None:
        where.append(r.key == search.key)
    if search.from_ms is not None:
        where.append(r.timestamp_ms >= search.from_ms)
    if search.to_ms is not None:
        where.append(r.timestamp_ms < search.to_ms)
    if search.partition is not None:
        where.append(r.kafka_partition == search.partition)
    if search.from_offset is not None:
        where.append(r.kafka_offset >= search.from_offset)
    if search.to_offset is not None:
        where.append(r.kafka_offset < search.to_offset)
    if search.after is not None:
        where.append(sa.tuple_(r.kafka_partition, r.kafka_offset) > sa.tuple_(*search.after))
    if search.contains:
        in_header = (
            sa.select(sa.literal(1))
            .where(
                h.stream == r.stream,
                h.kafka_partition == r.kafka_partition,
                h.kafka_offset == r.kafka_offset,
                dialect.contains(h.value, search.contains),
            )
            .exists()
        )
        where.append(sa.or_(dialect.contains(r.payload, search.contains), in_header))
    return where


def _headers(
    conn: Connection, stored_as: str, partition: int, offsets: list[int]
) -> dict[int, list[tuple[str, bytes]]]:
    h = HEADERS.c
    query = (
        sa.select(h.kafka_offset, h.name, h.value)
        .where(h.stream == stored_as, h.kafka_partition == partition, h.kafka_offset.in_(offsets))
        .order_by(h.kafka_offset, h.header_index)
    )
    rows = [tuple(row) for row in conn.execute(query)]
    return group_headers(rows, ESCAPED_NAME_MARK, header_name)
