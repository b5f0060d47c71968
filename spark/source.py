"""``format("bolide")``: a Spark Python data source that reads streams like Spark's Kafka source.

It has the Kafka source's schema and option names, reads through confluent-kafka (so it needs
no connector jar), keeps its offsets in Spark's checkpoint, and splices in the SQL history
(``bolide.store``) for positions Kafka no longer holds::

    register(spark)
    df = (spark.readStream.format("bolide")
          .option("kafka.bootstrap.servers", "host:9092")
          .option("subscribe", "orders")
          .option("startingOffsets", "earliest")
          .option("bolide.store", "postgresql+psycopg://user@host/db")
          .load())
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from bolide.spark._options import Offsets, SourceOptions
from bolide.spark._reader import ReadRange, cap_offsets, ranges, read_range

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["KAFKA_SCHEMA", "BolideDataSource", "register"]

#: The schema of Spark's Kafka source; ``headers`` only with ``includeHeaders=true``, as there.
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_HEADERS = "headers array<struct<key:string,value:binary>>"


def _range(partition: InputPartition) -> ReadRange:
    rng = partition.value
    if not isinstance(rng, ReadRange):
        raise TypeError(f"not a bolide read range: {rng!r}")
    return rng


class _BatchReader(DataSourceReader):
    """Reads ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        start = self.options.resolve(self.options.starting)
        end = self.options.resolve(self.options.ending, omitted=-1)
        return [InputPartition(r) for r in ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_range(self.options, _range(partition))


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges; the offsets live in Spark's checkpoint."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None  # availableNow: the end to stop at

    def initialOffset(self) -> dict[str, Any]:
        return self.options.resolve(self.options.starting)

    def _ends(self) -> Offsets:
        return self.options.resolve("latest")

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> dict[str, Any]:
        ends = self._target if self._target is not None else self._ends()
        # Never move backwards (a broker that lost data must not rewind the checkpoint).
        merged: Offsets = {
            topic: {p: max(o, start.get(topic, {}).get(p, o)) for p, o in parts.items()}
            for topic, parts in ends.items()
        }
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return cap_offsets(start, merged, rows)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._ends()

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        # Partitions created since ``start`` begin at their earliest, as in the Kafka source.
        full = {topic: dict(parts) for topic, parts in start.items()}
        for topic, parts in end.items():
            new = [int(p) for p in parts if p not in full.get(topic, {})]
            if new:
                early = self.options.earliest(topic, new)
                full.setdefault(topic, {}).update({str(p): o for p, o in early.items()})
        return [InputPartition(r) for r in ranges(full, end)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_range(self.options, _range(partition))

    def commit(self, end: Offsets) -> None:
        """Nothing to do: positions are Spark's checkpoint, never Kafka commits."""


class BolideDataSource(DataSource):
    """``format("bolide")``: the Kafka source's schema and options, plus the SQL history.

    Options (case-insensitive, as in Spark): ``kafka.bootstrap.servers`` (required) and any
    other ``kafka.<librdkafka setting>``; ``subscribe`` (required, comma-separated topics);
    ``startingOffsets`` (``earliest``/``latest``/JSON; default latest for streams, earliest for
    batch); ``endingOffsets`` (batch; ``latest``/JSON); ``maxOffsetsPerTrigger``;
    ``includeHeaders``; ``failOnDataLoss`` (default true); ``groupIdPrefix`` (the consumers'
    throwaway groups are ``<prefix>-<random>``, default ``bolide-spark``) or ``kafka.group.id``
    (one group for all): they never join or commit, yet need ``DESCRIBE`` where ACLs apply;
    ``bolide.store`` (SQLAlchemy URL of the history store to splice in).
    """

    @classmethod
    def name(cls) -> str:
        return "bolide"

    def schema(self) -> str:
        include = SourceOptions.parse(self.options, batch=False).include_headers
        return f"{KAFKA_SCHEMA}, {_HEADERS}" if include else KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(SourceOptions.parse(self.options, batch=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(SourceOptions.parse(self.options, batch=False))


def register(spark: SparkSession) -> None:
    """Add ``format("bolide")`` to ``spark`` (once per session is enough; repeats are harmless)."""
    spark.dataSource.register(BolideDataSource)
