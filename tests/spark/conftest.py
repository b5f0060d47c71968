"""Spark fixtures: ONE local SparkSession for every Spark test, stores, the log-start seam.

The session starts with ``BOLIDE_LOG_START_OVERRIDES`` pointing at a file of this session, so
every process Spark starts (planner and executor Python workers inherit the JVM's
environment) sees the same simulated log starts; tests write that file through
``log_start_overrides``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import LOG_START_OVERRIDES_ENV
from tests.conftest import DATABASES, upgraded_db_url


@pytest.fixture(scope="session")
def overrides_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log-start override file every Spark process reads (absent = no overrides)."""
    return tmp_path_factory.mktemp("spark-seam") / "log-starts.json"


@pytest.fixture(scope="session")
def spark(overrides_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The one local SparkSession of the test run (``local[2]``, UI off, 2 shuffle partitions)."""
    from bolide.spark import spark_session

    previous = os.environ.get(LOG_START_OVERRIDES_ENV)
    os.environ[LOG_START_OVERRIDES_ENV] = str(overrides_file)  # inherited by the JVM
    try:
        session = spark_session(
            "bolide-tests",
            config={
                "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
                "spark.sql.session.timeZone": "UTC",
            },
        )
    finally:
        if previous is None:
            del os.environ[LOG_START_OVERRIDES_ENV]
        else:
            os.environ[LOG_START_OVERRIDES_ENV] = previous
    yield session
    session.stop()


@pytest.fixture
def log_start_overrides(overrides_file: Path) -> Iterator[Callable[[str, dict[int, int]], None]]:
    """``set(topic, {partition: log_start})``: simulate a trimmed log in every Spark process."""
    data: dict[str, dict[str, int]] = {}

    def set_start(topic: str, starts: dict[int, int]) -> None:
        data[topic] = {str(p): o for p, o in starts.items()}
        overrides_file.write_text(json.dumps(data), encoding="utf-8")

    yield set_start
    overrides_file.unlink(missing_ok=True)


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
