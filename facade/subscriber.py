"""Subscriber: reads a stream, ungrouped (manual assignment) or in a subscriber group (a Kafka
consumer group; terms in docs/concepts.md#glossary).

Positions below what Kafka still holds are read from the stream's history store when it has
one (the splice), else skipped to the first available record with a warning (a stale read).
Positions are never taken from a reported high watermark alone (see ``kafka.log_ends``).

The subscriber holds the lease (its partitions' ownership in the consumer group: membership,
rebalance hooks, confirms) and the lifecycle;
its parts do the rest under its lock: ``Positions`` (where each partition reads, the splice),
``Fetcher`` (gathering records: queue, history, Kafka, decoding, dead letters) and, for a
durable client, a ``DurableSession`` that sees the subscriber only through ``DurableHost``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Unpack

from confluent_kafka import Consumer, Message, TopicPartition

from bolide.facade._internal.closing import Closing
from bolide.facade._internal.lock import HookLock
from bolide.facade._internal.transactions import OffsetSource
from bolide.facade._parts.client import (
    commit_reporter,
    consumer_config,
    group_id,
    partition_arg,
)
from bolide.facade._parts.confirms import Confirms
from bolide.facade._parts.fetch import Fetcher, Polled
from bolide.facade._parts.host import ReceiverHooks, ReceiverSeat, SessionHost
from bolide.facade._parts.positions import Positions
from bolide.facade.config import Cluster, InitialOffsetScheme, SubscriberConfig
from bolide.facade.durable import DurableSession
from bolide.facade.errors import (
    IllegalSubscriberStateError,
    NotAssignedError,
    ReceiverAlreadyAttachedError,
)
from bolide.facade.health import Health, measure
from bolide.facade.kafka import committed_offsets, ensure_topic, new_client, offsets_for_time
from bolide.facade.parallel import ReceiverOptions, new_receiver
from bolide.facade.receiver import AsyncRecordHandler, Receiver, RecordHandler
from bolide.facade.record import Record, RecordBatch
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["Subscriber"]

log = logging.getLogger(__name__)

#: How long ``close`` serves the group's revocation before closing the consumer anyway.
_LEAVE_TIMEOUT_S = 10.0
_LEAVE_BATCH = 500
_LEAVE_POLL_S = 0.05
#: Polls in a row with nothing assigned and no rebalance callback before ``close``.
_LEAVE_QUIET_POLLS = 4

_SLICE_S = 0.1  # longest wait of poll while holding the subscriber's lock


#: What ``Subscriber(...)`` builds for a config of several streams: the class that
#: ``bolide.facade.streams`` registers (``read_several_streams_with``) when it is imported,
#: which importing ``bolide.facade`` does.
_SEVERAL_STREAMS: list[type[Subscriber]] = []


def read_several_streams_with(cls: type[Subscriber]) -> type[Subscriber]:
    """Register the subclass that reads several streams (a class decorator)."""
    _SEVERAL_STREAMS[:] = [cls]
    return cls


class Subscriber(Closing):
    """Reads records from one stream, or from several (``SubscriberConfig(streams=...)`` or
    ``pattern=``: then a ``bolide.facade.streams.StreamsSubscriber``).

    Args:
        cluster: Where the stream lives.
        config: Stream, subscriber group, initial offset scheme and the other settings.

    Raises:
        InvalidInitialOffsetSchemeError: NONE on an ungrouped subscriber.
        OffsetLoadError: NONE on a grouped subscriber whose group confirmed nothing.
        StreamConfigMismatchError: The topic exists with another partition count.
    """

    def __new__(cls, cluster: Cluster, config: SubscriberConfig) -> Subscriber:
        if cls is Subscriber and isinstance(config, SubscriberConfig) and config.stream is None:
            return super().__new__(_SEVERAL_STREAMS[0])
        return super().__new__(cls)

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        if not isinstance(cluster, Cluster):
            raise TypeError("cluster must be a Cluster")
        if not isinstance(config, SubscriberConfig):
            raise TypeError("config must be a SubscriberConfig")
        self.cluster = cluster
        self.config = config
        self.stream = config.single
        self.topic = self.stream.name
        self.grouped = config.grouped
        self.group_id = group_id(config)
        # Settings are checked when the client is built: a bad one fails before any topic work.
        on_commit = commit_reporter(self.topic, self._report)
        settings = consumer_config(cluster, config, self.group_id, on_commit)
        self._consumer = new_client(Consumer, settings, "consumer_config")
        try:
            self._setup()
        except BaseException:
            self._consumer.close()
            raise

    def _setup(self) -> None:
        config, cluster = self.config, self.cluster
        self.partitions = ensure_topic(cluster, self.stream)
        # Held while talking to the consumer; user callbacks wait until it is let go.
        self._lock = HookLock()
        self._closed = False
        self._receiver: Receiver | None = None
        # A running parallel receiver's revoke listener and confirm limit.
        self._receiver_hooks = ReceiverHooks()
        # Updated in place: the fetcher holds the same set.
        self._assigned: set[int] = set() if self.grouped else set(range(self.partitions))
        self._positions = Positions(cluster, config, self._consumer, self.partitions, self._report)
        self.scheme = self._positions.scheme
        self._confirms = Confirms(
            self.topic,
            self._consumer,
            self._positions,
            self._assigned,
            grouped=self.grouped,
            group_id=self.group_id,
            store=config.positions,
            report=self._report,
            lock=self._lock,
        )
        self._pending: deque[Message | Record] = deque()  # read, not yet delivered
        self._rebalances = 0  # rebalance callbacks served (see _leave_group)
        # A durable client (GemFire): registry claim, expiry, marker; see bolide.facade.durable.
        self._durable: DurableSession | None = None
        if config.durable_id is not None:
            parts = (self._assigned, self._positions, self._pending, self._report, self._lock)
            host = SessionHost(self._consumer, self.topic, *parts)
            self._durable = DurableSession(host, cluster, config, self.partitions)
        self._fetcher = Fetcher(
            cluster,
            config,
            self._consumer,
            assigned=self._assigned,
            positions=self._positions,
            durable=self._durable,
            report=self._report,
            lease_expired=self._lease_expired,
            pending=self._pending,
        )
        try:
            self._start()
        except BaseException:
            try:
                if self._durable is not None:
                    self._durable.abort()
            finally:
                self._consumer.close()  # never subscribed: nothing to revoke
            raise
        if TELEMETRY is not None:
            TELEMETRY.watch(self)

    # -- setup ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Claim the durable id, then join the group or assign every partition."""
        if self._durable is not None:
            self._durable.connect()
        confirms, every = self._confirms, range(self.partitions)
        if self.grouped:
            if self.scheme is InitialOffsetScheme.NONE:
                stored = confirms.stored(every) if confirms.keeps_positions else None
                self._positions.require_confirmed(self.group_id, stored)
            self._subscribe()
        else:
            stored = confirms.stored(every, claim=True) if confirms.keeps_positions else {}
            positions = self._positions
            positions.assign({p: positions.initial(p, stored.get(p)) for p in every})

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    # -- lease ------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalances += 1
        parts = [tp.partition for tp in partitions]
        positions = self._positions
        try:
            committed = self._confirms.committed(parts)
            if self._durable is not None:
                committed = self._durable.kept_positions(committed)
            positions.resume(parts, committed)
        except Exception as exc:
            # Never leave the lease half taken: go on from what this member delivered, else
            # from the group's confirmed offsets (never back below either).
            self._report(f"positioning {self.topic}{parts} failed; using confirmed offsets", exc)
            positions.fallback(parts)
        self._assigned.intersection_update(parts)
        self._assigned.update(parts)
        log.info("%s assigned %s[%s]", self.group_id, self.topic, parts)
        if self._durable is not None:
            self._durable.on_assigned(parts)
        hook = self.config.on_assign
        if hook is not None:
            self._lock.call(lambda: self._call_hook(hook, "on_assign", parts))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalances += 1
        self._lose([tp.partition for tp in partitions], lost=False)
        consumer.unassign()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalances += 1
        self._lose([tp.partition for tp in partitions], lost=True)
        consumer.unassign()

    def _lose(self, parts: list[int], *, lost: bool) -> None:
        held = self._assigned & set(parts)
        hook, listener = self.config.on_revoke, self._receiver_hooks.on_revoke
        if held and listener is not None and lost:
            listener(sorted(held), True)
        if held and (hook is not None or listener is not None) and not lost:
            # Kafka's onPartitionsRevoked: the partitions are still owned, so a confirm in the
            # hook commits (synchronously) before the next owner reads them.
            self._confirms.revoking = True
            try:
                if listener is not None:
                    listener(sorted(held), False)
                self._call_hook(hook, "on_revoke", sorted(held))
            finally:
                self._confirms.revoking = False
        self._assigned -= set(parts)
        self._positions.holds.drop(parts)  # Kafka forgets a moved partition's pause too
        for p in parts:
            self._positions.history.close(p)
        self._fetcher.drop(parts)
        # A revocation in a rebalance is routine (the lease may come straight back); only a
        # lost session is reported here. A confirm without the lease is reported by confirm().
        if lost and held and not self._fetcher.deactivated and not self._closed:
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

    def _lease_expired(self) -> None:
        """The consumer missed its poll deadline: the group has moved on without it."""
        self._lose(sorted(self._assigned), lost=True)

    def is_assigned(self) -> bool:
        """True when this subscriber holds the lease (always true when ungrouped)."""
        if not self.grouped:
            return True
        with self._lock:
            if not self._closed and not self._fetcher.deactivated:
                self._fetcher.serve(self.config.max_batch)
            return bool(self._assigned)

    @property
    def joined(self) -> bool:
        """True once the subscriber group has given this subscriber an assignment (maybe an
        empty one: a group may have more members than partitions); always true when
        ungrouped. ``is_assigned`` and ``poll`` serve the join."""
        return not self.grouped or self._rebalances > 0

    def deactivate(self) -> None:
        """Give up the lease (grouped only); ``reactivate`` seeks it again."""
        if not self.grouped:
            raise IllegalSubscriberStateError("deactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            fetcher = self._fetcher
            if fetcher.deactivated:
                return
            self._lose(sorted(self._assigned), lost=False)  # on_revoke while still owned
            fetcher.deactivated = True
            self._consumer.unsubscribe()
            self._pending.clear()

    def reactivate(self) -> None:
        """Seek the lease again after ``deactivate`` (grouped only)."""
        if not self.grouped:
            raise IllegalSubscriberStateError("reactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            if not self._fetcher.deactivated:
                return
            self._fetcher.deactivated = False
            self._subscribe()

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
            polled = self._poll_once(min(deadline, time.monotonic() + _SLICE_S), first=first)
            first = False
            if polled.error is not None:
                raise polled.error
            batch = polled.batch
            if batch is None:
                return RecordBatch()  # closed by another thread while waiting
            if batch or time.monotonic() >= deadline:
                if batch and TELEMETRY is not None:
                    TELEMETRY.delivered(self, batch)
                return batch

    def _poll_once(self, deadline: float, *, first: bool) -> Polled:
        """One slice of ``poll``, its outcome kept so that an asyncio poll that was cancelled
        can give it back (``_give_back``). A subscriber closed by another caller while a poll
        waits returns nothing; closed before the ``first`` slice, it raises."""
        with self._lock:
            if self._closed and not first:
                return Polled(None, None, {})
            self._check_open()
            return self._fetcher.poll_once(deadline)

    def _rewind(self, offsets: Mapping[int, int]) -> None:
        """Read partitions again from ``offsets`` (records a receiver abandoned unfinished):
        what lies below stays confirmable, nothing at or past them until it is read again."""
        with self._lock:
            if self._closed:
                return
            last_read = self._positions.last_read
            for p, offset in offsets.items():
                if p not in self._assigned:
                    continue  # given up: the next owner reads on from the confirmed offset
                self._fetcher.drop({p})
                if self.grouped:
                    self._positions.rewind(p, offset)
                else:
                    self._fetcher.move(p, offset)
                if offset > 0 and last_read.get(p, -1) >= offset:
                    last_read[p] = offset - 1
                elif offset == 0:
                    last_read.pop(p, None)

    def _give_back(self, polled: Polled) -> None:
        """Undo a ``_poll_once`` whose outcome never reached the application."""
        with self._lock:
            if not self._closed:
                self._fetcher.give_back(polled)

    # -- positions and confirms -------------------------------------------------------------

    def seek(self, offset: int, partition: int | None = None, stream: str | None = None) -> None:
        """Move an ungrouped subscriber to ``offset`` (the next record read) on ``partition``
        of ``stream`` (which a subscriber of several streams needs).

        Raises:
            IllegalSubscriberStateError: The subscriber is grouped.
            ValueError: ``offset`` is negative, ``partition`` is missing on a
                multi-partition stream, or ``stream`` is not one this subscriber reads.
        """
        if self.grouped:
            raise IllegalSubscriberStateError("seek is for ungrouped subscribers only")
        check_int("offset", offset)
        self._stream_arg(stream)
        p = self._partition_arg(partition)
        with self._lock:
            self._check_open()
            self._fetcher.drop({p})
            self._fetcher.move(p, self._positions.seek_target(p, offset))

    def seek_to_time(
        self, timestamp_ms: int, partition: int | None = None, stream: str | None = None
    ) -> None:
        """Move an ungrouped subscriber to the first record at or after ``timestamp_ms``
        (epoch milliseconds) on ``partition``, or on every partition when ``None`` (of
        ``stream``, or of every stream read when ``None``); to the end of a partition with no
        such record (Kafka's ``offsetsForTimes``).

        Raises:
            IllegalSubscriberStateError: The subscriber is grouped.
            ValueError: ``timestamp_ms`` is negative, ``partition`` is not one of the
                stream's, or ``stream`` is not one this subscriber reads.
            BrokerError: The broker refused or did not answer the lookup.
        """
        if self.grouped:
            raise IllegalSubscriberStateError("seek_to_time is for ungrouped subscribers only")
        check_int("timestamp_ms", timestamp_ms)
        self._stream_arg(stream)
        if partition is None:
            parts = list(range(self.partitions))
        else:
            parts = [self._partition_arg(partition)]
        self._check_open()
        offsets = offsets_for_time(self.cluster, self.topic, parts, timestamp_ms)
        with self._lock:
            self._check_open()
            self._fetcher.drop(set(offsets))
            for p, offset in offsets.items():
                self._fetcher.move(p, self._positions.seek_target(p, offset))

    def pause(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Stop delivering ``partitions`` (every held one when ``None``) until ``resume``,
        keeping the lease: Kafka's ``pause``. Partitions are numbers, or ``(stream,
        partition)`` pairs as ``paused`` gives them. A rebalance that moves a paused partition
        forgets its pause, as Kafka does.

        Raises:
            ValueError: A partition is not one this subscriber holds.
        """
        with self._lock:
            self._check_open()
            self._positions.holds.hold(self._held_args(partitions), "user")

    def resume(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Deliver paused ``partitions`` (every paused one when ``None``) again, from where
        their delivery stopped: nothing is skipped or repeated.

        Raises:
            ValueError: A partition is not one this subscriber holds.
        """
        with self._lock:
            self._check_open()
            holds = self._positions.holds
            parts = holds.holding("user") if partitions is None else self._held_args(partitions)
            # Kafka fetches them again unless another reason holds them (history, a replay).
            holds.release(parts, "user")

    @property
    def paused(self) -> frozenset[tuple[str, int]]:
        """The partitions the application paused, as ``(stream, partition)`` pairs (read
        without the lock: the set is replaced, never changed)."""
        return frozenset((self.topic, p) for p in self._positions.holds.holding("user"))

    def _held_args(self, partitions: Iterable[int | tuple[str, int]] | None) -> set[int]:
        if partitions is None:
            return set(self._assigned)
        if isinstance(partitions, int | tuple):
            raise TypeError("partitions must be an iterable of partitions (a list), or None")
        parts: set[int] = set()
        for item in partitions:
            if isinstance(item, tuple):
                stream, part = item
                if stream != self.topic:
                    raise ValueError(f"{stream!r} is not this subscriber's stream {self.topic!r}")
                item = part
            check_int("partition", item)
            if item not in self._assigned:
                raise ValueError(f"partition {item} of {self.topic!r} is not held")
            parts.add(item)
        return parts

    def confirm(
        self,
        offset: int | None = None,
        partition: int | None = None,
        *,
        stream: str | None = None,
        conn: Any = None,
    ) -> None:
        """Confirm records up to ``offset`` (Meteor's meaning: the last record finished with)
        on ``partition`` of ``stream`` (which a subscriber of several streams needs).

        Without ``offset``, confirms the last record returned by ``poll`` on every partition
        (of ``stream`` when given); with nothing read it does nothing. Commits are
        asynchronous; failures go to the error handler, as does a confirm after the lease was
        lost (which changes nothing). Inside
        ``on_revoke`` the partitions are still owned and the commit is synchronous.

        With ``conn`` (a SQLAlchemy connection in the application's transaction, and
        ``SubscriberConfig(positions=...)``), the positions are written in that transaction,
        and committed to Kafka once it commits (docs/exactly-once.md); ungrouped subscribers
        confirm this way too.

        It does not wait for a ``poll`` running in another thread, so a worker thread can
        confirm while a hook on the polling thread waits for it.

        Raises:
            IllegalSubscriberStateError: The subscriber is ungrouped (without ``conn``), or
                closed, or ``conn`` is given without a position store, or missing with one.
            ValueError: ``offset`` is negative or beyond the last record read, or ``stream``
                is not one this subscriber reads.
            NotAssignedError: With ``conn``: another subscriber moved the stored position
                (it took the partition over); roll the transaction back.
        """
        self._stream_arg(stream)
        self._confirm(offset, partition, conn=conn)

    def _confirm(
        self,
        offset: int | None,
        partition: int | None,
        *,
        conn: Any = None,
        read: Mapping[int, int] | None = None,
        limited: bool = True,
    ) -> None:
        """``confirm``, against ``read``: the last record handed out per partition (an
        asyncio iteration hands a batch out one record at a time); by default the last
        record each poll returned. A running parallel receiver's safe points bound it unless
        not ``limited`` (the receiver's own confirms, computed from them)."""
        if not self.grouped and conn is None:
            raise IllegalSubscriberStateError("confirm is for grouped subscribers only")
        p = 0
        if offset is not None:
            check_int("offset", offset)
            p = self._partition_arg(partition)
        deactivated = self._fetcher.deactivated
        positions = self._confirms.targets(offset, p, deactivated=deactivated, read=read)
        limit = self._receiver_hooks.limit if limited else None
        if limit is not None and positions:
            positions = limit(positions, offset)
        if not positions:
            return
        if TELEMETRY is not None:
            TELEMETRY.confirmed(self, positions)
        self._confirms.confirm(positions, conn)

    def transaction_sources(self) -> list[OffsetSource]:
        """What ``Publisher.confirm(subscriber)`` sends with its transaction, one source per
        consumer: each gives the delivered positions and the group's metadata (Kafka's
        ``sendOffsetsToTransaction(positions, consumer.groupMetadata())``) and what to call
        once the transaction commits. Applications call ``Publisher.confirm``."""
        return [self._confirm_in_transaction]

    def _confirm_in_transaction(self) -> tuple[list[TopicPartition], Any, Callable[[], None]]:
        """For ``Publisher.confirm``: the delivered positions, the group's metadata, and what
        to call once the transaction commits. A durable client's polls stop committing what
        they delivered: the transactions confirm what is finished (an aborted one, nothing)."""
        if self._durable is not None:
            self._durable.commit_delivered = False
        return self._confirms.for_transaction(deactivated=self._fetcher.deactivated)

    def health(self, *, lag: bool = True) -> Health:
        """Lease held, last poll, lag per held partition (read from the log ends unless
        ``lag=False``) and closed, as a ``bolide.facade.health.Health``."""
        with self._lock:
            held = [] if self._fetcher.deactivated or self._closed else sorted(self._assigned)
            at = {(self.topic, p): self._positions.next.get(p) for p in held}
        group, last = (self.group_id if self.grouped else None), self._fetcher.last_poll_ms
        return measure(self.cluster, "subscriber", group, (self.topic,), at, closed=self._closed,
                       last_poll_ms=last, lag=lag)  # fmt: skip

    def committed(
        self, timeout_s: float = 10.0, *, stream: str | None = None
    ) -> dict[int, int | None]:
        """The group's confirmed positions (next offset to read) per partition of ``stream``
        (which a subscriber of several streams needs)."""
        self._stream_arg(stream)
        if not self.grouped:
            raise IllegalSubscriberStateError("ungrouped subscribers confirm nothing")
        parts = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with self._lock:
            result = committed_offsets(self._consumer, parts, timeout_s)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}

    # -- receiver, errors, lifecycle ----------------------------------------------------------

    def attach_receiver(
        self,
        handler: RecordHandler | AsyncRecordHandler,
        poll_timeout_ms: int = 100,
        **options: Unpack[ReceiverOptions],
    ) -> Receiver:
        """Start a background receiver that polls and calls ``handler(record)`` per record.

        With the defaults it is one thread calling the handler on one record at a time and
        confirming nothing; with more ``concurrency``, a ``retry``, a ``dead_letter``, a
        ``resequencer`` or an ``async def`` handler it is a ``ParallelReceiver``. The options
        (also ``ordering``, ``auto_confirm``, ``max_in_flight``) are ``ReceiverOptions``,
        described at ``parallel.new_receiver`` and in docs/parallel.md.

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
            seat = ReceiverSeat(
                self,
                assigned=self._assigned,
                holds=self._positions.holds,
                lock=self._lock,
                report=self._report,
                confirm=lambda offset, p: self._confirm(offset, p, limited=False),
                rewind=self._rewind,
                hooks=self._receiver_hooks,
                durable=self._durable,
            )
            receiver = self._receiver = new_receiver(seat, handler, poll_timeout_ms, **options)
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
        return partition_arg(self.topic, self.partitions, partition)

    def _stream_arg(self, stream: str | None) -> None:
        if stream is not None and stream != self.topic:
            raise ValueError(f"{stream!r} is not this subscriber's stream {self.topic!r}")

    @property
    def streams(self) -> tuple[str, ...]:
        """The names of the streams read."""
        return (self.topic,)

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
        """Stop the receiver, leave the subscriber group and release the consumer.

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
                    if self.grouped:
                        self._leave_group()
                    self._consumer.close()
                finally:
                    self._confirms.close()
                    if self._durable is not None:
                        self._durable.after_close(keep_alive)
                    self._fetcher.close()

    def _leave_group(self) -> None:
        """Leave the subscriber group, serving its callbacks here rather than in ``close``.

        Any call on the consumer from a rebalance callback that ``close`` itself serves (the
        unassign every revocation needs) can wait for ever when the group still had a join or
        an assignment in flight (librdkafka #4884; the GIL is held there, so the whole process
        freezes), and librdkafka aborts the process (an assert in rd_kafka_cgrp_destroy_final)
        when a consumer closes while a re-subscription is still settling. So a join in flight
        is finished first, the subscription is left, and the consumer is polled until nothing
        is assigned and no rebalance callback has come for a few polls; ``close`` then finds
        nothing left to revoke. Records fetched meanwhile are dropped: nothing past the
        confirmed positions was delivered.
        """
        consumer = self._consumer
        deadline = time.monotonic() + _LEAVE_TIMEOUT_S
        # A deactivated subscriber has left already: no join of its own is on its way.
        joining = not self._fetcher.deactivated
        while joining and not self._rebalances and time.monotonic() < deadline:
            consumer.consume(num_messages=_LEAVE_BATCH, timeout=_LEAVE_POLL_S)
        consumer.unsubscribe()
        quiet = 0
        while time.monotonic() < deadline and quiet < _LEAVE_QUIET_POLLS:
            served = self._rebalances
            consumer.consume(num_messages=_LEAVE_BATCH, timeout=_LEAVE_POLL_S)
            settled = self._rebalances == served and not consumer.assignment()
            quiet = quiet + 1 if settled else 0

    def __repr__(self) -> str:
        kind = f"group={self.group_id!r}" if self.grouped else "ungrouped"
        return f"Subscriber(stream={self.topic!r}, {kind})"


# -- the asyncio API's way in (bolide.facade.aio) --------------------------------------------


def poll_step(sub: Subscriber, *, first: bool) -> Polled:
    """One step of a poll that never waits (a deadline already past): what takes what is
    fetched; the asyncio API awaits between steps. Its outcome can be given back."""
    return sub._poll_once(0.0, first=first)


def give_back(sub: Subscriber, polled: Polled) -> None:
    """Undo a ``poll_step`` whose outcome never reached the application."""
    sub._give_back(polled)


def confirm_read(
    sub: Subscriber,
    offset: int | None,
    partition: int | None,
    *,
    conn: Any,
    read: Mapping[int, int] | None,
) -> None:
    """``Subscriber.confirm`` against ``read``: the last record handed out per partition (an
    asyncio iteration hands a batch out one record at a time)."""
    sub._confirm(offset, partition, conn=conn, read=read)
