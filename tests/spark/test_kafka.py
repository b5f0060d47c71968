"""Spark's own Kafka source: the option mapping alone, group offsets, the missing connector."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    InvalidInitialOffsetSchemeError,
    OffsetLoadError,
    StreamConfig,
)
from bolide.spark import ConnectorNotFoundError, kafka_batch, kafka_options
from bolide.spark._options import SourceOptions
from bolide.spark.kafka import connector_coordinates, require_connector, starting_offsets_json

from .conftest import publish, sample

ORDERS = StreamConfig(name="orders")


def test_options_map_bootstrap_topic_and_passthrough_settings() -> None:
    cluster = Cluster(
        "b1:9092,b2:9092",
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "app",
            "sasl.password": "s3cret",
            "socket.timeout.ms": 5000,
            "enable.auto.commit": True,  # Spark manages commits itself: left out
            "auto.offset.reset": "earliest",  # Spark refuses it: left out
        },
    )
    opts = kafka_options(ORDERS, cluster)
    assert opts["kafka.bootstrap.servers"] == "b1:9092,b2:9092"
    assert opts["subscribe"] == "orders"
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.socket.timeout.ms"] == "5000"
    assert "kafka.enable.auto.commit" not in opts
    assert "kafka.auto.offset.reset" not in opts
    # Java clients need a JAAS line where librdkafka takes username/password, which Java
    # does not know.
    assert opts["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="app" password="s3cret";'
    )
    assert "kafka.sasl.username" not in opts and "kafka.sasl.password" not in opts
    assert all(isinstance(v, str) for v in opts.values())


def test_tls_and_sasl_settings_become_the_java_clients() -> None:
    cluster = Cluster(
        "b:9093",
        **{
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": 'we"ird\\user',
            "sasl.password": "p",
            "ssl.ca.location": "/etc/kafka/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
        },
    )
    opts = kafka_options(ORDERS, cluster)
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "PLAIN"
    assert opts["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="we\\"ird\\\\user" password="p";'
    )
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert opts["kafka.ssl.truststore.location"] == "/etc/kafka/ca.pem"
    assert opts["kafka.ssl.endpoint.identification.algorithm"] == ""
    for librdkafka_only in ("ssl.ca.location", "sasl.mechanisms", "sasl.username"):
        assert f"kafka.{librdkafka_only}" not in opts
    # format("bolide") takes the same options and maps them back for librdkafka.
    parsed = SourceOptions.parse(opts, batch=False)
    assert parsed.cluster().settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": 'we"ird\\user',
        "sasl.password": "p",
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_a_client_certificate_is_a_pem_key_store_in_one_file() -> None:
    pem = {"ssl.certificate.location": "/c/me.pem", "ssl.key.location": "/c/me.pem"}
    opts = kafka_options(ORDERS, Cluster("b:9093", **{"security.protocol": "SSL", **pem}))
    assert (opts["kafka.ssl.keystore.type"], opts["kafka.ssl.keystore.location"]) == (
        "PEM",
        "/c/me.pem",
    )
    assert "kafka.ssl.key.location" not in opts
    assert SourceOptions.parse(opts, batch=False).cluster().settings == {
        "security.protocol": "SSL",
        **pem,
    }
    apart = {"ssl.certificate.location": "/c/me.pem", "ssl.key.location": "/c/me.key"}
    with pytest.raises(ValueError, match="one PEM file"):
        kafka_options(ORDERS, Cluster("b:9093", **apart))


def test_a_jaas_line_format_bolide_cannot_read_is_a_clear_error() -> None:
    opts = {
        "kafka.bootstrap.servers": "b:9093",
        "subscribe": "orders",
        "kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required;",
    }
    with pytest.raises(ValueError, match=r"kafka\.sasl\.username"):
        SourceOptions.parse(opts, batch=False)


def test_spark_options_pass_through_as_strings() -> None:
    opts = kafka_options(
        ORDERS,
        Cluster("b:9092"),
        startingOffsets="earliest",
        failOnDataLoss=False,
        maxOffsetsPerTrigger=1000,
        includeHeaders=True,
        minPartitions=4,
    )
    assert opts["startingOffsets"] == "earliest"
    assert opts["failOnDataLoss"] == "false"
    assert opts["maxOffsetsPerTrigger"] == "1000"
    assert opts["includeHeaders"] == "true"
    assert opts["minPartitions"] == "4"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, "latest"),  # AUTO without a group acts as LATEST (Meteor's table)
        (InitialOffsetScheme.AUTO, "latest"),
        (InitialOffsetScheme.EARLIEST, "earliest"),
        ("LATEST", "latest"),
        ('{"orders":{"0":7}}', '{"orders":{"0":7}}'),
    ],
)
def test_starting_offsets_without_group(given: Any, expected: str) -> None:
    extra = {} if given is None else {"startingOffsets": given}
    assert kafka_options(ORDERS, Cluster("b:9092"), **extra)["startingOffsets"] == expected


def test_bad_options_raise_typed_errors() -> None:
    with pytest.raises(InvalidInitialOffsetSchemeError, match="needs a group"):
        kafka_options(ORDERS, Cluster("b:9092"), startingOffsets=InitialOffsetScheme.NONE)
    with pytest.raises(TypeError, match="Spark option values"):
        kafka_options(ORDERS, Cluster("b:9092"), maxOffsetsPerTrigger=[1])
    with pytest.raises(TypeError, match="stream must be a StreamConfig"):
        kafka_options("orders", Cluster("b:9092"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group must be a non-empty string"):
        kafka_options(ORDERS, Cluster("b:9092"), group="")


def test_starting_offsets_json_from_commits() -> None:
    committed = {1: None, 0: 23, 2: -1001}
    earliest = json.loads(starting_offsets_json("t", committed, InitialOffsetScheme.EARLIEST))
    assert earliest == {"t": {"0": 23, "1": -2, "2": -2}}
    latest = json.loads(starting_offsets_json("t", committed, InitialOffsetScheme.LATEST))
    assert latest == {"t": {"0": 23, "1": -1, "2": -1}}


@pytest.mark.kafka
def test_group_confirmed_offsets_become_starting_offsets(cluster: Cluster, stream_factory) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    publish(cluster, stream, sample(6))
    group = f"g-{stream.name}"
    with pytest.raises(OffsetLoadError, match="no confirmed offset"):
        kafka_options(stream, cluster, group, startingOffsets="none")
    assert json.loads(kafka_options(stream, cluster, group)["startingOffsets"]) == {
        stream.name: {"0": -2, "1": -2}  # AUTO with a group acts as EARLIEST
    }
    consumer = Consumer(cluster.client_config({"group.id": group}))
    try:
        consumer.commit(offsets=[TopicPartition(stream.name, 1, 3)], asynchronous=False)
    finally:
        consumer.close()
    opts = kafka_options(stream, cluster, group, startingOffsets=InitialOffsetScheme.LATEST)
    assert json.loads(opts["startingOffsets"]) == {stream.name: {"0": -1, "1": 3}}
    opts = kafka_options(stream, cluster, group, startingOffsets="none")
    assert json.loads(opts["startingOffsets"]) == {stream.name: {"0": -2, "1": 3}}


def _connector_present(spark: Any) -> bool:
    """True when Spark's Kafka source loads (as ``kafka_stream`` loads it)."""
    try:
        require_connector(spark)
    except ConnectorNotFoundError:
        return False
    return True


