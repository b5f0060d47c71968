"""bolide's producer defaults: what ``linger.ms`` trades between throughput and latency.

librdkafka waits up to ``linger.ms`` for more records before it sends a batch: a longer wait
fills bigger batches (more records/s when many are in flight) and delays every record that is
alone (latency). For each ``linger.ms`` of ``LINGERS``, with bolide's other producer defaults
(idempotent, ``acks=all``; librdkafka's ``batch.size`` and ``batch.num.messages``), one run
measures side by side:

- throughput: ``--count`` records of 100 B through ``Publisher.publish_async`` until every
  future resolved, and through raw confluent-kafka ``produce`` with a delivery callback (the
  ratio bolide/raw), best of ``--repeat``;
- latency: one record in flight, from the publish call to its acknowledgement (bolide's future
  resolved; raw's delivery callback served), p50 and p99 of ``--samples``, settings alternating.

Run from the repository root: ``python -m benchmarks.bench_producer [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    markdown_table,
    percentile,
    positive_int,
)
from benchmarks.bench_facade import bolide_publish, fresh_topic, raw_producer, raw_publish
from bolide.facade import Cluster, Publisher, PublisherConfig, Record
from bolide.facade.kafka import PRODUCER_DEFAULTS

__all__ = ["LINGERS", "bench", "main", "run"]

NAME = "producer"
SIZE = 100
#: The ``linger.ms`` values compared (bolide's default among them).
LINGERS = (0, 1, 5, 20)
_TIMEOUT_S = 30.0


def _bolide_acks(cluster: Cluster, linger: int, samples: int) -> list[float]:
    """ms from ``publish_async`` to its future resolved, one record in flight."""
    config = PublisherConfig(
        stream=fresh_topic(cluster, "producer-lat"), producer_config={"linger.ms": linger}
    )
    payload = bytes(SIZE)
    with Publisher(cluster, config) as pub:
        pub.publish(Record(payload))  # connection and producer id
        out = []
        for _ in range(samples):
            start = time.perf_counter()
            pub.publish_async(Record(payload)).result(_TIMEOUT_S)
            out.append((time.perf_counter() - start) * 1000)
        return out


def _raw_acks(cluster: Cluster, linger: int, samples: int) -> list[float]:
    """ms from ``produce`` to its delivery callback served, one record in flight."""
    topic, payload = fresh_topic(cluster, "producer-lat-raw").name, bytes(SIZE)
    producer = raw_producer(cluster, {"linger.ms": linger})
    producer.produce(topic, payload, partition=0)
    producer.flush(_TIMEOUT_S)
    acked: list[bool] = []
    out = []
    for _ in range(samples):
        acked.clear()
        start = time.perf_counter()
        producer.produce(topic, payload, partition=0, on_delivery=lambda e, m: acked.append(True))
        deadline = time.monotonic() + _TIMEOUT_S
        while not acked:
            producer.poll(1.0)
            if time.monotonic() > deadline:
                raise TimeoutError("raw: no delivery report")
        out.append((time.perf_counter() - start) * 1000)
    producer.flush(_TIMEOUT_S)
    return out


def run(
    cluster: Cluster, count: int, repeat: int, samples: int, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """One row per ``linger.ms``: records/s of bolide and raw, and their ack latencies."""
    rows = []
    payload = bytes(SIZE)
    for linger in LINGERS:
        say(f"linger.ms={linger}")
        settings = {"linger.ms": linger}
        bolide_rate = raw_rate = 0.0
        for _ in range(repeat):
            raw_topic = fresh_topic(cluster, "producer-raw").name
            raw_rate = max(raw_rate, raw_publish(cluster, raw_topic, payload, count, settings))
            stream = fresh_topic(cluster, "producer-bolide")
            bolide_rate = max(
                bolide_rate, bolide_publish(cluster, stream, payload, count, settings)
            )
        bolide_ms, raw_ms = [], []
        for _ in range(2):  # alternate halves so neither side always runs first
            raw_ms += _raw_acks(cluster, linger, samples // 2)
            bolide_ms += _bolide_acks(cluster, linger, samples // 2)
        rows.append({
            "linger_ms": linger,
            "default": linger == PRODUCER_DEFAULTS["linger.ms"],
            "bolide_rate": bolide_rate,
            "raw_rate": raw_rate,
            "bolide_p50_ms": percentile(bolide_ms, 50),
            "bolide_p99_ms": percentile(bolide_ms, 99),
            "raw_p50_ms": percentile(raw_ms, 50),
            "raw_p99_ms": percentile(raw_ms, 99),
        })  # fmt: skip
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Throughput beside latency, a row per ``linger.ms``."""
    headers = ["linger.ms", "bolide records/s", "raw records/s", "bolide/raw"]
    headers += ["bolide ack p50 ms", "bolide ack p99 ms", "raw ack p50 ms", "raw ack p99 ms"]
    body = [
        [
            f"{r['linger_ms']}{' (default)' if r['default'] else ''}",
            f"{r['bolide_rate']:,.0f}",
            f"{r['raw_rate']:,.0f}",
            f"{r['bolide_rate'] / r['raw_rate']:.2f}x" if r["raw_rate"] else "",
            f"{r['bolide_p50_ms']:.2f}",
            f"{r['bolide_p99_ms']:.2f}",
            f"{r['raw_p50_ms']:.2f}",
            f"{r['raw_p99_ms']:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(headers, body)


def _ratios(rows: Sequence[dict[str, Any]]) -> list[Ratio]:
    return [
        Ratio(
            NAME,
            f"publish_async {SIZE} B, linger.ms={r['linger_ms']}",
            "confluent-kafka",
            "records/s",
            r["raw_rate"],
            r["bolide_rate"],
        )
        for r in rows
    ]


def _shape(quick: bool) -> tuple[int, int, int]:
    """(count, repeat, latency samples)."""
    return (500, 1, 10) if quick else (50_000, 2, 200)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=positive_int, default=None, help="records per run")
    parser.add_argument("--samples", type=positive_int, default=None, help="latency samples")


def _measure(context: Context, args: argparse.Namespace) -> Report:
    count, repeat, samples = _shape(args.quick)
    count, samples = args.count or count, args.samples or samples
    rows = run(context.cluster, count, repeat, samples, lambda m: context.say(NAME, m))
    title = (
        f"{NAME}: linger.ms against throughput ({count:,} records of {SIZE} B, best of "
        f"{repeat}) and ack latency (one in flight, {samples} samples); {context.broker}"
    )
    return Report(title, table(rows), _ratios(rows), {"rows": rows})


COMMAND = Command(NAME, _measure, _options, doc=__doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
