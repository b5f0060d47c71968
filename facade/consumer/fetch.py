"""``Fetcher``: gathers a subscriber's records from its history, its queue and Kafka.

Positions move only for records a poll returns (and for undecodable records it reports): a
failure after some records were gathered returns them and raises on the next poll; a failure
before any raises at once. Nothing taken from Kafka is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from itertools import islice
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, Message

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer._fetch_cy import take_run
from bolide.facade.consumer.client import refused_error
from bolide.facade.consumer.decoding import Decoder
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.consumer.shared_fetch import RingReader, reader
from bolide.facade.durable import DurableSession
from bolide.facade.errors import BolideError, SerializationError
from bolide.facade.kafka.fatal import Refusals, refused
from bolide.facade.ports import Polled
from bolide.facade.record import Record, RecordBatch, record_from_message

__all__ = ["Fetcher"]

_MIXED_WAIT_S = 0.01  # longest own-consumer wait while other partitions read the shared ring


class LeaseView(Protocol):
    """What the fetcher asks of the subscriber's lease (``Lease``, which owns this state)."""

    @property
    def deactivated(self) -> bool:
        """The subscriber gave its lease up: the consumer is served, nothing is read."""
        ...

    def claim_again(self) -> None:
        """Before each poll: ask again for the position store's claims that failed."""
        ...

    def expired(self) -> None:
        """The consumer missed its poll deadline: the lease is lost."""
        ...


