"""The work behind ``format("bolide")``: offset ranges, and reading one range.

Nothing here imports pyspark, so the planning and reading logic runs (and is typed) on its own.
Offsets have the shape of Spark's Kafka source: ``{"topic": {"0": 23, "1": 40}}``, the next
offset to read per partition; a range ``[start, end)`` of one partition is one Spark task.

A range reaching below the first offset Kafka still holds is read from the SQL history first
(``bolide.store``), then from Kafka, with no gap and no duplicate: the splice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bolide.facade.compat import FetchGaps
from bolide.facade.config import StreamConfig
from bolide.facade.errors import AuthorizationError, BrokerError, OffsetOutOfRangeError
from bolide.facade.history import HistoryCursor
from bolide.facade.kafka import (
    log_starts,
)
from bolide.facade.record import Record
from bolide.spark._options import Offsets, SourceOptions

__all__ = ["ReadRange", "cap_offsets", "ranges", "read_range"]

log = logging.getLogger("bolide.spark")

_BATCH_ROWS = 8_192
_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReadRange:
    """One Spark task: offsets ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


def cap_offsets(start: Offsets, end: Offsets, max_rows: int | None) -> Offsets:
    """Limit ``end`` so at most ``max_rows`` offsets lie past ``start``, shared by lag.

    Like Spark's Kafka source, each partition gets a share of ``max_rows`` proportional to
    its lag, so a burst on one partition does not starve the others.
    """
    if max_rows is None:
        return end
    lags = {
        (t, p): max(0, o - start.get(t, {}).get(p, o))
        for t, parts in end.items()
        for p, o in parts.items()
    }
    total = sum(lags.values())
    if total <= max_rows:
        return end
    capped: Offsets = {t: dict(parts) for t, parts in end.items()}
    for (t, p), lag in lags.items():
        if lag:
            share = max(1, lag * max_rows // total)
            capped[t][p] = start[t][p] + min(lag, share)
    return capped


def ranges(start: Offsets, end: Offsets) -> list[ReadRange]:
    """The non-empty ranges between two offsets (partitions missing from ``start`` skipped)."""
    out = []
    for topic, parts in end.items():
        for p, stop in parts.items():
            begin = start.get(topic, {}).get(p)
            if begin is not None and stop > begin:
                out.append(ReadRange(topic, int(p), begin, stop))
    return out


# -- reading (runs in Spark's executors) ---------------------------------------------------


class _Rows:
    """Column lists for one Arrow batch in the Kafka source's schema."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.columns: dict[str, list[Any]] = {
            name: []
            for name in ("key", "value", "topic", "partition", "offset", "timestamp", "type")
        }
        self.headers: list[list[tuple[str, bytes]] | None] = []

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def add(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        ts_type: int,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        c = self.columns
        c["key"].append(key)
        c["value"].append(value)
        c["topic"].append(topic)
        c["partition"].append(partition)
        c["offset"].append(offset)
        c["timestamp"].append(timestamp_ms)
        c["type"].append(ts_type)
        if self.include_headers:
            self.headers.append(headers or None)

    def batch(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        c = self.columns
        arrays = [
            pa.array(c["key"], pa.binary()),
            pa.array(c["value"], pa.binary()),
            pa.array(c["topic"], pa.string()),
            pa.array(c["partition"], pa.int32()),
            pa.array(c["offset"], pa.int64()),
            pc.multiply(pa.array(c["timestamp"], pa.int64()), 1000).cast(
                pa.timestamp("us", tz="UTC")  # Spark's unit
            ),
            pa.array(c["type"], pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            header = pa.struct([("key", pa.string()), ("value", pa.binary())])
            arrays.append(pa.array(self.headers, pa.list_(header)))
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _headers(raw: Any) -> list[tuple[str, bytes]]:
    pairs = raw.items() if isinstance(raw, dict) else raw or []
    return [(str(k), _bytes(v) or b"") for k, v in pairs]


def _timestamp_type(kind: int) -> int:
    """confluent-kafka's timestamp kind as the Java client's id (0 create, 1 log append)."""
    return {1: 0, 2: 1}.get(kind, -1)


def _lost(opts: SourceOptions, rng: ReadRange, lo: int, hi: int, why: str) -> None:
    message = (
        f"{rng.topic}[{rng.partition}] offsets {lo}..{hi - 1} are gone ({why}); set "
        "failOnDataLoss=false to skip them, or bolide.store to read them from the history"
    )
    if opts.fail_on_data_loss:
        raise OffsetOutOfRangeError(message, stream=rng.topic, partition=rng.partition, offset=lo)
    log.warning("%s", message)


def _from_store(opts: SourceOptions, rng: ReadRange, stop: int) -> Iterator[Record]:
    """The records of ``[rng.start, stop)`` that the history store holds."""
    store = opts.store()
    if store is None:
        _lost(opts, rng, rng.start, stop, "below Kafka's log start and no bolide.store")
        return
    key = opts.stored_as(rng.topic)  # the topic as it is now: never an older one's history
    which = {} if key is None else {"stored_as": key}
    first = store.smallest_offset(rng.topic, rng.partition, **which)
    if first is None or first >= stop:
        _lost(opts, rng, rng.start, stop, "below Kafka's log start and not in the store")
        return
    if first > rng.start:
        _lost(opts, rng, rng.start, first, "below both Kafka's log start and the store's")
    cursor = HistoryCursor(StreamConfig(name=rng.topic, global_order=False, store=store))
    cursor.stored_as = key
    cursor.open(rng.partition, max(first, rng.start), stop)
    while cursor.active(rng.partition):
        yield from cursor.read(_BATCH_ROWS)


def read_range(opts: SourceOptions, rng: ReadRange) -> Iterator[Any]:
    """Yield Arrow record batches with the records of ``rng``, spliced from the store.

    Raises:
        OffsetOutOfRangeError: Records in the range are gone and ``failOnDataLoss`` is true.
        BrokerError: Kafka did not deliver the range in time.
    """
    rows = _Rows(opts.include_headers)
    cluster = opts.cluster()
    group = opts.consumer_group()
    consumer = opts.consumer(group)
    try:
        parts = [rng.partition]
        kafka_start = log_starts(consumer, rng.topic, parts, cluster=cluster)[rng.partition]
        position = rng.start
        if position < kafka_start:
            for record in _from_store(opts, rng, min(kafka_start, rng.end)):
                rows.add(
                    rng.topic,
                    rng.partition,
                    int(record.offset or 0),
                    record.key,
                    record.data,
                    record.timestamp_ms,
                    0,
                    record.headers,
                )
                if len(rows) >= _BATCH_ROWS:
                    yield rows.batch()
                    rows = _Rows(opts.include_headers)
            position = kafka_start
        if position < rng.end:
            yield from _from_kafka(consumer, group, opts, rng, position, rows)
        elif len(rows):
            yield rows.batch()
    finally:
        consumer.close()


#: Refusals retrying cannot fix, raised as ``AuthorizationError`` naming the ACL to grant.
_REFUSED = frozenset({KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED})


def _refused(
    opts: SourceOptions, rng: ReadRange, group: str, err: KafkaError
) -> AuthorizationError:
    """The broker refused the source's consumer its ``group`` or its topic: the ACL to grant."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        kind, name, acl = "group", group, opts.group_acl()
    else:
        kind, name, acl = "topic", rng.topic, f"READ on topic {rng.topic!r}"
    return AuthorizationError(
        f"the broker refused format('bolide') reading {rng.topic}[{rng.partition}] "
        f"({err.str()}): grant the user {acl}",
        resource_type=kind,
        resource=name,
        cause=err,
        stream=rng.topic,
    )


def _undelivered(rng: ReadRange, position: int) -> BrokerError:
    """A range Kafka stopped delivering: the task fails, and Spark retries it."""
    return BrokerError(
        f"{rng.topic}[{rng.partition}]: offsets {position}..{rng.end - 1} were not "
        f"delivered within {_READ_TIMEOUT_S:.0f}s",
        stream=rng.topic,
        partition=rng.partition,
        offset=position,
        retriable=True,
    )


def _skip_trimmed(consumer: Consumer, opts: SourceOptions, rng: ReadRange, position: int) -> int:
    """Records trimmed from Kafka while the range was read: say what is lost (or fail, per
    ``failOnDataLoss``) and go on from the log start, which is returned."""
    start = log_starts(consumer, rng.topic, [rng.partition], cluster=opts.cluster())[rng.partition]
    _lost(opts, rng, position, start, "trimmed from Kafka while reading")
    consumer.assign([TopicPartition(rng.topic, rng.partition, start)])
    return start


def _from_kafka(
    consumer: Consumer, group: str, opts: SourceOptions, rng: ReadRange, position: int, rows: _Rows
) -> Iterator[Any]:
    consumer.assign([TopicPartition(rng.topic, rng.partition, position)])
    gaps = FetchGaps(rng.topic, opts.fetch_gap_settle_ms / 1000)
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while position < rng.end:
        if time.monotonic() > deadline:
            raise _undelivered(rng, position)
        for msg in consumer.consume(num_messages=_BATCH_ROWS, timeout=0.2):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    position = max(position, msg.offset() or 0)
                    continue
                if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    position = _skip_trimmed(consumer, opts, rng, position)
                    break
                if err.code() in _REFUSED:
                    raise _refused(opts, rng, group, err)
                raise BrokerError(
                    f"reading {rng.topic}[{rng.partition}]: {err.str()}",
                    stream=rng.topic,
                    partition=rng.partition,
                    retriable=err.retriable(),
                )
            offset = msg.offset() or 0
            gaps.expected[rng.partition] = position
            if offset > position and gaps.refetch(consumer, msg):
                break  # a skip ahead: this partition is fetched again from ``position``
            if offset >= rng.end:
                position = rng.end
                break
            kind, ts = msg.timestamp()
            rows.add(
                rng.topic,
                rng.partition,
                offset,
                _bytes(msg.key()),
                _bytes(msg.value()),
                ts if kind else None,
                _timestamp_type(kind),
                _headers(msg.headers()),
            )
            position = offset + 1
            deadline = time.monotonic() + _READ_TIMEOUT_S
        if len(rows) >= _BATCH_ROWS:
            yield rows.batch()
            rows = _Rows(opts.include_headers)
    if len(rows):
        yield rows.batch()
