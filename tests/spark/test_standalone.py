"""The Spark jobs on a standalone cluster: executors in other JVMs do the work, the driver
(which refuses results over 1 MiB here) only coordinates."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from bolide.facade import Cluster, Publisher, PublisherConfig, Record
from bolide.facade.record import trusted_record
from bolide.facade.resequencer.sequence import sequence_headers
from bolide.spark import (
    BatchReport,
    StoreNotSharedError,
    archive,
    cluster_source_options,
    kafka_options,
    query,
    register,
    resequence,
)
from bolide.stores import SqlStore
from bolide.testing.spark_cluster import StandaloneCluster
from tests.chaos.postgres import PrivatePostgres, postgres_binaries
from tests.conftest import eventually, upgraded_db_url
from tests.spark.conftest import Sessions, drain, publish

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


@pytest.mark.kafka
@pytest.mark.timeout(1200)
def test_resequence_publishes_more_than_the_driver_takes_from_the_executors(
    cluster_spark: Any, cluster: Cluster, stream_factory, tmp_path: Path
) -> None:
    # 40 groups of 100 records of 1 KiB, shuffled: about 4 MiB through one micro-batch, four
    # times what the driver takes, released in each group's order.
    source = stream_factory(partitions=2, global_order=False)
    output = stream_factory(name_prefix="ordered", partitions=2, global_order=False)
    groups, size = [f"order-{g}" for g in range(40)], 100
    records = [
        Record(
            f"{group}:{n}:".encode().ljust(1024, b"."),
            group=group,
            headers=sequence_headers(group, size, n),
        )
        for group in groups
        for n in range(size)
    ]
    random.Random(11).shuffle(records)
    publish(cluster, source, records)
    reports: list[BatchReport] = []
    running = resequence(cluster_spark, source, output, str(tmp_path / "ckpt"), bootstrap=cluster,
                         trigger_interval_s=0.5, on_batch=reports.append)  # fmt: skip
    try:
        got = drain(cluster, output, len(records), 900)
        # The batch reports once every task's acknowledgements came (after the records show).
        eventually(lambda: sum(r.written for r in reports) >= len(records), 300, 0.2)
    finally:
        running.stop()
    assert running.exception() is None
    assert len(got) == len(records)
    numbers: dict[str, list[int]] = {}
    for msg in got:
        group, number, _ = msg.value().split(b":", 2)
        numbers.setdefault(group.decode(), []).append(int(number))
    assert numbers == {group: list(range(size)) for group in groups}  # each group in order
    assert sum(r.written for r in reports) == len(records)


@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.timeout(1200)
def test_a_worker_killed_mid_stream_loses_and_doubles_nothing(
    cluster_spark: Any,
    spark_cluster: StandaloneCluster,
    cluster: Cluster,
    stream_factory,
    pg_url: str,
    tmp_path: Path,
) -> None:
    # Micro-batches of 1,000 records; once the archive holds 1,500 (inside the second batch
    # or later), one worker is killed with its executors, and the stream goes on with the
    # other: Spark runs the lost tasks again, and the archive's key absorbs what they redo.
    stream = stream_factory(partitions=2)
    total = 6_000
    publish(cluster, stream, [Record(f"r{n}".encode(), key=f"k{n % 5}") for n in range(total)])

    def stored() -> int:
        with SqlStore(pg_url) as store:
            return sum(len(store.read(stream.name, p, 0, total)) for p in (0, 1))

    def kill_once_busy() -> None:
        eventually(lambda: stored() >= 1_500, 600, 0.05)
        spark_cluster.kill_worker(0)

    killer = threading.Thread(target=kill_once_busy, name="kill-worker", daemon=True)
    killer.start()
    reports: list[BatchReport] = []
    try:
        archive(
            cluster_spark,
            stream,
            pg_url,
            str(tmp_path / "ckpt"),
            bootstrap=cluster,
            on_batch=reports.append,
            options={"maxOffsetsPerTrigger": "1000"},
        )
        killer.join(600)
    finally:
        spark_cluster.restart_worker(0)
    assert not killer.is_alive() and spark_cluster.workers[0].returncode is None
    # A task lost after its database commit runs again and inserts none of its rows: they
    # count as rows, never as written twice.
    assert sum(r.rows for r in reports) >= total
    assert sum(r.written for r in reports) <= total
    with SqlStore(pg_url) as store:
        places = [(p, r.offset) for p in (0, 1) for r in store.read(stream.name, p, 0, total)]
    assert len(places) == len(set(places)) == total


@pytest.mark.kafka
@pytest.mark.postgres
def test_the_bolide_source_splices_postgresql_history_on_the_executors(
    cluster_spark: Any, cluster: Cluster, stream_factory, pg_url: str, cluster_with_starts
) -> None:
    # 3,000 records of 1 KiB over two partitions, about 3 MiB; Kafka holds each partition from
    # offset 500, the history (copies marked "sql:") each partition's first 600. The read is
    # aggregated on the executors: no row reaches the driver, which takes 1 MiB at most.
    stream = stream_factory(partitions=2)
    records = [Record(bytes([n % 251]) * 1024, key=f"k{n % 7}") for n in range(3_000)]
    publish(cluster, stream, records)
    copies = []
    for r in records:
        if (r.offset or 0) < 600:
            copy = trusted_record(b"sql:" + r.data, r.key, [], stream.name, r.partition,
                                  r.offset, r.timestamp_ms)  # fmt: skip
            copies.append(copy)
    with SqlStore(pg_url) as store:
        store.store_all(stream.name, copies)
    trimmed = cluster_with_starts({stream.name: {0: 500, 1: 500}})
    register(cluster_spark)
    seam = {**cluster_source_options(trimmed), "bolide.store": pg_url}
    options = kafka_options(stream, trimmed, startingOffsets="earliest", **seam)
    df = cluster_spark.read.format("bolide").options(**options).load()
    from_sql = (F.substring("value", 1, 4) == F.lit(bytearray(b"sql:"))).cast("int")
    got = {
        row["partition"]: (row["n"], row["first"], row["last"], row["distinct"], row["sql"])
        for row in df.groupBy("partition").agg(
            F.count("*").alias("n"), F.min("offset").alias("first"),
            F.max("offset").alias("last"), F.countDistinct("offset").alias("distinct"),
            F.sum(from_sql).alias("sql"),
        ).collect()
    }  # fmt: skip
    sizes = {p: sum(1 for r in records if r.partition == p) for p in (0, 1)}
    # every offset once, the first 500 of each partition from PostgreSQL, the rest from Kafka
    assert got == {p: (n, 0, n - 1, n, 500) for p, n in sizes.items()}


@pytest.mark.kafka
@pytest.mark.timeout(1200)
@pytest.mark.skipif(postgres_binaries() is None, reason="needs initdb and pg_ctl")
def test_a_database_gone_from_the_executors_fails_the_query_and_keeps_the_checkpoint(
    cluster_spark: Any, cluster: Cluster, stream_factory, tmp_path: Path
) -> None:
    # A private PostgreSQL the archive writes to; it stops once the first batch is archived,
    # and the next batch's tasks cannot connect: the query fails with the database's own
    # message, and the checkpoint commits no batch the archive does not hold.
    server = PrivatePostgres(tmp_path / "postgres.log")
    server.start()
    stream = stream_factory()
    reports: list[BatchReport] = []
    try:
        with SqlStore(server.url) as store:
            store.upgrade()
        publish(cluster, stream, [Record(f"a{n}".encode()) for n in range(50)])
        running = archive(
            cluster_spark,
            stream,
            server.url,
            str(tmp_path / "ckpt"),
            bootstrap=cluster,
            until_caught_up=False,
            trigger_interval_s=0.5,
            on_batch=reports.append,
        )
        try:
            eventually(lambda: sum(r.written for r in reports) >= 50, 600, 0.2)
            server.stop()
            publish(cluster, stream, [Record(f"b{n}".encode()) for n in range(50)])
            with pytest.raises(Exception, match=r"(?i)connect"):  # psycopg's, from a task
                running.awaitTermination(900)
        finally:
            running.stop()
    finally:
        server.stop()
    assert sum(r.written for r in reports) == 50  # the second batch never reported
    commits = [int(p.name) for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit()]
    assert max(commits) == max(r.batch_id for r in reports)  # the failed batch runs again


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
    command = [sys.executable, "-m", "bolide.cli.main", "spark", "query"]
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
