"""bolide against the other Python Kafka clients: the same publish and consume work, one run.

The work: ``--count`` records of 100 B (50,000; 500 with ``--quick``) to a fresh one-partition
topic, timed until every record is acknowledged, each client with its documented settings for
``acks=all`` and idempotence and a 1 ms linger; then the same records read back from the start,
timed in the steady state, from the batch that brings the 1,000th record to the last (so
connecting, joining a group and the first fetches are left out on every side). The clients:

- bolide: ``Publisher.publish_async`` (a future per record) and ``publish_many`` (a future per
  1,000); ``Subscriber.poll``, ungrouped.
- raw confluent-kafka: ``Producer.produce`` with a delivery callback and ``poll(0)``;
  ``Consumer.consume(1000)``.
- aiokafka: ``await send()`` per record, then every future; ``getmany(max_records=1000)``.
- kafka-python: ``send()`` per record, ``flush()``, then every future; ``poll(max_records=1000)``.
- FastStream, with its confluent broker and its aiokafka broker: ``publish(no_confirm=True)``
  per record, then every future; a ``batch=True`` subscriber of up to 1,000 records.

Each row shows its records/s and the ratio bolide / that client (bolide's per-record
``publish_async`` for publishing, ``poll`` for consuming). The peers come with
``pip install 'bolide[bench]'``; a peer that is not installed, or that fails against the broker,
is a skipped row with the reason. Runs alternate the clients and keep the best of ``--repeat``.

Run from the repository root: ``python -m benchmarks.bench_peers [--quick] [--json]``, or
``bolide bench --peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks._common import (
    Context,
    Ratio,
    Report,
    broker_cluster,
    machine_info,
    markdown_table,
    positive_int,
    ratios_table,
)
from benchmarks.bench_facade import bolide_publish, bolide_publish_many, raw_publish
from bolide.facade import Cluster, InitialOffsetScheme, StreamConfig, Subscriber, SubscriberConfig
from bolide.facade.kafka import CONSUMER_DEFAULTS, ensure_topic

__all__ = ["PEERS", "Row", "bench", "main", "missing_peers"]

NAME = "peers"
SIZE = 100
_BATCH = 1000
_TIMEOUT_S = 120.0
#: The Python clients compared, by import name, with the distribution that provides each.
PEERS = {"aiokafka": "aiokafka", "kafka": "kafka-python", "faststream": "faststream"}
_INSTALL = "pip install 'bolide[bench]'"


def missing_peers() -> list[str]:
    """The distributions of ``PEERS`` that cannot be imported here."""
    missing = []
    for module, dist in PEERS.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(dist)
    return missing


@dataclass
class Row:
    """One client's figure for one kind of work; ``rate`` is ``None`` when it was skipped."""

    work: str
    client: str
    rate: float | None = None
    skipped: str = ""


# -- publishing -------------------------------------------------------------------------------


def _fresh(cluster: Cluster, label: str) -> str:
    stream = StreamConfig(name=f"bench-peers-{label}-{uuid.uuid4().hex[:8]}")
    ensure_topic(cluster, stream)
    return stream.name


async def _aiokafka_publish(bootstrap: str, topic: str, payload: bytes, count: int) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=1
    )
    try:
        await producer.start()
        await producer.send_and_wait(topic, payload, partition=0)  # connection, producer id
        start = time.perf_counter()
        futures = [await producer.send(topic, payload, partition=0) for _ in range(count)]
        await asyncio.gather(*futures)
        return count / (time.perf_counter() - start)
    finally:
        await producer.stop()


def _kafka_python_publish(bootstrap: str, topic: str, payload: bytes, count: int) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=1
    )
    try:
        producer.send(topic, payload, partition=0).get(_TIMEOUT_S)  # connection, producer id
        start = time.perf_counter()
        futures = [producer.send(topic, payload, partition=0) for _ in range(count)]
        producer.flush(_TIMEOUT_S)
        for future in futures:
            future.get(_TIMEOUT_S)  # resolved by flush: raises if a record failed
        return count / (time.perf_counter() - start)
    finally:
        producer.close(10)


