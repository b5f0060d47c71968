"""Receiver: a background thread that polls a subscriber and hands each record to a callback.

``ReceiverMetrics`` and the ``ReceiverHost`` seam are shared with the parallel receiver
(``bolide.facade.receiving.parallel``, with the receiver options), which
``Subscriber.attach_receiver`` starts for ``concurrency`` above 1, retries, dead letters or an
``async def`` handler.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from confluent_kafka import KafkaError, TopicPartition

from bolide.facade.config import Cluster, StreamConfig, SubscriberConfig
from bolide.facade.errors import (
    AuthenticationError,
    AuthorizationError,
    DurableClientBusyError,
    IncompatibleBrokerError,
    ProducerFencedError,
    SerializationError,
    TransactionInDoubtError,
)
from bolide.facade.record import Record, RecordBatch
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = [
    "STOPS_RECEIVER",
    "AsyncRecordHandler",
    "ConfirmLimit",
    "Receiver",
    "ReceiverHost",
    "ReceiverMetrics",
    "RecordHandler",
    "RevokeListener",
    "StreamReader",
    "is_async_handler",
    "refused_for_good",
    "stopped_because",
]

log = logging.getLogger(__name__)

RecordHandler = Callable[[Record], None]
AsyncRecordHandler = Callable[[Record], Awaitable[None]]

#: Longest single wait of the receiver's poll, whatever ``poll_timeout_ms`` says: a stop is
#: seen within it, so closing never waits for a long poll.
_STOP_CHECK_MS = 100


#: A parallel receiver's part in a revoke: ``fn(partitions, lost)``, before ``on_revoke``.
RevokeListener: TypeAlias = Callable[[list[int], bool], None]
#: A parallel receiver's safe points: ``fn(targets, offset)`` lowers what a confirm moves to
#: below the records still unfinished, whoever confirms.
ConfirmLimit: TypeAlias = Callable[[dict[int, int], int | None], dict[int, int]]


class Member(Protocol):
    """What a receiver reads of its subscriber's membership (``bolide.facade.consumer.
    membership``: in a consumer group or not, chosen once).

    Attributes:
        group: The consumer group reported; ``None`` without one.
        commits: Confirms reach the consumer group's offsets.
    """

    @property
    def group(self) -> str | None: ...

    @property
    def commits(self) -> bool: ...

    def needs_group(self, message: str, stream: str | None = None) -> None:
        """Raise ``IllegalSubscriberStateError(message)`` without a consumer group."""
        ...


class StreamReader(Protocol):
    """The public side of a subscriber of one stream.

    Attributes:
        topic: The stream's topic.
        stream: The stream's config.
        config: The subscriber's config.
        membership: In a consumer group or not.
        group_id: Its group id.
    """

    topic: str
    stream: StreamConfig
    config: SubscriberConfig
    group_id: str

    @property
    def membership(self) -> Member: ...

    @property
    def closed(self) -> bool:
        """True once the subscriber is closed."""
        ...

    def poll(self, timeout_ms: int) -> RecordBatch:
        """The subscriber's ``poll``."""
        ...


