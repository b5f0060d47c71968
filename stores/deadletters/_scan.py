"""Reading a whole stream through the splice: the archive below Kafka's log start, then Kafka.

``DeadLetters`` reads dead-letter streams this way, so nothing has to be archived first and
nothing Kafka already dropped is missed. The Kafka part reads each partition from its log start
to the end measured when the read began (``log_starts``, ``log_ends``: emulated retention and
Tansu's stale watermarks included), fetching a skipped offset again as subscribers do
(``FetchGaps``) and stopping at end-of-partition, so a transaction marker at the end cannot
hold it up.

A topic deleted and created again starts its offsets over, so a read also names the topic's
incarnation (``topic_id``: its Kafka topic id), and counts an archived row as the Kafka record
at its place only when the two are the same record (same timestamp): the archive keys rows by
place alone and may still hold a row of the topic's previous incarnation there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bolide.facade.compat import FetchGaps
from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError
from bolide.facade.kafka import (
    admin_client,
    log_ends,
    log_starts,
    partition_count,
    probe_consumer,
    topic_id,
)
from bolide.facade.record import Record, record_from_message
from bolide.stores.deadletters._books import Letter
from bolide.stores.schema import RECORDS
from bolide.stores.store import SqlStore

__all__ = [
    "StreamRead",
    "archived_stamps",
    "kafka_bounds",
    "read_kafka",
    "read_one",
    "read_stream",
    "reader",
    "topic_id",
]

_PAGE = 1_000
_READ_TIMEOUT_S = 30.0


@dataclass
class StreamRead:
    """What one read of a stream found.

    Attributes:
        records: Every record, partition by partition in offset order.
        archived: ``(partition, offset)`` of the records the archive holds.
        bounds: Per Kafka partition, ``(log start, end)`` as the read measured them; empty
            when the topic does not exist (the archive alone was read).
        in_kafka: Per Kafka partition, the offsets read from Kafka.
        topic_id: The topic's id while it was read (``None``: no topic, or a broker that
            reports no topic ids).
    """

    records: list[Record] = field(default_factory=list)
    archived: set[tuple[int, int]] = field(default_factory=set)
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict)
    in_kafka: dict[int, list[int]] = field(default_factory=dict)
    topic_id: str | None = None

    def from_kafka(self, record: Record) -> bool:
        """``record`` was read from Kafka (else from the archive alone)."""
        start, end = self.bounds.get(record.partition or 0, (0, 0))
        return start <= (record.offset or 0) < end


def reader(cluster: Cluster) -> Consumer:
    """A consumer for these reads: it never commits, and it reports a position that fell
    below the log start instead of jumping to the end."""
    return probe_consumer(cluster, **{"auto.offset.reset": "error"})


def kafka_bounds(cluster: Cluster, consumer: Consumer, topic: str) -> dict[int, tuple[int, int]]:
    """``(log start, end)`` per partition of ``topic``; empty when the topic does not exist.

    Raises:
        BrokerError: The cluster did not answer.
    """
    try:
        count = partition_count(admin_client(cluster), topic)
    except KafkaException as exc:
        raise BrokerError(
            f"cannot reach the cluster at {cluster.bootstrap_servers}: {exc.args[0].str()}",
            stream=topic,
            retriable=True,
        ) from None
    if count is None:
        return {}
    parts = list(range(count))
    starts = log_starts(consumer, topic, parts, cluster=cluster)
    ends = log_ends(cluster, topic, parts, consumer=consumer)
    return {p: (starts[p], max(starts[p], ends[p])) for p in parts}


def read_stream(cluster: Cluster, store: SqlStore, stream: str) -> StreamRead:
    """Every record of ``stream``: archived ones below Kafka's log start, Kafka's from there.

    Raises:
        BrokerError: Kafka did not deliver what it holds in time, or the topic was deleted
            and created again while it was read (read again).
        StoreError: The database failed.
    """
    found = StreamRead(topic_id=topic_id(cluster, stream))
    consumer = reader(cluster)
    try:
        found.bounds = kafka_bounds(cluster, consumer, stream)
        for partition in sorted(set(found.bounds) | set(store.partitions(stream))):
            start, end = found.bounds.get(partition, (None, None))
            for record in _archived(store, stream, partition, start):
                found.records.append(record)
                found.archived.add((partition, record.offset or 0))
            if start is None or end is None or start >= end:
                continue
            offsets = found.in_kafka.setdefault(partition, [])
            held = archived_stamps(store, stream, partition, start, end)
            for record in read_kafka(consumer, cluster, stream, partition, start, end):
                found.records.append(record)
                offsets.append(record.offset or 0)
                if _same(held, record):
                    found.archived.add((partition, record.offset or 0))
    finally:
        consumer.close()
    if found.bounds and topic_id(cluster, stream) != found.topic_id:
        raise BrokerError(
            f"{stream!r} was deleted and created again while being read; read again",
            stream=stream,
            retriable=True,
        )
    return found


def read_one(
    cluster: Cluster, store: SqlStore, stream: str, partition: int, offset: int
) -> tuple[Record, Letter, bool] | None:
    """The record at one place through the splice (Kafka, else the archive), which letter it
    is, and whether the archive holds that very record; ``None`` when neither holds it."""
    topic = topic_id(cluster, stream)
    archived = store.load(stream, partition, offset)
    consumer = reader(cluster)
    try:
        start, end = kafka_bounds(cluster, consumer, stream).get(partition, (0, 0))
        if start <= offset < end:
            for record in read_kafka(consumer, cluster, stream, partition, offset, end):
                if record.offset != offset:
                    return None
                same = archived is not None and archived.timestamp_ms == record.timestamp_ms
                return record, Letter(topic, record.timestamp_ms), same
            return None
    finally:
        consumer.close()
    return None if archived is None else (archived, Letter(None, archived.timestamp_ms), True)


def _same(held: dict[int, int | None], record: Record) -> bool:
    """The archive's row at ``record``'s offset is that record (not one of the topic's
    previous incarnation at the same place)."""
    offset = record.offset or 0
    return offset in held and held[offset] == record.timestamp_ms


def _archived(store: SqlStore, stream: str, partition: int, stop: int | None) -> Iterator[Record]:
    """The archived records of ``partition`` below ``stop`` (all of them when ``None``)."""
    first = store.smallest_offset(stream, partition)
    while first is not None and (stop is None or first < stop):
        page = store.read(stream, partition, first, _PAGE)
        for record in page:
            if stop is not None and (record.offset or 0) >= stop:
                return
            yield record
        if len(page) < _PAGE:
            return
        first = (page[-1].offset or 0) + 1


def archived_stamps(
    store: SqlStore, stream: str, partition: int, lo: int, hi: int
) -> dict[int, int | None]:
    """The offsets in ``[lo, hi)`` of ``partition`` that the archive holds, with the timestamp
    of the row at each."""
    r = RECORDS.c
    query = sa.select(r.kafka_offset, r.timestamp_ms).where(
        r.stream == store.stored_as(stream),  # the topic as it is now
        r.kafka_partition == partition,
        r.kafka_offset >= lo,
        r.kafka_offset < hi,
    )

    def fetch() -> dict[int, int | None]:
        with store.engine.connect() as conn:
            return {int(o): None if t is None else int(t) for o, t in conn.execute(query)}

    return store.guarded("archived offsets", fetch, stream=stream, partition=partition)


def read_kafka(
    consumer: Consumer, cluster: Cluster, topic: str, partition: int, start: int, end: int
) -> Iterator[Record]:
    """The records of ``[start, end)`` of one partition, in offset order.

    Raises:
        BrokerError: Kafka delivered nothing for ``_READ_TIMEOUT_S`` while records were left,
            or the records were trimmed from Kafka while being read (read again).
    """
    consumer.assign([TopicPartition(topic, partition, start)])
    gaps = FetchGaps(topic, cluster.fetch_gap_settle_ms / 1000)
    position = start
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while position < end:
        if time.monotonic() > deadline:
            raise BrokerError(
                f"{topic}[{partition}]: offsets {position}..{end - 1} were not delivered "
                f"within {_READ_TIMEOUT_S:.0f}s",
                stream=topic,
                partition=partition,
                offset=position,
                retriable=True,
            )
        for msg in consumer.consume(num_messages=_PAGE, timeout=0.2):
            err = msg.error()
            if err is not None:
                position = max(position, _past_error(err, topic, partition, msg.offset()))
                continue
            offset = msg.offset() or 0
            gaps.expected[partition] = position
            if offset > position and gaps.refetch(consumer, msg):
                break  # a skip ahead: fetched again from ``position``
            if offset >= end:
                position = end
                break
            yield record_from_message(msg, topic)
            position = offset + 1
            deadline = time.monotonic() + _READ_TIMEOUT_S


def _past_error(err: KafkaError, topic: str, partition: int, offset: int | None) -> int:
    """Where a read error leaves the position: end-of-partition moves it to the end; any
    other error is raised."""
    if err.code() == KafkaError._PARTITION_EOF:
        return offset or 0
    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise BrokerError(
            f"{topic}[{partition}]: records were trimmed from Kafka while being read; read again",
            stream=topic,
            partition=partition,
            retriable=True,
        )
    raise BrokerError(
        f"reading {topic}[{partition}]: {err.str()}",
        stream=topic,
        partition=partition,
        retriable=err.retriable(),
    )
