"""bolide's Spark jobs: archive a stream into SQL, resequence groups, query the archive.

Each job is a function over a SparkSession (``spark_session()`` gives a suitable local one);
``bolide spark <job>`` is a thin shim over them. Streams are read with Spark's own Kafka
source when the session has its connector (``source="auto"``, the default), else with
``format("bolide")`` (no jar needed; it also splices history); ``source=`` picks one.

Arguments the streaming jobs share: ``spark`` (the session); ``bootstrap`` (bootstrap servers
or a ``Cluster``); ``source`` (``"auto"``, ``"bolide"`` or ``"kafka"``, see ``read_stream``);
``starting_offsets`` (where a new checkpoint starts); ``trigger_interval_s`` (the micro-batch
interval when running continuously); ``on_batch`` (called after each micro-batch with a
``BatchReport``); ``options`` (further source options).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from bolide.facade.compat import stale_watermarks
from bolide.facade.config import Cluster, StreamConfig
from bolide.facade.errors import BolideError, TopicRecreatedError
from bolide.facade.kafka import ensure_topic
from bolide.spark._archive import archive_partitions, executor_store_url, load_archive
from bolide.spark._options import cluster_source_options
from bolide.spark._publish import publish_partitions
from bolide.spark._resequence import resequenced
from bolide.spark.kafka import has_connector, kafka_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from bolide.stores import SqlStore

__all__ = [
    "BatchReport",
    "archive",
    "load_archive",
    "query",
    "read_stream",
    "resequence",
    "resolve_source",
]

log = logging.getLogger("bolide.spark")

Source = Literal["auto", "bolide", "kafka"]


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch of a job did (handed to ``on_batch`` for progress).

    Attributes:
        batch_id: Spark's micro-batch id.
        rows: Rows the batch held.
        written: Rows newly written (archive: inserted; duplicates of a replayed batch are
            not counted) or records published (resequence).
        dead_letters: Records sent (or, without a target, dropped) as dead letters.
        seconds: Wall time the batch's sink took.
    """

    batch_id: int
    rows: int
    written: int
    dead_letters: int
    seconds: float


BatchCallback = Callable[[BatchReport], None]


def _cluster(bootstrap: str | Cluster) -> Cluster:
    return bootstrap if isinstance(bootstrap, Cluster) else Cluster(bootstrap)


def _stream(stream: str | StreamConfig) -> StreamConfig:
    return stream if isinstance(stream, StreamConfig) else StreamConfig(name=stream)


