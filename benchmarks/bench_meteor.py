"""Meteor's shape: 4 publishers and 16 ungrouped subscribers of one stream, in one process.

Deliveries per second (records published times subscribers reached, over the time from the
first publish to the last subscriber having every record), raw confluent-kafka against bolide,
runs alternating, best of ``--repeat`` kept:

- raw: four ``Producer`` threads (``produce`` with a delivery callback, ``poll(0)`` between
  calls) and sixteen ``Consumer`` threads, each assigned the stream's partition from its start,
  reading with ``consume(1000)`` and touching every value;
- bolide: four ``Publisher`` threads (``produce(record, on_delivery)``: no future per record)
  and sixteen ungrouped EARLIEST ``Subscriber`` threads reading with ``poll`` and touching
  every ``Record.data``.

Both sides use bolide's librdkafka settings, 100 B payloads, a fresh one-partition stream per
run, and start every subscriber (connected and assigned) before the first publish.
Run ``python -m benchmarks.bench_meteor --help`` from the repository root, or ``bolide bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    markdown_table,
    positive_int,
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

__all__ = ["bench", "main", "run"]

NAME = "meteor"
TARGET = 1.5
_TIMEOUT_S = 180.0


class _Reader(threading.Thread):
    """Counts what one subscriber (raw or bolide) reads until it has ``total`` records."""

    def __init__(self, read: Callable[[], int], total: int, close: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._read, self._total, self._close = read, total, close
        self.go = threading.Event()
        self.seen = 0
        self.done_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.go.wait(_TIMEOUT_S)
            deadline = time.monotonic() + _TIMEOUT_S
            while self.seen < self._total and time.monotonic() < deadline:
                self.seen += self._read()
            self.done_at = time.perf_counter()
        except BaseException as exc:  # reported by the driver
            self.error = exc
        finally:
            self._close()


def _raw_reader(cluster: Cluster, topic: str, total: int) -> _Reader:
    consumer = Consumer(
        cluster.client_config(CONSUMER_DEFAULTS, {"group.id": f"bench-{uuid.uuid4().hex}"})
    )
    consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)  # connect now
    consumer.assign([TopicPartition(topic, 0, 0)])

    def read() -> int:
        n = 0
        for msg in consumer.consume(1000, 0.1):
            if msg.error() is None:
                msg.value()
                n += 1
        return n

    return _Reader(read, total, consumer.close)


def _bolide_reader(cluster: Cluster, stream: StreamConfig, total: int) -> _Reader:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    sub = Subscriber(cluster, config)

    def read() -> int:
        n = 0
        for record in sub.poll(100):
            record.data  # noqa: B018  # touch the payload as the raw side does
            n += 1
        return n

    return _Reader(read, total, sub.close)


def _raw_writer(cluster: Cluster, topic: str, count: int, payload: bytes) -> Callable[[], int]:
    producer = Producer(cluster.client_config(PRODUCER_DEFAULTS, {"client.id": "bench-raw"}))
    producer.list_topics(topic, timeout=10)  # connect now

    def write() -> int:
        acked = 0

        def on_delivery(err: Any, msg: Any) -> None:
            nonlocal acked
            if err is None:
                acked += 1

        for _ in range(count):
            producer.poll(0)
            while True:
                try:
                    producer.produce(topic, payload, partition=0, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(_TIMEOUT_S)
        return acked

    return write


def _bolide_writer(
    cluster: Cluster, stream: StreamConfig, count: int, payload: bytes
) -> Callable[[], int]:
    pub = Publisher(cluster, PublisherConfig(stream=stream))

    def write() -> int:
        acked = 0

        def on_delivery(offset: int | None, error: BaseException | None) -> None:
            nonlocal acked
            if error is None:
                acked += 1

        try:
            for _ in range(count):
                pub.produce(Record(payload), on_delivery)
            pub.flush(_TIMEOUT_S)
        finally:
            pub.close()
        return acked

    return write


def one_run(
    cluster: Cluster, side: str, publishers: int, subscribers: int, per_publisher: int
) -> float:
    """Deliveries/s of one run of ``side`` ("raw" or "bolide") on a fresh stream."""
    stream = StreamConfig(name=f"bench-meteor-{side}-{uuid.uuid4().hex[:10]}")
    ensure_topic(cluster, stream)
    total = publishers * per_publisher
    payload = b"x" * 100
    if side == "raw":
        readers = [_raw_reader(cluster, stream.name, total) for _ in range(subscribers)]
        writers = [
            _raw_writer(cluster, stream.name, per_publisher, payload) for _ in range(publishers)
        ]
    else:
        readers = [_bolide_reader(cluster, stream, total) for _ in range(subscribers)]
        writers = [
            _bolide_writer(cluster, stream, per_publisher, payload) for _ in range(publishers)
        ]
    acked = [0] * publishers

    def publish(index: int) -> None:
        acked[index] = writers[index]()

    threads = [threading.Thread(target=publish, args=(i,), daemon=True) for i in range(publishers)]
    for reader in readers:
        reader.start()
    started = time.perf_counter()
    for reader in readers:
        reader.go.set()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_TIMEOUT_S)
    for reader in readers:
        reader.join(_TIMEOUT_S)
    failed = next((r.error for r in readers if r.error is not None), None)
    if failed is not None:
        raise RuntimeError(f"{side}: a subscriber failed") from failed
    if sum(acked) != total or any(r.seen < total for r in readers):
        raise RuntimeError(
            f"{side}: {sum(acked)} of {total} acknowledged, subscribers saw "
            f"{min(r.seen for r in readers)} to {max(r.seen for r in readers)}"
        )
    return total * subscribers / (max(r.done_at for r in readers) - started)


def run(
    cluster: Cluster,
    *,
    publishers: int = 4,
    subscribers: int = 16,
    per_publisher: int = 12_500,
    repeat: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Best deliveries/s of each side over ``repeat`` alternating runs."""
    best = {"raw": 0.0, "bolide": 0.0}
    for i in range(repeat):
        for side in ("raw", "bolide") if i % 2 == 0 else ("bolide", "raw"):
            rate = one_run(cluster, side, publishers, subscribers, per_publisher)
            if progress:
                progress(f"run {i + 1}/{repeat} {side}: {rate:,.0f} deliveries/s")
            best[side] = max(best[side], rate)
    return best


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publishers", type=positive_int, default=4)
    parser.add_argument("--subscribers", type=positive_int, default=16)
    parser.add_argument("--per-publisher", type=positive_int, default=12_500)
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per side (best)")


