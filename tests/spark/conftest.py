"""Spark fixtures: ONE SparkSession at a time (local, or on a standalone cluster started once
per run), and history stores.

A simulated log start reaches Spark's Python workers as a source option: the jobs (and the
tests' readers) pass ``cluster_source_options(cluster)`` of a ``cluster_with_starts`` cluster.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.testing.spark_cluster import DRIVER_SETTINGS, StandaloneCluster
from tests.conftest import DATABASES, upgraded_db_url

#: The cluster session's settings: small executors, no UI, and a driver that refuses results
#: over 1 MiB, so a job that collects its rows to the driver fails there.
CLUSTER_SETTINGS = {
    **DRIVER_SETTINGS,
    "spark.driver.maxResultSize": "1m",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


class Sessions:
    """The process's one SparkSession: the local one or the cluster's, created on demand.

    Spark allows one SparkContext per process, so asking for the other kind stops the live one.
    """

    def __init__(self, local_config: dict[str, str]) -> None:
        self.local_config = local_config
        self.live: Any = None
        self.master: str | None = None

    def get(self, master: str, config: dict[str, str] | None = None) -> Any:
        """The live session when it runs on ``master``, else a new one there."""
        from bolide.spark import spark_session

        if self.live is not None and self.master == master:
            return self.live
        self.stop()
        # Executors start their Python workers with the driver's PYSPARK_PYTHON: this one.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        settings = {**self.local_config, **(config or {})}
        self.live = spark_session("bolide-tests", master, config=settings)
        self.master = master
        return self.live

    def stop(self) -> None:
        """Stop the live session, if any."""
        if self.live is not None:
            self.live.stop()
            self.live = None
            self.master = None


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    """The process's one SparkSession, local or on the standalone cluster."""
    sessions = Sessions(
        {
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
            "spark.sql.session.timeZone": "UTC",
        }
    )
    yield sessions
    sessions.stop()


@pytest.fixture
def spark(spark_sessions: Sessions) -> Any:
    """The local SparkSession of the test run (``local[2]``, UI off, 2 shuffle partitions)."""
    return spark_sessions.get("local[2]")


@pytest.fixture(scope="session")
def spark_cluster(
    tmp_path_factory: pytest.TempPathFactory, spark_sessions: Sessions
) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and two workers (1 core, 1 GiB each), once per test run."""
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        standalone.start(workers=2)
        yield standalone
    finally:
        if spark_sessions.master == standalone.master_url:
            spark_sessions.stop()
        standalone.stop()


@pytest.fixture
def cluster_spark(spark_sessions: Sessions, spark_cluster: StandaloneCluster) -> Any:
    """A SparkSession on the standalone cluster: executors in the workers' JVMs, a driver
    refusing results over 1 MiB (``CLUSTER_SETTINGS``)."""
    return spark_sessions.get(spark_cluster.master_url, CLUSTER_SETTINGS)


@pytest.fixture(params=DATABASES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an upgraded history store: a SQLite file, or a fresh PostgreSQL schema."""
    return upgraded_db_url(request.param, tmp_path, request)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an upgraded SQLite history store."""
    return upgraded_db_url("sqlite", tmp_path, request)


def publish(cluster: Cluster, stream: StreamConfig, records: list[Record]) -> list[tuple[int, int]]:
    """Publish ``records`` in order; return their (partition, offset) pairs."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(r) for r in records]
        pub.flush(30)
        for f in futures:
            f.result(30)
    return [(int(r.partition or 0), int(r.offset or 0)) for r in records]


def drain(cluster: Cluster, stream: StreamConfig, want: int, timeout_s: float) -> list[Any]:
    """Read ``want`` messages of ``stream`` from the start, in each partition's order."""
    topic = stream.name
    consumer = Consumer(
        cluster.client_config({"group.id": f"t-{topic}", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(stream.partitions or 1)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
    finally:
        consumer.close()
    return got


def sample(n: int, *, prefix: str = "v") -> list[Record]:
    """``n`` records with keys (3 distinct) and repeated-name headers on some."""
    out = []
    for i in range(n):
        headers: list[tuple[str, bytes]] = [("i", str(i).encode())]
        if i % 4 == 0:
            headers += [("dup", b"a"), ("dup", b"b")]
        if i % 5 == 0:
            headers = []
        out.append(Record(f"{prefix}{i}".encode(), key=f"k{i % 3}", headers=headers))
    return out
