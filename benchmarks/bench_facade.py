"""Raw confluent-kafka against bolide's facade: publish and poll throughput, latency, round trip.

Both sides run in one process against one broker, with the same librdkafka settings
(``PRODUCER_DEFAULTS`` / ``CONSUMER_DEFAULTS``) and the same payloads. Throughput runs
alternate raw and bolide and keep the best of ``--repeat``; latency samples alternate one by
one, so drift in the machine's load hits both sides alike.

Run ``python -m benchmarks.bench_facade --help`` from the repository root, or ``bolide bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    markdown_table,
    positive_int,
    summarize,
)
from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, ensure_topic

__all__ = ["Row", "bench", "main", "run", "table"]

NAME = "facade"
PAYLOAD_SIZES = (100, 1024)
_PHASE_TIMEOUT_S = 120.0
_SAMPLE_TIMEOUT_S = 10.0
_WARMUP = 5


@dataclass
class Row:
    """One measured quantity, raw against bolide."""

    metric: str
    payload: int
    unit: str
    raw: float
    bolide: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        """bolide / raw."""
        return self.bolide / self.raw if self.raw else math.inf

    @property
    def target(self) -> str:
        """The target for this metric, or ``""``."""
        if self.higher_is_better:
            return ">= 0.9x"
        return "<= raw + 1 ms" if self.metric.endswith("p99") else ""

    @property
    def met(self) -> bool | None:
        """Whether the target holds; ``None`` when the row has no target."""
        if self.higher_is_better:
            return self.ratio >= 0.9
        if self.metric.endswith("p99"):
            return self.bolide <= self.raw + 1.0
        return None


# -- set-up ---------------------------------------------------------------------------------


def fresh_topic(cluster: Cluster, label: str) -> StreamConfig:
    """A fresh stream named ``bench-<label>-<random>``, its topic created."""
    stream = StreamConfig(name=f"bench-{label}-{uuid.uuid4().hex[:10]}")
    ensure_topic(cluster, stream)
    return stream


def raw_producer(cluster: Cluster, producer_config: Mapping[str, Any] | None = None) -> Producer:
    """A confluent-kafka producer with bolide's defaults, ``producer_config`` over them."""
    return Producer(
        cluster.client_config(PRODUCER_DEFAULTS, {"client.id": "bench-raw"}, producer_config)
    )


def _raw_consumer(cluster: Cluster, topic: str, offset: int) -> Consumer:
    consumer = Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {"group.id": f"bench-raw-{uuid.uuid4().hex}", "client.id": "bench-raw"},
        )
    )
    # Connect before any timing starts, as bolide's subscriber does in its constructor.
    consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, offset)])
    return consumer


def _subscriber(cluster: Cluster, stream: StreamConfig) -> Subscriber:
    return Subscriber(
        cluster,
        SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST),
    )


def _check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what} did not finish within {_PHASE_TIMEOUT_S}s")


# -- throughput -------------------------------------------------------------------------------


