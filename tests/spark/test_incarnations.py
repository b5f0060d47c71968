"""Spark across a topic deleted and created again: the archive job archives the new topic
apart from the old one, ``load_archive`` (JDBC and store pages) loads the current topic's
history only, and ``format("bolide")`` never splices the old topic's history into the new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bolide.facade import Cluster, Record
from bolide.spark import archive, cluster_source_options, kafka_options, load_archive, register
from bolide.spark._archive import has_jdbc_driver, jdbc_options
from bolide.stores import SqlStore
from tests.history.test_incarnations import recreate

from .conftest import publish

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _values(prefix: bytes, count: int) -> list[Record]:
    return [Record(b"%s %d" % (prefix, i), key=b"k") for i in range(count)]


def test_the_archive_job_and_the_source_keep_a_recreated_topic_apart(
    spark: Any,
    bolide_backend: tuple[str, Cluster],
    cluster_with_starts: Any,
    stream_factory: Any,
    store_url: str,
    tmp_path: Path,
) -> None:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine reports no topic ids")
    cluster = bolide_backend[1]
    stream = stream_factory(partitions=1)
    publish(cluster, stream, _values(b"old", 8))
    archive(spark, stream, store_url, str(tmp_path / "old"), bootstrap=cluster)
    new_id = recreate(cluster, stream.name)
    publish(cluster, stream, _values(b"new", 4))
    # A new checkpoint: the old one's offsets are of the deleted topic.
    archive(spark, stream, store_url, str(tmp_path / "new"), bootstrap=cluster)
    with SqlStore(store_url) as store:
        assert [i.topic_id for i in store.incarnations(stream.name) if i.current] == [new_id]
        assert [r.data for r in store.read(stream.name, 0, 0, 100)] == [
            b"new %d" % i for i in range(4)
        ]
        old = store.read(stream.name, 0, 0, 100, stored_as=stream.name)
        assert [r.data for r in old] == [b"old %d" % i for i in range(8)]
    ways = ["store"]
    if has_jdbc_driver(spark, jdbc_options(store_url)["driver"]):
        ways.append("jdbc")
    for via in ways:
        rows = load_archive(spark, store_url, [stream.name], via=via).orderBy("offset").collect()
        assert [(r["topic"], r["value"]) for r in rows] == [
            (stream.name, b"new %d" % i) for i in range(4)
        ], via
    # Kafka holds 2.. of the new topic: 0 and 1 come from its history, none of the old one's.
    trimmed = cluster_with_starts({stream.name: {0: 2}})
    register(spark)
    options = kafka_options(stream, trimmed, startingOffsets="earliest")
    options.update(cluster_source_options(trimmed))
    options["bolide.store"] = store_url
    df = spark.read.format("bolide").options(**options).load()
    assert [r["value"] for r in df.orderBy("offset").collect()] == [b"new %d" % i for i in range(4)]
