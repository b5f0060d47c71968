"""Spark's Kafka connector (``spark-sql-kafka-0-10``) as jars in the user cache.

``bolide fetch spark-kafka`` copies the connector of the installed PySpark version, with the
few jars PySpark does not ship itself (the Kafka client, the token provider, commons-pool2);
``spark_session()`` then puts them on ``spark.jars``, so ``format("kafka")`` works offline.
"""

from __future__ import annotations

from pathlib import Path

import pyspark

from bolide.facade.broker.jars import Artifacts

__all__ = ["SPARK_KAFKA", "connector_jars", "connector_package"]

#: The connector's jars for the installed PySpark (the versions must be equal).
SPARK_KAFKA = Artifacts(
    "spark-kafka",
    Path(__file__).with_name("spark-kafka-pom.xml"),
    pyspark.__version__,
    include=(
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
        "kafka-clients",
        "commons-pool2",
    ),
)


def connector_package() -> str:
    """The connector's Maven coordinates, for ``spark.jars.packages``."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def connector_jars() -> list[str] | None:
    """The fetched connector jars, or ``None`` when ``bolide fetch spark-kafka`` has not run."""
    jars = SPARK_KAFKA.jars()
    return None if jars is None else [str(jar) for jar in jars]


if __name__ == "__main__":  # `python -m bolide.spark.connector`: the coordinates, for scripts
    print(connector_package())
