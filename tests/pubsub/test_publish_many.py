"""The batch and callback publishing paths: ``publish_many`` and ``produce``."""

from __future__ import annotations

import pytest

from bolide.facade import (
    EmbeddedBroker,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.pubsub.test_publisher_close import broker as broker  # the fixture
from tests.pubsub.test_publisher_close import orphaned_publisher

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def read_all(cluster, stream, count: int) -> list[Record]:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 30)
    return got


def test_publish_many_resolves_one_future_with_every_offset_in_order(cluster, stream_factory):
    stream = stream_factory()
    records = [Record(b"r%d" % i, headers={"n": str(i)}) for i in range(500)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = pub.publish_many(records).result(30)
        assert pub.publish_many([]).result(1) == []
    assert offsets == list(range(500))
    assert [r.offset for r in records] == offsets
    assert all(r.partition == 0 and r.stream == stream.name for r in records)
    got = read_all(cluster, stream, 500)
    assert [r.data for r in got] == [b"r%d" % i for i in range(500)]
    assert [r.header("n") for r in got] == [str(i).encode() for i in range(500)]


def test_publish_many_fails_with_the_first_failed_record_after_every_answer(
    cluster, stream_factory
):
    stream = stream_factory()
    config = PublisherConfig(stream=stream, producer_config={"message.max.bytes": 10_000})
    big = Record(b"x" * 20_000)
    records = [Record(b"a"), big, Record(b"b")]
    with Publisher(cluster, config) as pub:
        future = pub.publish_many(records)
        error = future.exception(30)
    assert isinstance(error, PublishError)
    assert error.record is big and big.offset is None
    assert records[0].offset is not None and records[2].offset is not None  # stamped


def test_publish_many_and_produce_are_refused_after_close(cluster, stream_factory):
    pub = Publisher(cluster, PublisherConfig(stream=stream_factory()))
    pub.close()
    with pytest.raises(PublishError, match="closed"):
        pub.publish_many([Record(b"late")])
    with pytest.raises(PublishError, match="closed"):
        pub.produce(Record(b"late"))


def test_produce_calls_back_once_per_record_without_a_future(cluster, stream_factory):
    stream = stream_factory()
    calls: dict[int, list[tuple[int | None, BaseException | None]]] = {}
    records = [Record(b"p%d" % i) for i in range(200)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i, record in enumerate(records):
            assert (
                pub.produce(record, lambda o, e, i=i: calls.setdefault(i, []).append((o, e)))
                is None
            )
        assert pub.flush(30) == 0
    assert sorted(calls) == list(range(200))
    assert all(len(c) == 1 and c[0][1] is None for c in calls.values())
    assert [calls[i][0][0] for i in range(200)] == [r.offset for r in records] == list(range(200))


def test_close_fails_a_batch_the_gone_broker_never_acknowledged(broker: EmbeddedBroker) -> None:
    pub = orphaned_publisher(broker)
    records = [Record(b"r%d" % i) for i in range(20)]
    future = pub.publish_many(records)
    calls: list[tuple[int | None, BaseException | None]] = []
    pub.produce(Record(b"cb"), lambda o, e: calls.append((o, e)))
    pub.close(timeout_s=0.5)
    assert future.done()
    error = future.exception(0)
    assert isinstance(error, PublishError) and "closed" in str(error)
    assert len(calls) == 1 and calls[0][0] is None and isinstance(calls[0][1], PublishError)
