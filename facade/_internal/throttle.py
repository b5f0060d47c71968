"""``Throttle``: pauses a subscriber's Kafka fetching while its receiver has enough in flight.

librdkafka's pause stops the fetcher and drops what it had fetched for the partition; resume
fetches again from the position after the last record handed out, so nothing is lost or read
twice. The consumer is still called while paused (that call keeps the group membership:
Kafka's ``max.poll.interval.ms``), it just returns nothing for those partitions. Partitions
paused for other reasons (history being spliced in, a durable client's live records held back)
are resumed by their owners, never here.
"""

from __future__ import annotations

import contextlib

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bolide.facade._internal.lock import HookLock
from bolide.facade._internal.positions import Positions
from bolide.facade.durable import DurableSession

__all__ = ["Throttle"]


class Throttle:
    """Pauses and resumes fetching of the partitions a subscriber holds.

    Args:
        consumer: The subscriber's consumer.
        topic: Its topic.
        assigned: The partitions it holds (updated in place by the subscriber).
        positions: Its positions (which partitions read their history).
        durable: A durable client's session, else ``None``.
        lock: The subscriber's lock, held around every call on the consumer.
    """

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        assigned: set[int],
        positions: Positions,
        durable: DurableSession | None,
        lock: HookLock,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._assigned = assigned
        self._positions = positions
        self._durable = durable
        self._lock = lock
        self.paused: set[int] = set()

    def hold(self) -> None:
        """Pause every partition held that is not paused yet (one assigned meanwhile too)."""
        with self._lock:
            new = self._assigned - self.paused
            self.paused &= self._assigned
            if new:
                self._call(self._consumer.pause, new)
                self.paused |= new

    def forget(self, parts: list[int]) -> None:
        """``parts`` were revoked: a later assignment starts unpaused."""
        self.paused -= set(parts)

    def release(self) -> None:
        """Resume what ``hold`` paused, except partitions paused for another reason."""
        with self._lock:
            held, self.paused = self.paused & self._assigned, set()
            history, durable = self._positions.history, self._durable
            parts = {
                p
                for p in held
                if not history.active(p) and (durable is None or not durable.holds_paused(p))
            }
            if parts:
                self._call(self._consumer.resume, parts)

    def _call(self, method: object, parts: set[int]) -> None:
        assert callable(method)
        # The consumer closed or the partitions went away: nothing left to pause or resume.
        with contextlib.suppress(KafkaException, RuntimeError):
            method([TopicPartition(self._topic, p) for p in sorted(parts)])
