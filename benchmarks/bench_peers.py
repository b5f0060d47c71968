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

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    markdown_table,
    positive_int,
)
from benchmarks._steady import SteadyClock
from benchmarks.bench_facade import bolide_publish, bolide_publish_many, raw_publish
from bolide.facade import Cluster, InitialOffsetScheme, StreamConfig, Subscriber, SubscriberConfig
from bolide.facade.broker.jars import cache_dir
from bolide.facade.kafka import CONSUMER_DEFAULTS, ensure_topic

__all__ = ["PEERS", "QUIX", "QUIX_PRODUCER", "Row", "bench", "main", "missing_peers", "quix_python"]

NAME = "peers"
SIZE = 100
_BATCH = 1000
_TIMEOUT_S = 120.0
#: The Python clients compared, by import name, with the distribution that provides each.
PEERS = {"aiokafka": "aiokafka", "kafka": "kafka-python", "faststream": "faststream"}
_INSTALL = "pip install 'bolide[bench]'"
#: Quix Streams, measured from a virtualenv of its own: it pins ``confluent-kafka<2.13``, which
#: bolide cannot import. ``quix_python`` installs this there on first use.
QUIX = "quixstreams==3.28.*"
#: Quix's producer settings (librdkafka's defaults: ``linger.ms=5``, no idempotence) as
#: bolide's ``producer_config``, for bolide measured with the peer's settings.
QUIX_PRODUCER = {"linger.ms": 5, "enable.idempotence": False}
#: The ``needs`` of the rows that run through ``quix_python``.
_QUIX_NEEDS = "quixstreams (own virtualenv)"
#: The repository root, the working directory of ``python -m benchmarks.quix_peer``.
_ROOT = Path(__file__).resolve().parent.parent


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


# -- Quix Streams, in its own virtualenv ------------------------------------------------------


def quix_python() -> Path:
    """The Python of a virtualenv with ``QUIX`` installed (``$BOLIDE_CACHE/peers``), created on
    first use; ``RuntimeError`` saying why when it cannot be (no index reachable, no venv)."""
    home = cache_dir() / "peers" / QUIX.replace("==", "-").replace(".*", "")
    python, stamp = home / "bin" / "python", home / ".complete"
    if stamp.exists() and python.exists():
        return python
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(home)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", QUIX],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
            raise RuntimeError(f"could not set up {QUIX} in {home}: {reason}")
    stamp.touch()
    return python


def _quix(work: str, bootstrap: str, topic: str, count: int, *extra: str) -> float:
    """Records/s of ``benchmarks.quix_peer`` ``work``, run by ``quix_python``."""
    command = [str(quix_python()), "-m", "benchmarks.quix_peer", work, "--bootstrap", bootstrap,
               "--topic", topic, "--count", str(count), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True,
                          timeout=3 * _TIMEOUT_S, check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


# -- consuming --------------------------------------------------------------------------------


def _raw_consume(cluster: Cluster, topic: str, total: int) -> float:
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": uuid.uuid4().hex}))
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        clock = SteadyClock(total, _TIMEOUT_S)
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
        clock = SteadyClock(total, _TIMEOUT_S)
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
        clock = SteadyClock(total, _TIMEOUT_S)
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
        clock = SteadyClock(total, _TIMEOUT_S)
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
    clock = SteadyClock(total, _TIMEOUT_S)
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
        ("bolide publish_async (Quix's settings)", "",
         lambda t: bolide_publish(cluster, StreamConfig(name=t), payload, count, QUIX_PRODUCER)),
        ("confluent-kafka", "", lambda t: raw_publish(cluster, t, payload, count)),
        ("aiokafka", "aiokafka",
         lambda t: _sync(lambda: _aiokafka_publish(boot, t, payload, count))()),
        ("kafka-python", "kafka", lambda t: _kafka_python_publish(boot, t, payload, count)),
        ("FastStream (confluent)", "faststream", faststream("confluent")),
        ("FastStream (aiokafka)", "faststream", faststream("aiokafka")),
        ("Quix Streams (its defaults)", _QUIX_NEEDS,
         lambda t: _quix("publish", boot, t, count, "--size", str(SIZE), "--settings", "quix")),
        ("Quix Streams (bolide's settings)", _QUIX_NEEDS,
         lambda t: _quix("publish", boot, t, count, "--size", str(SIZE), "--settings", "bolide")),
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
        ("Quix Streams (StreamingDataFrame)", _QUIX_NEEDS,
         lambda t, n: _quix("consume", boot, t, n)),
    ]  # fmt: skip


def _attempt(
    row: Row, needs: str, measure: Callable[[], float], say: Callable[[str], None]
) -> None:
    """Run one measure into ``row`` (best kept); a missing or failing peer skips the row."""
    if row.skipped:
        return
    if needs == _QUIX_NEEDS:
        try:
            quix_python()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            row.skipped = str(exc)
            return
    elif needs:
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


#: bolide's row each peer is compared with: its per-record call with its own settings, except
#: where a peer row names other settings and a bolide row runs with the same ones.
_OURS = {"publish": "bolide publish_async", "consume": "bolide poll"}
_SAME_SETTINGS = {"Quix Streams (its defaults)": "bolide publish_async (Quix's settings)"}


def _ours(rows: Sequence[Row], row: Row) -> float | None:
    """bolide's figure to compare ``row`` with (``None`` for bolide's own rows)."""
    if row.client.startswith("bolide"):
        return None
    client = _SAME_SETTINGS.get(row.client, _OURS[row.work])
    return next(r.rate for r in rows if r.client == client and r.work == row.work)


def _ratios(rows: Sequence[Row]) -> list[Ratio]:
    ratios = []
    for row in rows:
        ours = _ours(rows, row)
        if ours is None or row.rate is None:
            continue
        target = 0.9 if row.client == "confluent-kafka" else 1.0
        ratios.append(Ratio(NAME, f"{row.work} {SIZE} B vs {row.client}", row.client,
                            "records/s", row.rate, ours, target))  # fmt: skip
    return ratios


def table(rows: Sequence[Row]) -> str:
    """The Markdown table: every client's records/s and bolide's ratio to it (to bolide with
    the same settings where a row names them)."""
    body = []
    for r in rows:
        if r.rate is None:
            body.append([r.work, r.client, "skipped", "", r.skipped])
            continue
        ours = _ours(rows, r) or 0.0
        ratio = f"{ours / r.rate:.2f}x" if ours and r.rate else ""
        body.append([r.work, r.client, f"{r.rate:,.0f}", ratio, ""])
    return markdown_table(["work", "client", "records/s", "bolide/client", "note"], body)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=positive_int, default=50_000, help="records per run")
    parser.add_argument("--repeat", type=positive_int, default=2, help="runs per client (best)")


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Every client, alternating, best of ``--repeat``."""
    count, repeat = args.count, args.repeat
    rows = run(context.cluster, count, repeat, lambda msg: context.say(NAME, msg))
    title = (
        f"peers: bolide vs the Python Kafka clients ({count:,} records of {SIZE} B, one "
        f"partition, best of {repeat}; {context.broker})"
    )
    data = {"count": count, "repeat": repeat, "rows": [vars(r) for r in rows]}
    return Report(title, table(rows), _ratios(rows), data)


#: ``--quick``: 500 records, one run per client.
COMMAND = Command(NAME, _measure, _options, ["--count", "500", "--repeat", "1"], __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
