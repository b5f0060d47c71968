"""The demo's Spark step: archive the stream with Structured Streaming, then query it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bolide.facade.config import Cluster

__all__ = ["SPARK_QUERY", "run_spark"]

#: Spark SQL over the archive the job wrote (the view ``records``, the Kafka source's columns).
SPARK_QUERY = (
    "SELECT partition, count(*) AS records, count(DISTINCT key) AS groups, "
    "max(offset) AS last_offset FROM records GROUP BY partition ORDER BY partition"
)


def run_spark(
    cluster: Cluster, stream: str, workdir: Path, say: Callable[[str], None]
) -> tuple[int, list[list[Any]]]:
    """Archive ``stream`` into a SQLite file of its own with Spark, then query that archive.

    Returns:
        Rows the job wrote, and the query's rows.

    Raises:
        ModuleNotFoundError: PySpark is not installed (``pip install 'bolide[spark]'``).
    """
    from bolide.spark import archive, query, spark_session
    from bolide.stores.store import SqlStore

    say("spark: starting a local session (the JVM's first lines follow)")
    # A host name that resolves to loopback makes Spark warn and guess an address: name it.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    url = f"sqlite:///{workdir / 'spark-archive.db'}"
    with SqlStore(url, check_schema=False) as store:
        store.upgrade()
    spark = spark_session(
        "bolide-demo", config={"spark.sql.warehouse.dir": str(workdir / "warehouse")}
    )
    try:
        say(f"spark {spark.version} session up; archiving {stream} with format('bolide')")
        written = 0

        def on_batch(report: Any) -> None:
            nonlocal written
            written += report.written
            say(f"spark archive batch {report.batch_id}: {report.rows} rows, {report.written} new")

        archive(
            spark,
            stream,
            url,
            str(workdir / "spark-checkpoint"),
            bootstrap=cluster,
            max_offsets_per_trigger=5_000,
            on_batch=on_batch,
        )
        rows = [list(r) for r in query(spark, SPARK_QUERY, url, [stream], via="store").collect()]
    finally:
        spark.stop()
    return written, rows