#: ``--quick``: 250 records per publisher, one run per side.
QUICK = ["--per-publisher", "250", "--repeat", "1"]


def _report(best: dict[str, float], settings: dict[str, int], broker: str) -> Report:
    ratio = Ratio(
        NAME,
        f"{settings['publishers']} publishers x {settings['subscribers']} subscribers, 100 B",
        "raw confluent-kafka",
        "deliveries/s",
        best["raw"],
        best["bolide"],
        TARGET,
    )
    table = markdown_table(
        ["shape", "raw deliveries/s", "bolide deliveries/s", "ratio", "target", "met"],
        [
            [
                ratio.metric,
                f"{best['raw']:,.0f}",
                f"{best['bolide']:,.0f}",
                f"{ratio.ratio:.2f}x",
                f">= {TARGET}x",
                "yes" if ratio.met else "NO",
            ]
        ],
    )
    records = settings["publishers"] * settings["per_publisher"]
    title = (
        f"meteor: one stream, {settings['publishers']} publishers x {settings['subscribers']} "
        f"ungrouped subscribers in one process ({records:,} records, best of "
        f"{settings['repeat']}; {broker})"
    )
    return Report(title, table, [ratio], {"settings": settings, "deliveries_per_s": best})


def _measure(context: Context, args: argparse.Namespace) -> Report:
    settings = {
        "publishers": args.publishers,
        "subscribers": args.subscribers,
        "per_publisher": args.per_publisher,
        "repeat": args.repeat,
    }
    best = run(context.cluster, **settings, progress=lambda msg: context.say(NAME, msg))
    return _report(best, settings, context.broker)


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
