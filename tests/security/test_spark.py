"""Spark's own Kafka source (a Java client) on the secured broker: ``kafka_batch`` and
``kafka_stream`` log in with the ``Cluster``'s SCRAM user and trust its CA, as
``kafka.sasl.jaas.config`` and a PEM trust store, and read every record whole, holding only the
ACLs docs/kafka-estate.md lists for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from bolide.facade import EmbeddedBroker, Record, Subscriber, SubscriberConfig
from bolide.facade.kafka import admin_client
from bolide.spark import kafka_batch, kafka_options, kafka_stream, register
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.security.conftest import LEASE_MS, UserFactory, grant, needs_kafka, new_stream
from tests.spark.conftest import publish, sample, spark, spark_sessions

pytestmark = [pytest.mark.kafka, pytest.mark.spark, needs_kafka]

__all__ = ["spark", "spark_sessions"]  # the Spark fixtures, shared with tests/spark

PREFIXED = ResourcePatternType.PREFIXED


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


def test_the_bolide_source_reads_archived_and_live_records_with_its_acls(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    spark: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """``format("bolide")`` splices the SQL history in front of a trimmed, secured stream for
    a user with READ on the topic and DESCRIBE on the groups its consumers are in: those
    ``groupIdPrefix`` names (prefixed), or the one ``kafka.group.id`` names."""
    stream = new_stream(secured, "spliced-secured")
    admin = secured.cluster()
    records = sample(40)
    publish(admin, stream, records[:30])
    url = upgraded_db_url("sqlite", tmp_path, request)
    with SqlStore(url) as store:
        assert Archiver(admin, store, [stream]).run(until_caught_up=True).inserted == 30
    trim = admin_client(admin)
    for done in trim.delete_records([TopicPartition(stream.name, 0, 12)]).values():
        done.result(60)  # Kafka holds 12.., the store 0..29
    publish(admin, stream, records[30:])  # live only
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.READ)])
    name = str(user.settings["sasl.username"])
    register(spark)
    options = kafka_options(stream, user, includeHeaders=True, startingOffsets="earliest")
    reader = spark.read.format("bolide").options(**options).option("bolide.store", url)

    # No group ACL: the consumers' throwaway groups are refused, and the error says what to grant.
    with pytest.raises(Exception, match="DESCRIBE on groups prefixed 'bolide-spark-'"):
        reader.load().collect()

    grant(admin, name, [(ResourceType.GROUP, "billing-spark-", AclOperation.DESCRIBE)], PREFIXED)
    rows = reader.option("groupIdPrefix", "billing-spark").load().collect()
    assert sorted(_row(r) for r in rows) == _sent(records)

    grant(admin, name, [(ResourceType.GROUP, "billing-spark", AclOperation.DESCRIBE)])
    seen: list[Any] = []
    query = (
        spark.readStream.format("bolide")
        .options(**options)
        .option("bolide.store", url)
        .option("kafka.group.id", "billing-spark")
        .load()
        .writeStream.foreachBatch(lambda df, _: seen.extend(_row(r) for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert sorted(seen) == _sent(records)


def test_spark_reads_over_mutual_tls(spark: Any, tmp_path: Path) -> None:
    """Spark's Kafka source presents the ``Cluster``'s client certificate (a PEM key store) to
    an ``"ssl"`` broker and reads every record whole as that certificate's user; so does
    ``format("bolide")``, which maps the key store back for librdkafka."""
    with EmbeddedBroker(engine="kafka", security="ssl", log_path=tmp_path / "k.log") as broker:
        admin = broker.cluster()
        stream = new_stream(broker, "spark-mtls")
        records = sample(20)
        publish(admin, stream, records)
        user = broker.cluster(**broker.add_user("spark-reader"))
        grant(admin, "spark-reader", [(ResourceType.TOPIC, stream.name, AclOperation.READ)])
        grant(
            admin,
            "spark-reader",
            [(ResourceType.GROUP, "bolide-spark-", AclOperation.DESCRIBE)],
            PREFIXED,
        )
        options = kafka_options(stream, user, includeHeaders=True, startingOffsets="earliest")
        assert options["kafka.security.protocol"] == "SSL"
        assert options["kafka.ssl.keystore.type"] == "PEM"
        assert options["kafka.ssl.truststore.location"] == broker.ca_location

        rows = kafka_batch(spark, stream, user, includeHeaders=True).collect()
        assert sorted(_row(r) for r in rows) == _sent(records)
        register(spark)
        rows = spark.read.format("bolide").options(**options).load().collect()
        assert sorted(_row(r) for r in rows) == _sent(records)
