"""The work behind ``format("bolide")``: options, offset ranges, and reading one range.

Nothing here imports pyspark, so the planning and reading logic runs (and is typed) on its own.
Offsets have the shape of Spark's Kafka source: ``{"topic": {"0": 23, "1": 40}}``, the next
offset to read per partition; a range ``[start, end)`` of one partition is one Spark task.

A range reaching below the first offset Kafka still holds is read from the SQL history first
(``bolide.store``), then from Kafka, with no gap and no duplicate: the splice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bolide.facade.compat import FetchGaps
from bolide.facade.config import Cluster, HistoryStore, StreamConfig
from bolide.facade.errors import BrokerError, OffsetOutOfRangeError
from bolide.facade.history import HistoryCursor
from bolide.facade.kafka import (
    CONSUMER_DEFAULTS,
    admin_client,
    log_ends,
    log_starts,
)
from bolide.facade.record import Record
from bolide.facade.redaction import redact, redact_url

__all__ = [
    "Offsets",
    "ReadRange",
    "SourceOptions",
    "cap_offsets",
    "cluster_source_options",
    "read_range",
]

log = logging.getLogger("bolide.spark")

#: ``{"topic": {"partition": next_offset}}``: JSON-friendly, as Spark checkpoints it.
Offsets = dict[str, dict[str, int]]

_EARLIEST, _LATEST = -2, -1
_BATCH_ROWS = 8_192
_READ_TIMEOUT_S = 30.0
_stores: dict[str, HistoryStore] = {}


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in {"true", "false"}:
        raise ValueError(f"option {name} must be 'true' or 'false', got {raw!r}")
    return value == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw))
    except ValueError:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _spec(options: Mapping[str, str], name: str, default: str, topics: list[str]) -> str:
    raw = str(options.get(name, default)).strip()
    if raw.lower() in {"earliest", "latest"}:
        return raw.lower()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(t, str) and isinstance(parts, dict) for t, parts in parsed.items()
    ):
        raise ValueError(
            f"option {name} must be 'earliest', 'latest' or JSON like "
            f'{{"{topics[0]}": {{"0": 23}}}}, got {raw!r}'
        )
    for topic, parts in parsed.items():
        if topic not in topics:
            raise ValueError(f"option {name} names topic {topic!r}, which is not subscribed")
        for p, offset in parts.items():
            if not str(p).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"option {name}: {topic}[{p}]={offset!r} is not a position")
            if offset < _EARLIEST:
                raise ValueError(f"option {name}: {topic}[{p}]={offset} is below -2 (earliest)")
    return raw


def _log_starts(options: Mapping[str, str], name: str) -> dict[str, dict[int, int]]:
    raw = options.get(name)
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(parts, dict) for parts in parsed.values()
    ):
        raise ValueError(f'option {name} must be JSON like {{"orders": {{"0": 10}}}}, got {raw!r}')
    out: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        for p, offset in parts.items():
            if not str(p).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"option {name}: {topic}[{p}]={offset!r} is not an offset")
            if offset < 0:
                raise ValueError(f"option {name}: {topic}[{p}]={offset} is negative")
        out[topic] = {int(p): offset for p, offset in parts.items()}
    return out


def cluster_source_options(cluster: Cluster) -> dict[str, str]:
    """The ``bolide.*`` options that carry ``cluster``'s own fields to ``format("bolide")``.

    ``kafka_options`` carries the librdkafka settings; these are the rest, which Spark's
    Python workers rebuild the ``Cluster`` from (``SourceOptions.cluster``).
    """
    options: dict[str, str] = {}
    if cluster.fetch_gap_settle_ms:
        options["bolide.fetchGapSettleMs"] = str(cluster.fetch_gap_settle_ms)
    starts = cluster.log_start_overrides
    if starts:
        options["bolide.logStartOverrides"] = json.dumps(
            {t: {str(p): o for p, o in parts.items()} for t, parts in starts.items()},
            separators=(",", ":"),
        )
    return options


@dataclass(frozen=True, repr=False)
class SourceOptions:
    """The options of ``format("bolide")``, by the Kafka source's names, checked once.

    Attributes:
        topics: ``subscribe`` (comma-separated topics).
        kafka: librdkafka settings from every ``kafka.<name>`` option.
        starting: ``startingOffsets``: ``earliest``, ``latest`` (default) or Spark's JSON.
        ending: ``endingOffsets`` (batch only): ``latest`` (default) or Spark's JSON.
        max_offsets_per_trigger: ``maxOffsetsPerTrigger``: most records per micro-batch.
        include_headers: ``includeHeaders``: add the ``headers`` column (default false).
        fail_on_data_loss: ``failOnDataLoss``: fail (default) or warn when a range is gone
            from both Kafka and the history store.
        store_url: ``bolide.store``: SQLAlchemy URL of the history to splice in.
        fetch_gap_settle_ms: ``bolide.fetchGapSettleMs``: the cluster's gap window
            (``Cluster(fetch_gap_settle_ms=...)``); default 0.
        log_start_overrides: ``bolide.logStartOverrides``: the cluster's assumed log starts
            (``Cluster.log_start_overrides``) as JSON ``{"topic": {"0": 10}}``; default none.

    Secrets (``kafka.sasl.password``, the store URL's password...) stay out of ``repr``.
    """

    topics: list[str]
    kafka: dict[str, str]
    starting: str = "latest"
    ending: str = "latest"
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    store_url: str | None = None
    fetch_gap_settle_ms: int = 0
    log_start_overrides: dict[str, dict[int, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool) -> SourceOptions:
        """Check ``options`` (names are case-insensitive, as Spark's are).

        Raises:
            ValueError: A missing or malformed option, named in the message.
        """
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        for unsupported in ("assign", "subscribepattern"):
            if unsupported in lowered:
                raise ValueError(
                    f"option {unsupported} is not supported by format('bolide'); use subscribe"
                )
        kafka = {k[len("kafka.") :]: v for k, v in lowered.items() if k.startswith("kafka.")}
        if not kafka.get("bootstrap.servers"):
            raise ValueError("option kafka.bootstrap.servers is required (host:port,...)")
        topics = [t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("option subscribe is required: the topic (stream) to read")
        starting = _spec(lowered, "startingoffsets", "earliest" if batch else "latest", topics)
        if batch and starting == "latest":
            raise ValueError("option startingOffsets='latest' is not valid for a batch read")
        ending = _spec(lowered, "endingoffsets", "latest", topics)
        if ending == "earliest":
            raise ValueError("option endingOffsets='earliest' is not valid")
        parsed = cls(
            topics=topics,
            kafka=kafka,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=_positive(lowered, "maxoffsetspertrigger"),
            include_headers=_flag(lowered, "includeheaders", False),
            fail_on_data_loss=_flag(lowered, "failondataloss", True),
            store_url=lowered.get("bolide.store") or None,
            fetch_gap_settle_ms=_positive(lowered, "bolide.fetchgapsettlems") or 0,
            log_start_overrides=_log_starts(lowered, "bolide.logstartoverrides"),
        )
        try:
            parsed.cluster()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"options do not make a Cluster: {exc}") from None
        return parsed

    def __repr__(self) -> str:
        shown = {item.name: getattr(self, item.name) for item in fields(self)}
        shown["kafka"] = redact(self.kafka)
        if self.store_url is not None:
            shown["store_url"] = redact_url(self.store_url)
        return f"SourceOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def cluster(self) -> Cluster:
        """The ``Cluster`` these options name."""
        settings: dict[str, Any] = dict(self.kafka)
        bootstrap = settings.pop("bootstrap.servers")
        return Cluster(
            bootstrap,
            fetch_gap_settle_ms=self.fetch_gap_settle_ms,
            log_start_overrides=self.log_start_overrides,
            **settings,
        )

    def store(self) -> HistoryStore | None:
        """The history store (one per URL and process), or ``None``."""
        if self.store_url is None:
            return None
        store = _stores.get(self.store_url)
        if store is None:
            from bolide.stores import SqlStore

            store = _stores[self.store_url] = SqlStore(self.store_url)
        return store

    # -- planning (runs in Spark's planner process) ----------------------------------------

    def partitions(self) -> dict[str, list[int]]:
        """The current partitions of each topic (a missing topic has none yet)."""
        meta = admin_client(self.cluster()).list_topics(timeout=10)
        found: dict[str, list[int]] = {}
        for topic in self.topics:
            info = meta.topics.get(topic)
            ok = info is not None and info.error is None
            found[topic] = sorted(info.partitions) if ok and info is not None else []
        return found

    def earliest(self, topic: str, parts: list[int]) -> dict[int, int]:
        """First available offset per partition: the store's first when it reaches lower."""
        if not parts:
            return {}
        cluster = self.cluster()
        consumer = _consumer(cluster)
        try:
            starts = log_starts(consumer, topic, parts, cluster=cluster)
        finally:
            consumer.close()
        store = self.store()
        if store is not None:
            for p in parts:
                first = store.smallest_offset(topic, p)
                if first is not None and first < starts[p]:
                    starts[p] = first
        return starts

    def latest(self, topic: str, parts: list[int]) -> dict[int, int]:
        """The true end (next offset to be written) per partition."""
        return log_ends(self.cluster(), topic, parts) if parts else {}

    def resolve(self, spec: str, omitted: int = _EARLIEST) -> Offsets:
        """Offsets for ``earliest``/``latest``/JSON; partitions a JSON omits get ``omitted``."""
        explicit: dict[str, dict[str, int]] = (
            {} if spec in {"earliest", "latest"} else json.loads(spec)
        )
        out: Offsets = {}
        for topic, parts in self.partitions().items():
            given = {int(p): int(o) for p, o in explicit.get(topic, {}).items()}
            default = {"earliest": _EARLIEST, "latest": _LATEST}.get(spec, omitted)
            wanted = {p: given.get(p, default) for p in parts}
            early = self.earliest(topic, [p for p, o in wanted.items() if o == _EARLIEST])
            late = self.latest(topic, [p for p, o in wanted.items() if o == _LATEST])
            resolved = {p: early.get(p, late.get(p, o)) for p, o in wanted.items()}
            out[topic] = {str(p): resolved[p] for p in parts}
        return out


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


def _consumer(cluster: Cluster) -> Consumer:
    return Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {
                "group.id": f"bolide-spark-{uuid.uuid4().hex}",  # never commits
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            },
        )
    )


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
    first = store.smallest_offset(rng.topic, rng.partition)
    if first is None or first >= stop:
        _lost(opts, rng, rng.start, stop, "below Kafka's log start and not in the store")
        return
    if first > rng.start:
        _lost(opts, rng, rng.start, first, "below both Kafka's log start and the store's")
    cursor = HistoryCursor(StreamConfig(name=rng.topic, global_order=False, store=store))
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
    consumer = _consumer(cluster)
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
            yield from _from_kafka(consumer, opts, rng, position, rows)
        elif len(rows):
            yield rows.batch()
    finally:
        consumer.close()


def _from_kafka(
    consumer: Consumer, opts: SourceOptions, rng: ReadRange, position: int, rows: _Rows
) -> Iterator[Any]:
    consumer.assign([TopicPartition(rng.topic, rng.partition, position)])
    gaps = FetchGaps(rng.topic, opts.fetch_gap_settle_ms / 1000)
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while position < rng.end:
        if time.monotonic() > deadline:
            raise BrokerError(
                f"{rng.topic}[{rng.partition}]: offsets {position}..{rng.end - 1} were not "
                f"delivered within {_READ_TIMEOUT_S:.0f}s",
                stream=rng.topic,
                partition=rng.partition,
                offset=position,
                retriable=True,
            )
        for msg in consumer.consume(num_messages=_BATCH_ROWS, timeout=0.2):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    position = max(position, msg.offset() or 0)
                    continue
                if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    start = log_starts(
                        consumer, rng.topic, [rng.partition], cluster=opts.cluster()
                    )[rng.partition]
                    _lost(opts, rng, position, start, "trimmed from Kafka while reading")
                    position = start
                    consumer.assign([TopicPartition(rng.topic, rng.partition, position)])
                    break
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
