"""Records and configs: validation happens at construction, before anything connects."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    InvalidInitialOffsetSchemeError,
    PublisherConfig,
    Record,
    RecordBatch,
    StreamConfig,
    SubscriberConfig,
)
from bolide.facade.record import MESSAGE_GROUP_HEADER, record_from_message, trusted_record


def test_record_defaults_and_headers():
    record = Record(b"x", headers={"a": "1", "b": b"2"})
    assert record.headers == [("a", b"1"), ("b", b"2")]
    assert record.offset is None and record.partition is None and not record.replayed
    repeated = Record(b"x", headers=[("a", b"1"), ("a", b"2")])
    assert repeated.header("a") == b"2"


def test_record_group_is_the_key():
    assert Record(b"x", group="ACME").key == b"ACME"
    assert Record(b"x", key="ACME", group="ACME").key == b"ACME"
    with pytest.raises(ValueError, match="disagree"):
        Record(b"x", key=b"other", group="ACME")
    with pytest.raises(TypeError, match="group"):
        Record(b"x", group=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group"):
        Record(b"x", group="")


def test_records_read_from_kafka_set_every_slot_and_their_message_group():
    headers = [("a", b"1"), (MESSAGE_GROUP_HEADER, b"ACME"), ("empty", None)]
    msg = Message(
        topic="t", partition=2, offset=7, key=b"ACME", value=b"x", headers=headers, timestamp=(1, 5)
    )
    record = record_from_message(msg)
    assert all(hasattr(record, slot) for slot in Record.__slots__)
    assert record == trusted_record(
        b"x", b"ACME", [("a", b"1"), (MESSAGE_GROUP_HEADER, b"ACME"), ("empty", b"")], "t", 2, 7, 5
    )
    assert (record.group, record.timestamp_ms, record.replayed, record.value) == (
        "ACME",
        5,
        False,
        None,
    )
    bare = record_from_message(Message(topic="t", partition=0, offset=0, value=None))
    assert (bare.data, bare.key, bare.headers, bare.group) == (None, None, [], None)  # a tombstone


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": ""}, ValueError, "name"),
        ({"name": "a b"}, ValueError, "name"),
        ({"name": 5}, TypeError, "name"),
        ({"name": "s", "partitions": 0}, ValueError, "partitions"),
        ({"name": "s", "partitions": 3, "global_order": True}, ValueError, "global_order"),
        ({"name": "s", "partitions": "2", "global_order": False}, TypeError, "partitions"),
        ({"name": "s", "retention_ms": -5}, ValueError, "retention_ms"),
        ({"name": "s", "capacity": 10}, ValueError, "store"),
        ({"name": "s", "store": object()}, TypeError, "store"),
    ],
)
def test_stream_config_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        StreamConfig(**kwargs)


def test_contradictory_or_unknown_settings():
    stream = StreamConfig(name="s")
    with pytest.raises(ValueError, match="auto_group"):
        PublisherConfig(stream=stream, group="g", auto_group=True)
    with pytest.raises(TypeError, match="auto_group"):
        PublisherConfig(stream=stream, auto_group="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SubscriberConfig(stream=stream, unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="durable_id"):
        SubscriberConfig(stream=stream, group="g", durable_id="d")
    with pytest.raises(InvalidInitialOffsetSchemeError):
        SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.NONE)
    with pytest.raises(TypeError, match="on_revoke"):
        SubscriberConfig(stream=stream, group="g", on_revoke=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="consumer_config"):
        SubscriberConfig(stream=stream, consumer_config={"fetch.wait.max.ms": [1]})


def test_cluster_keeps_secrets_out_of_repr():
    cluster = Cluster("k:9092", **{"sasl.password": "hunter2", "sasl.username": "u"})
    assert "hunter2" not in repr(cluster)
    assert cluster.client_config()["sasl.password"] == "hunter2"
    with pytest.raises(ValueError):
        Cluster("")


def test_cluster_log_start_overrides_are_checked_kept_apart_and_shown():
    cluster = Cluster("k:9092", log_start_overrides={"orders": {0: 10, 3: 0}})
    assert cluster.log_start_overrides == {"orders": {0: 10, 3: 0}}
    assert "log_start_overrides" not in str(cluster.client_config())  # not a librdkafka setting
    assert "log_start_overrides={'orders': {0: 10, 3: 0}}" in repr(cluster)
    assert "log_start_overrides" not in repr(Cluster("k:9092"))
    assert Cluster("k:9092").log_start_overrides == {}
    assert cluster != Cluster("k:9092")
    cluster.log_start_overrides["orders"][0] = 99  # a copy: the cluster stays as built
    assert cluster.log_start_overrides == {"orders": {0: 10, 3: 0}}
    for bad, error in [
        ({"orders": {0: -1}}, ValueError),
        ({"orders": {-1: 0}}, ValueError),
        ({"orders": {"0": 10}}, TypeError),
        ({"orders": {0: True}}, TypeError),
        ({"orders": {0: 1.5}}, TypeError),
        ({"orders": [10]}, TypeError),
        ({"no/topic": {0: 1}}, ValueError),
        ({7: {0: 1}}, TypeError),
        ([("orders", {0: 1})], TypeError),
    ]:
        with pytest.raises(error, match="log_start_overrides"):
            Cluster("k:9092", log_start_overrides=bad)  # type: ignore[arg-type]


def test_cluster_replace_keeps_what_it_does_not_change():
    cluster = Cluster("k:9092", fetch_gap_settle_ms=500, **{"sasl.password": "p"})
    trimmed = cluster.replace(log_start_overrides={"orders": {0: 10}})
    assert trimmed == Cluster(
        "k:9092",
        fetch_gap_settle_ms=500,
        log_start_overrides={"orders": {0: 10}},
        **{"sasl.password": "p"},
    )
    assert trimmed.replace(log_start_overrides={}) == cluster
    assert cluster.replace(bootstrap_servers="other:1").bootstrap_servers == "other:1"
    with pytest.raises(ValueError, match="fetch_gap_settle_ms"):
        cluster.replace(fetch_gap_settle_ms=-1)


def test_record_batch():
    batch = RecordBatch([Record(b"a"), Record(b"b")])
    assert len(batch) == 2 and batch.first().data == b"a" and batch.last().data == b"b"
    assert RecordBatch().first() is None and RecordBatch().is_empty()


def test_configs_are_hashable_values():
    assert hash(StreamConfig(name="s")) == hash(StreamConfig(name="s", topic_config={"a": "1"}))
    assert StreamConfig(name="s") == StreamConfig(name="s")


def test_incremental_rebalancing_is_accepted_and_broker_side_settings_are_refused():
    stream = StreamConfig(name="s")
    for settings in (
        {"partition.assignment.strategy": "cooperative-sticky"},
        {"group.protocol": "consumer"},
        {"group.protocol": "consumer", "group.remote.assignor": "uniform"},
    ):
        SubscriberConfig(stream=stream, group="g", consumer_config=settings)
    for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        with pytest.raises(ValueError, match=rf"{key}.*group\.protocol=consumer.*broker"):
            SubscriberConfig(
                stream=stream,
                group="g",
                consumer_config={"group.protocol": "consumer", key: "1000"},
            )
    with pytest.raises(ValueError, match="not a group protocol"):
        SubscriberConfig(stream=stream, group="g", consumer_config={"group.protocol": "streams"})
