"""Spark's own Kafka source, configured from bolide's stream, cluster and subscriber group.

``kafka_options`` is the mapping alone (a dict of Spark option strings), so it can be checked
without Spark; ``kafka_stream`` and ``kafka_batch`` hand it to ``format("kafka")``. That format
lives in a separate connector jar: when it is missing, ``ConnectorNotFoundError`` names the exact
package coordinates for the running Spark and Scala versions and how to add them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, TopicPartition

from bolide.facade.config import Cluster, InitialOffsetScheme, StreamConfig
from bolide.facade.errors import BolideError, InvalidInitialOffsetSchemeError, OffsetLoadError
from bolide.facade.kafka import CONSUMER_DEFAULTS, committed_offsets, ensure_topic
from bolide.spark._java_settings import java_client_settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "KAFKA_PROVIDER_CLASS",
    "ConnectorNotFoundError",
    "connector_coordinates",
    "has_connector",
    "kafka_batch",
    "kafka_options",
    "kafka_stream",
    "require_connector",
    "starting_offsets_json",
]

#: The class Spark loads for ``format("kafka")``; it ships in the connector jar only.
KAFKA_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

#: Spark's symbolic offsets inside a ``startingOffsets``/``endingOffsets`` JSON.
SPARK_EARLIEST, SPARK_LATEST = -2, -1

#: Consumer settings Spark's Kafka source refuses (it manages them itself) or that only make
#: sense to librdkafka clients; they are left out of the ``kafka.*`` passthrough.
_REFUSED = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "group.id",
        "interceptor.classes",
        "key.deserializer",
        "value.deserializer",
        "logger",
    }
)


class ConnectorNotFoundError(BolideError, RuntimeError):
    """Spark's Kafka connector (``spark-sql-kafka-0-10``) is not on the classpath.

    Attributes:
        coordinates: The Maven coordinates to add, for the running Spark and Scala versions.
    """

    def __init__(self, coordinates: str) -> None:
        super().__init__(
            f"Spark's Kafka source ({KAFKA_PROVIDER_CLASS}) is not on the classpath. Add the "
            f"connector package {coordinates}: build the session with "
            f'.config("spark.jars.packages", "{coordinates}") before it starts, or run '
            f"spark-submit --packages {coordinates} ...; where no Maven repository is reachable "
            "use bolide's own source instead: bolide.spark.register(spark) and "
            'spark.readStream.format("bolide")'
        )
        self.coordinates = coordinates


def _spark_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, InitialOffsetScheme):
        return value.value
    if isinstance(value, int | float | str):
        return str(value)
    raise TypeError(f"Spark option values must be str, int, float or bool, not {value!r}")


def _cluster_options(cluster: Cluster) -> dict[str, str]:
    """``kafka.*`` options of ``cluster``, by the Java client's names (``format("bolide")``
    maps them back to librdkafka's)."""
    settings = java_client_settings(cluster.settings)
    options = {"kafka.bootstrap.servers": cluster.bootstrap_servers}
    for key, value in settings.items():
        if key in _REFUSED or callable(value):
            continue
        options[f"kafka.{key}"] = _spark_value(value)
    return options


def starting_offsets_json(
    topic: str, committed: Mapping[int, int | None], fallback: InitialOffsetScheme
) -> str:
    """Spark's ``startingOffsets`` JSON from a group's committed offsets.

    Args:
        topic: The topic.
        committed: Kafka's committed offset per partition (the next offset to read), or
            ``None`` (or a negative value) where the group committed nothing.
        fallback: Where partitions without a commit start: EARLIEST or LATEST.

    Returns:
        ``{"topic": {"0": 23, "1": -2}}`` as Spark expects it (-2 earliest, -1 latest).
    """
    symbolic = SPARK_LATEST if fallback is InitialOffsetScheme.LATEST else SPARK_EARLIEST
    positions = {
        str(p): (offset if offset is not None and offset >= 0 else symbolic)
        for p, offset in sorted(committed.items())
    }
    return json.dumps({topic: positions}, separators=(",", ":"))


def _committed(cluster: Cluster, stream: StreamConfig, group: str) -> dict[int, int | None]:
    partitions = ensure_topic(cluster, stream)
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": group}))
    try:
        found = committed_offsets(
            consumer, [TopicPartition(stream.name, p) for p in range(partitions)]
        )
    finally:
        consumer.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}


def _scheme(value: object, grouped: bool) -> InitialOffsetScheme | None:
    """The scheme a ``startingOffsets`` value names, or ``None`` for Spark's JSON."""
    if isinstance(value, InitialOffsetScheme):
        scheme = value
    elif isinstance(value, str) and value.strip().lower() in {"earliest", "latest", "none", "auto"}:
        scheme = InitialOffsetScheme(value.strip().lower())
    else:
        return None
    if scheme is InitialOffsetScheme.AUTO:
        return InitialOffsetScheme.EARLIEST if grouped else InitialOffsetScheme.LATEST
    return scheme


