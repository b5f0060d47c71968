"""Moving records between Spark and the SQL history: Arrow rows to ``Record``s, tables to views.

Archived records come back to Spark with the Kafka source's columns (``topic`` is the stream
name), either through JDBC (Spark reads the tables itself, in parallel) or through
``SqlStore.read`` pages in the driver when no JDBC driver is on the classpath.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import make_url

from bolide.facade.record import Record, trusted_record
from bolide.stores.dialects import dialect_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from bolide.stores import SqlStore

__all__ = ["has_jdbc_driver", "jdbc_jars", "jdbc_options", "load_archive", "records_by_stream"]

_PAGE = 10_000
#: Where Debian's packages put the drivers (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java).
_JAR_GLOBS = ("/usr/share/java/postgresql.jar", "/usr/share/java/sqlite-jdbc.jar")
_ARCHIVE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


def records_by_stream(table: pa.Table) -> dict[str, list[Record]]:
    """Records (with stream, position, timestamp, message group) from Kafka-schema Arrow rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return {}
    millis = pc.divide(table.column("timestamp").cast(pa.int64()), 1000).to_pylist()
    out: dict[str, list[Record]] = {}
    columns = [table.column(n).to_pylist() for n in ("topic", "partition", "offset", "key")]
    values = table.column("value").to_pylist()
    headers = (
        table.column("headers").to_pylist()
        if "headers" in table.column_names
        else [None] * table.num_rows
    )
    # Arrow gives bytes for binary columns; the trusted constructor also reads the message group.
    for topic, partition, offset, key, value, pairs, ms in zip(
        *columns, values, headers, millis, strict=True
    ):
        record = trusted_record(
            value,  # None stays None: a tombstone
            key,
            [(h["key"], h["value"] or b"") for h in pairs] if pairs else [],
            topic,
            partition,
            offset,
            ms,
        )
        out.setdefault(topic, []).append(record)
    return out


def jdbc_jars() -> list[str]:
    """JDBC driver jars installed by Debian's packages, for ``spark.jars``."""
    return sorted(p for pattern in _JAR_GLOBS for p in glob.glob(pattern))


def jdbc_options(url: str) -> dict[str, str]:
    """Spark JDBC options (url, driver, user, password) for a SQLAlchemy URL.

    Raises:
        StoreError: A database the store does not support.
        ValueError: An in-memory SQLite database.
    """
    parsed = make_url(url)
    return dialect_of(parsed).jdbc_options(parsed)


def has_jdbc_driver(spark: SparkSession, driver: str) -> bool:
    """True when ``driver`` (a JDBC driver class) loads in Spark's JVM."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(driver, False, loader)
    except Exception:
        return False
    return True


def _via_jdbc(spark: SparkSession, url: str, streams: Sequence[str] | None) -> DataFrame:
    from pyspark.sql import functions as F

    options = jdbc_options(url)

    def table(name: str) -> DataFrame:
        reader = spark.read.format("jdbc").options(**options).option("dbtable", name)
        if streams is None:
            return reader.load()
        # Stream names are data: a DataFrame filter, evaluated by Spark. JDBC cannot bind
        # parameters, and a pushed-down filter is SQL text whose quoting depends on the
        # server's settings (standard_conforming_strings), so none is pushed down.
        df = reader.option("pushDownPredicate", "false").load()
        return df.where(F.col("stream").isin(list(streams)))

    records = table("bolide_records")
    headers = (
        table("bolide_record_headers")
        .groupBy("stream", "kafka_partition", "kafka_offset")
        .agg(
            F.expr(
                "transform(array_sort(collect_list(struct(header_index, name, value))), "
                "h -> named_struct('key', h.name, 'value', h.value))"
            ).alias("headers")
        )
    )
    joined = records.join(headers, ["stream", "kafka_partition", "kafka_offset"], "left")
    return joined.select(
        F.col("key").cast("binary"),
        F.col("payload").cast("binary").alias("value"),
        F.col("stream").alias("topic"),
        F.col("kafka_partition").cast("int").alias("partition"),
        F.col("kafka_offset").cast("long").alias("offset"),
        F.expr("timestamp_millis(cast(timestamp_ms AS bigint))").alias("timestamp"),
        F.lit(0).alias("timestampType"),
        F.col("headers"),
    )


def _via_store(spark: SparkSession, store: SqlStore, streams: Sequence[str] | None) -> DataFrame:
    import pyarrow as pa

    names = list(streams) if streams is not None else store.streams()
    columns: dict[str, list[Any]] = {
        c: [] for c in ("key", "value", "topic", "partition", "offset", "timestamp", "headers")
    }
    for name in names:
        for partition in store.partitions(name):
            position = 0
            while True:
                page = store.read(name, partition, position, _PAGE)
                for r in page:
                    columns["key"].append(r.key)
                    columns["value"].append(r.data)
                    columns["topic"].append(name)
                    columns["partition"].append(partition)
                    columns["offset"].append(r.offset)
                    columns["timestamp"].append(r.timestamp_ms)
                    columns["headers"].append(
                        [{"key": k, "value": v} for k, v in r.headers] or None
                    )
                if len(page) < _PAGE:
                    break
                position = int(page[-1].offset or 0) + 1
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    table = pa.table(
        {
            "key": pa.array(columns["key"], pa.binary()),
            "value": pa.array(columns["value"], pa.binary()),
            "topic": pa.array(columns["topic"], pa.string()),
            "partition": pa.array(columns["partition"], pa.int32()),
            "offset": pa.array(columns["offset"], pa.int64()),
            "timestamp": pa.array(columns["timestamp"], pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")
            ),
            "timestampType": pa.array([0] * len(columns["offset"]), pa.int32()),
            "headers": pa.array(columns["headers"], pa.list_(header)),
        }
    )
    return spark.createDataFrame(table, schema=_ARCHIVE_SCHEMA)


def load_archive(
    spark: SparkSession,
    store: str | SqlStore,
    streams: Sequence[str] | None = None,
    *,
    via: Literal["auto", "jdbc", "store"] = "auto",
) -> DataFrame:
    """Archived records as a DataFrame with the Kafka source's columns (headers included).

    Args:
        spark: The session.
        store: ``SqlStore`` or its SQLAlchemy URL.
        streams: Streams to load; every archived stream when ``None``.
        via: ``"jdbc"``, ``"store"`` or ``"auto"`` (JDBC when the driver class loads).

    Raises:
        ValueError: ``via="jdbc"`` without a JDBC driver on the classpath, or an unknown ``via``.
    """
    from bolide.stores import SqlStore

    if via not in ("auto", "jdbc", "store"):
        raise ValueError(f"via must be 'auto', 'jdbc' or 'store', got {via!r}")
    if isinstance(store, SqlStore):
        return _load(spark, store, streams, via)
    with SqlStore(store) as opened:
        return _load(spark, opened, streams, via)


def _load(spark: SparkSession, sql: SqlStore, streams: Sequence[str] | None, via: str) -> DataFrame:
    backend = sql.dialect
    driver = sql.sql_dialect.jdbc_driver
    usable = has_jdbc_driver(spark, driver) and sql.engine.url.database
    if via == "jdbc" and not usable:
        raise ValueError(
            f"no JDBC driver for {backend} on Spark's classpath: add its jar with spark.jars "
            "(Debian: apt install libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)"
        )
    sql.check_schema()
    if via == "store" or not usable:
        return _via_store(spark, sql, streams)
    url = sql.engine.url.render_as_string(hide_password=False)
    return _via_jdbc(spark, url, streams)
