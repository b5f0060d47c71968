"""A subscriber's parts as others see them: ``SessionHost`` for its durable session
(``DurableHost``), ``ReceiverSeat`` for its receivers (``ReceiverHost``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, Message, TopicPartition

from bolide.facade.config import Cluster
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.consumer.state import PartitionState
from bolide.facade.durable import DurableSession
from bolide.facade.errors import SerializationError
from bolide.facade.receiver import ConfirmLimit, RevokeListener, StreamReader
from bolide.facade.record import Record, RecordBatch
from bolide.facade.support import HookLock

__all__ = ["ReceiverHooks", "ReceiverSeat", "SessionHost", "SubscriberView"]


class SessionHost:
    """``bolide.facade.durable.DurableHost`` over one subscriber's consumer, partitions held,
    positions and queue; the durable session's only way in.

    Args:
        consumer: The subscriber's Kafka consumer.
        topic: The stream's topic.
        positions: The subscriber's positions (its partitions' state: ``positions.state``).
        pending: The subscriber's queue of what is read, not yet delivered.
        report: The subscriber's error handler.
        lock: The subscriber's lock; user code waits until it is let go.
    """

    __slots__ = ("_consumer", "_lock", "_pending", "_positions", "_report", "_state", "_topic")

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        positions: Positions,
        pending: deque[Message | Record],
        report: Report,
        lock: HookLock,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._state = positions.state
        self._positions = positions
        self._pending = pending
        self._lock = lock
        self._report = report

    def assigned(self) -> AbstractSet[int]:
        """The partitions the subscriber holds."""
        return self._state.assigned()

    def positions(self) -> Mapping[int, int]:
        """The next offset to deliver, per partition."""
        return self._state.nexts()

    def confirmed(self) -> Mapping[int, int]:
        """The highest position the application confirmed, per partition."""
        return self._state.confirmed()

    def idle(self, partition: int) -> bool:
        """Nothing queued; ``partition`` reads no history and checks no skipped fetch."""
        positions = self._positions
        return (
            not self._pending
            and not positions.history.active(partition)
            and not positions.gaps.checking(partition)
        )

    def read_positions(self, partitions: list[int]) -> dict[int, int]:
        """Kafka's read position per partition."""
        parts = [TopicPartition(self._topic, p) for p in partitions]
        return {tp.partition: tp.offset for tp in self._consumer.position(parts)}

    def pause(self, partitions: list[int]) -> None:
        """Stop fetching ``partitions`` (held for the replay)."""
        self._positions.holds.hold(partitions, "replay")

    def resume(self, partitions: list[int]) -> None:
        """Let go of the replay's hold: Kafka fetches ``partitions`` unless another reason
        (the application, a receiver's throttle) holds them."""
        self._positions.holds.release(partitions, "replay")

    def requeue(self, records: list[Record]) -> None:
        """Deliver ``records``, in order, before anything queued."""
        self._pending.extendleft(reversed(records))

    def commit(self, positions: dict[int, int], *, asynchronous: bool) -> None:
        """Commit ``positions`` to the subscriber's group."""
        offsets = [TopicPartition(self._topic, p, o) for p, o in positions.items()]
        self._state.commit(offsets, asynchronous=asynchronous)

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the subscriber's error handler (or the log)."""
        self._report(summary, error)

    def call_later(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the subscriber lets go of its lock."""
        self._lock.call(callback)


@dataclass(slots=True)
class ReceiverHooks:
    """What a running parallel receiver adds to its subscriber (``None`` when none runs).

    Attributes:
        on_revoke: Hears a revoke before the application's ``on_revoke``.
        limit: Bounds every confirm by the receiver's safe points.
    """

    on_revoke: RevokeListener | None = None
    limit: ConfirmLimit | None = None


class SubscriberView(StreamReader, Protocol):
    """The public side of a subscriber that a ``ReceiverSeat`` passes on."""

    cluster: Cluster
    partitions: int

    def is_assigned(self) -> bool: ...


class ReceiverSeat:
    """``bolide.facade.receiver.ReceiverHost`` over one subscriber: the receivers' only way in.

    Args:
        subscriber: The subscriber's public side.
        consumer: Its Kafka consumer (for a retry tier's committed offsets).
        state: Its partitions: which it holds, and their holds (the throttle is one reason).
        lock: Its lock, held around every call on the consumer.
        report: Its error handler.
        confirm: ``fn(offset, partition)``: confirm, not bounded by the receiver's limit.
        note_finished: ``fn(partition, offsets)``: records finished above the safe point.
        rewind: ``fn(offsets)``: read partitions again from ``offsets``.
        decode: ``fn(record)``: decode its value with the subscriber's serde.
        hooks: Where the receiver's revoke listener and confirm limit go.
        durable: A durable client's session, else ``None``.
    """

    def __init__(
        self,
        subscriber: SubscriberView,
        consumer: Consumer,
        *,
        state: PartitionState,
        lock: HookLock,
        report: Report,
        confirm: Callable[[int, int], None],
        note_finished: Callable[[int, Iterable[int]], None],
        rewind: Callable[[Mapping[int, int]], None],
        decode: Callable[[Record], SerializationError | None],
        hooks: ReceiverHooks,
        durable: DurableSession | None,
    ) -> None:
        self._subscriber = subscriber
        self.topic = subscriber.topic
        self.stream = subscriber.stream
        self.config = subscriber.config
        self.membership = subscriber.membership
        self.group_id = subscriber.group_id
        self.cluster = subscriber.cluster
        self.partitions = subscriber.partitions
        self._consumer = consumer
        self._state = state
        self._assigned = state.assigned()
        self._holds = state.holds
        self._lock = lock
        self.report = report
        self.confirm_finished = confirm
        self.note_finished = note_finished
        self.rewind = rewind
        self.decode = decode
        self._hooks = hooks
        self._durable = durable

    @property
    def closed(self) -> bool:
        """True once the subscriber is closed."""
        return self._subscriber.closed

    def poll(self, timeout_ms: int) -> RecordBatch:
        """The subscriber's ``poll``."""
        return self._subscriber.poll(timeout_ms)

    def serve(self) -> None:
        """Call the consumer without taking records: rebalances run, the lease holds."""
        self._subscriber.is_assigned()

    def assigned(self) -> AbstractSet[int]:
        """The partitions the subscriber holds now."""
        return self._assigned

    def holding(self, partition: int) -> int | None:
        """The id of the assignment that holds ``partition`` (``None`` when not held)."""
        return self._state.holding(partition)

    def committed_to(
        self, partitions: list[TopicPartition], timeout_s: float = 30.0
    ) -> list[TopicPartition]:
        """The group's committed offsets of ``partitions`` (of any topic)."""
        with self._lock:
            return list(self._consumer.committed(partitions, timeout=timeout_s))

    def group_metadata(self) -> Any:
        """The consumer's group metadata. Call it on the thread that polls: asked from
        another thread while polls go on, librdkafka does not answer."""
        return self._consumer.consumer_group_metadata()

    def hold_fetching(self) -> None:
        """Hold every partition held for the throttle (one assigned meanwhile too)."""
        with self._lock:
            self._holds.hold(self._assigned, "throttle")

    def release_fetching(self) -> None:
        """Let go of the throttle's holds; partitions another reason holds stay paused."""
        with self._lock:
            self._holds.release(self._holds.holding("throttle"), "throttle")

    def hold_parked(self, partitions: AbstractSet[int]) -> None:
        """Hold held ``partitions`` for the retry tiers (parked records, or a load)."""
        with self._lock:
            self._holds.hold(partitions & self._assigned, "parked")

    def release_parked(self, partitions: AbstractSet[int]) -> None:
        """Let go of the retry tiers' holds on ``partitions``."""
        with self._lock:
            self._holds.release(partitions, "parked")

    def take_over(self, on_revoke: RevokeListener, limit: ConfirmLimit) -> None:
        """A parallel receiver starts: it hears revokes, bounds confirms, and a durable
        client's polls stop committing what they delivered (not done yet)."""
        self._hooks.on_revoke, self._hooks.limit = on_revoke, limit
        if self._durable is not None:
            self._durable.receiving = True

    def hand_back(self) -> None:
        """The parallel receiver stopped: undo ``take_over``."""
        self._hooks.on_revoke = self._hooks.limit = None
        if self._durable is not None:
            self._durable.receiving = False
