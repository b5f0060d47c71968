"""Tombstones: a null Kafka value is published with ``Record(None, key=...)``, read back as
``record.data is None`` (never ``b""``), archived as a NULL payload and spliced back as one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import SqlStore
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _read_all(cluster: Cluster, stream: StreamConfig, count: int) -> list[Record]:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
    return got


def test_a_tombstone_is_published_read_and_archived_as_null(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], tmp_path: Path
) -> None:
    stream = stream_factory(topic_config={"cleanup.policy": "compact"})
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"v1", key=b"k"))
        pub.publish(Record(None, key=b"k"))  # the key's deletion marker
        pub.publish(Record(b"", key=b"e"))  # an empty value is not a tombstone
    got = _read_all(cluster, stream, 3)
    assert [(r.key, r.data) for r in got] == [(b"k", b"v1"), (b"k", None), (b"e", b"")]
    assert "data=None" in repr(got[1])

    # A plain Kafka client sees a null value too.
    consumer = Consumer(cluster.client_config({"group.id": "t-plain", "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(stream.name, 0, 1)])

        def record() -> tuple[int, bytes | None, bytes | None] | None:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                return None
            return (msg.offset(), msg.value(), msg.key())  # a Message's truth is its length

        assert eventually(record, 30) == (1, None, b"k")
    finally:
        consumer.close()

    with SqlStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        store.upgrade()
        assert store.store_all(stream.name, got) == 3
        stored = store.read(stream.name, 0, 0, 10)
        assert [(r.offset, r.data) for r in stored] == [(0, b"v1"), (1, None), (2, b"")]


def test_a_record_value_must_be_bytes_or_none() -> None:
    with pytest.raises(TypeError, match="bytes or None"):
        Record("text")  # type: ignore[arg-type]
    assert Record(None, key="k").data is None
