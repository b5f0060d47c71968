"""Marking a batch of outbox rows sent, with where each went: one ``UPDATE`` per row on
SQLite (local calls), one statement over arrays on PostgreSQL (a round trip per row would
cost more than Kafka's acknowledgement). ``SqlDialect.mark_outbox_sent`` picks one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.stores.schema import OUTBOX

__all__ = ["Sent", "mark_each", "mark_unnest"]

_O = OUTBOX.c


@dataclass(frozen=True, slots=True)
class Sent:
    """Where a row went: its partition and offset (``None`` when unknown)."""

    id: int
    partition: int | None
    offset: int | None


def mark_each(conn: Connection, sent: Sequence[Sent], sent_ms: int) -> None:
    """One ``UPDATE`` per row (executemany); a partition left unknown keeps the asked one."""
    statement = (
        OUTBOX.update()
        .where(_O.id == sa.bindparam("b_id"), _O.sent_ms.is_(None))
        .values(
            sent_ms=sent_ms,
            kafka_partition=sa.func.coalesce(sa.bindparam("b_partition"), _O.kafka_partition),
            kafka_offset=sa.bindparam("b_offset"),
        )
    )
    rows = [{"b_id": s.id, "b_partition": s.partition, "b_offset": s.offset} for s in sent]
    conn.execute(statement, rows)


_UNNEST = sa.text(
    "UPDATE bolide_outbox AS o SET sent_ms = :sent_ms, "
    "kafka_partition = coalesce(s.p, o.kafka_partition), kafka_offset = s.o "
    "FROM unnest(CAST(:ids AS bigint[]), CAST(:partitions AS integer[]), "
    "CAST(:offsets AS bigint[])) AS s(id, p, o) "
    "WHERE o.id = s.id AND o.sent_ms IS NULL"
)


def mark_unnest(conn: Connection, sent: Sequence[Sent], sent_ms: int) -> None:
    """One ``UPDATE ... FROM unnest(arrays)`` for the whole batch (PostgreSQL)."""
    conn.execute(
        _UNNEST,
        {
            "sent_ms": sent_ms,
            "ids": [s.id for s in sent],
            "partitions": [s.partition for s in sent],
            "offsets": [s.offset for s in sent],
        },
    )