async def _faststream_publish(
    broker: Any, bootstrap: str, topic: str, payload: bytes, count: int
) -> float:
    try:
        await broker.start()
        await broker.publish(payload, topic, partition=0)  # waits for the acknowledgement
        start = time.perf_counter()
        futures = [
            await broker.publish(payload, topic, partition=0, no_confirm=True) for _ in range(count)
        ]
        await asyncio.gather(*futures)
        return count / (time.perf_counter() - start)
    finally:
        await broker.stop()


def _faststream_broker(kind: str, bootstrap: str, *, publisher: bool) -> Any:
    settings: dict[str, Any] = {"logger": None}
    if publisher:
        settings.update(acks="all", enable_idempotence=True, linger_ms=1)
    if kind == "confluent":
        from faststream.confluent import KafkaBroker as ConfluentBroker

        return ConfluentBroker(bootstrap, **settings)
    from faststream.kafka import KafkaBroker as AiokafkaBroker

    return AiokafkaBroker(bootstrap, **settings)


# -- consuming --------------------------------------------------------------------------------


class _SteadyClock:
    """Records/s of a reader in its steady state: from the batch that brings the ``warm``-th
    record (a tenth of the run, at most 1,000) to the ``total``-th, so that connecting, joining
    a group and the first fetches are left out of every side alike (a reader whose first batch
    waits to fill up and one that returns the first record at once start equal)."""

    def __init__(self, total: int, timeout_s: float) -> None:
        self.total = total
        self.timeout_s = timeout_s
        self.warm = max(1, min(1000, total // 10))
        self.seen = 0
        self.warm_at = 0.0
        self.warm_count = 0
        self.deadline = time.monotonic() + timeout_s
        self.started = time.perf_counter()

    def count(self, records: int) -> bool:
        """Count a batch; true once ``total`` records were seen (``TimeoutError`` past the
        timeout)."""
        self.seen += records
        if not self.warm_count and self.seen >= self.warm:
            self.warm_at, self.warm_count = time.perf_counter(), self.seen
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.seen} of {self.total} records read in {self.timeout_s} s")
        return self.seen >= self.total

    def rate(self) -> float:
        """Records/s after the warm-up; since the start when one batch brought them all."""
        now = time.perf_counter()
        if self.seen > self.warm_count:
            return (self.seen - self.warm_count) / (now - self.warm_at)
        return self.seen / (now - self.started)


def _raw_consume(cluster: Cluster, topic: str, total: int) -> float:
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": uuid.uuid4().hex}))
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        clock = _SteadyClock(total, _TIMEOUT_S)
        while True:
            seen = 0
            for msg in consumer.consume(min(_BATCH, total - clock.seen), 1.0):
                if msg.error() is None:
                    msg.value()
                    seen += 1
            if clock.count(seen):
                return clock.rate()
    finally:
        consumer.close()


def _bolide_consume(cluster: Cluster, topic: str, total: int) -> float:
    config = SubscriberConfig(
        stream=StreamConfig(name=topic), initial_offset_scheme=InitialOffsetScheme.EARLIEST
    )
    with Subscriber(cluster, config) as sub:
        clock = _SteadyClock(total, _TIMEOUT_S)
        while True:
            seen = 0
            for record in sub.poll(1000):
                record.data  # noqa: B018  # touch the payload as every side does
                seen += 1
            if clock.count(seen):
                return clock.rate()


async def _aiokafka_consume(bootstrap: str, topic: str, total: int) -> float:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    try:
        await consumer.start()
        partition = AioPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        clock = _SteadyClock(total, _TIMEOUT_S)
        while True:
            seen = 0
            batches = await consumer.getmany(partition, timeout_ms=1000, max_records=_BATCH)
            for messages in batches.values():
                for message in messages:
                    message.value  # noqa: B018
                    seen += 1
            if clock.count(seen):
                return clock.rate()
    finally:
        await consumer.stop()


def _kafka_python_consume(bootstrap: str, topic: str, total: int) -> float:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    try:
        partition = KpPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        clock = _SteadyClock(total, _TIMEOUT_S)
        while True:
            seen = 0
            for messages in consumer.poll(timeout_ms=1000, max_records=_BATCH).values():
                for message in messages:
                    message.value  # noqa: B018
                    seen += 1
            if clock.count(seen):
                return clock.rate()
    finally:
        consumer.close()


async def _faststream_consume(kind: str, bootstrap: str, topic: str, total: int) -> float:
    broker = _faststream_broker(kind, bootstrap, publisher=False)
    clock = _SteadyClock(total, _TIMEOUT_S)
    done = asyncio.Event()

    @broker.subscriber(  # type: ignore[misc]
        topic,
        group_id=f"bench-peers-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        batch=True,
        max_records=_BATCH,
    )
    async def handle(bodies: list[bytes]) -> None:
        if not done.is_set() and clock.count(len(bodies)):
            done.set()

    try:
        await broker.start()
        await asyncio.wait_for(done.wait(), _TIMEOUT_S)
        return clock.rate()
    finally:
        await broker.stop()


# -- the run ----------------------------------------------------------------------------------


def _sync(coro: Callable[[], Awaitable[float]]) -> Callable[[], float]:
    async def bounded() -> float:
        return await asyncio.wait_for(coro(), _TIMEOUT_S)

    return lambda: asyncio.run(bounded())


def _publishers(cluster: Cluster, count: int) -> list[tuple[str, str, Callable[[str], float]]]:
    """(client, import needed, publish(topic) -> records/s) for every client."""
    payload = bytes(range(SIZE))
    boot = cluster.bootstrap_servers

    def faststream(kind: str) -> Callable[[str], float]:
        def run(topic: str) -> float:
            broker = _faststream_broker(kind, boot, publisher=True)
            return _sync(lambda: _faststream_publish(broker, boot, topic, payload, count))()

        return run

    return [
        ("bolide publish_async", "", lambda t: bolide_publish(cluster, StreamConfig(name=t),
                                                                payload, count)),
        ("bolide publish_many", "", lambda t: bolide_publish_many(cluster, StreamConfig(name=t),
                                                                  payload, count, _BATCH)),
        ("confluent-kafka", "", lambda t: raw_publish(cluster, t, payload, count)),
        ("aiokafka", "aiokafka",
         lambda t: _sync(lambda: _aiokafka_publish(boot, t, payload, count))()),
        ("kafka-python", "kafka", lambda t: _kafka_python_publish(boot, t, payload, count)),
        ("FastStream (confluent)", "faststream", faststream("confluent")),
        ("FastStream (aiokafka)", "faststream", faststream("aiokafka")),
    ]  # fmt: skip


def _consumers(cluster: Cluster) -> list[tuple[str, str, Callable[[str, int], float]]]:
    """(client, import needed, consume(topic, total) -> records/s) for every client."""
    boot = cluster.bootstrap_servers
    return [
        ("bolide poll", "", lambda t, n: _bolide_consume(cluster, t, n)),
        ("confluent-kafka", "", lambda t, n: _raw_consume(cluster, t, n)),
        ("aiokafka", "aiokafka", lambda t, n: _sync(lambda: _aiokafka_consume(boot, t, n))()),
        ("kafka-python", "kafka", lambda t, n: _kafka_python_consume(boot, t, n)),
        ("FastStream (confluent)", "faststream",
         lambda t, n: _sync(lambda: _faststream_consume("confluent", boot, t, n))()),
        ("FastStream (aiokafka)", "faststream",
         lambda t, n: _sync(lambda: _faststream_consume("aiokafka", boot, t, n))()),
    ]  # fmt: skip


def _attempt(
    row: Row, needs: str, measure: Callable[[], float], say: Callable[[str], None]
) -> None:
    """Run one measure into ``row`` (best kept); a missing or failing peer skips the row."""
    if row.skipped:
        return
    if needs:
        try:
            __import__(needs)
        except ImportError as exc:
            row.skipped = f"not installed ({exc.name}): {_INSTALL}"
            return
    say(f"{row.work}: {row.client}")
    try:
        rate = measure()
    except Exception as exc:  # a peer that cannot talk to this broker: reported, not fatal
        if not needs:
            raise  # bolide and confluent-kafka must work
        row.skipped = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return
    row.rate = max(row.rate or 0.0, rate)


def run(cluster: Cluster, count: int, repeat: int, say: Callable[[str], None]) -> list[Row]:
    """Every client's publish and consume figures, best of ``repeat`` alternating runs."""
    publishers = _publishers(cluster, count)
    consumers = _consumers(cluster)
    pub_rows = [Row("publish", client) for client, _, _ in publishers]
    con_rows = [Row("consume", client) for client, _, _ in consumers]
    for attempt in range(repeat):
        say(f"round {attempt + 1} of {repeat}")
        source = ""
        for row, (client, needs, publish) in zip(pub_rows, publishers, strict=True):
            topic = _fresh(cluster, "pub")
            _attempt(row, needs, lambda p=publish, t=topic: p(t), say)  # type: ignore[misc]
            if client == "confluent-kafka":
                source = topic  # count + 1 records (its warm-up record too)
        for row, (_, needs, consume) in zip(con_rows, consumers, strict=True):
            _attempt(row, needs, lambda c=consume, s=source: c(s, count + 1), say)  # type: ignore[misc]
    return pub_rows + con_rows


def _ratios(rows: Sequence[Row]) -> list[Ratio]:
    ratios = []
    for work, ours in (("publish", "bolide publish_async"), ("consume", "bolide poll")):
        mine = next(r.rate for r in rows if r.client == ours)
        for row in rows:
            if row.work != work or row.client.startswith("bolide") or row.rate is None:
                continue
            target = 0.9 if row.client == "confluent-kafka" else 1.0
            ratios.append(Ratio(NAME, f"{work} {SIZE} B vs {row.client}", row.client,
                                "records/s", row.rate, mine or 0.0, target))  # fmt: skip
    return ratios


def table(rows: Sequence[Row]) -> str:
    """The Markdown table: every client's records/s and bolide's ratio to it."""
    mine = {r.work: r.rate for r in rows if r.client in ("bolide publish_async", "bolide poll")}
    body = []
    for r in rows:
        if r.rate is None:
            body.append([r.work, r.client, "skipped", "", r.skipped])
            continue
        ours = 0.0 if r.client.startswith("bolide") else mine.get(r.work) or 0.0
        ratio = f"{ours / r.rate:.2f}x" if ours and r.rate else ""
        body.append([r.work, r.client, f"{r.rate:,.0f}", ratio, ""])
    return markdown_table(["work", "client", "records/s", "bolide/client", "note"], body)


def bench(context: Context) -> Report:
    """``run_all``'s entry: every client, alternating, best of 2 (1 when quick)."""
    count, repeat = (500, 1) if context.quick else (50_000, 2)
    rows = run(context.cluster, count, repeat, lambda msg: context.say(NAME, msg))
    title = (
        f"peers: bolide vs the Python Kafka clients ({count:,} records of {SIZE} B, one "
        f"partition, best of {repeat}; {context.broker})"
    )
    data = {"count": count, "repeat": repeat, "rows": [vars(r) for r in rows]}
    return Report(title, table(rows), _ratios(rows), data)


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone: ``--count``, ``--repeat``, ``--quick``, ``--bootstrap``, ``--json``."""
    parser = argparse.ArgumentParser(prog=f"bench_{NAME}", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=None, help="Kafka to use (default: embedded)")
    parser.add_argument("--count", type=positive_int, default=50_000, help="records per run")
    parser.add_argument("--repeat", type=positive_int, default=2, help="runs per client (best)")
    parser.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    count, repeat = (500, 1) if args.quick else (args.count, args.repeat)
    with broker_cluster(args.bootstrap) as (cluster, broker):
        rows = run(cluster, count, repeat, lambda m: print(f"[{NAME}] {m}", file=sys.stderr))
    ratios = _ratios(rows)
    if args.json:
        doc = {"benchmark": NAME, "broker": broker, "machine": machine_info(), "count": count,
               "repeat": repeat, "rows": [vars(r) for r in rows],
               "ratios": [r.as_dict() for r in ratios]}  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        print(f"## peers ({count:,} records of {SIZE} B, best of {repeat}; {broker})\n")
        print(f"{table(rows)}\n\n{ratios_table(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
