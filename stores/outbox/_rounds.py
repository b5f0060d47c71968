"""One round of an outbox relay: claim rows, publish them, mark them sent.

``AtLeastOnce`` (idempotent publishers): claim, publish, wait for the acknowledgements, mark
what was acknowledged. A crash before the mark publishes the claim again: each row reaches
Kafka at least once, and a key's first copies keep its order.

``ExactlyOnce`` (transactional publishers): claim (a committed claim: relay id and batch
number), publish in one Kafka transaction that also commits the batch number (the marker),
mark sent. After a crash, the marker says whether the batch committed: marked sent if it did,
handed back if not. Claims and marks check the relay's epoch, so a relay that a newer one with
the same id replaced writes nothing more.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NoReturn

from confluent_kafka import KafkaException

from bolide.facade.errors import ProducerFencedError, PublishError, TransactionError
from bolide.facade.record import Record
from bolide.stores.dialects import Sent
from bolide.stores.outbox._claims import (
    Row,
    claim,
    claim_batch,
    claimed_streams,
    fence,
    mark_sent,
    release,
    settle,
    start_epoch,
)
from bolide.stores.outbox._kafka import Marker, Publishers, final, record_of
from bolide.stores.store import SqlStore

__all__ = ["AtLeastOnce", "Done", "ExactlyOnce"]

log = logging.getLogger("bolide.stores.outbox")


@dataclass(frozen=True)
class Done:
    """What a round (or a start) did: rows published and marked sent; for a transactional
    relay, rows of earlier batches found committed (``recovered``) or handed back
    (``released``); ``busy``: more may be ready at once."""

    published: int = 0
    recovered: int = 0
    released: int = 0
    busy: bool = False


def named(error: PublishError, rows: list[Row], records: list[Record]) -> PublishError:
    """``error`` naming the outbox row of the record it carries."""
    where = next((r.id for r, rec in zip(rows, records, strict=True) if rec is error.record), None)
    if where is None:
        return error
    return PublishError(
        f"outbox row {where}: {error}",
        record=error.record,
        cause=error.cause,
        stream=error.stream,
        retriable=error.retriable,
    )


class AtLeastOnce:
    """Rounds of a relay with idempotent publishers."""

    def __init__(
        self, store: SqlStore, publishers: Publishers, batch_size: int, stop: threading.Event
    ) -> None:
        self._store = store
        self._publishers = publishers
        self._batch_size = batch_size
        self._stop = stop

    def start(self) -> Done:
        """Nothing to recover: rows locked by a relay that died are free again."""
        return Done()

    def round(self) -> Done:
        """Claim, publish, mark what Kafka acknowledged (a key stops at its first failure)."""
        dialect = self._store.sql_dialect
        with dialect.relay_scope(self._store.engine) as scope:
            rows = scope.run(lambda conn: claim(conn, dialect, self._batch_size))
            if not rows:
                return Done()
            sent, error = self._publish(rows)
            scope.run(lambda conn: mark_sent(conn, sent))
        if error is not None:
            if not final(error):
                self._publishers.reset()  # a failed record may have ended its producer
            raise error
        return Done(published=len(sent), busy=len(rows) == self._batch_size)

    def _publish(self, rows: list[Row]) -> tuple[list[Sent], PublishError | None]:
        by_stream: dict[str, list[Row]] = {}
        for row in rows:
            by_stream.setdefault(row.stream, []).append(row)
        # Every stream's publisher first: a stream that does not exist stops the round
        # before anything of it is sent.
        publishers = {stream: self._publishers.get(stream) for stream in by_stream}
        launched: list[tuple[list[Row], list[Record], Future[list[int]]]] = []
        for stream, group in by_stream.items():
            records = [record_of(r) for r in group]
            launched.append((group, records, publishers[stream].publish_many(records)))
        futures = [future for *_, future in launched]
        while not self._stop.is_set():
            if not concurrent.futures.wait(futures, timeout=0.5).not_done:
                break
        sent: list[Sent] = []
        error: PublishError | None = None
        for group, records, future in launched:
            if not future.done():
                continue  # closing: left unmarked, published again by the next relay
            failed: set[int] = set()
            for row, rec in zip(group, records, strict=True):
                if rec.offset is None or row.lane in failed:
                    failed.add(row.lane)
                    continue
                sent.append(Sent(row.id, rec.partition, rec.offset))
            problem = future.exception()
            if error is None and isinstance(problem, PublishError):
                error = named(problem, group, records)
        return sent, error

    def close(self) -> None:
        """Flush and close the publishers."""
        self._publishers.close()


@dataclass
class _Unsettled:
    """A claimed batch whose end is not written yet: ``committed`` ``None`` when only the
    marker can tell."""

    batch: int
    rows: list[Row]
    records: list[Record]
    committed: bool | None


class ExactlyOnce:
    """Rounds of a relay with transactional publishers (``transactional_id``)."""

    def __init__(
        self,
        store: SqlStore,
        publishers: Publishers,
        marker: Marker,
        relay_id: str,
        batch_size: int,
    ) -> None:
        self._store = store
        self._publishers = publishers
        self._marker = marker
        self._id = relay_id
        self._batch_size = batch_size
        self._epoch = 0
        self._unsettled: _Unsettled | None = None
        self._unheard = False  # the last claim failed: it may have landed unheard

    def start(self) -> Done:
        """Take the id over: a new epoch (fencing the database writes of the previous
        holder), its streams' publishers started (fencing its Kafka transactions), then its
        claimed batches settled by the marker."""
        engine = self._store.engine
        with engine.begin() as conn:
            self._epoch = start_epoch(conn, self._id)
        with engine.connect() as conn:
            streams = claimed_streams(conn, self._id)
        for stream in streams:
            self._publishers.get(stream)
        committed = self._marker.committed()
        with engine.begin() as conn:
            fence(conn, self._id, self._epoch)
            recovered, released = settle(conn, self._id, committed)
        if recovered or released:
            log.info(
                "outbox relay %r: %d claimed rows were committed in Kafka (marked sent), %d "
                "were not (handed back)",
                self._id,
                recovered,
                released,
            )
        return Done(recovered=recovered, released=released)

    def round(self) -> Done:
        """Settle the last batch if it is open; claim one stream's rows; publish them in a
        transaction with their batch number; mark them sent."""
        settled = self._settle() if self._unsettled is not None else Done()
        claimed = self._claim()
        if claimed is None:
            return settled
        batch, rows = claimed
        records = [record_of(r) for r in rows]
        self._unsettled = _Unsettled(batch, rows, records, None)
        publisher = self._publishers.get(rows[0].stream)
        future: Future[list[int]] | None = None
        try:
            with publisher.transaction():
                future = publisher.publish_many(records)
                publisher.confirm(self._marker.at(batch))
        except ProducerFencedError as exc:
            self._fenced_in_kafka(rows[0].stream, exc)
        except (PublishError, KafkaException) as exc:
            self._publishers.drop(rows[0].stream)  # aborts what is open; restarts clean
            problem = future.exception() if future is not None and future.done() else None
            if isinstance(problem, PublishError) and final(problem):
                raise named(problem, rows, records) from exc
            raise
        self._unsettled.committed = True
        assert future is not None  # the transaction committed: the batch was sent in it
        future.result(30.0)  # committed, so delivered: every record has its offset
        done = self._settle()
        return Done(
            published=settled.published + done.published, released=settled.released, busy=True
        )

    def _fenced_in_kafka(self, stream: str, error: ProducerFencedError) -> NoReturn:
        """A publisher fenced: by a newer relay with the id (it holds the epoch now: stop),
        or by an older one starting that stream's publisher before it found itself fenced in
        the database (this relay goes on with a fresh publisher)."""
        with self._store.engine.begin() as conn:
            fence(conn, self._id, self._epoch)  # raises for a newer relay
        self._publishers.drop(stream)
        raise TransactionError(
            f"the publisher of {stream!r} was fenced by an older relay with the id "
            f"{self._id!r}; it starts again",
            stream=stream,
            cause=error.cause,
            retriable=True,
        ) from error

    def _claim(self) -> tuple[int, list[Row]] | None:
        """Claim the next batch: publishable rows of the oldest one's stream.

        A claim whose commit failed may have landed all the same (the database went away
        before it answered). Its rows would then wait under this relay's claim, never
        published, and once a later batch committed, the next start would take them for
        sent. So the claim after a failed one first hands back every claim of the relay:
        none is in flight while it claims."""
        try:
            claimed, needs = self._claim_rows(unheard=self._unheard)
        except BaseException:
            self._unheard = True
            raise
        self._unheard = False
        if needs is None:
            return claimed
        # A publisher starts before its stream's rows are claimed: a relay replaced while it
        # starts one is fenced in Kafka by the replacement, which sees the claim.
        self._publishers.get(needs)
        return self._claim()

    def _claim_rows(self, *, unheard: bool) -> tuple[tuple[int, list[Row]] | None, str | None]:
        """The claimed batch, or the stream whose publisher must start before its rows are
        claimed; ``unheard``: hand back the relay's claims first."""
        dialect = self._store.sql_dialect
        with self._store.engine.begin() as conn:
            fence(conn, self._id, self._epoch)  # first: on SQLite it takes the write lock
            if unheard:
                release(conn, self._id, None)
            rows = claim(conn, dialect, self._batch_size)
            if not rows:
                return None, None
            stream = rows[0].stream
            if not self._publishers.has(stream):
                return None, stream
            mine = [r for r in rows if r.stream == stream]
            return (claim_batch(conn, self._id, mine), mine), None

    def _settle(self) -> Done:
        """Write the end of the open batch: sent if its transaction committed, else handed
        back (the marker decides when the commit's outcome is unknown)."""
        open_batch = self._unsettled
        assert open_batch is not None
        committed = open_batch.committed
        if committed is None:
            # Its publisher started first: a transaction of the id left open (an abandoned
            # publisher's commit may still be landing) is finished or aborted before the
            # marker is read.
            self._publishers.get(open_batch.rows[0].stream)
            committed = self._marker.committed() >= open_batch.batch
            open_batch.committed = committed
        sent = [
            Sent(r.id, rec.partition, rec.offset)
            for r, rec in zip(open_batch.rows, open_batch.records, strict=True)
        ]
        with self._store.engine.begin() as conn:
            fence(conn, self._id, self._epoch)
            if committed:
                mark_sent(conn, sent)
            else:
                released = release(conn, self._id, open_batch.batch)
        self._unsettled = None
        if committed:
            return Done(published=len(sent))
        return Done(released=released)

    def close(self) -> None:
        """Settle the open batch if the database and Kafka let us (else the next start
        does), then close the publishers and the marker."""
        try:
            if self._unsettled is not None:
                self._store.guarded("settle the last outbox batch", self._settle)
        except Exception as exc:  # a database or broker failure: the next start settles it
            log.warning("outbox relay %r: the last batch is left to the next start: %s",
                        self._id, exc)  # fmt: skip
        finally:
            self._publishers.close()
            self._marker.close()
