"""Purging dead letters: a mark per dead letter, its archived row deleted, Kafka trimmed.

Kafka deletes only a partition's oldest records (DeleteRecords up to an offset), so a purge
cannot take one record out of the middle of a partition. It therefore does three things:

1. marks every purged dead letter in ``bolide_dead_letter_purges``, with the topic's id and
   the letter's timestamp (``_books``): listing, showing and replaying skip the letters
   a mark covers, wherever they are still held, and a letter of a topic created again at the
   same place is not covered;
2. deletes the archived rows (and headers) of every marked dead letter, in the same
   transaction, including rows the archiver wrote again after an earlier purge: a row the
   mark's timestamp names (or, for a mark written before ``0009``, a row no younger than it);
3. where the broker supports DeleteRecords (``require_delete_records``, as ``capacity`` needs),
   deletes each partition's records up to its first dead letter that a mark does not
   *certainly* cover (same topic id), after checking the topic is still the one read. A broker
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
from bolide.facade.kafka.deletion import require_delete_records, trim
from bolide.stores.deadletters._books import Entry, Letter
from bolide.stores.deadletters._scan import StreamRead, topic_id
from bolide.stores.schema import HEADERS, PURGES, RECORDS, UNKNOWN_TOPIC
from bolide.stores.store import SqlStore

__all__ = ["Marks", "mark_and_delete", "purged", "trim_kafka"]

log = logging.getLogger(__name__)

#: Purge marks by ``(partition, offset)``: every incarnation's at that place.
Marks = dict[tuple[int, int], list[Entry]]


def purged(conn: Connection, stream: str) -> Marks:
    """The purge marks of ``stream``, by place."""
    p = PURGES.c
    query = sa.select(
        p.kafka_partition, p.kafka_offset, p.topic_id, p.timestamp_ms, p.purged_ms
    ).where(p.stream == stream)
    marks: Marks = {}
    for part, offset, topic, stamp, at in conn.execute(query):
        entry = Entry(str(topic), None if stamp is None else int(stamp), int(at))
        marks.setdefault((int(part), int(offset)), []).append(entry)
    return marks


def _marked_records(stream: str, key: str) -> sa.ColumnElement[bool]:
    """Archived records of ``stream`` (its topic incarnation stored as ``key``) that a purge
    mark names (``_books``' rule for a letter only the archive holds)."""
    p, r = PURGES.c, RECORDS.c
    legacy = sa.and_(
        p.topic_id == UNKNOWN_TOPIC, p.timestamp_ms.is_(None), r.timestamp_ms <= p.purged_ms
    )
    return sa.and_(
        r.stream == key,
        sa.exists().where(
            p.stream == stream,
            p.kafka_partition == r.kafka_partition,
            p.kafka_offset == r.kafka_offset,
            sa.or_(p.timestamp_ms == r.timestamp_ms, legacy),
        ),
    )


def mark_and_delete(store: SqlStore, stream: str, chosen: list[tuple[int, int, Letter]]) -> None:
    """Mark ``chosen`` (partition, offset, which letter) purged and delete every marked dead
    letter's archived row, in one transaction."""
    now = int(time.time() * 1000)
    rows = [
        {
            "stream": stream,
            "topic_id": letter.stored_topic,
            "kafka_partition": part,
            "kafka_offset": offset,
            "timestamp_ms": letter.timestamp_ms,
            "purged_ms": now,
        }
        for part, offset, letter in chosen
    ]
    p, h, r = PURGES.c, HEADERS.c, RECORDS.c
    keys = [p.stream, p.topic_id, p.kafka_partition, p.kafka_offset]
    key = store.stored_as(stream)  # the archive of the topic as it is now
    headers = sa.exists().where(
        r.stream == h.stream,
        r.kafka_partition == h.kafka_partition,
        r.kafka_offset == h.kafka_offset,
        _marked_records(stream, key),
    )

    def write() -> None:
        with store.engine.begin() as conn:
            if rows:
                conn.execute(store.sql_dialect.insert_ignoring(PURGES, keys), rows)
            conn.execute(sa.delete(HEADERS).where(h.stream == key, headers))
            conn.execute(sa.delete(RECORDS).where(_marked_records(stream, key)))

    store.guarded("purge", write, stream=stream)


def trim_kafka(store: SqlStore, cluster: Cluster, stream: str, read: StreamRead) -> dict[int, int]:
    """Delete from Kafka each partition's purged prefix, where the broker allows it; return the
    new log start of each partition trimmed.

    Only letters a mark certainly covers (the same topic id) count as purged: a mark of the
    topic's previous incarnation, or one written before ``0009``, never lets Kafka delete a
    letter. Nothing is deleted when the topic is no longer the one ``read`` read.
    """
    if read.topic_id is None:
        return {}  # no topic, or a broker without topic ids: no mark is certain
    marks = store.guarded("purge", lambda: _purged_now(store, stream), stream=stream)
    letters = {
        (r.partition or 0, r.offset or 0): Letter(read.topic_id, r.timestamp_ms)
        for r in read.records
        if read.from_kafka(r)
    }

    def gone(place: tuple[int, int]) -> bool:
        return any(e.certain(letters[place]) for e in marks.get(place, []))

    wanted: dict[tuple[str, int], int] = {}
    for partition, offsets in read.in_kafka.items():
        start, end = read.bounds[partition]
        first_kept = next((o for o in offsets if not gone((partition, o))), end)
        if first_kept > start:
            wanted[(stream, partition)] = first_kept
    if not wanted:
        return {}
    try:
        require_delete_records(cluster, stream)
    except BrokerError as exc:
        log.info("purged dead letters of %s stay in Kafka, hidden: %s", stream, exc)
        return {}
    if topic_id(cluster, stream) != read.topic_id:
        log.warning(
            "%s was deleted and created again during the purge: Kafka left as it is", stream
        )
        return {}
    return {p: start for (_, p), start in trim(cluster, wanted).items()}


def _purged_now(store: SqlStore, stream: str) -> Marks:
    with store.engine.connect() as conn:
        return purged(conn, stream)
