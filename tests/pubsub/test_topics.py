"""A stream's topic: created on first use, checked against every later config."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from confluent_kafka.admin import NewPartitions

from bolide.facade import (
    AuthenticationError,
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    StreamConfigMismatchError,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import (
    admin_client,
    ensure_topic,
    forget_topic,
    log_starts,
    partition_count,
    probe_consumer,
)
from tests.conftest import eventually

pytestmark = pytest.mark.kafka


def test_other_partition_counts_are_refused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    assert ensure_topic(cluster, stream) == 2
    other = replace(stream, partitions=4)
    with pytest.raises(StreamConfigMismatchError, match="has 2 partitions"):
        ensure_topic(cluster, other)
    forget_topic(cluster, stream.name)  # as a new process would: described, not cached
    with pytest.raises(StreamConfigMismatchError, match="has 2 partitions"):
        ensure_topic(cluster, other)
    assert ensure_topic(cluster, stream) == 2


def test_a_second_config_of_a_known_topic_has_its_settings_checked(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], embedded_broker: bool
) -> None:
    if embedded_broker:
        pytest.skip("the embedded broker describes no topic configs (docs/compatibility.md)")
    stream = stream_factory(retention_ms=3_600_000)
    ensure_topic(cluster, stream)
    with pytest.raises(StreamConfigMismatchError, match=r"retention\.ms"):
        ensure_topic(cluster, replace(stream, retention_ms=60_000))


def test_an_existing_topic_is_used_as_it_is(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    """``StreamConfig(name=...)`` opens a topic someone else made, whatever its partitions;
    what the config states explicitly is still checked."""
    made = stream_factory(partitions=3, global_order=False)
    ensure_topic(cluster, made)
    forget_topic(cluster, made.name)  # as another process would meet it
    plain = StreamConfig(name=made.name)
    assert ensure_topic(cluster, plain) == 3
    values = [b"v%d" % i for i in range(30)]
    with Publisher(cluster, PublisherConfig(stream=plain)) as pub:
        for i, value in enumerate(values):
            pub.publish_async(Record(value, key=b"k%d" % i))
        assert pub.flush(30) == 0
    config = SubscriberConfig(stream=plain, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= len(values), 60)
    assert sorted(r.data for r in got) == sorted(values)
    assert {r.partition for r in got} == {0, 1, 2}
    with pytest.raises(StreamConfigMismatchError, match="global_order=True needs one"):
        ensure_topic(cluster, StreamConfig(name=made.name, global_order=True))
    with pytest.raises(StreamConfigMismatchError, match="has 3 partitions"):
        ensure_topic(cluster, StreamConfig(name=made.name, partitions=2))


def test_a_topic_known_to_one_client_identity_is_described_again_as_another(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    """What one set of credentials learnt of a topic does not stand for another on the same
    servers: the other's describe meets its own refusal (here SASL the broker cannot speak)
    when the client starts, not on every record later."""
    stream = stream_factory()
    ensure_topic(cluster, stream)
    other = Cluster(
        cluster.bootstrap_servers,
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        },
    )
    with pytest.raises(AuthenticationError):
        ensure_topic(other, stream)
    with pytest.raises(AuthenticationError):
        Publisher(other, PublisherConfig(stream=stream))


def test_forgetting_a_topic_forgets_it_for_every_client_identity(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    another = cluster.replace(**{"client.id": "another-identity"})
    assert ensure_topic(cluster, stream) == ensure_topic(another, stream) == 1
    admin = admin_client(cluster)  # grown behind bolide's back
    admin.create_partitions([NewPartitions(stream.name, 2)])[stream.name].result(30)
    eventually(lambda: partition_count(admin, stream.name) == 2, 30)
    forget_topic(cluster, stream.name)
    assert ensure_topic(another, stream) == 2


def test_a_missing_topic_is_created_with_one_partition(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    assert stream.partitions is None and stream.global_order is None
    assert ensure_topic(cluster, stream) == 1
    forget_topic(cluster, stream.name)
    assert ensure_topic(cluster, replace(stream, global_order=True)) == 1


def test_offsets_of_a_topic_another_client_is_creating_are_waited_for(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    """A partition missing from this client's metadata for a moment (a topic another client
    just created, a node that restarted and has not caught up) is asked again, not refused."""
    stream = stream_factory(partitions=1)
    creator = threading.Timer(1.0, ensure_topic, args=(cluster, stream))
    consumer = probe_consumer(cluster)
    try:
        creator.start()
        assert log_starts(consumer, stream.name, [0], cluster=cluster) == {0: 0}
    finally:
        creator.join()
        consumer.close()
