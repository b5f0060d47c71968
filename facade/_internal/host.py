"""``SessionHost``: a subscriber's parts as its durable session sees them (``DurableHost``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet

from confluent_kafka import Consumer, Message, TopicPartition

from bolide.facade._internal.lock import HookLock
from bolide.facade._internal.positions import Positions, Report
from bolide.facade.record import Record

__all__ = ["SessionHost"]


class SessionHost:
    """``bolide.facade.durable.DurableHost`` over one subscriber's consumer, partitions held,
    positions and queue; the durable session's only way in.

    Args:
        consumer: The subscriber's Kafka consumer.
        topic: The stream's topic.
        assigned: The partitions the subscriber holds (updated in place by it).
        positions: The subscriber's positions.
        pending: The subscriber's queue of what is read, not yet delivered.
        report: The subscriber's error handler.
        lock: The subscriber's lock; user code waits until it is let go.
    """

    __slots__ = ("_assigned", "_consumer", "_lock", "_pending", "_positions", "_report", "_topic")

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        assigned: set[int],
        positions: Positions,
        pending: deque[Message | Record],
        report: Report,
        lock: HookLock,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._assigned = assigned
        self._positions = positions
        self._pending = pending
        self._lock = lock
        self._report = report

    def assigned(self) -> AbstractSet[int]:
        """The partitions the subscriber holds."""
        return self._assigned

    def positions(self) -> Mapping[int, int]:
        """The next offset to deliver, per partition."""
        return self._positions.next

    def confirmed(self) -> Mapping[int, int]:
        """The highest position the application confirmed, per partition."""
        return self._positions.confirmed

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
        """Stop fetching ``partitions``."""
        self._consumer.pause([TopicPartition(self._topic, p) for p in partitions])

    def resume(self, partitions: list[int]) -> None:
        """Fetch ``partitions`` again."""
        self._consumer.resume([TopicPartition(self._topic, p) for p in partitions])

    def requeue(self, records: list[Record]) -> None:
        """Deliver ``records``, in order, before anything queued."""
        self._pending.extendleft(reversed(records))

    def commit(self, positions: dict[int, int], *, asynchronous: bool) -> None:
        """Commit ``positions`` to the subscriber's group."""
        offsets = [TopicPartition(self._topic, p, o) for p, o in positions.items()]
        if asynchronous:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        else:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the subscriber's error handler (or the log)."""
        self._report(summary, error)

    def call_later(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the subscriber lets go of its lock."""
        self._lock.call(callback)
