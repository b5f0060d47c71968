"""Publishing a micro-batch from the executors that hold it (the resequence job's sink).

The driver never sees the rows: ``publish_partitions`` shuffles the batch so that each
sequence group (and each input partition's unsequenced records) sits in one Spark partition,
sorts each partition into release order, and has every task publish its rows through its own
``Publisher``. Only the counts come back to the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from bolide.facade.config import Cluster, PublisherConfig, StreamConfig
from bolide.facade.deadletter import letter
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["publish_partitions"]

log = logging.getLogger("bolide.spark")
_FLUSH_S = 60.0


class _Sink:
    """One task's publishers (opened on its first row) and the futures of what it sent."""

    def __init__(self, cluster: Cluster, output: StreamConfig, dead: StreamConfig | None) -> None:
        self._cluster, self._output, self._dead_stream = cluster, output, dead
        self._out: Publisher | None = None
        self._dead: Publisher | None = None
        self._sent: list[Future[Any]] = []
        self.rows = self.published = self.dead_letters = 0

    def take(self, row: dict[str, Any]) -> None:
        """Publish one released row, or dead-letter it (log and drop without a stream)."""
        self.rows += 1
        headers = [(h["key"], h["value"] or b"") for h in row["headers"] or []]
        record = Record(row["value"] or b"", key=row["key"], headers=headers)
        if row["reason"] is None:
            if self._out is None:
                self._out = Publisher(self._cluster, PublisherConfig(stream=self._output))
            self._sent.append(self._out.publish_async(record))
            self.published += 1
            return
        self.dead_letters += 1
        if self._dead_stream is None:
            log.warning("dropping %s[%s]@%s: %s (%s)", row["topic"], row["partition"],
                        row["offset"], row["reason"], row["detail"])  # fmt: skip
            return
        if self._dead is None:
            self._dead = Publisher(self._cluster, PublisherConfig(stream=self._dead_stream))
        self._sent.append(self._dead.publish_async(letter(record, row["reason"], row["detail"])))

    def close(self) -> None:
        """Wait for every acknowledgement; the first failure fails the task (Spark runs it
        again: publishing is at least once)."""
        for publisher in (self._out, self._dead):
            if publisher is not None:
                publisher.close(_FLUSH_S)
        for future in self._sent:
            error = future.exception()
            if error is not None:
                raise error


def publish_partitions(
    batch: DataFrame, cluster: Cluster, output: StreamConfig, dead: StreamConfig | None
) -> tuple[int, int, int]:
    """Publish ``batch`` (``resequenced`` rows) from the executors; return (rows, published,
    dead letters), the only data that reaches the driver.

    Each sequence group keeps its records in sequence order and each input partition its
    unsequenced records in offset order: they are shuffled into one Spark partition by
    (topic, partition, group) and sorted there. Released records keep their key, so a group
    stays on one output partition.
    """
    from pyspark.sql import functions as F

    group = F.coalesce(F.col("seq_group"), F.lit(""))
    number = F.coalesce(F.col("seq_number"), F.lit(0))
    ordered = batch.repartition(F.col("topic"), F.col("partition"), group)
    ordered = ordered.sortWithinPartitions(
        F.col("topic"), F.col("partition"), group, number, F.col("offset")
    )

    def publish(chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        sink = _Sink(cluster, output, dead)
        try:
            for chunk in chunks:
                for row in chunk.to_pylist():
                    sink.take(row)
        finally:
            sink.close()
        yield pa.RecordBatch.from_pydict(
            {"rows": [sink.rows], "published": [sink.published], "dead": [sink.dead_letters]}
        )

    totals = (
        ordered.mapInArrow(publish, "rows long, published long, dead long")
        .agg(
            F.sum("rows").alias("rows"),
            F.sum("published").alias("published"),
            F.sum("dead").alias("dead"),
        )
        .first()
    )
    if totals is None:
        return 0, 0, 0
    return int(totals["rows"] or 0), int(totals["published"] or 0), int(totals["dead"] or 0)
