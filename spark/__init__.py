"""PySpark sources and jobs over bolide streams (needs the ``spark`` extra).

``kafka_stream``/``kafka_batch`` configure Spark's own Kafka source from bolide's config;
``register`` adds ``format("bolide")``, a Python source with the same schema that splices in
the SQL history (``cluster_source_options`` carries a ``Cluster``'s own fields to it);
``archive``, ``resequence`` and ``query`` are the jobs behind ``bolide spark <job>``.
"""

try:
    import pyspark  # noqa: F401 - only checks the extra is installed
except ImportError as exc:  # pragma: no cover - exercised without pyspark only
    raise ModuleNotFoundError(
        "bolide.spark needs PySpark and pandas: pip install 'bolide[spark]'", name="pyspark"
    ) from exc

from bolide.spark._archive import StoreNotSharedError, load_archive
from bolide.spark._options import cluster_source_options
from bolide.spark._resequence import resequenced
from bolide.spark.jobs import BatchReport, archive, query, read_stream, resequence
from bolide.spark.kafka import (
    ConnectorNotFoundError,
    connector_coordinates,
    kafka_batch,
    kafka_options,
    kafka_stream,
)
from bolide.spark.session import spark_session
from bolide.spark.source import KAFKA_SCHEMA, BolideDataSource, register

__all__ = [
    "KAFKA_SCHEMA",
    "BatchReport",
    "BolideDataSource",
    "ConnectorNotFoundError",
    "StoreNotSharedError",
    "archive",
    "cluster_source_options",
    "connector_coordinates",
    "kafka_batch",
    "kafka_options",
    "kafka_stream",
    "load_archive",
    "query",
    "read_stream",
    "register",
    "resequence",
    "resequenced",
    "spark_session",
]
