"""Meteor's publisher and end-to-end scenarios (21-26) on a real broker."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.pubsub.test_grouped import LEASE_MS, wait_until_settled

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def test_async_publishes_complete_in_order(cluster, stream_factory, api):
    stream = stream_factory()
    calls: list[tuple[int | None, BaseException | None]] = []
    with api.Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        records = [Record(b"r%d" % i) for i in range(5)]
        futures = [
            pub.publish_async(r, callback=lambda o, e: calls.append((o, e))) for r in records
        ]
        offsets = [f.result(10) for f in futures]
    assert offsets == [0, 1, 2, 3, 4]
    assert [r.offset for r in records] == offsets
    assert sorted(o for o, _ in calls) == offsets
    assert all(e is None for _, e in calls)


def test_blocking_publish_then_read_in_order(cluster, stream_factory, api):
    stream = stream_factory()
    with api.Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = [pub.publish(Record(b"x%d" % i)) for i in range(3)]
    scheme = InitialOffsetScheme.EARLIEST
    with api.Subscriber(
        cluster, SubscriberConfig(stream=stream, initial_offset_scheme=scheme)
    ) as s:
        got: list[Record] = []
        eventually(lambda: got.extend(s.poll(100)) or len(got) >= 3)
    assert [r.offset for r in got] == offsets
    assert [r.data for r in got] == [b"x0", b"x1", b"x2"]


def test_failed_publish_completes_with_an_error(cluster, stream_factory, api):
    stream = stream_factory()
    calls: list[tuple[int | None, BaseException | None]] = []
    record = Record(os.urandom(2_000_000))  # larger than the broker accepts
    with api.Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        future = pub.publish_async(record, callback=lambda o, e: calls.append((o, e)))
        with pytest.raises(PublishError) as info:
            future.result(10)
    assert info.value.record is record
    assert record.offset is None
    assert len(calls) == 1 and calls[0][0] is None and isinstance(calls[0][1], PublishError)
    assert "too large" in str(info.value).lower()


def test_bad_arguments_raise_documented_errors(cluster, stream_factory, api):
    stream = stream_factory()
    with pytest.raises(ValueError, match="name"):
        StreamConfig(name="")
    with api.Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        with pytest.raises(TypeError, match="Record"):
            pub.publish_async("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="bytes"):
            Record("text")  # type: ignore[arg-type]
    with (
        api.Subscriber(cluster, SubscriberConfig(stream=stream)) as sub,
        pytest.raises(ValueError, match="timeout_ms"),
    ):
        sub.poll(-1)
    with pytest.raises(ValueError, match="lease_timeout_ms"):
        SubscriberConfig(stream=stream, group="g", lease_timeout_ms=-5)


def _longs(sub_records: list[Record]) -> list[int]:
    return [struct.unpack(">q", r.data)[0] for r in sub_records]


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
def test_three_receivers(cluster, stream_factory, grouped):
    stream = stream_factory()
    group = f"g-{stream.name}" if grouped else None
    received: list[list[Record]] = [[], [], []]
    subs = [
        Subscriber(cluster, SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS))
        for _ in range(3)
    ]
    if grouped:
        wait_until_settled(cluster, group, *subs, size=3)
    for sub, sink in zip(subs, received, strict=True):
        sub.attach_receiver(sink.append, 10)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(struct.pack(">q", i))) for i in range(5)]
        for f in futures:
            f.result(10)
    if grouped:
        eventually(lambda: sum(len(r) for r in received) >= 5)
        time.sleep(0.3)
        assert sorted(len(r) for r in received) == [0, 0, 5]
        assert _longs(max(received, key=len)) == [0, 1, 2, 3, 4]
    else:
        eventually(lambda: all(len(r) >= 5 for r in received))
        assert all(_longs(r) == [0, 1, 2, 3, 4] for r in received)
    for sub in subs:
        sub.close()


def test_one_way_load(cluster, stream_factory, api):
    stream = stream_factory()
    subs = [api.Subscriber(cluster, SubscriberConfig(stream=stream)) for _ in range(4)]
    counts = [0, 0, 0, 0]
    pubs = [api.Publisher(cluster, PublisherConfig(stream=stream)) for _ in range(2)]

    def publish(pub: Publisher) -> None:
        for _ in range(10_000):
            pub.publish_async(Record(os.urandom(10)))
        pub.flush(30)

    threads = [threading.Thread(target=publish, args=(p,)) for p in pubs]
    for t in threads:
        t.start()

    def drained() -> bool:
        for i, sub in enumerate(subs):
            counts[i] += len(sub.poll(50))
        return all(c >= 20_000 for c in counts)

    eventually(drained, timeout_s=60)
    for t in threads:
        t.join()
    for obj in (*subs, *pubs):
        obj.close()
    assert counts == [20_000] * 4


def test_round_trip(cluster, stream_factory):
    requests, replies = stream_factory(), stream_factory()
    with (
        Publisher(cluster, PublisherConfig(stream=requests)) as req_pub,
        Publisher(cluster, PublisherConfig(stream=replies)) as reply_pub,
        Subscriber(cluster, SubscriberConfig(stream=requests)) as req_sub,
        Subscriber(cluster, SubscriberConfig(stream=replies)) as reply_sub,
    ):
        req_sub.attach_receiver(lambda r: reply_pub.publish_async(Record(r.data)), 1)
        latencies: list[float] = []
        for i in range(100):
            started = time.perf_counter()
            req_pub.publish_async(Record(b"%d" % i))
            batch = reply_sub.poll(10_000)
            latencies.append(time.perf_counter() - started)
            assert [r.data for r in batch] == [b"%d" % i]
    assert len(latencies) == 100


def test_a_closed_publisher_refuses_records_and_a_receiver_can_be_replaced(cluster, stream_factory):
    stream = stream_factory()
    pub = Publisher(cluster, PublisherConfig(stream=stream))
    pub.close()
    with pytest.raises(PublishError, match="closed"):
        pub.publish_async(Record(b"late"))
    with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
        first = sub.attach_receiver(lambda r: None, 10)
        first.close()
        second = sub.attach_receiver(lambda r: None, 10)
        assert second.running


def test_a_record_may_name_its_partition(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=3)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for p in (2, 0, 1, 2):
            record = Record(b"to-%d" % p, key=b"same key", partition=p)
            pub.publish(record)
            assert record.partition == p
        with pytest.raises(PublishError, match="partition 3 does not exist"):
            pub.publish(Record(b"nowhere", partition=3))
        again = Record(b"again", key=b"same key", partition=0)
        pub.publish(again)
        moved = pub.publish_async(again)  # already published: the key picks the partition
        assert moved.result(10) >= 0
    with pytest.raises(ValueError, match="partition must be an int"):
        Record(b"x", partition=-1)
    with pytest.raises(ValueError, match="partition and group"):
        Record(b"x", group="g", partition=0)
