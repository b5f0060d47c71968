"""The drop-in for confluent-kafka's consumer (``bolide.confluent.Consumer``) against
confluent-kafka's own, in one run on one topic.

One partition of ``records`` records of 100 B, archived into a SQLite store; every consumer
reads it from ``auto.offset.reset=earliest`` with ``poll`` in a fresh group, timed from its first
message to its last (the group join, a broker matter, is left out):

- Kafka: confluent-kafka's ``Consumer`` reading the whole topic from Kafka (the reference);
- drop-in from Kafka: ``bolide.confluent.Consumer`` with ``bolide.history``, the topic not
  trimmed, so every record comes from Kafka (target >= 0.95x);
- drop-in from the archive: the same, the topic trimmed to its last record first
  (DeleteRecords), timed over the records that come from the archive (target >= 0.5x).

Run from the repository root: ``python -m benchmarks.bench_confluent [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tempfile
import time
import uuid
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks._common import Context, Ratio, Report, markdown_table, standalone, wait_until
from bolide.confluent import Consumer
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import admin_client
from bolide.stores import Archiver, SqlStore

NAME = "confluent"
_TIMEOUT_S = 300.0


def _settings(cluster: Cluster, history: str | None) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **cluster.settings,
    }
    if history is not None:
        settings["bolide.history"] = history
    return settings


def read_all(consumer: Any, topic: str, count: int) -> float:
    """Messages per second of ``consumer`` reading the first ``count`` messages of ``topic``,
    from its first message to its last."""
    consumer.subscribe([topic])
    seen, first = 0, 0.0
    deadline = time.monotonic() + _TIMEOUT_S
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{NAME}: {seen} of {count} read")
            msg = consumer.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            if seen == 0:
                first = time.perf_counter()
            seen += 1
        return (count - 1) / max(time.perf_counter() - first, 1e-9)
    finally:
        consumer.close()


def _trim(cluster: Cluster, topic: str, before: int) -> None:
    admin = admin_client(cluster)  # held: its futures never resolve once it is collected
    for future in admin.delete_records([TopicPartition(topic, 0, before)]).values():
        future.result(timeout=_TIMEOUT_S)


def bench(context: Context) -> Report:
    """``run_all``'s entry: the three reads, alternating, best of ``repeat`` each."""
    count = 2_000 if context.quick else 100_000
    repeat = 1 if context.quick else 3
    cluster = context.cluster
    stream = StreamConfig(name=f"bench-confluent-{time.time_ns()}", partitions=1)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish_async(Record(b"%099d" % i, key=b"k"))
        pub.flush(_TIMEOUT_S)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'history.db'}"
        with SqlStore(url) as store:
            store.upgrade()
            context.say(NAME, f"archiving {count} records")
            Archiver(cluster, store, [stream], group=f"bench-arch-{stream.name}").run()
        best = {"kafka": 0.0, "drop-in, Kafka": 0.0}
        for _ in range(repeat):
            context.say(NAME, "reading from Kafka: confluent-kafka, then the drop-in")
            best["kafka"] = max(
                best["kafka"],
                read_all(confluent_kafka.Consumer(_settings(cluster, None)), stream.name, count),
            )
            best["drop-in, Kafka"] = max(
                best["drop-in, Kafka"],
                read_all(Consumer(_settings(cluster, url)), stream.name, count),
            )
        _trim(cluster, stream.name, count - 1)
        wait_until(lambda: _low(cluster, stream.name) == count - 1, f"{NAME}: trimmed", 60)
        archive = 0.0
        for _ in range(repeat):
            context.say(NAME, "reading from the archive: the drop-in")
            # The archived records alone: the last one, in Kafka, comes after the resumed
            # partition's first fetch (a latency once per partition, not a rate).
            drop_in = Consumer(_settings(cluster, url))
            archive = max(archive, read_all(drop_in, stream.name, count - 1))
    ratios = [
        Ratio(NAME, "drop-in reading from Kafka", "confluent-kafka Consumer", "msg/s",
              best["kafka"], best["drop-in, Kafka"], 0.95),
        Ratio(NAME, "drop-in reading from the archive (SQLite)", "confluent-kafka Consumer",
              "msg/s", best["kafka"], archive, 0.5),
    ]  # fmt: skip
    rows = [[r.metric, f"{r.bolide_value:,.0f}", f"{r.reference_value:,.0f}", f"{r.ratio:.2f}x",
             f">= {r.target}x"] for r in ratios]  # fmt: skip
    table = markdown_table(["read", "msg/s", "confluent-kafka msg/s", "ratio", "target"], rows)
    title = (
        f"{NAME}: {count:,} records of 100 B, one partition, poll(); best of {repeat}; "
        f"{context.broker}"
    )
    return Report(title, table, ratios, {"records": count, "repeat": repeat})


def _low(cluster: Cluster, topic: str) -> int:
    settings = {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "bench-probe"}
    probe = confluent_kafka.Consumer({**settings, **cluster.settings})
    try:
        return int(probe.get_watermark_offsets(TopicPartition(topic, 0), 30)[0])
    finally:
        probe.close()


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