@pytest.mark.spark
@pytest.mark.kafka
def test_kafka_source_reads_what_the_bolide_source_reads(
    spark: Any, cluster: Cluster, stream_factory
) -> None:
    if not _connector_present(spark):
        pytest.skip(
            f"needs {connector_coordinates(spark)} on the classpath (spark.jars.packages); "
            "it cannot be downloaded here"
        )
    stream = stream_factory()
    publish(cluster, stream, sample(10))
    kafka = kafka_batch(spark, stream, cluster, includeHeaders=True)
    from bolide.spark import register

    register(spark)
    ours = (
        spark.read.format("bolide")
        .options(**kafka_options(stream, cluster, startingOffsets="earliest", includeHeaders=True))
        .load()
    )
    assert kafka.schema == ours.schema
    cols = ["partition", "offset", "key", "value", "headers"]
    assert kafka.select(*cols).collect() == ours.select(*cols).orderBy("offset").collect()


def test_without_pyspark_the_error_names_the_extra() -> None:
    import subprocess
    import sys

    hide = "import sys; sys.modules['pyspark'] = None; "
    done = subprocess.run(
        [sys.executable, "-c", hide + "import bolide.spark"], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "pip install 'bolide[spark]'" in done.stderr
    cli = subprocess.run(
        [sys.executable, "-c", hide + "from bolide.cli.main import main; main(['--help'])"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    commands = {
        line.split()[0]: line for line in cli.stdout.splitlines() if line.startswith("    ")
    }
    assert "broker" in commands
    assert "needs pip install 'bolide[spark]'" in commands["spark"]