class Fetcher:
    """Reads one subscriber's records; its caller holds the subscriber's lock.

    Args:
        cluster: Where the dead letter stream lives.
        config: The subscriber's settings (batch size, serde, dead letter).
        consumer: The subscriber's Kafka consumer.
        positions: The subscriber's positions, moved as records are delivered.
        durable: A durable client's session (replay flags, live records held back), or ``None``.
        report: The subscriber's error handler.
        pending: The queue of what is read, not yet delivered (history records and Kafka
            messages, in order); updated in place, never replaced.
        refusals: The consumer's ``error_cb``: an answer retrying cannot fix, raised by poll.
        may_share: The subscriber holds every partition for life (``Membership.may_share``),
            so it may read through the process's shared fetch.

    The subscriber's lease (built after the fetcher, whose records it drops when partitions
    move) introduces itself with ``follow``; the fetcher asks it what a poll needs
    (``LeaseView``).

    Attributes:
        last_poll_ms: When ``poll`` was last called, in epoch milliseconds.
    """

    def __init__(
        self,
        cluster: Cluster,
        config: SubscriberConfig,
        consumer: Consumer,
        positions: Positions,
        durable: DurableSession | None,
        report: Report,
        pending: deque[Message | Record],
        refusals: Refusals,
        *,
        may_share: bool,
    ) -> None:
        self.pending = pending
        self._refusals = refusals
        self._lease: LeaseView  # set by ``follow``, before anything is read
        self._consumer = consumer
        self._topic = config.single.name
        self._limit = config.max_batch
        self._positions = positions
        self._state = state = positions.state
        self._assigned = state.assigned()
        self._history, self._gaps = positions.history, positions.gaps
        self._decoder = Decoder(cluster, config) if config.serde is not None else None
        self._dead_letter = config.dead_letter is not None
        self._durable = durable
        # A subscriber that holds every partition for life (``may_share``: ungrouped), without
        # a serde or a durable replay, reads through the process's shared fetch, joined on its
        # first read from Kafka (shared_fetch.RingReader).
        self._sharing = (
            may_share
            and self._decoder is None
            and durable is None
            and config.shared_fetch_bytes > 0
        )
        self._cluster, self._config = cluster, config
        self._ring: RingReader | None = None
        self._ringed: set[int] = set()  # partitions read from the shared ring
        self._report = report
        # Raised by the next poll, with the positions it counts as read once raised.
        self._deferred: tuple[Exception, dict[int, int]] | None = None
        self._consumed: tuple[int, int] | None = None  # an undecodable record, counted as read
        self.last_poll_ms: int | None = None  # epoch ms of the last poll (for health checks)
        self._returned = 0  # records given back at the head of the queue, delivered first

    def poll(self, deadline: float) -> RecordBatch:
        """Gather up to ``max_batch`` records, waiting until ``deadline`` for the first one.

        Raises:
            Exception: The failure deferred by the previous poll, or one before any record
                was gathered; the records not delivered stay queued.
        """
        self.last_poll_ms = int(time.time() * 1000)
        if self._deferred is not None and not self._returned:
            (error, counted), self._deferred = self._deferred, None
            self._state.read(counted)
            raise error
        refused = self._refusals.take()  # kept by the error_cb in the previous poll
        if refused is not None:
            raise refused_error(refused, self._cluster, self._config)
        if self._durable is not None:
            self._durable.before_poll()
        self._lease.claim_again()
        # Records given back come alone before a deferred failure, as they did the first time.
        limit = self._limit if self._deferred is None else min(self._limit, self._returned)
        self._returned = 0
        # History joins the queue behind what is already queued, so each partition stays in
        # offset order; its Kafka partitions stay paused until the history ends.
        room = limit - len(self.pending)
        stored = self._history.read(room) if room > 0 else []
        self.pending.extend(stored)
        if self.pending and not self._lease.deactivated:
            # Call the consumer on every poll: that call is what keeps the lease.
            msg = self._consumer.poll(0)
            if msg is not None:
                self.pending.append(msg)
        self._positions.history_read()
        out: list[Record] = []
        read: dict[int, int] = {}  # last offset read per partition by this call
        self._consumed = None
        try:
            self._gather(out, read, limit, deadline)
        except Exception as exc:
            self._state.read(read)
            consumed, self._consumed = self._consumed, None
            if out:
                # Deliver what was gathered; the error (and the consumed record's position)
                # come with the next poll.
                self._deferred = (exc, dict([consumed]) if consumed is not None else {})
                return RecordBatch(out)
            if consumed is not None:
                self._state.read(dict([consumed]))
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit): hand nothing out, move nothing.
            self._requeue(out)
            raise
        else:
            self._state.read(read)
        return RecordBatch(out)

    def poll_once(self, deadline: float) -> Polled:
        """``poll``, with its outcome kept (a failure included) so that it can be given back."""
        before = dict(self._state.last_read())
        try:
            return Polled(self.poll(deadline), None, before)
        except Exception as exc:
            return Polled(None, exc, before)

    def give_back(self, polled: Polled) -> None:
        """Undo a poll whose outcome never reached the application (a cancelled asyncio poll).

        Its records are returned first by the next poll, and its failure raised there; until
        then ``last_read`` (what ``confirm()`` confirms) and the delivery positions are as they
        were before it, so nothing is lost and no position moves.
        """
        records = list(polled.batch or ())
        moved = self._state.restore_read(polled.last_read)
        if polled.error is not None:
            # Positions it counted as read (an undecodable record) count once it is raised.
            self._deferred = (polled.error, moved)
        if records:
            self._requeue(records)
            self._returned += len(records)

    def follow(self, lease: LeaseView) -> None:
        """Read under ``lease`` (the subscriber's, built after the fetcher)."""
        self._lease = lease

    def forget_pending(self) -> None:
        """Drop everything read and not delivered (the lease was given up)."""
        self.pending.clear()

    def serve(self, max_messages: int) -> None:
        """Serve rebalance callbacks; what is read waits in the queue for the next poll."""
        self.pending.extend(self._consumer.consume(max_messages, 0))

    def drop(self, partitions: Collection[int]) -> None:
        """Forget what is queued for ``partitions`` (revoked, or repositioned), and a failure
        deferred to the next poll that concerns one of them: it is read again from wherever
        the partition goes next, and fails there again if it still does."""
        self._keep(lambda m: _partition_of(m) not in partitions)
        if self._deferred is not None:
            error, counted = self._deferred
            where: set[int | None] = set(counted) or {getattr(error, "partition", None)}
            if not where.isdisjoint(partitions):
                self._deferred = None

    def move(self, partition: int, offset: int) -> None:
        """Move ``partition`` to ``offset``; every other partition restarts where delivery
        stands, so what was fetched but not yet delivered is dropped and read again."""
        self.pending.clear()
        self._returned = 0
        self._positions.move(self._assigned, partition, offset)

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Move each partition to its offset (where the history splice or the log start
        takes it when Kafka no longer holds it)."""
        self.drop(set(offsets))
        for p, offset in offsets.items():
            self.move(p, self._positions.seek_target(p, offset))

    def rewind(self, offsets: Mapping[int, int]) -> None:
        """Read partitions again from ``offsets`` (records a receiver abandoned unfinished):
        what lies below stays confirmable, nothing at or past them until it is read again."""
        state = self._state
        for p, offset in offsets.items():
            if p not in self._assigned:
                continue  # given up: the next owner reads on from the confirmed offset
            self.drop({p})
            if state.reassigns_on_rewind:
                self.move(p, offset)
            else:
                self._positions.rewind(p, offset)
            state.read_again_from(p, offset)

    def decode(self, record: Record) -> SerializationError | None:
        """Decode ``record.value`` with the subscriber's serde, if it has one (a retry
        tier's copy, say); return a permanent failure.

        Raises:
            SerializationError: A retriable failure.
        """
        return self._decoder.decode(record) if self._decoder is not None else None

    def close(self) -> None:
        """Release the dead letter publisher and the shared fetch."""
        if self._decoder is not None:
            self._decoder.close()
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    # -- gathering ---------------------------------------------------------------------------

    def _gather(self, out: list[Record], read: dict[int, int], limit: int, deadline: float) -> None:
        """Fill ``out`` from the queue and Kafka; an item whose handling fails is queued again.
        What belongs to a paused partition stays queued, in order."""
        held: list[Message | Record] = []
        try:
            self._gather_into(out, read, limit, deadline, held)
        finally:
            self.pending.extendleft(reversed(held))

    def _gather_into(
        self,
        out: list[Record],
        read: dict[int, int],
        limit: int,
        deadline: float,
        held: list[Message | Record],
    ) -> None:
        paused = self._positions.holds.holding("user")
        while len(out) < limit:
            if self.pending:
                item = self.pending.popleft()
                if paused and _partition_of(item) in paused:
                    held.append(item)
                    continue
            else:
                remaining = deadline - time.monotonic()
                wait = 0.0 if out else max(0.0, remaining)
                if self._lease.deactivated:
                    self._consumer.poll(0)
                    time.sleep(min(wait, 0.05))
                    if time.monotonic() >= deadline:
                        return
                    continue
                if self._sharing:
                    ring = self._ring or self._join()
                    took, seq, alone = ring.take(out, read, limit)
                    if took:
                        continue
                    if alone:  # the own consumer fetches nothing: wait for the ring
                        if out or time.monotonic() >= deadline:
                            return
                        ring.wait(seq, wait)
                        msg = self._consumer.poll(0)  # serves the own consumer's callbacks
                        if msg is not None:
                            self.pending.append(msg)
                        continue
                    if self._ringed:
                        wait = min(wait, _MIXED_WAIT_S)
                msgs = self._consumer.consume(1, wait) if not out else []
                if msgs and len(out) + 1 < limit:
                    msgs += self._consumer.consume(limit - len(out) - 1, 0)
                if not msgs:
                    if out or time.monotonic() >= deadline:
                        return
                    continue
                self._take(msgs, out, read)
                continue
            try:
                record = self._accept(item, read)
            except BaseException:
                self.pending.appendleft(item)  # not lost: the next poll tries it again
                raise
            if isinstance(record, BolideError):  # not queued again
                if isinstance(record, SerializationError):
                    # Counted as read: once raised, confirming moves past it.
                    self._consumed = _place_of(item)
                raise record
            if record is not None:
                out.append(record)

    def _join(self) -> RingReader:
        """Join the subscribers of the stream that may share a fetch."""
        self._ring = reader(self._cluster, self._config, self._positions)
        self._ringed = self._ring.ringed
        return self._ring

    def _requeue(self, out: list[Record]) -> None:
        """Put records gathered by an interrupted call back in front, positions with them."""
        self.pending.extendleft(reversed(out))
        for record in reversed(out):
            if record.partition is not None and record.offset is not None:
                self._state.delivered(record.partition, record.offset)

    def _take(self, msgs: list[Message], out: list[Record], read: dict[int, int]) -> None:
        """Deliver messages straight into ``out`` (no serde, no error; in a durable replay,
        below the marker); the first that needs the per-record checks goes with the rest to
        the pending queue (``_accept``). Runs of a partition go through ``take_run`` (the
        compiled per-record loop) and write the positions (``_end_run``) once, before anything
        reads them. Each message delivered is dropped from ``msgs`` at once: the collector
        never finds it."""
        state = self._state
        if self._decoder is not None or state.holds.holding("user") or state.skipping():
            self.pending.extend(msgs)
            return
        fetched, durable = self._gaps.expected, self._durable
        assigned, topic, ringed = self._assigned, self._topic, self._ringed
        run = -1  # partition of the current run (-1: none, or a partition to skip)
        expected: int | None = None  # next offset expected in the run (None: not known yet)
        end: int | None = None  # the run's replay marker while a durable replay runs
        last = -1  # last offset delivered in the run (-1: none yet)
        index, count = 0, len(msgs)
        try:
            while index < count:
                msg = msgs[index]
                if msg.error() is not None:
                    self.pending.extend(msgs[index:])
                    return
                partition = msg.partition()
                if partition != run:
                    if last >= 0:
                        last = self._end_run(run, last, end, read)
                    gone = partition not in assigned or partition in ringed
                    if partition is None or gone:  # not held, or read from the shared ring
                        run, index = -1, index + 1
                        continue
                    run, expected = partition, fetched.get(partition)
                    end = durable.replay_end(partition) if durable is not None else None
                index, done, expected, record = take_run(
                    msgs, index, run, expected, end, topic, out
                )
                if done >= 0:
                    last = done
                if record is None:  # another partition, an error or the end: seen above
                    continue
                offset: int = record.offset  # type: ignore[assignment]  # take_run checked
                if expected is not None and offset > expected:
                    if last >= 0:  # the gap check reads the positions: write the run's first
                        last = self._end_run(run, last, end, read)
                    if self._refetched(msgs, index, run):
                        return
                if end is not None:
                    if offset >= end:  # live while the replay runs: admitted one by one
                        self.pending.extend(msgs[index:])
                        return
                    record.replayed = True
                msgs[index] = None  # type: ignore[call-overload]  # let go at once
                out.append(record)
                last, expected, index = offset, offset + 1, index + 1
        finally:
            if last >= 0:
                self._end_run(run, last, end, read)

    def _refetched(self, msgs: list[Message], index: int, run: int) -> bool:
        """True when the gap before ``msgs[index]`` is fetched again (``_refetch_gap``): the
        messages of other partitions after it go to the pending queue, the rest is dropped."""
        try:
            refetch = self._refetch_gap(msgs[index])
        except BaseException:
            self.pending.extend(msgs[index:])
            raise
        if refetch:
            self.pending.extend(m for m in msgs[index + 1 :] if m.partition() != run)
        return refetch

    def _end_run(self, partition: int, last: int, end: int | None, read: dict[int, int]) -> int:
        """Write the positions of a run delivered up to offset ``last`` (and the replay's
        progress when ``end``, its marker, is set); returns -1, the next run's ``last``."""
        read[partition] = last
        self._gaps.expected[partition] = last + 1
        self._state.delivered(partition, last + 1)
        if end is not None and self._durable is not None:
            self._durable.replayed_run(partition, last)
        return -1

    def _refetch_gap(self, msg: Message) -> bool:
        """``FetchGaps.refetch``, also dropping what is queued for that partition."""
        at = self._gaps.refetch_from(msg)
        if at is None:
            return False
        partition = msg.partition()
        self._state.seek(partition or 0, at)
        self._keep(lambda m: _partition_of(m) != partition)
        return True

    def _keep(self, wanted: Callable[[Message | Record], bool]) -> None:
        self._returned = sum(1 for m in islice(self.pending, self._returned) if wanted(m))
        kept = [m for m in self.pending if wanted(m)]
        self.pending.clear()
        self.pending.extend(kept)

    def _accept(self, item: Message | Record, read: dict[int, int]) -> Record | BolideError | None:
        """Turn a message into a record to deliver.

        Returns:
            The record; ``None`` when there is nothing to deliver (an error message handled,
            a record held back or sent to the dead letter); the ``SerializationError`` of
            an undecodable record without a dead letter, which counts as read; or the error
            of a broker answer that retrying cannot fix (``fatal_error``).

        Raises:
            Exception: Handling failed; the item was not consumed and positions did not move.
        """
        if isinstance(item, Record):
            record = item
        else:
            if self._ringed and item.partition() in self._ringed:
                return None  # fetched before its pause: the shared ring delivers it
            err = item.error()
            if err is not None:
                return self._on_error(item, err)
            if item.partition() in self._assigned and self._refetch_gap(item):
                return None
            record = record_from_message(item, self._topic)
        partition = record.partition if record.partition is not None else 0
        if partition not in self._assigned:
            return None
        if record.offset is not None and self._state.skips(partition, record.offset):
            self._state.delivered(partition, record.offset + 1)
            return None  # finished by an earlier owner: its confirm says so
        failure = self._decoder.decode(record) if self._decoder is not None else None
        if self._durable is not None and not self._durable.admit(record):
            return None  # a live record held back until the durable replay is over
        if failure is not None and self._dead_letter:
            assert self._decoder is not None
            self._decoder.dead_letter(record, failure)
        if record.offset is not None:
            if failure is None or self._dead_letter:
                read[partition] = record.offset
            self._state.delivered(partition, record.offset + 1)
        if failure is not None:
            return failure if not self._dead_letter else None
        return record

    def _on_error(self, msg: Message, err: KafkaError) -> BolideError | None:
        code = err.code()
        if refused(err):
            return refused_error(err, self._cluster, self._config)
        if code == KafkaError._AUTO_OFFSET_RESET or code == KafkaError.OFFSET_OUT_OF_RANGE:
            partition = msg.partition() or 0
            self.move(partition, self._positions.out_of_range(partition, msg.offset()))
        elif code == KafkaError._MAX_POLL_EXCEEDED:
            self._lease.expired()
        elif code != KafkaError._PARTITION_EOF:
            self._report(f"read error on {self._topic}: {err.str()}", None)
        return None


def _place_of(item: Message | Record) -> tuple[int, int] | None:
    """``(partition, offset)`` of a record or message, when it has both."""
    if isinstance(item, Record):
        partition, offset = item.partition, item.offset
    else:
        partition, offset = item.partition(), item.offset()
    return (partition, offset) if partition is not None and offset is not None else None


def _partition_of(item: Message | Record) -> int | None:
    return item.partition if isinstance(item, Record) else item.partition()
