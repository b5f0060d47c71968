"""Spark fixtures: ONE local SparkSession for every Spark test, and history stores.

A simulated log start reaches Spark's Python workers as a source option: the jobs (and the
tests' readers) pass ``cluster_source_options(cluster)`` of a ``cluster_with_starts`` cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from tests.conftest import DATABASES, upgraded_db_url


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The one local SparkSession of the test run (``local[2]``, UI off, 2 shuffle partitions)."""
    from bolide.spark import spark_session

    session = spark_session(
        "bolide-tests",
        config={
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
            "spark.sql.session.timeZone": "UTC",
        },
    )
    yield session
    session.stop()


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