def read_stream(
    spark: SparkSession,
    stream: str | StreamConfig,
    bootstrap: str | Cluster,
    *,
    source: Source = "auto",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    history: str | None = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame of a stream, headers included, from either source.

    Args:
        spark: The session (``format("bolide")`` is registered on it if needed).
        stream: Stream name or config.
        bootstrap: Bootstrap servers or a ``Cluster`` (its settings pass through).
        source: ``"kafka"`` (Spark's connector), ``"bolide"`` (Python source, no jar; the
            one that splices ``history``) or ``"auto"``: ``"kafka"`` when the session has
            the connector and nothing is spliced, else ``"bolide"``.
        starting_offsets: ``earliest``, ``latest`` or Spark's JSON.
        max_offsets_per_trigger: Most records per micro-batch.
        history: SQLAlchemy URL of a history store to splice in (``bolide`` source only).
        options: Further source options, by the Kafka source's names.
    """
    cluster = _cluster(bootstrap)
    config = _stream(stream)
    source = resolve_source(spark, source, cluster, history)
    extra: dict[str, Any] = {"includeHeaders": True, "startingOffsets": starting_offsets}
    if max_offsets_per_trigger is not None:
        extra["maxOffsetsPerTrigger"] = max_offsets_per_trigger
    extra.update(options or {})
    if source == "kafka":
        if history is not None:
            raise ValueError("history splicing needs source='bolide'")
        return kafka_stream(spark, config, cluster, **extra)
    if source != "bolide":
        raise ValueError(f"source must be 'bolide' or 'kafka', got {source!r}")
    from bolide.spark.kafka import kafka_options
    from bolide.spark.source import register

    register(spark)
    opts = kafka_options(config, cluster, **extra)
    opts.update(cluster_source_options(cluster))
    if history is not None:
        opts["bolide.store"] = history
    return spark.readStream.format("bolide").options(**opts).load()


def resolve_source(
    spark: SparkSession, source: Source, cluster: Cluster, history: str | None = None
) -> Source:
    """``source`` itself, unless ``"auto"``: Spark's Kafka source when the session can load
    its connector, nothing is spliced and the broker keeps Kafka's fetch semantics (an engine
    with Tansu's deviations keeps the Python source, which works around them)."""
    if source != "auto":
        return source
    if history is not None or stale_watermarks(cluster):
        return "bolide"
    return "kafka" if has_connector(spark) else "bolide"


def _check_store(store: str | SqlStore) -> None:
    """Fail before the query starts when the store's schema is missing or behind."""
    from bolide.stores import SqlStore

    if isinstance(store, SqlStore):
        store.check_schema()
        return
    with SqlStore(store) as opened:
        opened.check_schema()


def _shipped_serde(serde: Any | None) -> Any | None:
    """What executors rebuild ``serde`` from: a schema serde's description, else itself."""
    from bolide.facade.schemas.base import SchemaSerde

    if isinstance(serde, SchemaSerde):
        from bolide.spark.avro import serde_spec

        return serde_spec(serde)
    return serde


def _start(
    writer: Any, checkpoint: str, until_caught_up: bool, trigger_interval_s: float
) -> StreamingQuery:
    writer = writer.option("checkpointLocation", checkpoint)
    if until_caught_up:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(trigger_interval_s * 1000)} milliseconds")
    query: StreamingQuery = writer.start()
    if until_caught_up:
        from pyspark.errors import StreamingQueryException

        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            raise BolideError(f"the streaming query {query.name!r} failed: {exc}") from exc
    return query


def archive(
    spark: SparkSession,
    stream: str | StreamConfig,
    store: str | SqlStore,
    checkpoint: str,
    *,
    bootstrap: str | Cluster,
    source: Source = "auto",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = 10_000,
    until_caught_up: bool = True,
    trigger_interval_s: float = 1.0,
    on_batch: BatchCallback | None = None,
    options: Mapping[str, str] | None = None,
    serde: Any | None = None,
) -> StreamingQuery:
    """Archive a stream into the SQL history store with Structured Streaming.

    Each Spark partition of a micro-batch is written by the executor holding it, one database
    connection per task, through ``SqlStore.store_batches``, which is idempotent on (stream,
    partition, offset): a task Spark retries, or a batch it replays after a crash or restart,
    inserts nothing twice, and the checkpoint ensures nothing is skipped. The rows never pass
    through the driver, which gets each task's counts for the ``BatchReport`` and, each batch,
    records which topic incarnation the stream is (docs/history.md). The store's schema must
    be current (``bolide db upgrade``). With ``serde`` (the stream's ``AvroSerde``,
    ``ProtobufSerde`` or ``JsonSchemaSerde``), each micro-batch also fills the stream's typed
    table in the same transactions, from the same executors, as the ``Archiver`` does
    (docs/schemas.md): what does not decode stays raw only.

    Args (and those every job takes, in the module's docstring):
        stream: The stream to archive.
        store: ``SqlStore`` or its SQLAlchemy URL; the executors open it by its URL, so it
            must be one they reach (a SQLite file serves a ``local[...]`` master only).
        checkpoint: Spark checkpoint directory; restarting with it resumes where it stopped.
        max_offsets_per_trigger: Most records per micro-batch.
        until_caught_up: Archive what the stream holds now, then stop (``availableNow``);
            false runs until ``query.stop()``.
        serde: The stream's schema serde: also write its typed table.

    Returns:
        The streaming query (already finished when ``until_caught_up``).

    Raises:
        TypeError: ``serde`` cannot decode typed rows (it is not a schema serde).
        StoreNotSharedError: A SQLite store with a master other than ``local[...]``.
    """
    url = executor_store_url(spark, store)
    _check_store(store)
    _check_typed_serde(serde)
    limit, name = max_offsets_per_trigger, _stream(stream).name
    df = read_stream(
        spark, stream, bootstrap, source=source, starting_offsets=starting_offsets,
        max_offsets_per_trigger=limit, options=options,
    )  # fmt: skip
    batches = _archive_batches(url, _shipped_serde(serde), on_batch, (_cluster(bootstrap), name))
    writer = df.writeStream.queryName(f"bolide-archive-{name}").foreachBatch(batches)
    return _start(writer, checkpoint, until_caught_up, trigger_interval_s)