def kafka_options(
    stream: StreamConfig, cluster: Cluster, group: str | None = None, **options: Any
) -> dict[str, str]:
    """Options for Spark's ``format("kafka")`` from bolide's config.

    Args:
        stream: The stream; its topic becomes ``subscribe``.
        cluster: Bootstrap servers and settings, as ``kafka.<name>`` by the Java client's
            names (``kafka.sasl.jaas.config``, PEM trust and key stores: docs/spark.md),
            minus those Spark manages (``group.id``, ``auto.offset.reset``...).
        group: A subscriber group whose confirmed offsets become ``startingOffsets``
            (Spark's JSON); partitions it never confirmed start per the scheme.
        **options: Spark options by Spark's names (``startingOffsets``, ``endingOffsets``,
            ``failOnDataLoss``, ``maxOffsetsPerTrigger``, ``includeHeaders``...), passed
            through as strings. ``startingOffsets`` also takes an ``InitialOffsetScheme`` or
            ``"auto"``: the initial offset schemes (docs/concepts.md), so AUTO is EARLIEST for a
            subscriber group and LATEST without.

    Returns:
        Option names to string values.

    Raises:
        InvalidInitialOffsetSchemeError: NONE without a group.
        OffsetLoadError: NONE with a group that confirmed nothing.
        TypeError: An option value is not a str, int, float or bool.
        ValueError: A client certificate and its key in two files (Java reads one).
    """
    if not isinstance(stream, StreamConfig):
        raise TypeError("stream must be a StreamConfig")
    if not isinstance(cluster, Cluster):
        raise TypeError("cluster must be a Cluster")
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError("group must be a non-empty string or None")
    result = _cluster_options(cluster)
    result["subscribe"] = stream.name
    starting = options.pop("startingOffsets", InitialOffsetScheme.AUTO)
    scheme = _scheme(starting, grouped=group is not None)
    if scheme is InitialOffsetScheme.NONE and group is None:
        raise InvalidInitialOffsetSchemeError(
            "startingOffsets NONE needs a group with confirmed offsets", stream=stream.name
        )
    if group is not None and scheme is not None:
        committed = _committed(cluster, stream, group)
        if scheme is InitialOffsetScheme.NONE and all(v is None for v in committed.values()):
            raise OffsetLoadError(
                f"group {group!r} has no confirmed offset on {stream.name!r} and "
                "startingOffsets is NONE",
                stream=stream.name,
            )
        fallback = InitialOffsetScheme.LATEST
        if scheme is not InitialOffsetScheme.LATEST:
            fallback = InitialOffsetScheme.EARLIEST
        result["startingOffsets"] = starting_offsets_json(stream.name, committed, fallback)
    elif scheme is not None:
        result["startingOffsets"] = scheme.value
    else:
        result["startingOffsets"] = _spark_value(starting)
    for name, value in options.items():
        result[name] = _spark_value(value)
    return result


def connector_coordinates(spark: SparkSession) -> str:
    """``org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark>`` for the running session."""
    scala = "2.13"  # Spark 4 is built for Scala 2.13 only
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        try:
            full = str(jvm.scala.util.Properties.versionNumberString())
            scala = ".".join(full.split(".")[:2])
        except Exception:  # a JVM without scala.util on its path: keep Spark 4's default
            pass
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark.version}"


def require_connector(spark: SparkSession) -> None:
    """Raise ``ConnectorNotFoundError`` unless Spark's Kafka source can be loaded.

    Only a classic (JVM) session can be checked up front; a Spark Connect session reports a
    missing connector when the query is analysed, which ``kafka_stream`` also translates.
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(KAFKA_PROVIDER_CLASS, False, loader)
    except Exception as exc:
        if "ClassNotFoundException" not in str(exc):
            raise
        raise ConnectorNotFoundError(connector_coordinates(spark)) from None


def has_connector(spark: SparkSession) -> bool:
    """True when a classic (JVM) session can load Spark's Kafka source; a Spark Connect
    session cannot be checked up front, and counts as without it."""
    if getattr(spark, "_jvm", None) is None:
        return False
    try:
        require_connector(spark)
    except ConnectorNotFoundError:
        return False
    return True


def _load(spark: SparkSession, options: dict[str, str], *, streaming: bool) -> DataFrame:
    require_connector(spark)
    reader = spark.readStream if streaming else spark.read
    try:
        return reader.format("kafka").options(**options).load()
    except Exception as exc:
        if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source" in str(exc):
            raise ConnectorNotFoundError(connector_coordinates(spark)) from exc
        raise


def kafka_stream(
    spark: SparkSession,
    stream: StreamConfig,
    cluster: Cluster,
    group: str | None = None,
    **options: Any,
) -> DataFrame:
    """A streaming DataFrame from Spark's own Kafka source (``readStream.format("kafka")``).

    Args:
        spark: The session; it needs the Kafka connector package.
        stream: The stream to read.
        cluster: Where it lives.
        group: Start from this subscriber group's confirmed offsets.
        **options: Further Spark options (see ``kafka_options``).

    Raises:
        ConnectorNotFoundError: The connector is not on the classpath.
    """
    return _load(spark, kafka_options(stream, cluster, group, **options), streaming=True)


def kafka_batch(
    spark: SparkSession,
    stream: StreamConfig,
    cluster: Cluster,
    group: str | None = None,
    **options: Any,
) -> DataFrame:
    """A batch DataFrame from Spark's own Kafka source (``read.format("kafka")``).

    ``startingOffsets`` defaults to EARLIEST (Spark refuses LATEST as a batch start) and
    ``endingOffsets`` to Spark's ``latest``.

    Raises:
        ConnectorNotFoundError: The connector is not on the classpath.
    """
    options.setdefault("startingOffsets", InitialOffsetScheme.EARLIEST)
    return _load(spark, kafka_options(stream, cluster, group, **options), streaming=False)
