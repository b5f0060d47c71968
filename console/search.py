"""A record search over one stream: the archive's answer first, then Kafka for what the
archive does not hold, as one history in (partition, offset) order.

Kafka is read partition by partition, in order, only over the ranges the archive lacks:
below the first archived offset (an archive that started late) and past the archived
frontier. A read stops once the first ``limit`` matches are known, or at the scan limit or
the time limit; then the page ends where the read stopped (``Found.next``), so the next page
goes on from there and nothing in between is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from bolide.console.settings import ConsoleSettings
from bolide.facade.errors import BrokerError
from bolide.facade.kafka import probe_consumer
from bolide.facade.kafka.fatal import Scope, fatal_error
from bolide.facade.ops.inventory import TopicInfo
from bolide.facade.record import Record, record_from_message
from bolide.stores import Search, SqlStore

__all__ = ["Found", "search"]

Place = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True)
class Found:
    """A search's records, archive and Kafka spliced, in (partition, offset) order.

    Attributes:
        records: The records found (at most the limit asked).
        archived: How many of them came from the archive.
        scanned: Kafka records read outside the archive.
        complete: Kafka was read as far as the page needed (else the scan limit or the time
            limit stopped it: ``next`` goes on from where it stopped).
        next: The ``after`` of the next page (``None``: this was the last).
        decoded: Each record's value decoded (framed the Confluent way, in any format, its
            schema in the store's registry), else ``None``; filled by ``Console.search``.
    """

    records: list[Record]
    archived: int
    scanned: int
    complete: bool
    next: Place | None
    decoded: list[Any] = field(default_factory=list)


@dataclass
class _Scan:
    """One search's Kafka read: what it found, how far it got."""

    stream: str
    search: Search
    limit: int
    budget: int  # records it may read
    deadline: float  # monotonic
    found: dict[Place, Record]
    scanned: int = 0
    stopped: Place | None = None  # the last place considered, when it stopped short


def search(
    settings: ConsoleSettings,
    store: SqlStore | None,
    topic: TopicInfo | None,
    stream: str,
    wanted: Search,
    limit: int,
) -> Found:
    """The first ``limit`` records of ``stream`` matching ``wanted`` (after ``wanted.after``);
    ``topic``: the stream's partitions in Kafka (``None``: Kafka does not have it).

    Raises:
        AuthorizationError: Kafka refused the read.
        BrokerError: Kafka did not answer. StoreError: the database failed.
    """
    limit = max(1, min(limit, settings.max_rows))
    deadline = time.monotonic() + settings.query_timeout_ms / 1000
    held: dict[int, tuple[int, int]] = {}  # partition: archived (first, last)
    found: dict[Place, Record] = {}
    if store is not None:  # the frontiers first: what is archived after is read from Kafka
        for p in store.partitions(stream):
            first, last = store.smallest_offset(stream, p), store.largest_offset(stream, p)
            if first is not None and last is not None:
                held[p] = (first, last)
        hits = store.search(stream, wanted, limit, timeout_ms=settings.query_timeout_ms)
        found = {(r.partition or 0, r.offset or 0): r for r in hits}
    archived = set(found)
    scan = _Scan(stream, wanted, limit, settings.scan_limit, deadline, found)
    _read_kafka(settings, scan, _ranges(topic, wanted, held))
    places = sorted(found)
    if scan.stopped is not None:
        places = [k for k in places if k <= scan.stopped]
    more = scan.stopped is not None or len(places) > limit or len(archived) >= limit
    places = places[:limit]
    after = None
    if more:
        after = places[-1] if len(places) == limit or scan.stopped is None else scan.stopped
    return Found(
        [found[k] for k in places],
        len(archived.intersection(places)),
        scan.scanned,
        scan.stopped is None,
        after,
    )