def raw_publish(
    cluster: Cluster,
    topic: str,
    payload: bytes,
    count: int,
    producer_config: Mapping[str, Any] | None = None,
) -> float:
    """Records/s until all ``count`` records are acknowledged (confluent-kafka's own pattern);
    ``producer_config`` over bolide's producer defaults."""
    producer = raw_producer(cluster, producer_config)
    producer.produce(topic, payload, partition=0)
    producer.flush(10)  # warm-up: connection and idempotent producer id
    acked = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    start = time.perf_counter()
    for _ in range(count):
        producer.poll(0)
        while True:
            try:
                producer.produce(topic, payload, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(_PHASE_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if acked != count:
        raise RuntimeError(f"raw publish: {acked} of {count} records acknowledged")
    return count / elapsed


def raw_publish_batch(
    cluster: Cluster, topic: str, payload: bytes, count: int, batch: int = 1000
) -> float:
    """Records/s with ``Producer.produce_batch`` of ``batch`` records and one delivery callback
    for all: the ceiling of ``publish_many`` (confluent-kafka's own batch call)."""
    producer = raw_producer(cluster)
    producer.produce(topic, payload, partition=0)
    producer.flush(10)
    acked = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    start = time.perf_counter()
    for first in range(0, count, batch):
        messages = [{"value": payload} for _ in range(min(batch, count - first))]
        while messages:
            taken = producer.produce_batch(topic, messages, partition=0, on_delivery=on_delivery)
            if taken == len(messages):
                break
            # A full queue refuses the rest of the batch: offer it again once there is room.
            messages = [{"value": payload} for m in messages if "_error" in m]
            producer.poll(0.01)
    producer.flush(_PHASE_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if acked != count:
        raise RuntimeError(f"raw produce_batch: {acked} of {count} records acknowledged")
    return count / elapsed


def bolide_publish(
    cluster: Cluster,
    stream: StreamConfig,
    payload: bytes,
    count: int,
    producer_config: Mapping[str, Any] | None = None,
) -> float:
    """Records/s until all ``count`` records are acknowledged and their futures resolved.

    Delivery reports of one partition arrive in order, so the clock stops when ``flush`` has
    returned and the last future has resolved; every future is checked afterwards, untimed.
    ``producer_config`` replaces bolide's producer defaults where it names them.
    """
    config = PublisherConfig(stream=stream, producer_config=dict(producer_config or {}))
    with Publisher(cluster, config) as pub:
        pub.publish(Record(payload))  # warm-up: connection and idempotent producer id
        futures: list[Future[int]] = []
        append = futures.append
        start = time.perf_counter()
        for _ in range(count):
            append(pub.publish_async(Record(payload)))
        pub.flush(_PHASE_TIMEOUT_S)
        futures[-1].result(_PHASE_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        done, pending = wait(futures, timeout=_PHASE_TIMEOUT_S)
    if pending or any(f.exception() is not None for f in done):
        raise RuntimeError(f"bolide publish: {len(pending)} of {count} records unacknowledged")
    return count / elapsed


def bolide_publish_many(
    cluster: Cluster, stream: StreamConfig, payload: bytes, count: int, batch: int = 1000
) -> float:
    """Records/s with ``publish_many``: one future per ``batch`` records."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(payload))
        futures: list[Future[list[int]]] = []
        start = time.perf_counter()
        for first in range(0, count, batch):
            size = min(batch, count - first)
            futures.append(pub.publish_many([Record(payload) for _ in range(size)]))
        pub.flush(_PHASE_TIMEOUT_S)
        futures[-1].result(_PHASE_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        done, pending = wait(futures, timeout=_PHASE_TIMEOUT_S)
    if pending or any(f.exception() is not None for f in done):
        raise RuntimeError(f"bolide publish_many: {len(pending)} batches unacknowledged")
    return count / elapsed


def bolide_produce(cluster: Cluster, stream: StreamConfig, payload: bytes, count: int) -> float:
    """Records/s with ``produce`` and a delivery callback (no future per record)."""
    acked = 0

    def on_delivery(offset: int | None, error: BaseException | None) -> None:
        nonlocal acked
        if error is None:
            acked += 1

    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(payload))
        start = time.perf_counter()
        for _ in range(count):
            pub.produce(Record(payload), on_delivery)
        pub.flush(_PHASE_TIMEOUT_S)
        elapsed = time.perf_counter() - start
    if acked != count:
        raise RuntimeError(f"bolide produce: {acked} of {count} records acknowledged")
    return count / elapsed


def _raw_read(
    consumer: Consumer, total: int, deadline: float, what: str, early: list[Any] | None = None
) -> float:
    """Records/s of ``consume`` reading ``total`` records (``early``: a batch already taken,
    counted first), touching each value."""
    start = time.perf_counter()
    seen = 0
    batch = early or []
    while seen < total:
        # Ask for no more than is left: consume() waits for the full count or the timeout.
        for msg in batch or consumer.consume(min(1000, total - seen), 1.0):
            if msg.error() is None:
                msg.value()
                seen += 1
        batch = []
        _check_deadline(deadline, what)
    return total / (time.perf_counter() - start)


def raw_poll(cluster: Cluster, topic: str, total: int) -> float:
    """Records/s reading ``total`` records from the start of the topic with ``consume``."""
    consumer = _raw_consumer(cluster, topic, OFFSET_BEGINNING)
    try:
        return _raw_read(consumer, total, time.monotonic() + _PHASE_TIMEOUT_S, "raw poll")
    finally:
        consumer.close()


def bolide_poll(cluster: Cluster, stream: StreamConfig, total: int) -> float:
    """Records/s reading ``total`` records from the start with ``Subscriber.poll``."""
    with _subscriber(cluster, stream) as sub:
        seen = 0
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        start = time.perf_counter()
        while seen < total:
            for record in sub.poll(1000):
                record.data  # noqa: B018  # touch the payload as the raw side does
                seen += 1
            _check_deadline(deadline, "bolide poll")
        return total / (time.perf_counter() - start)


def raw_poll_grouped(cluster: Cluster, topic: str, total: int) -> float:
    """Records/s of a consumer group's one member (``subscribe``, from the log start) reading
    ``total`` records with ``consume``, timed from its assignment, as ``raw_poll`` is from its
    ``assign``: records read while the join was served are counted then."""
    assigned = threading.Event()
    consumer = Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {"group.id": f"bench-raw-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"},
        )
    )

    def on_assign(member: Consumer, partitions: list[TopicPartition]) -> None:
        # From the log start read beforehand, as bolide's subscriber positions itself: no
        # committed-offset or offset-reset lookup left for the timed part.
        member.assign([TopicPartition(p.topic, p.partition, low) for p in partitions])
        assigned.set()

    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.subscribe([topic], on_assign=on_assign)
        early: list[Any] = []
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        while not assigned.is_set():
            early += consumer.consume(1000, 0.01)
            _check_deadline(deadline, "raw group join")
        return _raw_read(consumer, total, deadline, "raw grouped poll", early)
    finally:
        consumer.close()


def bolide_poll_grouped(cluster: Cluster, stream: StreamConfig, total: int) -> float:
    """Records/s of a subscriber group's one member with ``poll``, timed from its
    assignment (``is_assigned`` serves the join; what it read comes with the first poll)."""
    config = SubscriberConfig(
        stream=stream,
        group=f"bench-bolide-{uuid.uuid4().hex}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
    )
    with Subscriber(cluster, config) as sub:
        deadline = time.monotonic() + _PHASE_TIMEOUT_S
        while not sub.is_assigned():
            time.sleep(0.01)
            _check_deadline(deadline, "bolide group join")
        seen = 0
        start = time.perf_counter()
        while seen < total:
            for record in sub.poll(1000):
                record.data  # noqa: B018
                seen += 1
            _check_deadline(deadline, "bolide grouped poll")
        return total / (time.perf_counter() - start)


def throughput(cluster: Cluster, size: int, count: int, repeat: int) -> list[Row]:
    """Best-of-``repeat`` publish and poll throughput, raw and bolide runs alternating."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    best = dict.fromkeys(
        ("raw_pub", "raw_batch", "bolide_pub", "bolide_many", "bolide_produce", "raw_poll",
         "bolide_poll", "raw_grouped", "bolide_grouped"),
        0.0,
    )  # fmt: skip
    for _ in range(repeat):
        raw_stream = fresh_topic(cluster, "raw")
        best["raw_pub"] = max(
            best["raw_pub"], raw_publish(cluster, raw_stream.name, payload, count)
        )
        batch_topic = fresh_topic(cluster, "raw-batch").name
        best["raw_batch"] = max(
            best["raw_batch"], raw_publish_batch(cluster, batch_topic, payload, count)
        )
        for key, publish in (
            ("bolide_pub", bolide_publish),
            ("bolide_many", bolide_publish_many),
            ("bolide_produce", bolide_produce),
        ):
            rate = publish(cluster, fresh_topic(cluster, "bolide"), payload, count)
            best[key] = max(best[key], rate)
        # Both read the same topic (count + 1 warm-up record each).
        best["raw_poll"] = max(best["raw_poll"], raw_poll(cluster, raw_stream.name, count + 1))
        best["bolide_poll"] = max(best["bolide_poll"], bolide_poll(cluster, raw_stream, count + 1))
        best["raw_grouped"] = max(
            best["raw_grouped"], raw_poll_grouped(cluster, raw_stream.name, count + 1)
        )
        best["bolide_grouped"] = max(
            best["bolide_grouped"], bolide_poll_grouped(cluster, raw_stream, count + 1)
        )
    return [
        Row("publish", size, "records/s", best["raw_pub"], best["bolide_pub"], True),
        Row("publish_many", size, "records/s", best["raw_pub"], best["bolide_many"], True),
        Row("publish_many vs produce_batch", size, "records/s", best["raw_batch"],
            best["bolide_many"], True),
        Row("produce", size, "records/s", best["raw_pub"], best["bolide_produce"], True),
        Row("poll", size, "records/s", best["raw_poll"], best["bolide_poll"], True),
        Row("poll grouped", size, "records/s", best["raw_grouped"], best["bolide_grouped"], True),
    ]  # fmt: skip


# -- latency ----------------------------------------------------------------------------------


class _RawPair:
    """A raw producer and a consumer of one topic: send one record, wait for it to come back."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        self.topic = topic
        self.producer = raw_producer(cluster)
        self.consumer = _raw_consumer(cluster, topic, 0)

    def send(self, payload: bytes) -> None:
        self.producer.produce(self.topic, payload, partition=0)
        self.producer.poll(0)

    def receive(self) -> bytes:
        deadline = time.monotonic() + _SAMPLE_TIMEOUT_S
        while time.monotonic() < deadline:
            msg = self.consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return msg.value() or b""
        raise TimeoutError("raw: record did not arrive")

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(10)


class _BolidePair:
    """A bolide publisher and an ungrouped subscriber of one stream."""

    def __init__(self, cluster: Cluster, stream: StreamConfig) -> None:
        self.publisher = Publisher(cluster, PublisherConfig(stream=stream))
        self.subscriber = _subscriber(cluster, stream)

    def send(self, payload: bytes) -> None:
        self.publisher.publish_async(Record(payload))

    def receive(self) -> bytes:
        deadline = time.monotonic() + _SAMPLE_TIMEOUT_S
        while time.monotonic() < deadline:
            first = self.subscriber.poll(1000).first()
            if first is not None:
                return first.data
        raise TimeoutError("bolide: record did not arrive")

    def close(self) -> None:
        self.subscriber.close()
        self.publisher.close()


def _sample(pair: _RawPair | _BolidePair, payload: bytes) -> float:
    start = time.perf_counter()
    pair.send(payload)
    pair.receive()
    return (time.perf_counter() - start) * 1000


def _alternate(
    raw: _RawPair | _BolidePair, bolide: _RawPair | _BolidePair, payload: bytes, samples: int
) -> tuple[list[float], list[float]]:
    for _ in range(_WARMUP):
        _sample(raw, payload)
        _sample(bolide, payload)
    raw_ms: list[float] = []
    bolide_ms: list[float] = []
    for i in range(samples):
        # Swap who goes first each time so neither side always follows the other.
        if i % 2:
            bolide_ms.append(_sample(bolide, payload))
            raw_ms.append(_sample(raw, payload))
        else:
            raw_ms.append(_sample(raw, payload))
            bolide_ms.append(_sample(bolide, payload))
    return raw_ms, bolide_ms


def latency(cluster: Cluster, size: int, samples: int) -> tuple[list[float], list[float]]:
    """End-to-end ms from publish to poll, one record in flight, raw and bolide alternating."""
    payload = bytes(size)
    raw = _RawPair(cluster, fresh_topic(cluster, "lat-raw").name)
    bolide = _BolidePair(cluster, fresh_topic(cluster, "lat-bolide"))
    try:
        return _alternate(raw, bolide, payload, samples)
    finally:
        raw.close()
        bolide.close()


class _RawEcho(_RawPair):
    """Requests go out on one topic; a thread republishes each to the reply topic."""

    def __init__(self, cluster: Cluster, request: str, reply: str) -> None:
        super().__init__(cluster, reply)
        self.request = request
        self._stop = threading.Event()
        self._echo_in = _raw_consumer(cluster, request, 0)
        self._echo_out = raw_producer(cluster)
        self._thread = threading.Thread(target=self._echo, name="bench-raw-echo", daemon=True)
        self._thread.start()

    def _echo(self) -> None:
        while not self._stop.is_set():
            msg = self._echo_in.poll(0.1)
            if msg is not None and msg.error() is None:
                self._echo_out.produce(self.topic, msg.value(), partition=0)
                self._echo_out.poll(0)

    def send(self, payload: bytes) -> None:
        self.producer.produce(self.request, payload, partition=0)
        self.producer.poll(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._echo_in.close()
        self._echo_out.flush(10)
        super().close()


class _BolideEcho(_BolidePair):
    """bolide's scenario: a receiver on the request stream republishes to the reply stream."""

    def __init__(self, cluster: Cluster, request: StreamConfig, reply: StreamConfig) -> None:
        super().__init__(cluster, reply)
        self.request = Publisher(cluster, PublisherConfig(stream=request))
        self._echo_out = Publisher(cluster, PublisherConfig(stream=reply))
        self._echo_in = _subscriber(cluster, request)
        self._echo_in.attach_receiver(self._echo, poll_timeout_ms=100)

    def _echo(self, record: Record) -> None:
        self._echo_out.publish_async(Record(record.data))

    def send(self, payload: bytes) -> None:
        self.request.publish_async(Record(payload))

    def close(self) -> None:
        self._echo_in.close()
        self._echo_out.close()
        self.request.close()
        super().close()


def round_trip(cluster: Cluster, size: int, samples: int) -> tuple[list[float], list[float]]:
    """Request/reply ms with one request in flight, raw and bolide alternating."""
    payload = bytes(size)
    raw = _RawEcho(
        cluster, fresh_topic(cluster, "req-raw").name, fresh_topic(cluster, "rep-raw").name
    )
    bolide = _BolideEcho(
        cluster, fresh_topic(cluster, "req-bolide"), fresh_topic(cluster, "rep-bolide")
    )
    try:
        return _alternate(raw, bolide, payload, samples)
    finally:
        raw.close()
        bolide.close()


# -- driver -----------------------------------------------------------------------------------


def _latency_rows(metric: str, size: int, raw: list[float], bolide: list[float]) -> list[Row]:
    raw_s, bolide_s = summarize(raw), summarize(bolide)
    return [Row(f"{metric} {q}", size, "ms", raw_s[q], bolide_s[q], False) for q in raw_s]


def run(
    cluster: Cluster,
    *,
    count: int = 50_000,
    repeat: int = 3,
    latency_samples: int = 200,
    round_trips: int = 100,
    sizes: Sequence[int] = PAYLOAD_SIZES,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Measure every row of the facade table against ``cluster``."""
    say = progress or (lambda _msg: None)
    rows: list[Row] = []
    for size in sizes:
        say(f"throughput, {size} B payloads, {count} records x {repeat}")
        rows.extend(throughput(cluster, size, count, repeat))
    for size in sizes:
        say(f"latency, {size} B payloads, {latency_samples} samples")
        raw, bolide = latency(cluster, size, latency_samples)
        rows.extend(
            r
            for r in _latency_rows("latency", size, raw, bolide)
            if r.metric[-3:] in {"p50", "p99"}
        )
    say(f"round trip, {sizes[0]} B payloads, {round_trips} requests")
    raw, bolide = round_trip(cluster, sizes[0], round_trips)
    rows.extend(_latency_rows("round trip", sizes[0], raw, bolide))
    return rows


def _number(value: float, unit: str) -> str:
    return f"{value:,.0f}" if unit == "records/s" else f"{value:.2f}"


def table(rows: Sequence[Row]) -> str:
    """The Markdown table of ``rows`` with bolide/raw ratios and the targets."""
    body = [
        [
            r.metric,
            f"{r.payload} B",
            r.unit,
            _number(r.raw, r.unit),
            _number(r.bolide, r.unit),
            f"{r.ratio:.2f}x",
            r.target,
            {True: "yes", False: "NO", None: ""}[r.met],
        ]
        for r in rows
    ]
    headers = ["metric", "payload", "unit", "raw", "bolide", "bolide/raw", "target", "met"]
    return markdown_table(headers, body)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--count", type=positive_int, default=50_000, help="records per throughput run"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="throughput runs per side (best)"
    )
    parser.add_argument(
        "--latency-samples", type=positive_int, default=200, help="per side and size"
    )
    parser.add_argument("--round-trips", type=positive_int, default=100, help="requests per side")


#: ``--quick``: tiny counts, a smoke run.
QUICK = ["--count", "2000", "--repeat", "1", "--latency-samples", "5", "--round-trips", "5"]


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """The whole table, and the throughput rows as ratios with targets."""
    started = time.monotonic()
    rows = run(
        context.cluster,
        count=args.count,
        repeat=args.repeat,
        latency_samples=args.latency_samples,
        round_trips=args.round_trips,
        progress=lambda msg: context.say(NAME, msg),
    )
    ratios = [
        Ratio(
            NAME,
            f"{r.metric} {r.payload} B",
            "raw confluent-kafka",
            r.unit,
            r.raw,
            r.bolide,
            0.9,
        )
        for r in rows
        if r.higher_is_better
    ]
    title = (
        f"facade: raw confluent-kafka vs bolide ({args.count:,} records x "
        f"{args.repeat}, best kept; {context.broker}, {time.monotonic() - started:.0f} s)"
    )
    data = {
        "rows": [{**asdict(r), "ratio": r.ratio, "target": r.target, "met": r.met} for r in rows]
    }
    return Report(title, table(rows), ratios, data)


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
