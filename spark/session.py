"""A SparkSession with settings that suit bolide's jobs on one machine."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from bolide.spark.connector import connector_jars, connector_package

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LOCAL_SETTINGS", "spark_session"]

#: Small shuffles and no UI: local jobs over a few partitions start and finish fast.
LOCAL_SETTINGS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def _classpath(
    packages: Sequence[str], jars: Sequence[str] | None, *, kafka_connector: bool
) -> tuple[list[str], list[str]]:
    """``spark.jars.packages`` and ``spark.jars``: the JDBC drivers by default, and the Kafka
    connector's cached jars (else its Maven coordinates)."""
    packages = list(packages)
    if jars is None:
        from bolide.spark._archive import jdbc_jars

        jars = jdbc_jars()
    jars = list(jars)
    if kafka_connector:
        cached = connector_jars()
        if cached is not None:
            jars += cached
        elif connector_package() not in packages:
            packages.append(connector_package())
    return packages, jars


def spark_session(
    app_name: str = "bolide",
    master: str | None = "local[2]",
    *,
    packages: Sequence[str] = (),
    jars: Sequence[str] | None = None,
    config: Mapping[str, str] | None = None,
    register_source: bool = True,
    kafka_connector: bool = True,
) -> SparkSession:
    """Get or create a SparkSession for bolide jobs.

    Args:
        app_name: Spark application name.
        master: Spark master URL; ``None`` leaves it to ``spark-submit`` (cluster runs).
        packages: Maven coordinates for ``spark.jars.packages`` (e.g. the Kafka connector).
        jars: Jar files for ``spark.jars``; by default the PostgreSQL and SQLite JDBC drivers
            where Debian's packages installed them (the ``query`` job then reads through JDBC).
        config: Further Spark settings; they override ``LOCAL_SETTINGS`` (applied to
            ``local[...]`` masters only).
        register_source: Also add ``format("bolide")`` to the session.
        kafka_connector: Add Spark's Kafka connector, so ``format("kafka")`` works: the jars
            ``bolide fetch spark-kafka`` cached (``spark.jars``), else its package coordinates
            (``spark.jars.packages``, which Spark resolves from Maven Central at start).

    In local mode, Python workers run the interpreter of this process unless
    ``PYSPARK_PYTHON`` says otherwise, so they see the same packages (pyarrow,
    confluent-kafka, bolide). On a cluster, executors need them installed in their own
    Python (see docs/spark.md).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - bolide.spark already checked
        raise ImportError("bolide's Spark jobs need PySpark: pip install 'bolide[spark]'") from exc
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        for key, value in LOCAL_SETTINGS.items():
            builder = builder.config(key, value)
    packages, jars = _classpath(packages, jars, kafka_connector=kafka_connector)
    if packages:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if register_source:
        from bolide.spark.source import register

        register(spark)
    return spark
