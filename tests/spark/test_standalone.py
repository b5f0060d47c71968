"""The Spark jobs on a standalone cluster: executors in other JVMs do the work, the driver
(which refuses results over 1 MiB here) only coordinates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import Cluster, Publisher, PublisherConfig, Record
from bolide.facade.record import trusted_record
from bolide.spark import BatchReport, StoreNotSharedError, archive, query
from bolide.stores import SqlStore
from tests.conftest import upgraded_db_url
from tests.spark.standalone import Sessions, StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an upgraded PostgreSQL history store (a fresh schema)."""
    return upgraded_db_url("postgresql", tmp_path, request)


@pytest.mark.kafka
@pytest.mark.postgres
def test_archive_of_more_than_the_driver_takes(
    cluster_spark: Any, cluster: Cluster, stream_factory, pg_url: str, tmp_path: Path
) -> None:
    # 4,000 records of 1 KiB in one micro-batch: about 4 MiB, four times what the driver takes.
    stream = stream_factory(partitions=2)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for n in range(4_000):
            pub.publish_async(Record(bytes([n % 251]) * 1024, key=f"k{n % 7}"))
        pub.flush(60)
    reports: list[BatchReport] = []
    archive(
        cluster_spark,
        stream,
        pg_url,
        str(tmp_path / "ckpt"),
        bootstrap=cluster,
        on_batch=reports.append,
    )
    assert sum(r.rows for r in reports) == 4_000
    assert sum(r.written for r in reports) == 4_000
    with SqlStore(pg_url) as store:
        stored = [len(store.read(stream.name, p, 0, 10_000)) for p in (0, 1)]
    assert sum(stored) == 4_000


def test_a_sqlite_store_on_a_cluster_says_to_use_postgresql(
    cluster_spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    with pytest.raises(StoreNotSharedError, match="PostgreSQL"):
        archive(cluster_spark, "s", sqlite_url, str(tmp_path / "ckpt"), bootstrap="127.0.0.1:1")
    assert not (tmp_path / "ckpt").exists()  # refused before the query started


@pytest.mark.postgres
def test_query_reads_the_archive_in_offset_ranges(cluster_spark: Any, pg_url: str) -> None:
    records = [
        trusted_record(bytes([n % 251]) * 1024, b"k", [], "big", n % 2, n // 2, 1_000 + n)
        for n in range(2_000)
    ]
    with SqlStore(pg_url) as store:
        store.store_all("big", records)
    df = query(
        cluster_spark,
        "SELECT topic, count(*) AS n, sum(length(value)) AS bytes FROM records GROUP BY topic",
        pg_url,
        via="jdbc",
    )
    plan = df._jdf.queryExecution().optimizedPlan().toString()
    assert "JDBCRelation(bolide_records) [numPartitions=2]" in plan
    assert [tuple(r) for r in df.collect()] == [("big", 2_000, 2_000 * 1024)]


@pytest.mark.postgres
def test_cli_submits_a_job_to_the_cluster(
    spark_sessions: Sessions, spark_cluster: StandaloneCluster, pg_url: str
) -> None:
    records = [trusted_record(b"v", b"k", [], "cli", 0, n, 1_000 + n) for n in range(30)]
    with SqlStore(pg_url) as store:
        store.store_all("cli", records)
    spark_sessions.stop()  # the command's own driver takes the workers' cores
    conf = {
        "spark.app.name": "bolide-cli-on-the-cluster",
        "spark.driver.maxResultSize": "1m",
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
    }
    command = [sys.executable, "-m", "bolide.facade.cli.main", "spark", "query"]
    command += ["--master", spark_cluster.master_url, "--deploy-mode", "client"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--db", pg_url, "--via", "jdbc", "SELECT count(*) AS n FROM records"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    environ["PYSPARK_PYTHON"] = sys.executable  # what the executors run
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env=environ
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 30|" in done.stdout
    # The master ran it as an application of that name: --master and --conf both took.
    url = f"http://127.0.0.1:{spark_cluster.ui_port}/json/"
    with urllib.request.urlopen(url, timeout=10) as reply:
        state = json.load(reply)
    names = [app["name"] for app in state["completedapps"] + state["activeapps"]]
    assert "bolide-cli-on-the-cluster" in names