class ReceiverHost(StreamReader, Protocol):
    """What a receiver sees of its subscriber, and all it sees: ``Subscriber.attach_receiver``
    hands one to the receiver it starts."""

    def serve(self) -> None:
        """Call the consumer without taking records: rebalances run, the lease holds."""
        ...

    def assigned(self) -> AbstractSet[int]:
        """The partitions the subscriber holds now."""
        ...

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the subscriber's error handler (or the log)."""
        ...

    def holding(self, partition: int) -> int | None:
        """The id of the assignment that holds ``partition`` (``None`` when not held): a
        partition revoked and assigned again is held by another (a revoke heard from
        another thread comes before the partition leaves ``assigned``)."""
        ...

    def confirm_finished(self, offset: int, partition: int) -> None:
        """Confirm ``partition`` up to ``offset``, every record at and below it finished.

        Raises:
            ValueError: The partition was repositioned: the offset is no longer this reader's.
            IllegalSubscriberStateError: The subscriber is closed or deactivated.
        """
        ...

    def note_finished(self, partition: int, offsets: Iterable[int]) -> None:
        """Records of ``partition`` finished above its safe point (handlers finish out of
        order): kept with its position, so that its next owner skips them."""
        ...

    def rewind(self, offsets: Mapping[int, int]) -> None:
        """Read partitions again from ``offsets`` (records abandoned unfinished)."""
        ...

    def hold_fetching(self) -> None:
        """Stop Kafka fetching every partition held (those assigned later too, when called
        again), keeping the lease."""
        ...

    def release_fetching(self) -> None:
        """Fetch again what ``hold_fetching`` stopped, unless another reason holds it."""
        ...

    def hold_parked(self, partitions: AbstractSet[int]) -> None:
        """Stop Kafka fetching held ``partitions``, keeping the lease: they have as many
        records parked in retry tiers as the receiver keeps in memory, or their tiers are
        not read yet."""
        ...

    def release_parked(self, partitions: AbstractSet[int]) -> None:
        """Fetch again what ``hold_parked`` stopped, unless another reason holds it."""
        ...

    @property
    def cluster(self) -> Cluster:
        """The subscriber's cluster."""
        ...

    @property
    def partitions(self) -> int:
        """The stream's partition count."""
        ...

    def committed_to(
        self, partitions: list[TopicPartition], timeout_s: float = 30.0
    ) -> list[TopicPartition]:
        """The group's committed offsets of other topics' ``partitions`` (a retry tier's),
        asked for up to ``timeout_s``."""
        ...

    def group_metadata(self) -> Any:
        """The consumer's group metadata now (its member and generation): sent with a
        transaction's offsets, so that Kafka refuses them once the generation is over. On
        the thread that polls only (librdkafka does not answer another while polls go on)."""
        ...

    def decode(self, record: Record) -> SerializationError | None:
        """Decode ``record.value`` with the subscriber's serde (if any); return a permanent
        failure.

        Raises:
            SerializationError: A retriable failure (the registry is unreachable).
        """
        ...

    def take_over(self, on_revoke: RevokeListener, limit: ConfirmLimit) -> None:
        """A parallel receiver starts: it hears revokes first, bounds every confirm by its
        safe points, and a poll no longer means the records it returned are done."""
        ...

    def hand_back(self) -> None:
        """The parallel receiver stopped: undo ``take_over``."""
        ...


@dataclass(frozen=True, slots=True)
class ReceiverMetrics:
    """A snapshot of a receiver's counters.

    Attributes:
        in_flight: Records taken from the subscriber and not finished: queued behind their
            key, running, waiting for a retry or for their dead letter's acknowledgement.
        finished: Records finished: handled, dead-lettered, or given up and reported.
        retried: Handler calls that were retries.
        dead_lettered: Records handed to the dead letter after their last attempt failed.
        failed: Records given up without a dead letter (reported to the error handler).
        abandoned: Records of revoked partitions (or left when closing) not finished in
            time; never confirmed, so whoever reads the partition next reads them again.
        paused: Fetching is paused because ``max_in_flight`` records are in flight.
        confirmed: Per partition, the last offset the receiver confirmed.
        safe: Per partition, the highest offset at and below which every record taken is
            finished (what ``auto_confirm`` confirms; kept for ungrouped subscribers too).
        parked: Records in retry tiers (``RetryTier``), failed or parked behind their key.
    """

    in_flight: int = 0
    finished: int = 0
    retried: int = 0
    dead_lettered: int = 0
    failed: int = 0
    abandoned: int = 0
    paused: bool = False
    confirmed: Mapping[int, int] = field(default_factory=dict)
    safe: Mapping[int, int] = field(default_factory=dict)
    parked: int = 0


def is_async_handler(handler: object) -> bool:
    """True for an ``async def`` handler (or an object with an ``async def __call__``)."""
    call = getattr(handler, "__call__", None)  # noqa: B004 (async __call__ of an object)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


