"""Spark's own Kafka source (a Java client) on the secured broker: ``kafka_batch`` and
``kafka_stream`` log in with the ``Cluster``'s SCRAM user and trust its CA, as
``kafka.sasl.jaas.config`` and a PEM trust store, and read every record whole, holding only the
ACLs docs/kafka-estate.md lists for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import EmbeddedBroker, Record, Subscriber, SubscriberConfig
from bolide.spark import kafka_batch, kafka_options, kafka_stream
from tests.conftest import eventually
from tests.security.conftest import LEASE_MS, UserFactory, needs_kafka, new_stream
from tests.spark.conftest import publish, sample, spark, spark_sessions

pytestmark = [pytest.mark.kafka, pytest.mark.spark, needs_kafka]

__all__ = ["spark", "spark_sessions"]  # the Spark fixtures, shared with tests/spark


def _row(row: Any) -> tuple[int, int, bytes | None, bytes, list[tuple[str, bytes]]]:
    key = bytes(row["key"]) if row["key"] is not None else None
    headers = [(h["key"], bytes(h["value"])) for h in row["headers"] or []]
    return row["partition"], row["offset"], key, bytes(row["value"]), headers


def _sent(records: list[Record]) -> list[tuple[int, int, bytes | None, bytes, list[Any]]]:
    return sorted(
        (
            int(r.partition or 0),
            int(r.offset or 0),
            r.key.encode() if isinstance(r.key, str) else r.key,
            bytes(r.data or b""),
            list(r.headers),
        )
        for r in records
    )


def test_spark_kafka_source_reads_a_secured_stream_with_its_acls(
    secured: EmbeddedBroker, user_factory: UserFactory, spark: Any, tmp_path: Path
) -> None:
    stream = new_stream(secured, "spark-secured")
    records = sample(20)
    publish(secured.cluster(), stream, records)
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, "spark-billing", AclOperation.READ),
        ]
    )
    options = kafka_options(stream, user)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert "ScramLoginModule" in options["kafka.sasl.jaas.config"]
    assert options["kafka.ssl.truststore.location"] == secured.ca_location

    rows = kafka_batch(spark, stream, user, includeHeaders=True).collect()
    assert sorted(_row(r) for r in rows) == _sent(records)

    # A group's confirms as the stream's start: the group confirms the first 5 records.
    config = SubscriberConfig(stream=stream, group="spark-billing", lease_timeout_ms=LEASE_MS)
    with Subscriber(user, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(500)) or len(got) >= 5, 120)
        sub.confirm(4, 0)
        eventually(lambda: sub.committed() == {0: 5}, 60)
    seen: list[Any] = []
    query = (
        kafka_stream(spark, stream, user, group="spark-billing", includeHeaders=True)
        .writeStream.foreachBatch(lambda df, _: seen.extend(_row(r) for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert sorted(seen) == _sent(records)[5:]
