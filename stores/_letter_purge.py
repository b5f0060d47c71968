"""Purging dead letters: a mark per dead letter, its archived row deleted, Kafka trimmed.

Kafka deletes only a partition's oldest records (DeleteRecords up to an offset), so a purge
cannot take one record out of the middle of a partition. It therefore does three things:

1. marks every purged dead letter in ``bolide_dead_letter_purges``: listing, showing and
   replaying skip marked ones, wherever they are still held;
2. deletes the archived rows (and headers) of every marked dead letter, in the same
   transaction, including rows the archiver wrote again after an earlier purge;
3. where the broker supports DeleteRecords (``require_delete_records``, as ``capacity`` needs),
   deletes each partition's records up to its first dead letter that is not purged. A broker
   without it (the embedded Tansu) keeps them; the marks keep them hidden.

The marks stay: a dead letter Kafka still holds, or the archiver writes again, stays purged.
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError
from bolide.stores._capacity import require_delete_records, trim
from bolide.stores._dead_letter_schema import PURGES
from bolide.stores._letter_scan import StreamRead
from bolide.stores._schema import HEADERS, RECORDS
from bolide.stores.store import SqlStore

__all__ = ["mark_and_delete", "purged", "trim_kafka"]

log = logging.getLogger(__name__)


def purged(conn: Connection, stream: str) -> set[tuple[int, int]]:
    """``(partition, offset)`` of the purged dead letters of ``stream``."""
    p = PURGES.c
    query = sa.select(p.kafka_partition, p.kafka_offset).where(p.stream == stream)
    return {(int(part), int(offset)) for part, offset in conn.execute(query)}


def _marked(table: sa.Table, stream: str) -> sa.ColumnElement[bool]:
    """Rows of ``table`` (records or headers) whose dead letter of ``stream`` is marked."""
    p, t = PURGES.c, table.c
    return sa.and_(
        t.stream == stream,
        sa.exists().where(
            p.stream == t.stream,
            p.kafka_partition == t.kafka_partition,
            p.kafka_offset == t.kafka_offset,
        ),
    )


def mark_and_delete(store: SqlStore, stream: str, chosen: list[tuple[int, int]]) -> None:
    """Mark ``chosen`` purged and delete every marked dead letter's archived row, in one
    transaction."""
    now = int(time.time() * 1000)
    rows = [
        {"stream": stream, "kafka_partition": part, "kafka_offset": offset, "purged_ms": now}
        for part, offset in chosen
    ]
    p = PURGES.c
    keys = [p.stream, p.kafka_partition, p.kafka_offset]

    def write() -> None:
        with store.engine.begin() as conn:
            if rows:
                conn.execute(store.sql_dialect.insert_ignoring(PURGES, keys), rows)
            conn.execute(sa.delete(HEADERS).where(_marked(HEADERS, stream)))
            conn.execute(sa.delete(RECORDS).where(_marked(RECORDS, stream)))

    store.guarded("purge", write, stream=stream)


def trim_kafka(store: SqlStore, cluster: Cluster, stream: str, read: StreamRead) -> dict[int, int]:
    """Delete from Kafka each partition's purged prefix, where the broker allows it; return the
    new log start of each partition trimmed."""
    marks = store.guarded("purge", lambda: _purged_now(store, stream), stream=stream)
    wanted: dict[tuple[str, int], int] = {}
    for partition, offsets in read.in_kafka.items():
        start, end = read.bounds[partition]
        first_kept = next((o for o in offsets if (partition, o) not in marks), end)
        if first_kept > start:
            wanted[(stream, partition)] = first_kept
    if not wanted:
        return {}
    try:
        require_delete_records(cluster, stream)
    except BrokerError as exc:
        log.info("purged dead letters of %s stay in Kafka, hidden: %s", stream, exc)
        return {}
    return {p: start for (_, p), start in trim(cluster, wanted).items()}


def _purged_now(store: SqlStore, stream: str) -> set[tuple[int, int]]:
    with store.engine.connect() as conn:
        return purged(conn, stream)
