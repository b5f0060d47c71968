"""Spark's own Kafka source and sink (``format("kafka")``, the connector jar) on bolide's streams:
what Spark reads is exactly what bolide wrote, a checkpointed query restarts without loss or
duplicates, a group's confirms become the starting offsets, and bolide reads what Spark writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Record,
    Subscriber,
    SubscriberConfig,
)
from bolide.spark import kafka_batch, kafka_stream
from tests.conftest import eventually

from .conftest import publish, sample

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _headers(row_headers: Any) -> list[tuple[str, bytes]]:
    return [(h["key"], bytes(h["value"])) for h in row_headers or []]


def test_a_batch_read_returns_exactly_what_bolide_published(
    spark: Any, cluster: Cluster, stream_factory
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    records = sample(12)
    publish(cluster, stream, records)
    rows = kafka_batch(spark, stream, cluster, includeHeaders=True).collect()
    got = {(r["partition"], r["offset"]): r for r in rows}
    assert len(rows) == len(records) == len(got)
    for record in records:
        row = got[(record.partition, record.offset)]
        assert row["topic"] == stream.name
        assert bytes(row["key"]) == _bytes(record.key)
        assert bytes(row["value"]) == record.data
        assert _headers(row["headers"]) == list(record.headers)
        assert int(row["timestamp"].timestamp() * 1000) == record.timestamp_ms
        assert row["timestampType"] == 0  # CreateTime


def test_a_checkpointed_query_restarted_mid_stream_loses_and_repeats_nothing(
    spark: Any, cluster: Cluster, stream_factory, tmp_path: Path
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    seen: list[bytes] = []

    def run() -> None:
        query = (
            kafka_stream(spark, stream, cluster, startingOffsets="earliest")
            .writeStream.foreachBatch(
                lambda df, _: seen.extend(bytes(r["value"]) for r in df.collect())
            )
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    publish(cluster, stream, [Record(b"a%d" % i) for i in range(10)])
    run()
    assert sorted(seen) == sorted(b"a%d" % i for i in range(10))
    publish(cluster, stream, [Record(b"b%d" % i) for i in range(7)])
    run()  # the same checkpoint: only what came after the first run
    expected = [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(7)]
    assert sorted(seen) == sorted(expected)


def test_starting_offsets_come_from_a_subscriber_groups_confirms(
    spark: Any, cluster: Cluster, stream_factory
) -> None:
    stream = stream_factory()
    offsets = publish(cluster, stream, [Record(b"r%d" % i) for i in range(10)])
    group = f"g-{stream.name}"
    config = SubscriberConfig(
        stream=stream,
        group=group,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=6_000,
        max_batch=4,
    )
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= 4, 30)
        sub.confirm(got[3].offset)
        eventually(lambda: sub.committed() == {0: offsets[3][1] + 1})
    rows = kafka_batch(spark, stream, cluster, group=group).collect()
    assert [bytes(r["value"]) for r in sorted(rows, key=lambda r: r["offset"])] == [
        b"r%d" % i for i in range(4, 10)
    ]


def test_what_spark_writes_to_kafka_a_bolide_subscriber_reads(
    spark: Any, cluster: Cluster, stream_factory
) -> None:
    stream = stream_factory()
    frame = spark.createDataFrame(
        [
            (b"k1", b"v1", [("h", b"x")]),
            (b"k2", b"v2", [("h", b"y"), ("h", b"z")]),
            (None, b"v3", []),
        ],
        "key binary, value binary, headers array<struct<key: string, value: binary>>",
    )
    # One partition: Spark writes the rows of one task in order.
    (
        frame.coalesce(1)
        .write.format("kafka")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("topic", stream.name)
        .save()
    )
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= 3, 30)
    assert [r.data for r in got] == [b"v1", b"v2", b"v3"]
    assert [r.key for r in got] == [b"k1", b"k2", None]
    assert [list(r.headers) for r in got] == [[("h", b"x")], [("h", b"y"), ("h", b"z")], []]


_NO_CONNECTOR = """
import sys
from bolide.facade import Cluster, StreamConfig
from bolide.spark import ConnectorNotFoundError, kafka_batch, spark_session

spark = spark_session("no-connector", kafka_connector=False, register_source=False)
try:
    kafka_batch(spark, StreamConfig(name="orders"), Cluster("127.0.0.1:1"))
except ConnectorNotFoundError as exc:
    print(exc.coordinates)
    print(exc)
    sys.exit(0)
finally:
    spark.stop()
sys.exit(3)
"""


@pytest.mark.slow
def test_without_the_connector_the_error_names_its_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_CONNECTOR], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    coords, _, message = done.stdout.partition("\n")
    import pyspark

    assert coords == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    assert "spark.jars.packages" in message and "--packages" in message
