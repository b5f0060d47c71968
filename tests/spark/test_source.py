"""format("bolide"): the Kafka source's schema, exactly what a subscriber reads, checkpoints,
and the splice of SQL history below Kafka's log start."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.spark import KAFKA_SCHEMA, cluster_source_options, kafka_options, register
from bolide.spark._options import SourceOptions
from bolide.spark._reader import cap_offsets
from bolide.stores import SqlStore
from tests.conftest import eventually
from tests.pubsub.test_sparse_offsets import publish_transactions

from .conftest import publish, sample

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

COLUMNS = ["partition", "offset", "key", "value", "headers"]


def _reader(spark: Any, cluster: Cluster, stream: StreamConfig, stream_mode: bool, **opts: Any):
    register(spark)
    options = kafka_options(stream, cluster, includeHeaders=True, **opts)
    reader = spark.readStream if stream_mode else spark.read
    return reader.format("bolide").options(**options)


def _subscriber_read(cluster: Cluster, stream: StreamConfig, n: int) -> list[Record]:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:

        def more() -> bool:
            got.extend(sub.poll(100))
            return len(got) >= n

        eventually(more, 20)
    return got


def _as_tuple(row: Any) -> tuple[Any, ...]:
    headers = [(h["key"], bytes(h["value"])) for h in row["headers"] or []]
    return (row["partition"], row["offset"], row["key"], row["value"], headers)


# -- options alone --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers is required"),
        ({"kafka.bootstrap.servers": "b:1"}, "subscribe is required"),
        ({"kafka.bootstrap.servers": "b:1", "subscribe": "t", "startingOffsets": "soon"}, "JSON"),
        ({"kafka.bootstrap.servers": "b:1", "subscribe": "t", "assign": "{}"}, "not supported"),
        (
            {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "startingOffsets": '{"u":{}}'},
            "not subscribed",
        ),
        ({"kafka.bootstrap.servers": "b:1", "subscribe": "t", "failOnDataLoss": "y"}, "true"),
        ({"kafka.bootstrap.servers": "b:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "pos"),
        (
            {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "bolide.fetchGapSettleMs": "x"},
            "fetchgapsettlems",
        ),
        (
            {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "bolide.logStartOverrides": "5"},
            "logstartoverrides must be JSON",
        ),
        (
            {
                "kafka.bootstrap.servers": "b:1",
                "subscribe": "t",
                "bolide.logStartOverrides": '{"t": {"0": -1}}',
            },
            "negative",
        ),
        (
            {
                "kafka.bootstrap.servers": "b:1",
                "subscribe": "t",
                "bolide.logStartOverrides": '{"t": {"x": 1}}',
            },
            "not an offset",
        ),
        (
            {
                "kafka.bootstrap.servers": "b:1",
                "subscribe": "t",
                "bolide.logStartOverrides": '{"no/topic": {"0": 1}}',
            },
            "not a topic name",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(options, batch=False)


def test_options_mirror_the_kafka_source_names() -> None:
    parsed = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "b:1",
            "kafka.security.protocol": "SSL",
            "SUBSCRIBE": "a, b",
            "startingoffsets": '{"a": {"0": 5}}',
            "maxOffsetsPerTrigger": "100",
            "includeHeaders": "true",
            "failOnDataLoss": "false",
            "bolide.store": "sqlite:///x.db",
            "bolide.fetchGapSettleMs": "250",
        },
        batch=False,
    )
    assert parsed.topics == ["a", "b"]
    assert parsed.cluster().fetch_gap_settle_ms == 250
    assert parsed.kafka == {"bootstrap.servers": "b:1", "security.protocol": "SSL"}
    assert parsed.cluster().settings == {"security.protocol": "SSL"}
    assert (parsed.max_offsets_per_trigger, parsed.include_headers) == (100, True)
    assert (parsed.fail_on_data_loss, parsed.store_url) == (False, "sqlite:///x.db")
    with pytest.raises(ValueError, match="not valid for a batch read"):
        SourceOptions.parse(
            {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "startingOffsets": "latest"},
            batch=True,
        )


def test_the_consumers_group_is_named_as_in_the_kafka_source() -> None:
    """``groupIdPrefix`` names each consumer's throwaway group, ``kafka.group.id`` one group
    for all: what an admin grants ``DESCRIBE`` on (a consumer looks its coordinator up)."""
    base = {"kafka.bootstrap.servers": "b:1", "subscribe": "t"}
    default = SourceOptions.parse(base, batch=True)
    assert default.consumer_group().startswith("bolide-spark-")
    assert default.consumer_group() != default.consumer_group()
    prefixed = SourceOptions.parse({**base, "groupIdPrefix": "billing"}, batch=True)
    assert prefixed.consumer_group().startswith("billing-")
    assert "prefixed 'billing-'" in prefixed.group_acl()
    named = SourceOptions.parse({**base, "kafka.group.id": "Billing-Spark"}, batch=True)
    assert named.consumer_group() == "Billing-Spark"
    assert "group.id" not in named.kafka and "group.id" not in named.cluster().settings
    assert "group 'Billing-Spark'" in named.group_acl()
    for empty in ({"groupIdPrefix": " "}, {"kafka.group.id": ""}):
        with pytest.raises(ValueError, match="must not be empty"):
            SourceOptions.parse({**base, **empty}, batch=True)


def test_the_cluster_reaches_the_workers_through_options() -> None:
    """``Cluster`` -> ``kafka_options`` + ``cluster_source_options`` -> the same ``Cluster``."""
    cluster = Cluster(
        "b:1",
        fetch_gap_settle_ms=250,
        log_start_overrides={"t": {0: 10, 2: 7}},
        **{"security.protocol": "SSL", "sasl.password": "hunter2"},
    )
    options = {**kafka_options(StreamConfig(name="t"), cluster), **cluster_source_options(cluster)}
    assert options["bolide.logStartOverrides"] == '{"t":{"0":10,"2":7}}'
    parsed = SourceOptions.parse(options, batch=False)
    assert parsed.log_start_overrides == {"t": {0: 10, 2: 7}}
    assert parsed.cluster() == cluster
    assert "log_start_overrides={'t': {0: 10, 2: 7}}" in repr(parsed)
    assert "hunter2" not in repr(parsed)
    assert cluster_source_options(Cluster("b:1")) == {}


def test_rate_limit_is_shared_by_lag() -> None:
    start = {"t": {"0": 0, "1": 100}}
    end = {"t": {"0": 300, "1": 200}}
    assert cap_offsets(start, end, None) == end
    assert cap_offsets(start, end, 1000) == end
    assert cap_offsets(start, end, 40) == {"t": {"0": 30, "1": 110}}


# -- reads ----------------------------------------------------------------------------------


def test_schema_is_the_kafka_sources(spark: Any, cluster: Cluster, stream_factory) -> None:
    stream = stream_factory()
    publish(cluster, stream, sample(1))
    register(spark)
    plain = (
        spark.read.format("bolide")
        .options(**kafka_options(stream, cluster, startingOffsets="earliest"))
        .load()
    )
    # Without includeHeaders there is no headers column, as with the Kafka source.
    assert plain.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert plain.schema == spark.createDataFrame([], KAFKA_SCHEMA).schema
    with_headers = _reader(spark, cluster, stream, False, startingOffsets="earliest").load()
    assert with_headers.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )


def test_batch_read_equals_a_subscriber(spark: Any, cluster: Cluster, stream_factory) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    records = sample(40)
    for i, r in enumerate(records):  # spread over both partitions by key
        r.key = f"key-{i % 7}".encode()
    publish(cluster, stream, records)
    expected = _subscriber_read(cluster, stream, 40)
    df = _reader(spark, cluster, stream, False, startingOffsets="earliest").load()
    rows = df.collect()
    got = sorted(_as_tuple(r) for r in rows)
    want = sorted((r.partition, r.offset, r.key, r.data, r.headers) for r in expected)
    assert got == want
    assert {r.partition for r in expected} == {0, 1}
    by_pos = {(r.partition, r.offset): r for r in expected}
    for row in rows:
        record = by_pos[(row["partition"], row["offset"])]
        assert row["topic"] == stream.name
        assert int(row["timestamp"].timestamp() * 1000) == record.timestamp_ms
        assert row["timestampType"] == 0  # CreateTime, as the Java client numbers it


def test_batch_read_of_a_transactional_topic(spark: Any, cluster: Cluster, stream_factory) -> None:
    stream = stream_factory()
    publish_transactions(cluster, stream, count=3, size=2)  # markers at 2, 5 and 8
    window = {"bolide.fetchGapSettleMs": str(cluster.fetch_gap_settle_ms or 1)}
    df = _reader(spark, cluster, stream, False, startingOffsets="earliest", **window).load()
    rows = [(r["offset"], bytes(r["value"])) for r in df.orderBy("offset").collect()]
    assert rows == [(0, b"0-0"), (1, b"0-1"), (3, b"1-0"), (4, b"1-1"), (6, b"2-0"), (7, b"2-1")]


def test_batch_ranges_by_json_offsets(spark: Any, cluster: Cluster, stream_factory) -> None:
    stream = stream_factory()
    publish(cluster, stream, sample(20))
    df = _reader(
        spark,
        cluster,
        stream,
        False,
        startingOffsets=json.dumps({stream.name: {"0": 5}}),
        endingOffsets=json.dumps({stream.name: {"0": 12}}),
    ).load()
    assert [r["offset"] for r in df.orderBy("offset").collect()] == list(range(5, 12))


def test_stream_restart_from_checkpoint_loses_and_repeats_nothing(
    spark: Any, cluster: Cluster, stream_factory, tmp_path: Path
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    first = sample(30)
    for i, r in enumerate(first):
        r.key = f"key-{i % 5}".encode()
    publish(cluster, stream, first)
    batches: dict[int, list[tuple[int, int]]] = {}
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        rows = [(r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()]
        with lock:  # a replayed batch id carries the same rows: keep the last copy
            batches[batch_id] = rows

    def start(trigger: dict[str, Any]) -> Any:
        df = _reader(
            spark, cluster, stream, True, startingOffsets="earliest", maxOffsetsPerTrigger=7
        ).load()
        return (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "100 milliseconds"})
    eventually(lambda: len(batches) >= 2, 60)
    query.stop()
    seen_before_restart = sum(len(v) for v in batches.values())
    assert seen_before_restart > 0
    second = sample(15, prefix="late")
    for i, r in enumerate(second):
        r.key = f"key-{i % 5}".encode()
    positions = publish(cluster, stream, second)
    query = start({"availableNow": True})
    query.awaitTermination(120)
    assert query.exception() is None
    delivered = [pos for rows in batches.values() for pos in rows]
    assert len(delivered) == len(set(delivered)) == 45
    expected = {(r.partition, r.offset) for r in first} | set(positions)
    assert set(delivered) == expected
    assert all(len(rows) <= 7 for rows in batches.values())


# -- the splice ----------------------------------------------------------------------------
#
# The embedded broker never trims its log (retention is not applied, DeleteRecords drops the
# connection), so a trimmed log is simulated by a cluster whose ``log_start_overrides`` raise
# the log start; it reaches the source's Python workers as ``bolide.logStartOverrides``. The
# archived copies carry a different payload than Kafka's so each row shows which side it
# came from; real archives hold identical copies.


def _archive_copies(url: str, stream: StreamConfig, published: list[Record], upto: int) -> None:
    copies = []
    for r in published[:upto]:
        copy = Record(b"sql:" + r.data, key=r.key, headers=r.headers)
        copy.partition, copy.offset, copy.timestamp_ms = r.partition, r.offset, r.timestamp_ms
        copies.append(copy)
    with SqlStore(url) as store:
        store.store_all(stream.name, copies)


def test_spliced_batch_read_across_the_seam(
    spark: Any, cluster: Cluster, stream_factory, sqlite_url: str, cluster_with_starts
) -> None:
    stream = stream_factory()
    records = sample(30)
    publish(cluster, stream, records)
    _archive_copies(sqlite_url, stream, records, 12)
    trimmed = cluster_with_starts({stream.name: {0: 10}})  # Kafka "holds" 10.., the store 0..11
    seam = cluster_source_options(trimmed)
    df = _reader(
        spark,
        trimmed,
        stream,
        False,
        startingOffsets="earliest",
        **seam,
        **{"bolide.store": sqlite_url},
    ).load()
    rows = df.orderBy("offset").collect()
    assert [r["offset"] for r in rows] == list(range(30))  # no gap, no duplicate
    assert [r["value"] for r in rows[:10]] == [b"sql:" + r.data for r in records[:10]]
    assert [r["value"] for r in rows[10:]] == [r.data for r in records[10:]]
    assert [_as_tuple(r)[4] for r in rows] == [r.headers for r in records]
    assert [r["key"] for r in rows] == [r.key for r in records]

    without_store = _reader(
        spark, trimmed, stream, False, startingOffsets=json.dumps({stream.name: {"0": 0}}), **seam
    )
    with pytest.raises(Exception, match="failOnDataLoss"):
        without_store.load().collect()
    skipped = without_store.option("failOnDataLoss", "false").load()
    assert [r["offset"] for r in skipped.orderBy("offset").collect()] == list(range(10, 30))


def test_spliced_stream_across_the_seam(
    spark: Any,
    cluster: Cluster,
    stream_factory,
    sqlite_url: str,
    cluster_with_starts,
    tmp_path: Path,
) -> None:
    stream = stream_factory()
    records = sample(25)
    publish(cluster, stream, records)
    _archive_copies(sqlite_url, stream, records, 8)
    trimmed = cluster_with_starts({stream.name: {0: 8}})
    got: list[tuple[int, bytes]] = []
    df = _reader(
        spark,
        trimmed,
        stream,
        True,
        startingOffsets="earliest",
        maxOffsetsPerTrigger=5,
        **cluster_source_options(trimmed),
        **{"bolide.store": sqlite_url},
    ).load()
    query = (
        df.writeStream.foreachBatch(
            lambda d, _: got.extend((r["offset"], r["value"]) for r in d.collect())
        )
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(got) == [(i, (b"sql:" if i < 8 else b"") + r.data) for i, r in enumerate(records)]
