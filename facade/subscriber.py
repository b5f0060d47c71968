"""Subscriber: reads a stream, ungrouped (manual assignment) or grouped (a consumer group).

Positions below what Kafka still holds are read from the stream's history store when it has
one (the splice), else skipped to the first available record with a warning (Meteor's stale
read). Positions are never taken from a reported high watermark alone (see ``_kafka.log_ends``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from bolide.facade._internal.closing import Closing
from bolide.facade._internal.lock import HookLock
from bolide.facade.config import Cluster, InitialOffsetScheme, SubscriberConfig, check_eager
from bolide.facade.durable import DurableSession
from bolide.facade.errors import (
    IllegalSubscriberStateError,
    NotAssignedError,
    OffsetLoadError,
    OffsetOutOfRangeError,
    ReceiverAlreadyAttachedError,
    SerializationError,
)
from bolide.facade.history import HistoryCursor
from bolide.facade.kafka import (
    CONSUMER_DEFAULTS,
    FetchGaps,
    ensure_topic,
    log_ends,
    log_starts,
    new_client,
)
from bolide.facade.receiver import Receiver, RecordHandler
from bolide.facade.record import Record, RecordBatch, record_from_message
from bolide.facade.resequencer.sequence import DETAIL_HEADER, REASON_HEADER
from bolide.facade.validate import check_int

__all__ = ["Subscriber"]

log = logging.getLogger(__name__)

_EARLIEST, _LATEST = -2, -1  # symbolic positions resolved per partition
_SLICE_S = 0.1  # longest wait of poll while holding the subscriber's lock


class Subscriber(Closing):
    """Reads records from one stream.

    Args:
        cluster: Where the stream lives.
        config: Stream, group, initial offset scheme and the other subscriber settings.

    Raises:
        InvalidInitialOffsetSchemeError: NONE on an ungrouped subscriber.
        OffsetLoadError: NONE on a grouped subscriber whose group confirmed nothing.
        StreamConfigMismatchError: The topic exists with another partition count.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        if not isinstance(cluster, Cluster):
            raise TypeError("cluster must be a Cluster")
        if not isinstance(config, SubscriberConfig):
            raise TypeError("config must be a SubscriberConfig")
        self.cluster = cluster
        self.config = config
        self.stream = config.stream
        self.topic = config.stream.name
        self.grouped = config.grouped
        self.group_id = self._group_id()
        # Settings are checked when the client is built: a bad one fails before any topic work.
        self._consumer = new_client(Consumer, self._consumer_config(), "consumer_config")
        try:
            self._setup()
        except BaseException:
            self._consumer.close()
            raise

    def _setup(self) -> None:
        config, cluster = self.config, self.cluster
        self.partitions = ensure_topic(cluster, config.stream)
        # Held while talking to the consumer; user callbacks wait until it is let go.
        self._lock = HookLock()
        self._closed = False
        self._consumer_closed = False
        self._commit_lock = threading.Lock()  # confirm vs. closing the consumer
        self._revoking = False  # on_revoke runs: partitions still owned, confirms are synchronous
        self._deactivated = False
        self._receiver: Receiver | None = None
        self._pending: deque[Message | Record] = deque()  # read, not yet delivered
        self._assigned: set[int] = set() if self.grouped else set(range(self.partitions))
        self._last_read: dict[int, int] = {}
        self._next: dict[int, int] = {}  # next offset to deliver, per partition
        self._confirmed: dict[int, int] = {}  # highest position this member confirmed
        self._resume_at: dict[int, int] = {}  # where Kafka takes over from the history
        self._gaps = FetchGaps(self.topic, cluster.fetch_gap_settle_ms / 1000)
        self._history = HistoryCursor(self.stream)
        self._dead_letter: Any = None
        # Raised by the next poll, with the position of the record it consumed (if any).
        self._deferred: tuple[Exception, tuple[int, int] | None] | None = None
        self._consumed: tuple[int, int] | None = None  # an undecodable record, counted as read
        scheme = config.initial_offset_scheme
        if scheme is InitialOffsetScheme.AUTO:
            scheme = InitialOffsetScheme.EARLIEST if self.grouped else InitialOffsetScheme.LATEST
        self.scheme = scheme
        # LATEST means after the last record that existed when the subscriber started.
        self._latest = (
            log_ends(cluster, self.topic, range(self.partitions))
            if scheme is InitialOffsetScheme.LATEST
            else {}
        )
        # A durable client (GemFire): registry claim, expiry, marker; see bolide.facade.durable.
        self._durable = DurableSession(self) if config.durable_id is not None else None
        try:
            if self._durable is not None:
                self._durable.connect()
            if self.grouped:
                if scheme is InitialOffsetScheme.NONE:
                    self._require_confirmed()
                self._subscribe()
            else:
                self._assign_all({p: self._initial(p, None) for p in range(self.partitions)})
        except BaseException:
            if self._durable is not None:
                self._durable.abort()
            raise

    # -- setup ---------------------------------------------------------------------------

    def _group_id(self) -> str:
        if self.config.durable_id is not None:
            return f"bolide-durable-{self.config.durable_id}"
        if self.config.group is not None:
            return self.config.group
        return f"bolide-ungrouped-{uuid.uuid4().hex}"  # never commits

    def _consumer_config(self) -> dict[str, Any]:
        lease = self.config.lease_timeout_ms
        own: dict[str, Any] = {
            "group.id": self.group_id,
            "client.id": f"bolide-sub-{self.topic}",
            # Kafka's OFFSET_OUT_OF_RANGE reaches us as an error: we splice or skip ourselves.
            "auto.offset.reset": "error",
            "on_commit": self._on_commit,
        }
        if self.grouped:
            own.update(
                {
                    "session.timeout.ms": lease,
                    "max.poll.interval.ms": lease,
                    "heartbeat.interval.ms": max(100, lease // 10),
                }
            )
        config = self.cluster.client_config(CONSUMER_DEFAULTS, own, self.config.consumer_config)
        check_eager("Cluster settings", config)
        return config

    def _require_confirmed(self) -> None:
        parts = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        committed = self._consumer.committed(parts, timeout=10)
        if not any(tp.offset >= 0 for tp in committed):
            raise OffsetLoadError(
                f"group {self.group_id!r} has no confirmed offset on {self.topic!r} and the "
                "initial offset scheme is NONE",
                stream=self.topic,
            )

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _initial(self, partition: int, committed: int | None) -> int:
        """Resolve where a partition without a usable position starts."""
        if committed is not None and committed >= 0:
            return committed
        if self.scheme is InitialOffsetScheme.LATEST:
            return self._latest[partition]
        if self.scheme is InitialOffsetScheme.NONE:
            self._report(
                f"no confirmed offset for partition {partition}; starting at the earliest",
                OffsetLoadError("no confirmed offset", stream=self.topic, partition=partition),
            )
        return _EARLIEST

    # -- positioning -----------------------------------------------------------------------

    def _assign_all(self, positions: dict[int, int]) -> None:
        """Assign Kafka partitions at ``positions``, splicing history for what Kafka dropped."""
        starts = log_starts(self._consumer, self.topic, positions, cluster=self.cluster)
        assignment: list[TopicPartition] = []
        paused: list[TopicPartition] = []
        for partition, wanted in positions.items():
            start = starts[partition]
            offset = wanted
            if wanted == _EARLIEST:
                first = self._history.first_offset(partition)
                offset = first if first is not None and first < start else start
            if offset < start:
                if self._history.covers(partition, offset, start):
                    self._history.open(partition, offset, start)
                else:
                    self._report(
                        f"position {offset} of {self.topic}[{partition}] is below the first "
                        f"available record {start}; skipping to it (stale read)",
                        OffsetOutOfRangeError(
                            "stale position",
                            stream=self.topic,
                            partition=partition,
                            offset=offset,
                        ),
                    )
                offset = start
            spliced = self._history.position(partition)
            self._next[partition] = spliced if spliced is not None else offset
            self._gaps.expected[partition] = offset
            tp = TopicPartition(self.topic, partition, offset)
            assignment.append(tp)
            if self._history.active(partition):
                paused.append(TopicPartition(self.topic, partition))
                self._resume_at[partition] = offset
        self._consumer.assign(assignment)
        if paused:
            self._consumer.pause(paused)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = [tp.partition for tp in partitions]
        try:
            self._position_assigned(consumer, parts)
        except Exception as exc:
            # Never leave the lease half taken: go on from what this member delivered, else
            # from the group's confirmed offsets (never back below either).
            self._report(f"positioning {self.topic}{parts} failed; using confirmed offsets", exc)
            self._fallback_assign(consumer, parts)
        self._assigned = set(parts)
        log.info("%s assigned %s[%s]", self.group_id, self.topic, parts)
        if self._durable is not None:
            self._durable.on_assigned(parts)
        hook = self.config.on_assign
        if hook is not None:
            self._lock.call(lambda: self._call_hook(hook, "on_assign", parts))

    def _fallback_assign(self, consumer: Consumer, parts: list[int]) -> None:
        """Assign ``parts`` without the history or the initial offset scheme."""
        assignment = []
        for p in parts:
            self._history.close(p)
            self._resume_at.pop(p, None)
            if p in self._confirmed:
                offset = self._next[p] = self._gaps.expected[p] = self._confirmed[p]
            else:
                # Kafka resumes from the group's confirmed offset.
                offset = OFFSET_INVALID
                self._next.pop(p, None)
                self._gaps.expected.pop(p, None)
            assignment.append(TopicPartition(self.topic, p, offset))
        consumer.assign(assignment)

    def _position_assigned(self, consumer: Consumer, parts: list[int]) -> None:
        committed = {
            tp.partition: tp.offset
            for tp in consumer.committed([TopicPartition(self.topic, p) for p in parts], timeout=10)
        }
        if self._durable is not None:
            committed = self._durable.kept_positions(committed)
        for p, mine in self._confirmed.items():
            # An asynchronous confirm may not have landed yet: never go back below it.
            if p in committed and mine > committed[p]:
                committed[p] = mine
        for p in parts:
            # What this member read stays confirmable unless another member confirmed beyond
            # it in the meantime (a routine rebalance hands the same partition straight back).
            last, done = self._last_read.get(p), committed.get(p)
            if last is not None and done is not None and done > last + 1:
                del self._last_read[p]
            self._history.close(p)
        self._assign_all({p: self._initial(p, committed.get(p)) for p in parts})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._lose([tp.partition for tp in partitions], lost=False)
        consumer.unassign()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._lose([tp.partition for tp in partitions], lost=True)
        consumer.unassign()

    def _lose(self, parts: list[int], *, lost: bool) -> None:
        held = self._assigned & set(parts)
        hook = self.config.on_revoke
        if held and hook is not None and not lost:
            # Kafka's onPartitionsRevoked: the partitions are still owned, so a confirm in the
            # hook commits (synchronously) before the next owner reads them.
            self._revoking = True
            try:
                self._call_hook(hook, "on_revoke", sorted(held))
            finally:
                self._revoking = False
        self._assigned -= set(parts)
        for p in parts:
            self._history.close(p)
        self._pending = deque(m for m in self._pending if _partition_of(m) not in parts)
        # A revocation in a rebalance is routine (the lease may come straight back); only a
        # lost session is reported here. A confirm without the lease is reported by confirm().
        if lost and held and not self._deactivated and not self._closed:
            self._report(
                f"lease lost on {self.topic}{sorted(held)}",
                NotAssignedError("lease lost", stream=self.topic),
            )
        if held and hook is not None and lost:
            # Kafka's onPartitionsLost: another member may own them already; nothing to commit.
            self._call_hook(hook, "on_revoke", sorted(held))

    def _call_hook(
        self, hook: Callable[[list[int]], None] | None, name: str, parts: list[int]
    ) -> None:
        if hook is None:
            return
        try:
            hook(parts)
        except Exception as exc:
            self._report(f"{name} raised", exc)

    # -- reading -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> RecordBatch:
        """Read the next records, waiting at most ``timeout_ms`` for the first one.

        Returns as soon as at least one record is available, with up to ``max_batch`` records.
        A grouped subscriber that gains the lease during the wait returns its records in the
        same call.
        """
        check_int("timeout_ms", timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        first = True
        while True:
            # Wait in slices and let go of the lock between them, so that confirm, seek,
            # is_assigned or close from another thread wait a slice, not the whole timeout.
            with self._lock:
                if self._closed and not first:
                    return RecordBatch()  # closed by another thread while waiting
                batch = self._poll_until(min(deadline, time.monotonic() + _SLICE_S))
            first = False
            if batch or time.monotonic() >= deadline:
                return batch

    def _poll_until(self, deadline: float) -> RecordBatch:
        """One slice of ``poll`` (the caller holds the lock).

        Positions move only for records this call returns (and for undecodable records it
        reports): a failure after some records were gathered returns them and raises on the
        next poll; a failure before any raises at once. Nothing taken from Kafka is dropped.
        """
        self._check_open()
        if self._deferred is not None:
            (error, consumed), self._deferred = self._deferred, None
            if consumed is not None:
                self._last_read[consumed[0]] = consumed[1]
            raise error
        if self._durable is not None:
            self._durable.before_poll()
        limit = self.config.max_batch
        # History joins the queue behind what is already queued, so each partition stays in
        # offset order; its Kafka partitions stay paused until the history ends.
        room = limit - len(self._pending)
        stored = self._history.read(room) if room > 0 else []
        self._pending.extend(stored)
        if self._pending and not self._deactivated:
            # Call the consumer on every poll: that call is what keeps the lease.
            msg = self._consumer.poll(0)
            if msg is not None:
                self._pending.append(msg)
        self._report_history_gaps()
        self._resume_finished_history()
        out: list[Record] = []
        read: dict[int, int] = {}  # last offset read per partition by this call
        self._consumed = None
        try:
            self._gather(out, read, limit, deadline)
        except Exception as exc:
            self._last_read.update(read)
            consumed, self._consumed = self._consumed, None
            if out:
                # Deliver what was gathered; the error (and the consumed record's position)
                # come with the next poll.
                self._deferred = (exc, consumed)
                return RecordBatch(out)
            if consumed is not None:
                self._last_read[consumed[0]] = consumed[1]
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit): hand nothing out, move nothing.
            self._requeue(out)
            raise
        else:
            self._last_read.update(read)
        return RecordBatch(out)

    def _gather(self, out: list[Record], read: dict[int, int], limit: int, deadline: float) -> None:
        """Fill ``out`` from the queue and Kafka; an item whose handling fails is queued again."""
        while len(out) < limit:
            if self._pending:
                item = self._pending.popleft()
            else:
                remaining = deadline - time.monotonic()
                wait = 0.0 if out else max(0.0, remaining)
                if self._deactivated:
                    self._consumer.poll(0)
                    time.sleep(min(wait, 0.05))
                    if time.monotonic() >= deadline:
                        return
                    continue
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
                self._pending.appendleft(item)  # not lost: the next poll tries it again
                raise
            if isinstance(record, SerializationError):
                # Counted as read: once raised, confirming moves past it.
                self._consumed = _place_of(item)
                raise record
            if record is not None:
                out.append(record)

    def _requeue(self, out: list[Record]) -> None:
        """Put records gathered by an interrupted call back in front, positions with them."""
        self._pending.extendleft(reversed(out))
        for record in reversed(out):
            if record.partition is not None and record.offset is not None:
                self._next[record.partition] = record.offset

    def _take(self, msgs: list[Message], out: list[Record], read: dict[int, int]) -> None:
        """Deliver plain messages straight into ``out``; anything else goes through ``_accept``.

        The common case (no serde, no durable replay, no error) skips the per-record checks;
        the first message that needs them sends it and the rest to the pending queue.
        """
        if self.config.serde is not None or self._durable is not None:
            self._pending.extend(msgs)
            return
        next_offsets, fetched = self._next, self._gaps.expected
        assigned, grouped, topic = self._assigned, self.grouped, self.topic
        for index, msg in enumerate(msgs):
            if msg.error() is not None:
                self._pending.extend(msgs[index:])
                return
            partition = msg.partition()
            if partition is None or (grouped and partition not in assigned):
                continue
            expected = fetched.get(partition)
            record = record_from_message(msg, topic)
            offset = record.offset
            if offset is None:
                continue
            if expected is not None and offset > expected:
                try:
                    refetch = self._refetch_gap(msg)
                except BaseException:
                    self._pending.extend(msgs[index:])
                    raise
                if refetch:
                    self._pending.extend(m for m in msgs[index + 1 :] if m.partition() != partition)
                    return
            out.append(record)
            read[partition] = offset
            next_offsets[partition] = fetched[partition] = offset + 1

    def _refetch_gap(self, msg: Message) -> bool:
        """``FetchGaps.refetch``, also dropping what is queued for that partition."""
        if not self._gaps.refetch(self._consumer, msg):
            return False
        partition = msg.partition()
        self._pending = deque(m for m in self._pending if _partition_of(m) != partition)
        return True

    def _accept(
        self, item: Message | Record, read: dict[int, int]
    ) -> Record | SerializationError | None:
        """Turn a message into a record to deliver.

        Returns:
            The record; ``None`` when there is nothing to deliver (an error message handled,
            a record held back or sent to the dead letter); or the ``SerializationError`` of
            an undecodable record without a dead letter, which counts as read.

        Raises:
            Exception: Handling failed; the item was not consumed and positions did not move.
        """
        if isinstance(item, Record):
            record = item
        else:
            err = item.error()
            if err is not None:
                self._on_error(item, err)
                return None
            if (not self.grouped or item.partition() in self._assigned) and self._refetch_gap(item):
                return None
            record = record_from_message(item, self.topic)
        partition = record.partition if record.partition is not None else 0
        if self.grouped and partition not in self._assigned:
            return None
        failure = self._decode(record) if self.config.serde is not None else None
        if self._durable is not None and not self._durable.admit(record):
            return None  # a live record held back until the durable replay is over
        if failure is not None and self.config.dead_letter is not None:
            self._send_dead_letter(record, failure)
        if record.offset is not None:
            if failure is None or self.config.dead_letter is not None:
                read[partition] = record.offset
            self._next[partition] = record.offset + 1
        if failure is not None:
            return failure if self.config.dead_letter is None else None
        return record

    def _decode(self, record: Record) -> SerializationError | None:
        """Decode ``record.value``; return a permanent failure, raise a retriable one.

        A serde's own exception (not a ``SerializationError``) is a permanent failure too,
        wrapped with the record's place and the original as its cause.
        """
        serde = self.config.serde
        try:
            record.value = serde.decode(
                record.data, stream=self.topic, partition=record.partition, offset=record.offset
            )
        except SerializationError as exc:
            if exc.retriable:
                raise  # the registry is unreachable: the record is tried again next poll
            return exc
        except Exception as exc:
            error = SerializationError(
                f"{type(serde).__name__} could not decode {self.topic}[{record.partition}] "
                f"offset {record.offset}: {type(exc).__name__}: {exc}",
                stream=self.topic,
                partition=record.partition,
                offset=record.offset,
            )
            error.__cause__ = exc
            return error
        return None

    def _send_dead_letter(self, record: Record, exc: SerializationError) -> None:
        from bolide.facade.config import PublisherConfig
        from bolide.facade.publisher import Publisher

        if self._dead_letter is None:
            assert self.config.dead_letter is not None
            self._dead_letter = Publisher(
                self.cluster, PublisherConfig(stream=self.config.dead_letter)
            )
        headers = [
            *record.headers,
            (REASON_HEADER, b"undecodable"),
            (DETAIL_HEADER, str(exc).encode()),
            ("bolide.source", f"{self.topic}/{record.partition}/{record.offset}".encode()),
        ]
        self._dead_letter.publish(Record(record.data, key=record.key, headers=headers))

    def _on_error(self, msg: Message, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError._AUTO_OFFSET_RESET or code == KafkaError.OFFSET_OUT_OF_RANGE:
            self._handle_out_of_range(msg.partition() or 0, msg.offset())
        elif code == KafkaError._PARTITION_EOF:
            return
        elif code == KafkaError._MAX_POLL_EXCEEDED:
            self._lose(sorted(self._assigned), lost=True)
        else:
            self._report(f"read error on {self.topic}: {err.str()}", None)

    def _handle_out_of_range(self, partition: int, offset: int | None) -> None:
        """Kafka says a position is out of range: below the log start, or past the end."""
        start = log_starts(self._consumer, self.topic, [partition], cluster=self.cluster)[partition]
        position = offset if offset is not None and offset >= 0 else start
        if position < start:
            self._assign_one(partition, position)
            return
        end = log_ends(self.cluster, self.topic, [partition])[partition]
        self._report(
            f"offset {position} is past the end {end} of {self.topic}[{partition}]",
            OffsetOutOfRangeError(
                "offset out of range", stream=self.topic, partition=partition, offset=position
            ),
        )
        self._assign_one(partition, end)

    def _assign_one(self, partition: int, offset: int) -> None:
        """Move ``partition`` to ``offset``; every other partition restarts where delivery
        stands, so what was fetched but not yet delivered is dropped and read again."""
        positions = {p: self._next.get(p, _EARLIEST) for p in self._assigned}
        positions[partition] = offset
        self._pending.clear()
        for p in positions:
            self._history.close(p)
        self._assign_all(positions)

    def _report_history_gaps(self) -> None:
        for partition, first, stop in self._history.gaps():
            self._report(
                f"offsets {first} to {stop - 1} of {self.topic}[{partition}] are neither in "
                "the history store nor in Kafka; skipping to what Kafka holds (stale read)",
                OffsetOutOfRangeError(
                    "gap in the history", stream=self.topic, partition=partition, offset=first
                ),
            )

    def _resume_finished_history(self) -> None:
        finished = self._history.finished()
        if finished:
            parts = [TopicPartition(self.topic, p, self._resume_at.pop(p)) for p in finished]
            self._consumer.resume(parts)
            # A fresh fetch at once: a resumed partition otherwise waits out a fetch backoff.
            for tp in parts:
                self._consumer.seek(tp)

    # -- positions ------------------------------------------------------------------------

    def seek(self, offset: int, partition: int | None = None) -> None:
        """Move an ungrouped subscriber to ``offset`` (the next record read).

        Raises:
            IllegalSubscriberStateError: The subscriber is grouped.
            ValueError: ``offset`` is negative, or ``partition`` is missing on a
                multi-partition stream.
        """
        if self.grouped:
            raise IllegalSubscriberStateError("seek is for ungrouped subscribers only")
        check_int("offset", offset)
        p = self._partition_arg(partition)
        with self._lock:
            self._check_open()
            self._pending = deque(m for m in self._pending if _partition_of(m) != p)
            end = log_ends(self.cluster, self.topic, [p])[p]
            if offset > end:
                self._report(
                    f"seek to {offset} is past the end {end} of {self.topic}[{p}]",
                    OffsetOutOfRangeError(
                        "offset out of range", stream=self.topic, partition=p, offset=offset
                    ),
                )
                offset = end
            self._last_read.pop(p, None)
            self._assign_one(p, offset)

    def confirm(self, offset: int | None = None, partition: int | None = None) -> None:
        """Confirm records up to ``offset`` (Meteor's meaning: the last record finished with).

        Without arguments, confirms the last record returned by ``poll`` on every partition;
        with nothing read it does nothing. Commits are asynchronous; failures go to the error
        handler, as does a confirm after the lease was lost (which changes nothing). Inside
        ``on_revoke`` the partitions are still owned and the commit is synchronous.

        It does not wait for a ``poll`` running in another thread, so a worker thread can
        confirm while a hook on the polling thread waits for it.

        Raises:
            IllegalSubscriberStateError: The subscriber is ungrouped, or closed.
            ValueError: ``offset`` is negative or beyond the last record read.
        """
        if not self.grouped:
            raise IllegalSubscriberStateError("confirm is for grouped subscribers only")
        if offset is None:
            targets = dict(self._last_read)
        else:
            check_int("offset", offset)
            p = self._partition_arg(partition)
            last = self._last_read.get(p)
            if last is None or offset > last:
                raise ValueError(
                    f"offset {offset} of {self.topic}[{p}] was never read (last read: {last})"
                )
            targets = {p: offset}
        if not targets or self._deactivated:
            return
        assigned = set(self._assigned)
        not_held = sorted(set(targets) - assigned)
        if not_held:
            self._report(
                f"confirm without the lease on {self.topic}{not_held}: nothing changed",
                NotAssignedError(
                    "confirm without the lease", stream=self.topic, partition=not_held[0]
                ),
            )
        positions = {p: o + 1 for p, o in targets.items() if p in assigned}
        if not positions:
            return
        commits = [TopicPartition(self.topic, p, o) for p, o in positions.items()]
        for p, o in positions.items():
            self._confirmed[p] = max(o, self._confirmed.get(p, o))
        with self._commit_lock:
            if self._consumer_closed:
                raise IllegalSubscriberStateError("subscriber is closed", stream=self.topic)
            if self._durable is not None:
                self._durable.confirmed(positions)
            if not self._revoking:
                self._consumer.commit(offsets=commits, asynchronous=True)
                return
            try:
                self._consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                self._report(f"confirm failed on {self.topic} while revoking", exc)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:
            self._report(f"confirm failed on {self.topic}: {err.str()}", None)
            return
        failed = [tp for tp in partitions if tp.error is not None]
        if failed:
            self._report(f"confirm failed on {self.topic}: {failed}", None)

    def committed(self, timeout_s: float = 10.0) -> dict[int, int | None]:
        """The group's confirmed positions (next offset to read) per partition."""
        if not self.grouped:
            raise IllegalSubscriberStateError("ungrouped subscribers confirm nothing")
        parts = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with self._lock:
            result = self._consumer.committed(parts, timeout=timeout_s)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}

    # -- lease ------------------------------------------------------------------------------

    def is_assigned(self) -> bool:
        """True when this subscriber holds the lease (always true when ungrouped)."""
        if not self.grouped:
            return True
        with self._lock:
            if not self._closed and not self._deactivated:
                # Serve rebalance callbacks; keep anything read for the next poll.
                self._pending.extend(self._consumer.consume(self.config.max_batch, 0))
            return bool(self._assigned)

    def deactivate(self) -> None:
        """Give up the lease (grouped only); ``reactivate`` seeks it again."""
        if not self.grouped:
            raise IllegalSubscriberStateError("deactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            if self._deactivated:
                return
            self._lose(sorted(self._assigned), lost=False)  # on_revoke while still owned
            self._deactivated = True
            self._consumer.unsubscribe()
            self._pending.clear()

    def reactivate(self) -> None:
        """Seek the lease again after ``deactivate`` (grouped only)."""
        if not self.grouped:
            raise IllegalSubscriberStateError("reactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            if not self._deactivated:
                return
            self._deactivated = False
            self._subscribe()

    # -- receiver, errors, lifecycle ----------------------------------------------------------

    def attach_receiver(self, handler: RecordHandler, poll_timeout_ms: int = 100) -> Receiver:
        """Start a background thread that polls and calls ``handler(record)`` per record.

        Raises:
            ReceiverAlreadyAttachedError: A receiver is already attached.
        """
        with self._lock:
            self._check_open()
            if self._receiver is not None and self._receiver.running:
                raise ReceiverAlreadyAttachedError(
                    "a receiver is already attached", stream=self.topic
                )
            # Started under the lock: a second caller finds it running.
            receiver = self._receiver = Receiver(self, handler, poll_timeout_ms)
            receiver.start()
        return receiver

    def _report(self, summary: str, error: BaseException | None) -> None:
        """Tell the error handler (or the log); while the lock is held, once it is let go."""
        handler = self.config.error_handler
        if handler is None:
            log.warning("%s: %s", summary, error if error is not None else "")
            return

        def call() -> None:
            try:
                handler(summary, error)
            except Exception:
                log.exception("error handler raised")

        self._lock.call(call)

    def _partition_arg(self, partition: int | None) -> int:
        if partition is None:
            if self.partitions != 1:
                raise ValueError(
                    f"partition is required: {self.topic!r} has {self.partitions} partitions"
                )
            return 0
        check_int("partition", partition)
        if partition >= self.partitions:
            raise ValueError(f"partition {partition} does not exist in {self.topic!r}")
        return partition

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalSubscriberStateError("subscriber is closed", stream=self.topic)

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed

    @property
    def durable(self) -> DurableSession | None:
        """A durable client's connection state (marker, live, state), else ``None``."""
        return self._durable

    @property
    def marker(self) -> dict[int, int]:
        """A durable client's marker: partition -> first offset not replayed (else empty)."""
        return dict(self._durable.marker) if self._durable is not None else {}

    def close(self, keep_alive: bool = True) -> None:
        """Stop the receiver, leave the group and release the consumer.

        Args:
            keep_alive: Durable clients only: keep the queue for a later reconnect, committing
                what the application had finished (what it had before its last poll, or
                confirmed); ``False`` unregisters the client and drops its position.
        """
        self._close(keep_alive, failed=False)

    def __exit__(self, *exc_info: object) -> None:
        # Leaving by an exception: the batch in hand was not finished, so a durable client
        # commits nothing new (its last batch is delivered again on reconnect).
        self._close(True, failed=bool(exc_info) and exc_info[0] is not None)

    def _close(self, keep_alive: bool, *, failed: bool) -> None:
        receiver = self._receiver
        if receiver is not None:
            receiver.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._durable is not None:
                    self._durable.before_close(keep_alive, failed=failed)
            finally:
                try:
                    self._consumer.close()  # on_revoke runs here, partitions still owned
                finally:
                    with self._commit_lock:
                        self._consumer_closed = True
                    if self._durable is not None:
                        self._durable.after_close(keep_alive)
                    if self._dead_letter is not None:
                        self._dead_letter.close()

    def __repr__(self) -> str:
        kind = f"group={self.group_id!r}" if self.grouped else "ungrouped"
        return f"Subscriber(stream={self.topic!r}, {kind})"


def _place_of(item: Message | Record) -> tuple[int, int] | None:
    """``(partition, offset)`` of a record or message, when it has both."""
    if isinstance(item, Record):
        partition, offset = item.partition, item.offset
    else:
        partition, offset = item.partition(), item.offset()
    return (partition, offset) if partition is not None and offset is not None else None


def _partition_of(item: Message | Record) -> int | None:
    return item.partition if isinstance(item, Record) else item.partition()