def _key(url: str, cluster: Cluster, name: str) -> dict[str, str]:
    """``{name: key}`` of the topic incarnation the stream is now, recorded in the store (a
    topic deleted and created again is archived apart); empty without a topic id."""
    from bolide.facade.kafka import topic_identity
    from bolide.stores import SqlStore

    identity = topic_identity(cluster, name)
    if identity is None:
        return {}
    with SqlStore(url) as store:
        return {name: store.identify(name, identity)[0].stored_as}


def _same_topic(first: str, keys: dict[str, str]) -> None:
    """Refuse a micro-batch of a query that began on another topic of the same name: the
    checkpoint's offsets are the old topic's, and the new one is archived from its start
    only by a query with a new checkpoint.

    Raises:
        TopicRecreatedError: The topic was deleted and created again since the query began.
    """
    ((name, key),) = keys.items()
    if key != first:
        raise TopicRecreatedError(
            f"{name!r} was deleted and created again while the archive job ran: start it "
            "again with a new checkpoint (the old one's offsets are the old topic's); the "
            "new topic is archived apart from the old one (docs/history.md)",
            stream=name,
            old_topic_id=first.partition("@")[2] or "unknown",
            topic_id=key.partition("@")[2] or "unknown",
        )


def _archive_batches(
    url: str,
    serde: Any | None,
    on_batch: BatchCallback | None,
    topic: tuple[Cluster, str] | None = None,
) -> Callable[[DataFrame, int], None]:
    """The archive job's batch writer: the driver learns which incarnation the ``topic``
    (cluster, name) is now, the executors write their partitions into it, the driver gets the
    counts and reports."""

    first: dict[str, str] = {}

    def write(batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        keys = _key(url, *topic) if topic is not None else None
        if keys:
            _same_topic(first.setdefault(*next(iter(keys.items()))), keys)
        rows, inserted = archive_partitions(batch, url, serde, keys)
        report = BatchReport(batch_id, rows, inserted, 0, time.monotonic() - began)
        log.info("archive batch %d: %d rows, %d new", batch_id, rows, inserted)
        if on_batch is not None:
            on_batch(report)

    return write


def resequence(
    spark: SparkSession,
    stream: str | StreamConfig,
    output: str | StreamConfig,
    checkpoint: str,
    *,
    bootstrap: str | Cluster,
    mode: Literal["batch", "stream"] = "batch",
    timeout_s: float = 30.0,
    on_timeout: Literal["release", "dead_letter"] = "release",
    dead_letter: str | StreamConfig | None = None,
    source: Source = "auto",
    starting_offsets: str = "earliest",
    trigger_interval_s: float = 1.0,
    on_batch: BatchCallback | None = None,
    options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Publish each sequence group's records to ``output`` in order (stateful streaming).

    Groups are read from the ``bolide.seq.*`` headers (see ``resequenced`` for the rules).
    Released records keep their key (so a group stays on one partition), payload and headers;
    dead letters go to ``dead_letter`` with ``bolide.reason`` and ``bolide.reason.detail``
    headers, or are logged and dropped without one. Publishing is at least once: a batch
    Spark replays after a crash is published again.

    Args (and those every job takes, in the module's docstring; timeouts are checked at each
    trigger):
        stream: Input stream.
        output: Stream receiving the records in order (created if missing).
        checkpoint: Spark checkpoint directory (offsets and group state).
        mode: ``"batch"`` or ``"stream"`` (see ``resequenced``).
        timeout_s: Seconds a group has to complete, from its first record.
        on_timeout: ``"release"`` or ``"dead_letter"``.
        dead_letter: Dead-letter stream; required for ``on_timeout="dead_letter"``.

    Returns:
        The running query; call ``stop()`` to end it.
    """
    if on_timeout == "dead_letter" and dead_letter is None:
        raise ValueError("on_timeout='dead_letter' needs a dead_letter stream")
    cluster = _cluster(bootstrap)
    out_stream = _stream(output)
    df = read_stream(
        spark, stream, cluster, source=source, starting_offsets=starting_offsets, options=options
    )
    ordered = resequenced(df, mode=mode, timeout_s=timeout_s, on_timeout=on_timeout)
    dead = _stream(dead_letter) if dead_letter is not None else None
    for target in (out_stream, dead):
        if target is not None:
            ensure_topic(cluster, target)  # once here, not by every task

    writer = ordered.writeStream.queryName(f"bolide-resequence-{out_stream.name}")
    writer = writer.foreachBatch(_release_batches(cluster, out_stream, dead, on_batch))
    return _start(writer, checkpoint, False, trigger_interval_s)


def _release_batches(
    cluster: Cluster,
    output: StreamConfig,
    dead: StreamConfig | None,
    on_batch: BatchCallback | None,
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function of ``resequence``: the executors publish a micro-batch's
    released records (each group in sequence order) and dead letters; the driver reports."""

    def write(batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        rows, published, dead_letters = publish_partitions(batch, cluster, output, dead)
        report = BatchReport(batch_id, rows, published, dead_letters, time.monotonic() - began)
        if on_batch is not None:
            on_batch(report)

    return write


def _check_typed_serde(serde: object) -> None:
    """A typed table needs a serde that names each payload's writer schema (``AvroSerde``,
    ``ProtobufSerde``, ``JsonSchemaSerde``)."""
    if serde is not None and not (
        callable(getattr(serde, "payload_schema_id", None))
        and callable(getattr(serde, "value_schema", None))
    ):
        raise TypeError(
            "serde must be an AvroSerde, a ProtobufSerde or a JsonSchemaSerde (a typed table "
            "needs the writer schema), "
            f"not {type(serde).__name__}"
        )


def query(
    spark: SparkSession,
    sql: str,
    store: str | SqlStore,
    streams: Sequence[str] | None = None,
    *,
    view: str = "records",
    via: Literal["auto", "jdbc", "store"] = "auto",
) -> DataFrame:
    """Run Spark SQL over archived records.

    The archive is loaded (``load_archive``) as the temporary view ``view``, with the Kafka
    source's columns (``topic`` is the stream name) plus ``headers``.

    Args:
        spark: The session.
        sql: A Spark SQL query over ``view``.
        store: ``SqlStore`` or its SQLAlchemy URL.
        streams: Streams to load; all archived streams when ``None``.
        view: Name of the temporary view.
        via: ``"jdbc"`` (Spark reads the tables itself; needs the JDBC driver on the
            classpath), ``"store"`` (pages through ``SqlStore.read`` in the driver), or
            ``"auto"`` (JDBC when the driver is there).

    Returns:
        The query's DataFrame.
    """
    load_archive(spark, store, streams, via=via).createOrReplaceTempView(view)
    return spark.sql(sql)
