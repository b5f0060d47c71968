"""Spark over bolide streams: format("bolide") reads and the archive job, against raw reads.

The same records (``--records`` of ``--payload`` bytes with two headers, over two partitions)
are read three ways, best of ``--repeat`` each:

* raw: one confluent-kafka consumer in this process, from offset 0 to the end;
* format("bolide"): a Spark batch read in ``local[2]`` (one task per partition), forced
  through every column by an aggregate;
* archive job: Structured Streaming into a fresh SQLite store (``availableNow``, 10,000 records
  per micro-batch), a new checkpoint each run.

Spark's times include planning and task start; the first run in a session warms the Python
workers and is not counted. Run ``python -m benchmarks.bench_spark --help`` from the repository
root, or ``bolide bench --only spark``. The same jobs on a standalone cluster with 1 and 2
workers: ``benchmarks/bench_spark_cluster.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    Skipped,
    markdown_table,
    positive_int,
)
from bolide.facade import Cluster, StreamConfig
from bolide.facade.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, ensure_topic, log_ends

__all__ = [
    "PARTITIONS",
    "bench",
    "best_seconds",
    "fill",
    "main",
    "needs_pyspark",
    "run",
    "stream_options",
]

KAFKA_ARCHIVE = "archive job into SQLite, Spark's Kafka source"
BOLIDE_ARCHIVE = "archive job into SQLite, format('bolide')"
TARGETS = {KAFKA_ARCHIVE: 0.5, BOLIDE_ARCHIVE: 0.5}

NAME = "spark"
PARTITIONS = 2


def fill(cluster: Cluster, stream: StreamConfig, records: int, payload: int) -> None:
    """Publish ``records`` of ``payload`` bytes with two headers, round robin over the
    partitions; wait until all are acknowledged."""
    ensure_topic(cluster, stream)
    producer = Producer(cluster.client_config(PRODUCER_DEFAULTS, {"linger.ms": 5}))
    body = b"x" * payload
    for i in range(records):
        while True:
            try:
                producer.produce(
                    stream.name,
                    value=body,
                    key=str(i % 64).encode(),
                    partition=i % PARTITIONS,
                    headers=[("i", str(i).encode()), ("source", b"bench")],
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("records were not acknowledged within 60 s")


def _raw(cluster: Cluster, stream: StreamConfig, records: int) -> int:
    ends = log_ends(cluster, stream.name, range(PARTITIONS))
    consumer = Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {"group.id": f"bench-{uuid.uuid4().hex}", "enable.partition.eof": True},
        )
    )
    consumer.assign([TopicPartition(stream.name, p, 0) for p in range(PARTITIONS)])
    count, done, total = 0, set(), 0
    try:
        while len(done) < PARTITIONS:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if (
                        err.code() == KafkaError._PARTITION_EOF
                        and msg.offset() >= ends[msg.partition()]
                    ):
                        done.add(msg.partition())
                    continue
                count += 1
                total += len(msg.value() or b"")
    finally:
        consumer.close()
    if count != records:
        raise RuntimeError(f"raw consumer read {count} records, expected {records}")
    return total


def best_seconds(repeat: int, fn: Callable[[], Any]) -> float:
    """The shortest of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def run(cluster: Cluster, records: int, payload: int, repeat: int) -> dict[str, Any]:
    """Fill a stream, then time the three readers; return seconds and records/s of each."""
    from bolide.spark import archive, kafka_batch, kafka_options, spark_session
    from bolide.spark.kafka import has_connector
    from bolide.stores import SqlStore

    stream = StreamConfig(
        name=f"bench-spark-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS, global_order=False
    )
    fill(cluster, stream, records, payload)
    spark = spark_session("bolide-bench")
    options = kafka_options(stream, cluster, startingOffsets="earliest", includeHeaders=True)

    def source() -> None:
        df = spark.read.format("bolide").options(**options).load()
        row = df.selectExpr(
            "count(*) AS n", "sum(length(value)) AS b", "sum(size(headers)) AS h"
        ).first()
        if row is None or row["n"] != records or row["h"] != 2 * records:
            raise RuntimeError(f"format('bolide') read {row}, expected {records} records")

    def kafka_source() -> None:
        df = kafka_batch(spark, stream, cluster, includeHeaders=True)
        row = df.selectExpr(
            "count(*) AS n", "sum(length(value)) AS b", "sum(size(headers)) AS h"
        ).first()
        if row is None or row["n"] != records or row["h"] != 2 * records:
            raise RuntimeError(f"format('kafka') read {row}, expected {records} records")

    with tempfile.TemporaryDirectory() as tmp:
        runs = iter(range(1_000))

        def archive_job(source: str) -> None:
            n = next(runs)
            url = f"sqlite:///{Path(tmp) / f'history-{n}.db'}"
            with SqlStore(url) as store:
                store.upgrade()
            archive(
                spark,
                stream,
                url,
                str(Path(tmp) / f"ckpt-{n}"),
                bootstrap=cluster,
                max_offsets_per_trigger=10_000,
                source=source,
            )
            with SqlStore(url) as store:
                stored = sum(len(store.read(stream.name, p, 0, records)) for p in range(PARTITIONS))
            if stored != records:
                raise RuntimeError(f"archive stored {stored} records, expected {records}")

        _raw(cluster, stream, records)  # warm the broker's cache alike for everyone
        source()  # warm Spark's Python workers
        seconds = {
            "raw confluent-kafka consumer": best_seconds(
                repeat, lambda: _raw(cluster, stream, records)
            ),
            "format('bolide') batch read": best_seconds(repeat, source),
            BOLIDE_ARCHIVE: best_seconds(repeat, lambda: archive_job("bolide")),
        }
        if has_connector(spark):  # the session adds the jar `bolide fetch spark-kafka` cached
            kafka_source()  # warm its JVM classes
            seconds["format('kafka') batch read"] = best_seconds(repeat, kafka_source)
            seconds[KAFKA_ARCHIVE] = best_seconds(repeat, lambda: archive_job("kafka"))
    return {k: {"seconds": v, "records_per_s": records / v} for k, v in seconds.items()}