def _ranges(
    topic: TopicInfo | None, wanted: Search, held: dict[int, tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """The (partition, start, end) ranges Kafka holds and the archive does not, in order,
    within what ``wanted`` asks for."""
    out: list[tuple[int, int, int]] = []
    for part in topic.partitions if topic is not None else ():
        p = part.partition
        if wanted.partition is not None and p != wanted.partition:
            continue
        low = max(part.log_start, wanted.from_offset or 0)
        high = part.log_end if wanted.to_offset is None else min(part.log_end, wanted.to_offset)
        if wanted.after is not None:
            if p < wanted.after[0]:
                continue
            if p == wanted.after[0]:
                low = max(low, wanted.after[1] + 1)
        first, last = held.get(p, (high, high - 1))
        for start, end in ((low, min(high, first)), (max(low, last + 1), high)):
            if start < end:
                out.append((p, start, end))
    return out


def _read_kafka(settings: ConsoleSettings, scan: _Scan, ranges: list[tuple[int, int, int]]) -> None:
    """Read each range in order into ``scan.found``, until the first ``limit`` matches are
    known or the budget or the time is spent (``scan.stopped``)."""
    if not ranges:
        return
    with _consumer(settings) as consumer:
        for p, start, end in ranges:
            if _known_first(scan.found, scan.limit, (p, start)):
                return
            consumer.assign([TopicPartition(scan.stream, p, start)])
            try:
                if not _read_range(consumer, scan, p, start, end):
                    return
            finally:
                consumer.unassign()


def _read_range(consumer: Any, scan: _Scan, p: int, start: int, end: int) -> bool:
    """Read partition ``p`` from ``start`` to ``end``; ``False`` when the read stopped."""
    at = start  # every offset below it was considered
    while at < end:
        if scan.scanned >= scan.budget or time.monotonic() > scan.deadline:
            scan.stopped = (p, at - 1)
            return False
        for msg in consumer.consume(500, timeout=0.2):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at = max(at, msg.offset() or 0)
                    continue
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    continue  # the probe's own group: a read by hand commits nothing there
                _raise(scan.stream, error)
            offset = msg.offset() or 0
            if offset >= end:
                at = end
                break
            at = offset + 1
            scan.scanned += 1
            record = record_from_message(msg)
            if _matches(record, scan.search):
                scan.found.setdefault((p, offset), record)
        # A transaction's marker takes an offset no message shows: the position passes it.
        position = consumer.position([TopicPartition(scan.stream, p)])[0].offset
        at = max(at, position)
        if _known_first(scan.found, scan.limit, (p, at)):
            return False
    return True


def _known_first(found: dict[Place, Record], limit: int, place: Place) -> bool:
    """Whether ``limit`` matches lie before ``place``: the page is known."""
    return sum(1 for k in found if k < place) >= limit


def _matches(record: Record, wanted: Search) -> bool:
    if wanted.key is not None and record.key != wanted.key:
        return False
    ts = record.timestamp_ms
    if wanted.from_ms is not None and (ts is None or ts < wanted.from_ms):
        return False
    if wanted.to_ms is not None and (ts is None or ts >= wanted.to_ms):
        return False
    needle = wanted.contains
    if needle:
        return (record.data is not None and needle in record.data) or any(
            needle in value for _, value in record.headers
        )
    return True


def _raise(stream: str, error: KafkaError) -> None:
    """A Kafka read's failure, typed: a topic the user may not read is the one ACL refusal
    the caller lets through (its probe group's is skipped), named with the ACL to grant
    (``fatal_error``); anything else is the broker's."""
    refusal = (
        fatal_error(error, Scope("subscriber", stream))
        if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        else None
    )
    if refusal is not None:
        raise refusal
    raise BrokerError(f"reading {stream} failed: {error.str()}", stream=stream)


@contextmanager
def _consumer(settings: ConsoleSettings) -> Iterator[Any]:
    consumer = probe_consumer(settings.cluster)  # partition EOF on: an end is told
    try:
        yield consumer
    finally:
        consumer.close()
