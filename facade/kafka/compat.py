"""Workarounds for brokers that deviate from Apache Kafka: the embedded Tansu engine.

Everything here is off unless the ``Cluster`` turns it on with ``fetch_gap_settle_ms > 0``,
which only ``EmbeddedBroker(engine="tansu").cluster()`` does by default: on Apache Kafka a
skip in offsets is a real gap (transaction markers, compaction) and the reported high
watermark is the end, so the hot path pays nothing for these. The deviations themselves are
listed in docs/compatibility.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from bolide.facade.errors import BrokerError

if TYPE_CHECKING:
    from bolide.facade.config import Cluster

__all__ = ["FetchGaps", "confirm_ends", "confirm_time_offsets", "stale_watermarks"]


def stale_watermarks(cluster: Cluster) -> bool:
    """True when ``cluster``'s broker may answer a fetch or a high watermark before its last
    batch is visible (Tansu), so ends and skips must be confirmed by reading again."""
    return cluster.fetch_gap_settle_ms > 0


def confirm_ends(
    consumer: Consumer, topic: str, marks: dict[int, tuple[int, int]], timeout_s: float
) -> dict[int, int]:
    """The true end of each partition, read forward from its reported ``(low, high)``
    watermarks until the fetch reports end-of-partition.

    Raises:
        BrokerError: An end was not confirmed within ``timeout_s``.
    """
    ends: dict[int, int] = {}
    starts: list[TopicPartition] = []
    for p, (low, high) in marks.items():
        ends[p] = max(low, high)
        # The reported end may point into the last batch: read on from just before it. An
        # empty-looking partition is read too: Tansu may report a last stable offset below the
        # log start while a transaction is open (it reports 0).
        starts.append(TopicPartition(topic, p, max(low, high - 1)))
    pending = {tp.partition for tp in starts}
    if not pending:
        return ends
    consumer.assign(starts)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        err = msg.error()
        part, offset = msg.partition(), msg.offset()
        if part is None or offset is None or msg.topic() != topic:
            continue  # a reused consumer may still hold another topic's fetch
        if err is None:
            ends[part] = max(ends[part], offset + 1)
        elif err.code() == KafkaError._PARTITION_EOF:
            ends[part] = max(ends[part], offset)
            pending.discard(part)
    if pending:
        raise BrokerError(f"could not confirm the end of {topic!r} partitions {pending}")
    return ends


class FetchGaps:
    """Reads a partition again from the expected offset when a fetch skipped ahead.

    Offsets may be sparse (transaction markers, compaction), but Tansu may also answer a fetch
    before an earlier batch is visible (under concurrent producers). Fetching again from the
    expected offset tells the two apart: a record that shows up comes next, in order; a gap
    still there once ``settle_s`` has passed since it was first seen (and at least one fetch
    again) is a real gap. With ``settle_s == 0`` (Apache Kafka) every skip is a real gap and
    nothing is fetched again. One instance per topic.

    Attributes:
        expected: Next offset expected from Kafka, per partition (callers on a hot path may
            read and advance it themselves, calling ``refetch`` only when a fetch skips ahead).
    """

    __slots__ = ("_checked", "expected", "settle_s", "topic")

    def __init__(self, topic: str, settle_s: float = 0.0) -> None:
        self.topic = topic
        self.settle_s = settle_s
        self.expected: dict[int, int] = {}
        self._checked: dict[int, tuple[int, float]] = {}  # partition: (expected, first seen)

    def checking(self, partition: int) -> bool:
        """True while a skip in ``partition`` is being fetched again."""
        return partition in self._checked

    def refetch(self, consumer: Consumer, msg: Message) -> bool:
        """True when ``msg`` skipped ahead and its partition is being fetched again: drop it
        and whatever else was fetched for that partition."""
        at = self.refetch_from(msg)
        if at is None:
            return False
        consumer.seek(TopicPartition(self.topic, msg.partition() or 0, at))
        return True

    def refetch_from(self, msg: Message) -> int | None:
        """Where ``msg``'s partition must be fetched again from, when ``msg`` skipped ahead
        (drop it and whatever else was fetched for that partition), else ``None``."""
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None:
            return None
        expected = self.expected.get(partition)
        if expected is None or offset <= expected or self.settle_s <= 0:
            self._checked.pop(partition, None)
            self.expected[partition] = offset + 1
            return None
        now = time.monotonic()
        seen = self._checked.get(partition)
        if seen is not None and seen[0] == expected:
            if now - seen[1] >= self.settle_s:
                del self._checked[partition]
                self.expected[partition] = offset + 1
                return None
        else:
            self._checked[partition] = (expected, now)
        return expected


def confirm_time_offsets(
    consumer: Consumer,
    topic: str,
    answers: dict[int, int],
    when_ms: int,
    starts: dict[int, int],
    ends: dict[int, int],
) -> dict[int, int]:
    """The first offset at or after ``when_ms`` per partition, checked against the records'
    timestamps: Tansu ignores the timestamp of a ListOffsets request and answers 0, so an
    answer that does not hold is replaced by a binary search over the partition.

    Raises:
        BrokerError: A record could not be read.
    """
    out: dict[int, int] = {}
    for p, answer in answers.items():
        at = _Reader(consumer, topic, p)
        if not at.holds(answer, when_ms, starts[p], ends[p]):
            answer = at.search(when_ms, starts[p], ends[p])
        out[p] = answer
    return out


class _Reader:
    """Reads single records of one partition by offset, for the time lookup."""

    def __init__(self, consumer: Consumer, topic: str, partition: int) -> None:
        self.consumer, self.topic, self.partition = consumer, topic, partition

    def at(self, offset: int) -> tuple[int, int] | None:
        """``(offset, timestamp_ms)`` of the first record at or after ``offset``, or None."""
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        for _ in range(100):  # up to 10 s
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            err, at = msg.error(), msg.offset()
            if err is None and at is not None and at >= offset:
                return at, int(msg.timestamp()[1])
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                return None
        raise BrokerError(f"cannot read {self.topic}[{self.partition}] at offset {offset}")

    def holds(self, answer: int, when: int, start: int, end: int) -> bool:
        """True when ``answer`` is the first position at or after ``when``."""
        if answer < end:
            first = self.at(answer)
            if first is None or first[1] < when:
                return False
        if answer > start:
            before = self.at(answer - 1)
            if before is not None and before[0] < answer and before[1] >= when:
                return False
        return True

    def search(self, when: int, start: int, end: int) -> int:
        """Binary search for the first position whose record is at or after ``when``."""
        lo, hi = start, end
        while lo < hi:
            mid = (lo + hi) // 2
            found = self.at(mid)
            if found is None or found[1] >= when:
                hi = mid
            else:
                lo = found[0] + 1
        return lo
