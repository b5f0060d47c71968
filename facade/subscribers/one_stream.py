"""OneStreamSubscriber: reads one stream through one Kafka consumer, ungrouped (manual
assignment) or in a subscriber group (a Kafka consumer group; terms in
docs/concepts.md#glossary). ``bolide.facade.subscriber.Subscriber`` is this class under its
pinned name; a subscriber of several streams holds one of these per stream.

Positions below what Kafka still holds are read from the stream's history store when it has
one (the splice), else skipped to the first available record with a warning (a stale read).
Positions are never taken from a reported high watermark alone (see ``kafka.log_ends``).

The subscriber holds the lifecycle and the public API; its parts (``bolide.facade.consumer``) do the
rest under its lock: ``Lease`` (membership, rebalance hooks), ``Positions`` (where each
partition reads, the splice), ``Fetcher`` (queue, history, Kafka, decoding, dead letters),
``Confirms`` and, for a durable client, a ``DurableSession`` (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, Unpack

from confluent_kafka import TopicPartition

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer.assembly import assemble
from bolide.facade.consumer.client import (
    error_reporter,
    group_id,
    new_consumer,
    partition_arg,
    partitions_arg,
)
from bolide.facade.consumer.lifecycle import Lifecycle
from bolide.facade.consumer.membership import membership_of
from bolide.facade.durable import DurableSession
from bolide.facade.health import Health, measure
from bolide.facade.kafka import committed_offsets, ensure_topic, offsets_for_time
from bolide.facade.ports import Polled
from bolide.facade.producer.transactions import OffsetSource
from bolide.facade.receiver import AsyncRecordHandler, Receiver, RecordHandler
from bolide.facade.receiving.parallel import ReceiverOptions, new_receiver
from bolide.facade.record import RecordBatch
from bolide.facade.support import HookLock
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["OneStreamSubscriber"]

_SLICE_S = 0.1  # longest wait of poll while holding the subscriber's lock


class OneStreamSubscriber(Lifecycle):
    """Reads records from one stream through one Kafka consumer (applications write
    ``Subscriber``: see ``bolide.facade.subscriber``).

    Args:
        cluster: Where the stream lives.
        config: Stream, subscriber group, initial offset scheme and the other settings.

    Raises:
        ValueError: The config names several streams, a pattern or a share group (those are
            ``StreamsSubscriber`` and ``ShareSubscriber``).
        InvalidInitialOffsetSchemeError: NONE on an ungrouped subscriber.
        OffsetLoadError: NONE on a grouped subscriber whose group confirmed nothing.
        StreamConfigMismatchError: The topic exists with another partition count.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        super().__init__(cluster, config)
        if config.share_group is not None:
            raise ValueError(
                "this config names a share group: read it with ShareSubscriber (or "
                "new_subscriber, which picks the kind the config names)"
            )
        self.stream = config.single
        self.topic = self.stream.name
        # In a group or not, chosen here once: nothing else asks.
        self.membership = membership = membership_of(config, group_id(config))
        self.group_id = membership.group_id
        # Held while talking to the consumer; user callbacks wait until it is let go.
        self._lock = HookLock()
        self._report = error_reporter(config.error_handler, self._lock)
        # Settings are checked when the client is built: a bad one fails before any topic work.
        self._consumer, refusals = new_consumer(
            cluster, config, self.group_id, self._report, membership.settings(cluster, config)
        )
        try:
            self.partitions = ensure_topic(cluster, self.stream)
            parts = assemble(
                cluster,
                config,
                self._consumer,
                self.partitions,
                membership=membership,
                report=self._report,
                lock=self._lock,
                closed=lambda: self._closed,
                refusals=refusals,
            )
        except BaseException:
            self._consumer.close()
            raise
        self._core = parts
        self._state, self._positions = parts.state, parts.positions
        self._assigned = parts.state.assigned()
        self._confirms, self._durable = parts.confirms, parts.durable
        self._fetcher, self._lease = parts.fetcher, parts.lease
        self._receiver_hooks = parts.receiver_hooks
        self.scheme = self._positions.scheme
        parts.start(self.partitions)
        if TELEMETRY is not None:
            TELEMETRY.watch(self)

    def is_assigned(self) -> bool:
        """True when this subscriber holds the lease (always true when ungrouped)."""
        return self.membership.assigned(self._held)

    def _held(self) -> bool:
        """Serve the group (its rebalances run); whether any partition is held now."""
        with self._lock:
            if not self._closed and not self._lease.deactivated:
                self._fetcher.serve(self.config.max_batch)
            return bool(self._assigned)

    @property
    def joined(self) -> bool:
        """True once the subscriber group has given this subscriber an assignment (maybe an
        empty one: a group may have more members than partitions); always true when
        ungrouped. ``is_assigned`` and ``poll`` serve the join."""
        return self.membership.joined(self._lease)

    def deactivate(self) -> None:
        """Give up the lease (grouped only); ``reactivate`` seeks it again."""
        self.membership.needs_group("deactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            self._lease.deactivate()

    def reactivate(self) -> None:
        """Seek the lease again after ``deactivate`` (grouped only)."""
        self.membership.needs_group("reactivate is for grouped subscribers only")
        with self._lock:
            self._check_open()
            self._lease.reactivate()

    # -- reading -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> RecordBatch:
        """Read the next records, waiting at most ``timeout_ms`` for the first one.

        Returns as soon as at least one record is available, with up to ``max_batch`` records.
        A grouped subscriber that gains the lease during the wait returns its records in the
        same call. A broker answer that retrying cannot fix raises its typed error
        (``AuthorizationError``, ``AuthenticationError``, ``IncompatibleBrokerError``).
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
        can give it back (``give_back``). A subscriber closed by another caller while a poll
        waits returns nothing; closed before the ``first`` slice, it raises."""
        with self._lock:
            if self._closed and not first:
                return Polled(None, None, {})
            self._check_open()
            return self._fetcher.poll_once(deadline)

    def _rewind(self, offsets: Mapping[int, int]) -> None:
        """Read partitions again from ``offsets`` (records a receiver abandoned unfinished)."""
        with self._lock:
            if not self._closed:
                self._fetcher.rewind(offsets)

    def poll_step(self, *, first: bool) -> Polled:
        """One step of a poll that never waits (``SubscriberLike``: the asyncio API awaits
        between steps); its outcome is kept so that it can be given back."""
        return self._poll_once(0.0, first=first)

    def give_back(self, polled: Polled) -> None:
        """Undo a ``poll_step`` whose outcome never reached the application: its records come
        first in the next poll, and what it read is no longer confirmable until then."""
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
        self.membership.needs_no_group("seek is for ungrouped subscribers only")
        check_int("offset", offset)
        self._stream_arg(stream)
        p = self._partition_arg(partition)
        with self._lock:
            self._check_open()
            self._fetcher.seek({p: offset})

    def seek_to_time(
        self, timestamp_ms: int, partition: int | None = None, stream: str | None = None
    ) -> None:
        """Move an ungrouped subscriber to the first record at or after ``timestamp_ms``
        (epoch ms) on ``partition`` (every one when ``None``) of ``stream``; to the end of a
        partition with no such record (Kafka's ``offsetsForTimes``).

        Raises:
            IllegalSubscriberStateError: The subscriber is grouped.
            ValueError: ``timestamp_ms`` is negative, ``partition`` is not one of the
                stream's, or ``stream`` is not one this subscriber reads.
            BrokerError: The broker refused or did not answer the lookup.
        """
        self.membership.needs_no_group("seek_to_time is for ungrouped subscribers only")
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
            self._fetcher.seek(offsets)

    def pause(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Stop delivering ``partitions`` (numbers or ``(stream, partition)`` pairs; every
        held one when ``None``) until ``resume``, keeping the lease: Kafka's ``pause``, whose
        pause a rebalance that moves the partition forgets.

        Raises:
            ValueError: A partition is not one this subscriber holds.
        """
        with self._lock:
            self._check_open()
            self._state.holds.hold(partitions_arg(self.topic, self._assigned, partitions), "user")

    def resume(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Deliver paused ``partitions`` (every paused one when ``None``) again, from where
        their delivery stopped: nothing is skipped or repeated.

        Raises:
            ValueError: A partition is not one this subscriber holds.
        """
        with self._lock:
            self._check_open()
            holds = self._state.holds
            parts = (
                holds.holding("user")
                if partitions is None
                else partitions_arg(self.topic, self._assigned, partitions)
            )
            # Kafka fetches them again unless another reason holds them (history, a replay).
            holds.release(parts, "user")

    @property
    def paused(self) -> frozenset[tuple[str, int]]:
        """The partitions the application paused, as ``(stream, partition)`` pairs (read
        without the lock: the set is replaced, never changed)."""
        return frozenset((self.topic, p) for p in self._state.holds.holding("user"))

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
        lost (which changes nothing). Inside ``on_revoke`` the commit is synchronous. With
        ``conn`` (a SQLAlchemy connection, and ``SubscriberConfig(positions=...)``), the
        positions are written in that transaction and committed to Kafka once it commits
        (docs/exactly-once.md); ungrouped subscribers confirm this way too. It does not wait
        for a ``poll`` running in another thread.

        Raises:
            IllegalSubscriberStateError: The subscriber is ungrouped (without ``conn``), or
                closed, or ``conn`` is given without a position store, or missing with one.
            ValueError: ``offset`` is negative or beyond the last record read, or ``stream``
                is not one this subscriber reads.
            NotAssignedError: With ``conn``: the partition is not held (revoked, or the
                subscriber deactivated, since the record was read), or another subscriber
                moved the stored position (it took the partition over); roll the transaction
                back.
        """
        self._stream_arg(stream)
        self._confirm(offset, partition, conn=conn)

    def confirm_read(
        self,
        offset: int | None,
        partition: int | None,
        *,
        conn: Any,
        read: Mapping[int, int] | None,
    ) -> None:
        """``confirm`` against ``read``, what an asyncio iteration handed out (the last
        record per partition), not what the polls returned (``SubscriberLike``)."""
        self._confirm(offset, partition, conn=conn, read=read)

    def _confirm(
        self,
        offset: int | None,
        partition: int | None,
        *,
        conn: Any = None,
        read: Mapping[int, int] | None = None,
        limited: bool = True,
    ) -> None:
        """``confirm`` against ``read`` (the last record handed out per partition; by default
        the last each poll returned), bounded by a running parallel receiver's safe points
        unless not ``limited`` (the receiver's own confirms, computed from them)."""
        if conn is None:
            self.membership.needs_group("confirm is for grouped subscribers only")
        if offset is not None:
            check_int("offset", offset)
        p = 0 if offset is None else self._partition_arg(partition)
        limit = self._receiver_hooks.limit if limited else None
        deactivated = self._lease.deactivated
        positions = self._confirms.targets(
            offset, p, deactivated=deactivated, read=read, held_only=conn is not None
        )
        positions = limit(positions, offset) if limit is not None and positions else positions
        finished = self._confirms.finished(positions, offset, p)
        if not positions:
            return
        if TELEMETRY is not None:
            TELEMETRY.confirmed(self, positions)
        self._confirms.confirm(positions, conn, finished)

    def transaction_sources(self) -> list[OffsetSource]:
        """What ``Publisher.confirm(subscriber)`` sends with its transaction, one source per
        consumer: each gives the delivered positions and the group's metadata (Kafka's
        ``sendOffsetsToTransaction(positions, consumer.groupMetadata())``) and what to call
        once the transaction commits. Applications call ``Publisher.confirm``."""
        return [self._core.for_transaction]

    def health(self, *, lag: bool = True) -> Health:
        """Lease held, last poll, lag per held partition (read from the log ends unless
        ``lag=False``) and closed, as a ``bolide.facade.health.Health``."""
        with self._lock:
            held = [] if self._lease.deactivated or self._closed else sorted(self._assigned)
            nexts = self._state.nexts()
            at = {(self.topic, p): nexts.get(p) for p in held}
        group, last = self.membership.group, self._fetcher.last_poll_ms
        return measure(self.cluster, "subscriber", group, (self.topic,), at, closed=self._closed,
                       last_poll_ms=last, lag=lag)  # fmt: skip

    def committed(
        self, timeout_s: float = 10.0, *, stream: str | None = None
    ) -> dict[int, int | None]:
        """The group's confirmed positions (next offset to read) per partition of ``stream``
        (which a subscriber of several streams needs)."""
        self._stream_arg(stream)
        self.membership.needs_group("ungrouped subscribers confirm nothing")
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
            self._check_no_receiver()
            # Started under the lock: a second caller finds it running.
            confirm = partial(self._confirm, limited=False)
            seat = self._core.seat(self, self._lock, self._report, confirm, self._rewind)
            receiver = self._receiver = new_receiver(seat, handler, poll_timeout_ms, **options)
            receiver.start()
        return receiver

    def _partition_arg(self, partition: int | None) -> int:
        return partition_arg(self.topic, self.partitions, partition)

    def _stream_arg(self, stream: str | None) -> None:
        if stream is not None and stream != self.topic:
            raise ValueError(f"{stream!r} is not this subscriber's stream {self.topic!r}")

    @property
    def streams(self) -> tuple[str, ...]:
        """The names of the streams read."""
        return (self.topic,)

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
        self._stop_receiver()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._core.close(keep_alive, failed=failed)

    def __repr__(self) -> str:
        return f"Subscriber(stream={self.topic!r}, {self.membership.label()})"