def _table(results: dict[str, Any]) -> str:
    raw = results["raw confluent-kafka consumer"]["records_per_s"]
    rows = [
        [
            name,
            f"{r['records_per_s']:,.0f}",
            f"{r['seconds']:.2f}",
            f"{r['records_per_s'] / raw:.2f}x",
            f">= {TARGETS[name]}x" if name in TARGETS else "",
            ""
            if name not in TARGETS
            else ("yes" if r["records_per_s"] / raw >= TARGETS[name] else "NO"),
        ]
        for name, r in results.items()
    ]
    return markdown_table(["reader", "records/s", "seconds", "vs raw", "target", "met"], rows)


def stream_options(parser: argparse.ArgumentParser) -> None:
    """``--records`` and ``--payload``: the stream the Spark benchmarks fill and read."""
    parser.add_argument(
        "--records", type=positive_int, default=100_000, help="records in the stream"
    )
    parser.add_argument(
        "--payload", type=positive_int, default=100, help="payload bytes per record"
    )


def _options(parser: argparse.ArgumentParser) -> None:
    stream_options(parser)
    parser.add_argument(
        "--repeat", type=positive_int, default=2, help="runs per reader (best kept)"
    )


def needs_pyspark(_: argparse.Namespace) -> None:
    """``Skipped`` naming the extra to install when PySpark is missing."""
    try:
        import pyspark  # noqa: F401 - only checks the extra is installed
    except ImportError:
        raise Skipped("needs PySpark: pip install 'bolide[spark]'") from None


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Every reader against the raw consumer; the archive jobs with their targets."""
    context.say(NAME, f"{args.records:,} records, best of {args.repeat}")
    started = time.monotonic()
    results = run(context.cluster, args.records, args.payload, args.repeat)
    raw = results.pop("raw confluent-kafka consumer")
    results = {"raw confluent-kafka consumer": raw, **results}
    ratios = [
        Ratio(
            NAME,
            name,
            "raw confluent-kafka consumer",
            "records/s",
            raw["records_per_s"],
            r["records_per_s"],
            TARGETS.get(name),
        )
        for name, r in results.items()
        if name != "raw confluent-kafka consumer"
    ]
    title = (
        f"spark ({args.records:,} records of {args.payload} B over {PARTITIONS} partitions, "
        f"local[2]; {context.broker}, {time.monotonic() - started:.0f} s)"
    )
    return Report(title, _table(results), ratios, {"results": results})


#: ``--quick``: 2,000 records, one run per reader.
QUICK = ["--records", "2000", "--repeat", "1"]
COMMAND = Command(NAME, _measure, _options, QUICK, __doc__, check=needs_pyspark)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
