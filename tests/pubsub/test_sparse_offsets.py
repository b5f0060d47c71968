"""Sparse offsets (transaction markers) against fetch skips: nothing is lost, nothing waits."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from bolide.facade import (
    Cluster,
    EmbeddedBroker,
    InitialOffsetScheme,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.broker import FETCH_GAP_SETTLE_MS
from bolide.facade.broker.apache import kafka_unavailable
from bolide.facade.kafka import ensure_topic
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def publish_transactions(cluster: Cluster, stream: StreamConfig, count: int, size: int) -> None:
    """``count`` committed transactions of ``size`` records: each leaves a marker offset."""
    ensure_topic(cluster, stream)
    producer = Producer(cluster.client_config({"transactional.id": f"tx-{uuid.uuid4().hex}"}))
    producer.init_transactions(30)
    for t in range(count):
        producer.begin_transaction()
        for i in range(size):
            producer.produce(stream.name, f"{t}-{i}".encode())
        producer.commit_transaction(30)


def read(cluster: Cluster, stream: StreamConfig, count: int) -> list[Record]:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(100)) or len(got) >= count, 30)
        got.extend(sub.poll(300))  # nothing more may come
    return got


@pytest.mark.parametrize("settle_ms", [0, 300])
def test_transaction_markers_are_real_gaps(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], settle_ms: int
) -> None:
    stream = stream_factory()
    publish_transactions(cluster, stream, count=4, size=3)
    windowed = Cluster(cluster.bootstrap_servers, fetch_gap_settle_ms=settle_ms, **cluster.settings)
    got = read(windowed, stream, 12)
    assert [r.data for r in got] == [f"{t}-{i}".encode() for t in range(4) for i in range(3)]
    offsets = [r.offset for r in got]
    assert offsets == sorted(offsets) and offsets[-1] is not None
    assert offsets[-1] > 11, "the markers take offsets of their own"


def test_cluster_checks_the_gap_window() -> None:
    with pytest.raises(ValueError, match="fetch_gap_settle_ms"):
        Cluster("k:9092", fetch_gap_settle_ms=-1)
    with pytest.raises(ValueError, match="fetch_gap_settle_ms"):
        Cluster("k:9092", fetch_gap_settle_ms=True)
    assert Cluster("k:9092", fetch_gap_settle_ms=5) != Cluster("k:9092")
    assert "fetch_gap_settle_ms=5" in repr(Cluster("k:9092", fetch_gap_settle_ms=5))


def test_only_the_tansu_engine_gives_a_gap_window(tmp_path) -> None:
    log = tmp_path / "broker.log"
    tansu = EmbeddedBroker(engine="tansu", log_path=log)
    assert tansu.cluster().fetch_gap_settle_ms == FETCH_GAP_SETTLE_MS > 0
    assert tansu.cluster(fetch_gap_settle_ms=0).fetch_gap_settle_ms == 0
    if kafka_unavailable() is None:  # Apache Kafka: a skip is a real gap, nothing to settle
        assert EmbeddedBroker(engine="kafka", log_path=log).cluster().fetch_gap_settle_ms == 0
