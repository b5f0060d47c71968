"""``publish_many`` of records without headers: one ``produce_batch`` call per run of room in
the local queue, with the same answers as record by record (docs/performance.md)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future

import pytest

from bolide.facade import (
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    TransactionError,
)
from tests.conftest import eventually
from tests.pubsub.test_publish_many import read_all
from tests.pubsub.test_publisher_close import broker as broker  # the fixture
from tests.pubsub.test_publisher_close import orphaned_publisher

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def test_batches_keep_their_order_and_stamp_every_record(cluster, stream_factory):
    stream = stream_factory()
    batches = [[Record(b"b%d-%d" % (b, i)) for i in range(700)] for b in range(3)]
    batches[1][5] = Record(None, key=b"gone")  # a tombstone travels in a batch too
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_many(batch) for batch in batches]
        offsets = [f.result(30) for f in futures]
    assert [o for batch in offsets for o in batch] == list(range(2100))
    for batch, answer in zip(batches, offsets, strict=True):
        assert [r.offset for r in batch] == answer
        assert all(r.partition == 0 and r.stream == stream.name for r in batch)
        assert all(isinstance(r.timestamp_ms, int) and r.timestamp_ms > 0 for r in batch)
    got = read_all(cluster, stream, 2100)
    assert [(r.data, r.key) for r in got] == [(r.data, r.key) for b in batches for r in b]


def test_identical_records_each_get_their_own_offset(cluster, stream_factory):
    stream = stream_factory()
    records = [Record(b"same") for _ in range(500)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = pub.publish_many(records).result(30)
    assert offsets == [r.offset for r in records] == list(range(500))


def test_a_full_local_queue_holds_the_rest_of_a_batch_until_there_is_room(cluster, stream_factory):
    stream = stream_factory()
    config = PublisherConfig(stream=stream, producer_config={"queue.buffering.max.messages": 50})
    records = [Record(b"r%d" % i) for i in range(2000)]
    with Publisher(cluster, config) as pub:
        offsets = pub.publish_many(records).result(60)
    assert offsets == [r.offset for r in records] == list(range(2000))
    assert [r.data for r in read_all(cluster, stream, 2000)] == [r.data for r in records]


def test_records_refused_inside_a_batch_fail_it_and_the_others_are_delivered(
    cluster, stream_factory
):
    stream = stream_factory()
    config = PublisherConfig(stream=stream, producer_config={"message.max.bytes": 10_000})
    big, bigger = Record(b"x" * 20_000), Record(b"y" * 30_000)
    records = [Record(b"a"), big, Record(b"b"), bigger, Record(b"c")]
    with Publisher(cluster, config) as pub:
        error = pub.publish_many(records).exception(30)
        assert pub.publish_many([Record(b"d")]).result(30) == [3]  # the publisher goes on
    assert isinstance(error, PublishError) and error.record is big
    assert "too large" in str(error).lower()
    assert [r.offset for r in records] == [0, None, 1, None, 2]
    assert [r.data for r in read_all(cluster, stream, 4)] == [b"a", b"b", b"c", b"d"]


def test_keyed_batches_on_several_partitions_keep_each_key_in_order(cluster, stream_factory):
    stream = stream_factory(partitions=3, global_order=False)
    records = [Record(b"%d" % i, key=b"k%d" % (i % 7)) for i in range(600)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = pub.publish_many(records).result(30)
    assert offsets == [r.offset for r in records]
    placed = {(r.partition, r.offset): r.data for r in records}
    assert len(placed) == 600 and {p for p, _ in placed} == {0, 1, 2}
    got = read_all(cluster, stream, 600)
    assert {(r.partition, r.offset): r.data for r in got} == placed
    for key in {r.key for r in records}:
        mine = [r for r in records if r.key == key]
        assert len({r.partition for r in mine}) == 1
        assert [r.offset for r in mine] == sorted(r.offset for r in mine)  # type: ignore[type-var]


def test_records_read_elsewhere_are_published_again_in_a_batch(cluster, stream_factory):
    source, sink = stream_factory(), stream_factory()
    with Publisher(cluster, PublisherConfig(stream=source)) as pub:
        pub.publish_many([Record(b"s%d" % i) for i in range(30)]).result(30)
    read = read_all(cluster, source, 30)
    assert all(r.partition == 0 and r.offset is not None for r in read)
    with Publisher(cluster, PublisherConfig(stream=sink)) as pub:
        pub.publish(Record(b"first"))
        offsets = pub.publish_many(read).result(30)
    assert offsets == list(range(1, 31)) == [r.offset for r in read]
    assert all(r.stream == sink.name for r in read)
    assert [r.data for r in read_all(cluster, sink, 31)][1:] == [b"s%d" % i for i in range(30)]


def test_a_transactional_batch_needs_its_transaction(cluster, stream_factory):
    stream = stream_factory()
    config = PublisherConfig(stream=stream, transactional_id=f"tx-{uuid.uuid4().hex}")
    with Publisher(cluster, config) as pub:
        outside = pub.publish_many([Record(b"no"), Record(b"no")]).exception(30)
        with pub.transaction():
            future = pub.publish_many([Record(b"t%d" % i) for i in range(100)])
        assert future.result(30) == sorted(future.result(30))
    assert isinstance(outside, TransactionError) and "inside" in str(outside)
    assert [r.data for r in read_all(cluster, stream, 100)] == [b"t%d" % i for i in range(100)]


def test_close_refuses_the_rest_of_a_batch_waiting_for_room(broker: EmbeddedBroker) -> None:
    pub = orphaned_publisher(broker, **{"queue.buffering.max.messages": 5})
    records = [Record(b"r%d" % i) for i in range(1_000)]
    futures: list[Future[list[int]]] = []
    thread = threading.Thread(target=lambda: futures.append(pub.publish_many(records)))
    thread.start()
    eventually(lambda: pub.flush(0) >= 5, 30)  # the queue is full: the batch waits for room
    pub.close(timeout_s=0.5)
    thread.join(30)
    assert not thread.is_alive(), "publish_many still waits for room after close"
    error = futures[0].exception(0)
    assert isinstance(error, PublishError) and "closed" in str(error)
    assert any(error.record is r for r in records)
    assert all(r.offset is None for r in records)
