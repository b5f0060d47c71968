"""Moving records between Spark and the SQL history: Arrow rows to ``Record``s, tables to views.

Archived records come back to Spark with the Kafka source's columns (``topic`` is the stream
name), either through JDBC (Spark reads the tables itself, in parallel) or through
``SqlStore.read`` pages in the driver when no JDBC driver is on the classpath.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import make_url

from bolide.facade.errors import BolideError
from bolide.facade.record import Record, trusted_record
from bolide.stores.dialects import dialect_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from bolide.stores import SqlStore

__all__ = [
    "StoreNotSharedError",
    "archive_partitions",
    "executor_store_url",
    "has_jdbc_driver",
    "jdbc_jars",
    "jdbc_options",
    "load_archive",
    "records_by_stream",
]

_PAGE = 10_000
#: Where Debian's packages put the drivers (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java).
_JAR_GLOBS = ("/usr/share/java/postgresql.jar", "/usr/share/java/sqlite-jdbc.jar")
_ARCHIVE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


class StoreNotSharedError(BolideError, ValueError):
    """The history store is a SQLite database, which executors on other machines cannot
    share: a Spark job on a cluster needs a PostgreSQL store."""


def executor_store_url(spark: SparkSession, store: str | SqlStore) -> str:
    """The URL Spark's executors open ``store`` with (each task its own connection).

    Raises:
        StoreNotSharedError: An in-memory SQLite store (only this process sees it), or a
            SQLite file with a master that is not ``local[...]``.
    """
    from bolide.stores import SqlStore

    url = store.engine.url if isinstance(store, SqlStore) else make_url(store)
    if url.get_backend_name() == "sqlite":
        master = spark.sparkContext.master or "local"
        if url.database in (None, "", ":memory:"):
            raise StoreNotSharedError(
                "an in-memory SQLite store cannot be written by Spark's executors: "
                "give a SQLite file (local master) or a PostgreSQL URL"
            )
        if not master.startswith("local"):
            raise StoreNotSharedError(
                f"a SQLite store ({url.database}) cannot be shared by the executors of the "
                f"Spark master {master}: use a PostgreSQL store "
                "(postgresql+psycopg://user@host/db) that every executor reaches"
            )
    return url.render_as_string(hide_password=False)


def records_by_stream(table: pa.Table) -> dict[str, list[Record]]:
    """Records (with stream, position, timestamp, message group) from Kafka-schema Arrow rows.

    Each column is converted in one call (numbers through NumPy, bytes and strings through
    Arrow's own conversion, the headers flattened once): converting value by value costs
    more than storing the rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return {}
    millis = _column(pc.divide(table.column("timestamp").cast(pa.int64()), 1000))
    topics, partitions, offsets, keys, values = (
        _column(table.column(n)) for n in ("topic", "partition", "offset", "key", "value")
    )
    headers = (
        _headers(table.column("headers"))
        if "headers" in table.column_names
        else [[] for _ in range(table.num_rows)]
    )
    out: dict[str, list[Record]] = {}
    # Arrow gives bytes for binary columns (a None value stays None: a tombstone); the trusted
    # constructor also reads the message group.
    for topic, partition, offset, key, value, pairs, ms in zip(
        topics, partitions, offsets, keys, values, headers, millis, strict=True
    ):
        record = trusted_record(value, key, pairs, topic, partition, offset, ms)
        out.setdefault(topic, []).append(record)
    return out


def _column(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """``column`` as Python values, ``None`` for nulls: NumPy's ``tolist`` for numbers
    without nulls, Arrow's conversion to NumPy objects for bytes and strings (both far cheaper
    than ``to_pylist``, which makes a scalar per value); numbers with nulls (never in Kafka's
    schema) through ``to_pylist``, which NumPy would turn into floats."""
    import pyarrow as pa

    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        if column.null_count:
            return list(column.to_pylist())
        return list(column.to_numpy().tolist())
    return list(column.to_numpy(zero_copy_only=False))


def _headers(column: pa.ChunkedArray) -> list[list[tuple[str, bytes]]]:
    """Each row's headers as ``(name, value)`` pairs (a null value as ``b""``), from Kafka's
    ``array<struct<key, value>>`` column flattened once (a null list has none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    flat = lists.flatten()  # every row's structs, in order; none for a null list
    names = _column(flat.field("key"))
    values = [b"" if v is None else v for v in _column(flat.field("value"))]
    pairs = list(zip(names, values, strict=True))
    out: list[list[tuple[str, bytes]]] = []
    at = 0
    for n in pc.list_value_length(lists).fill_null(0).to_numpy().tolist():
        out.append(pairs[at : at + n])
        at += n
    return out


def archive_partitions(
    batch: DataFrame, url: str, serde: Any | None, stored_as: dict[str, str] | None = None
) -> tuple[int, int]:
    """Write each Spark partition of ``batch`` into the store at ``url`` from the executor that
    holds it; return (rows, rows inserted), the only data that reaches the driver.

    Each task opens one connection and writes each Arrow batch of its partition in one
    transaction through ``SqlStore.store_batches``: idempotent on (stream, partition, offset),
    so a task Spark retries, or a micro-batch it replays, inserts nothing twice. ``serde`` is
    a ``serde_spec`` (an ``AvroSerde`` rebuilt in each worker) or a picklable typed serde; its
    typed table is written in the same transactions. ``stored_as``: the key of each stream's
    topic incarnation the batch was read from (``SqlStore.identify``; by default the current).
    """
    from pyspark.sql import functions as F

    def write(chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from bolide.stores import SqlStore

        rows = inserted = 0
        store: SqlStore | None = None
        try:
            for chunk in chunks:
                by_stream = records_by_stream(pa.Table.from_batches([chunk]))
                if not by_stream:
                    continue
                store = store or SqlStore(url)
                rows += chunk.num_rows
                also = typed_writer(by_stream, serde, stored_as)
                inserted += store.store_batches(by_stream, also=also, stored_as=stored_as)
        finally:
            if store is not None:
                store.close()
        yield pa.RecordBatch.from_pydict({"rows": [rows], "written": [inserted]})

    totals = (
        batch.mapInArrow(write, "rows long, written long")
        .agg(F.sum("rows").alias("rows"), F.sum("written").alias("written"))
        .first()
    )
    if totals is None:
        return 0, 0
    return int(totals["rows"] or 0), int(totals["written"] or 0)


def typed_writer(
    batches: dict[str, list[Record]], serde: Any | None, stored_as: dict[str, str] | None = None
) -> Callable[[Any], None] | None:
    """The ``also`` of ``store_batches`` filling the records' typed tables (``serde``: a
    ``serde_spec`` or a typed serde; ``stored_as``: each stream's topic incarnation), or
    ``None`` without a serde."""
    if serde is None:
        return None
    from bolide.stores.typed_archive import write_typed

    if isinstance(serde, dict):
        from bolide.spark.avro import worker_serde

        serde = worker_serde(serde)

    def also(conn: Any) -> None:
        for name, recs in batches.items():
            if recs:
                write_typed(conn, name, recs, serde, stored_as=(stored_as or {}).get(name))

    return also


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


def _offset_ranges(
    spark: SparkSession, sql: SqlStore, streams: Sequence[str] | None
) -> dict[str, str]:
    """JDBC options splitting a table's read into offset ranges, one task each (the archive's
    offsets span ``min..max``); none when there is at most one row's worth of range."""
    import sqlalchemy as sa

    records = sa.table("bolide_records", sa.column("stream"), sa.column("kafka_offset"))
    span = sa.select(sa.func.min(records.c.kafka_offset), sa.func.max(records.c.kafka_offset))
    span = span.where(records.c.stream.in_(list(_current_keys(sql, streams))))
    with sql.engine.connect() as conn:
        low, high = conn.execute(span).one()
    tasks = max(1, spark.sparkContext.defaultParallelism)
    if low is None or high is None or high <= low or tasks == 1:
        return {}
    return {
        "partitionColumn": "kafka_offset",
        "lowerBound": str(low),
        "upperBound": str(high + 1),
        "numPartitions": str(min(tasks, high + 1 - low)),
    }


def _current_keys(sql: SqlStore, streams: Sequence[str] | None) -> dict[str, str]:
    """The key of the current topic incarnation of each of ``streams`` (every archived stream
    when ``None``) -> its name: what an archive read loads (``bolide.stores.incarnations``)."""
    names = list(streams) if streams is not None else sql.streams()
    current = {i.stream: i.stored_as for i in sql.incarnations() if i.current}
    return {current.get(name, name): name for name in names}


def _via_jdbc(
    spark: SparkSession, url: str, keys: dict[str, str], ranges: dict[str, str]
) -> DataFrame:
    from pyspark.sql import functions as F

    options = {**jdbc_options(url), **ranges}
    # Keys are data: a DataFrame filter, evaluated by Spark. JDBC cannot bind parameters, and
    # a pushed-down filter is SQL text whose quoting depends on the server's settings
    # (standard_conforming_strings), so none is pushed down.
    names = F.create_map(*[F.lit(v) for pair in keys.items() for v in pair])

    def table(name: str) -> DataFrame:
        reader = spark.read.format("jdbc").options(**options).option("dbtable", name)
        df = reader.option("pushDownPredicate", "false").load()
        return df.where(F.col("stream").isin(list(keys)))

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
        names[F.col("stream")].alias("topic"),
        F.col("kafka_partition").cast("int").alias("partition"),
        F.col("kafka_offset").cast("long").alias("offset"),
        F.expr("timestamp_millis(cast(timestamp_ms AS bigint))").alias("timestamp"),
        F.lit(0).alias("timestampType"),
        F.col("headers"),
    )


def _via_store(spark: SparkSession, store: SqlStore, streams: Sequence[str] | None) -> DataFrame:
    import pyarrow as pa

    names = list(_current_keys(store, streams).values())
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
    url = executor_store_url(spark, sql)
    return _via_jdbc(spark, url, _current_keys(sql, streams), _offset_ranges(spark, sql, streams))
