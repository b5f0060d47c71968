"""The SQL of an outbox relay: which rows it may publish now, marking them sent, and the
claims, epochs and batch numbers of a transactional relay.

The order rule: a row is publishable only when every older unsent row of its lane is in the
same claim. A relay takes the oldest pending rows it can lock (others' locks are skipped) and
keeps those whose lane has no older unsent row held elsewhere (by another relay's locks or a
transactional relay's claim), so a key's rows never overtake each other across relays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.facade.errors import ProducerFencedError
from bolide.facade.ports import now_ms
from bolide.stores.dialects import Sent, SqlDialect, dialect_of
from bolide.stores.schema import OUTBOX, OUTBOX_RELAYS

__all__ = [
    "Row",
    "claim",
    "claim_batch",
    "claimed_streams",
    "fence",
    "mark_sent",
    "pending_count",
    "pending_streams",
    "release",
    "settle",
    "start_epoch",
]

_O = OUTBOX.c
_R = OUTBOX_RELAYS.c


@dataclass(frozen=True, slots=True)
class Row:
    """A pending outbox row, as the relay publishes it."""

    id: int
    stream: str
    lane: int
    partition: int | None
    key: bytes | None
    payload: bytes | None
    headers: bytes | None


_COLUMNS = (_O.id, _O.stream, _O.lane, _O.kafka_partition, _O.key, _O.payload, _O.headers)


def claim(conn: Connection, dialect: SqlDialect, limit: int) -> list[Row]:
    """Lock up to ``limit`` of the oldest pending, unclaimed rows no other relay holds, and
    return the publishable ones among them, in id order (the rest stay locked, unused, until
    the transaction ends)."""
    query = (
        sa.select(*_COLUMNS)
        .where(_O.sent_ms.is_(None), _O.relay.is_(None))
        .order_by(_O.id)
        .limit(limit)
    )
    rows = [Row(*r) for r in conn.execute(dialect.skip_locked(query))]
    if not rows:
        return []
    ids = [r.id for r in rows]
    # Per lane, the oldest unsent row below the claim's newest that is not in the claim.
    held = (
        sa.select(_O.lane, sa.func.min(_O.id))
        .where(
            _O.lane.in_(sorted({r.lane for r in rows})),
            _O.sent_ms.is_(None),
            _O.id < ids[-1],
            _O.id.not_in(ids),
        )
        .group_by(_O.lane)
    )
    first_held: dict[int, int] = {int(lane): int(first) for lane, first in conn.execute(held)}
    return [r for r in rows if r.id < first_held.get(r.lane, r.id + 1)]


def mark_sent(conn: Connection, sent: Sequence[Sent]) -> None:
    """Mark rows sent, with where they went (a partition left unknown keeps the asked one)."""
    if sent:
        dialect_of(conn).mark_outbox_sent(conn, sent, now_ms())


def pending_count(conn: Connection, stream: str | None = None) -> int:
    """Rows not yet sent (of ``stream``, or of every stream)."""
    query = sa.select(sa.func.count()).select_from(OUTBOX).where(_O.sent_ms.is_(None))
    if stream is not None:
        query = query.where(_O.stream == stream)
    return int(conn.execute(query).scalar_one())


def pending_streams(conn: Connection) -> dict[str, int]:
    """Each stream with unsent rows, and its oldest unsent row's id."""
    query = sa.select(_O.stream, sa.func.min(_O.id)).where(_O.sent_ms.is_(None)).group_by(_O.stream)
    return {str(stream): int(first) for stream, first in conn.execute(query)}


# -- a transactional relay's claims ---------------------------------------------------------


def start_epoch(conn: Connection, relay: str) -> int:
    """Begin a new epoch of ``relay`` (fencing the previous holder's database writes)."""
    insert = dialect_of(conn).insert_ignoring(OUTBOX_RELAYS, [_R.relay])
    conn.execute(insert.values(relay=relay, epoch=0, batch=0, updated_ms=now_ms()))
    conn.execute(
        OUTBOX_RELAYS.update()
        .where(_R.relay == relay)
        .values(epoch=_R.epoch + 1, updated_ms=now_ms())
    )
    return int(conn.execute(sa.select(_R.epoch).where(_R.relay == relay)).scalar_one())


def fence(conn: Connection, relay: str, epoch: int) -> None:
    """Go on only while ``epoch`` is ``relay``'s newest (it also holds the relay's row until
    the transaction ends, so a start waits for the claim or mark in progress).

    Raises:
        ProducerFencedError: A newer relay with the same id started.
    """
    done = conn.execute(
        OUTBOX_RELAYS.update()
        .where(_R.relay == relay, _R.epoch == epoch)
        .values(updated_ms=now_ms())
    )
    if done.rowcount != 1:
        raise ProducerFencedError(
            f"outbox relay {relay!r} was fenced: another relay with the same transactional_id "
            "started; this one stops (the newer one takes its claims over)"
        )


def claim_batch(conn: Connection, relay: str, rows: Sequence[Row]) -> int:
    """Claim ``rows`` as ``relay``'s next batch; returns its number."""
    conn.execute(OUTBOX_RELAYS.update().where(_R.relay == relay).values(batch=_R.batch + 1))
    batch = int(conn.execute(sa.select(_R.batch).where(_R.relay == relay)).scalar_one())
    conn.execute(
        OUTBOX.update()
        .where(_O.id.in_([r.id for r in rows]), _O.sent_ms.is_(None))
        .values(relay=relay, batch=batch)
    )
    return batch


def claimed_streams(conn: Connection, relay: str) -> list[str]:
    """The streams of ``relay``'s claimed, unsent rows."""
    query = sa.select(_O.stream).where(_O.relay == relay, _O.sent_ms.is_(None)).distinct()
    return sorted(str(s) for s in conn.execute(query).scalars())


def settle(conn: Connection, relay: str, committed: int) -> tuple[int, int]:
    """After a start: ``relay``'s claimed batches up to ``committed`` (the last batch whose
    Kafka transaction committed) are sent; later ones never became visible and are handed
    back. Returns (rows marked sent, rows handed back)."""
    mine = (_O.relay == relay, _O.sent_ms.is_(None))
    sent = conn.execute(
        OUTBOX.update().where(*mine, _O.batch <= committed).values(sent_ms=now_ms())
    )
    released = conn.execute(
        OUTBOX.update().where(*mine, _O.batch > committed).values(relay=None, batch=None)
    )
    return int(sent.rowcount), int(released.rowcount)


def release(conn: Connection, relay: str, batch: int | None) -> int:
    """Hand batch ``batch`` of ``relay`` back: its transaction did not commit (``None``:
    every batch ``relay`` claimed and did not send)."""
    mine = [_O.relay == relay, _O.sent_ms.is_(None)]
    if batch is not None:
        mine.append(_O.batch == batch)
    done = conn.execute(OUTBOX.update().where(*mine).values(relay=None, batch=None))
    return int(done.rowcount)