#: Poll failures that stop a receiver, reported once, instead of being tried again: the same
#: answer would come every time.
STOPS_RECEIVER = (
    DurableClientBusyError,
    AuthorizationError,
    AuthenticationError,
    IncompatibleBrokerError,
)


def refused_for_good(error: BaseException) -> bool:
    """Whether a write a receiver cannot do without (a retry tier's copy, a dead letter)
    failed in a way retrying cannot fix: an ACL or the credentials refused, another producer
    with its transactional id, a commit whose outcome stayed unknown, or librdkafka's fatal
    error. The receiver then reports it once and stops."""
    if isinstance(error, (*STOPS_RECEIVER, ProducerFencedError, TransactionInDoubtError)):
        return True
    cause = getattr(error, "cause", None)
    return isinstance(cause, KafkaError) and bool(cause.fatal())


def stopped_because(exc: BaseException) -> str:
    """The report of a receiver that ``exc`` (one of ``STOPS_RECEIVER``) stopped."""
    if isinstance(exc, DurableClientBusyError):
        return "receiver stopped: the durable id is taken"
    return "receiver stopped: the broker refuses this subscriber"


class Receiver:
    """Polls ``subscriber`` and calls ``handler(record)`` per record.

    Each poll waits up to ``poll_timeout_ms`` for records, and at most 100 ms, so that a stop
    is seen promptly.

    An exception in the handler is logged (and reported to the subscriber's error handler); the
    thread carries on with the next record. A failed poll is reported and tried again, unless
    the broker refuses the subscriber for good (``AuthorizationError``,
    ``AuthenticationError``, ``IncompatibleBrokerError``): that is reported and the receiver
    stops. Closing the subscriber stops the receiver: it waits
    for the handler call in progress to return, so the handler never finds its consumer closed
    under it, and no record is polled or handled after that call.
    """

    def __init__(self, host: ReceiverHost, handler: RecordHandler, poll_timeout_ms: int) -> None:
        if not callable(handler):
            raise TypeError("handler must be callable")
        check_int("poll_timeout_ms", poll_timeout_ms)
        self._host = host
        self._handler = handler
        if TELEMETRY is not None:  # each call in a process span, timed
            self._handler = TELEMETRY.handler(host, handler)
        self._poll_timeout_ms = poll_timeout_ms
        self._stop = threading.Event()
        self._busy = False
        self._finished = 0
        self._failed = 0
        self._thread = threading.Thread(
            target=self._run, name=f"bolide-receiver-{host.stream.name}", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._host.poll(min(self._poll_timeout_ms, _STOP_CHECK_MS))
            except STOPS_RECEIVER as exc:
                self._host.report(stopped_because(exc), exc)
                return
            except Exception as exc:
                if self._stop.is_set() or self._host.closed:
                    return  # closed under the poll: nothing more to read
                self._host.report("receiver poll failed", exc)
                # Back off, also with poll_timeout_ms=0: a lasting failure must not spin.
                self._stop.wait(max(self._poll_timeout_ms / 1000, 0.1))
                continue
            for record in batch:
                if self._stop.is_set():
                    return
                self._busy = True
                try:
                    self._handler(record)
                except Exception as exc:
                    self._failed += 1
                    log.exception("receiver handler raised on %r", record)
                    self._host.report(f"receiver handler raised on {record!r}", exc)
                finally:
                    self._busy = False
                    self._finished += 1

    def metrics(self) -> ReceiverMetrics:
        """Records handled so far (``failed``: the handler raised) and the one in hand."""
        return ReceiverMetrics(
            in_flight=int(self._busy), finished=self._finished, failed=self._failed
        )

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait until it has ended.

        The thread ends once the current poll (at most 100 ms) or the current handler call
        returns; no record is handled after that. Called from inside the handler, ``close``
        does not wait: the thread ends when the handler returns.

        Args:
            timeout_s: Longest wait; ``None`` (the default, and what ``Subscriber.close`` uses)
                waits for the handler however long it runs.
        """
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
