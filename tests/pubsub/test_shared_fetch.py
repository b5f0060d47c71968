"""The shared fetch: ungrouped subscribers of one stream in one process read one consumer's
records, each from its own position, alone where the ring does not hold it."""

from __future__ import annotations

import gc

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.consumer.shared_fetch import active
from tests.history.test_splice import drain

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

EARLIEST = InitialOffsetScheme.EARLIEST


def publish(cluster, stream: StreamConfig, count: int, first: int = 0, size: int = 0) -> None:
    """Records ``first`` to ``count``, spread over the partitions in turn."""
    parts = stream.partitions or 1
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_many(
            [Record(b"r%d" % i + b"." * size, partition=i % parts) for i in range(first, count)]
        )


def subscriber(cluster, stream: StreamConfig, **kwargs) -> Subscriber:
    kwargs.setdefault("initial_offset_scheme", EARLIEST)
    return Subscriber(cluster, SubscriberConfig(stream=stream, **kwargs))


def per_partition(records: list[Record]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.offset)
    return out


def check_all(records: list[Record], count: int) -> None:
    """Every record once, each partition in offset order."""
    assert sorted(int(r.data.split(b".")[0][1:]) for r in records) == list(range(count))
    for offsets in per_partition(records).values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_subscribers_of_one_stream_share_one_fetch(cluster, stream_factory) -> None:
    stream = stream_factory(partitions=3)
    subs = [subscriber(cluster, stream) for _ in range(4)]
    try:
        publish(cluster, stream, 300)
        for sub in subs:
            check_all(drain(sub, 300), 300)
        assert active().get(stream.name) == 4
        publish(cluster, stream, 360, first=300)
        for sub in subs:
            records = drain(sub, 60)
            assert sorted(int(r.data[1:]) for r in records) == list(range(300, 360))
    finally:
        for sub in subs:
            sub.close()
    assert stream.name not in active()


def test_a_subscriber_behind_the_ring_reads_alone_then_joins_it(cluster, stream_factory) -> None:
    stream = stream_factory()
    small = {"shared_fetch_bytes": 1}  # the smallest ring: far less than what is published
    with subscriber(cluster, stream, **small) as first, subscriber(cluster, stream, **small) as two:
        publish(cluster, stream, 2_000, size=200)
        for sub in (first, two):
            check_all(drain(sub, 2_000), 2_000)
        with subscriber(cluster, stream, **small) as late:
            check_all(drain(late, 2_000), 2_000)  # from offset 0: below the ring, alone
            assert late._fetcher._ringed == {0}  # caught up: on the ring since
            publish(cluster, stream, 2_100, first=2_000)
            for sub in (first, two, late):
                assert [r.offset for r in drain(sub, 100)] == list(range(2_000, 2_100))
            assert active()[stream.name] == 3
        # Two readers left: still shared; one left: it reads alone, from where it stood.
        assert active()[stream.name] == 2
    assert stream.name not in active()


def test_a_subscriber_that_stops_polling_does_not_hold_the_others(cluster, stream_factory) -> None:
    stream = stream_factory()
    small = {"shared_fetch_bytes": 1}
    subs = [subscriber(cluster, stream, **small) for _ in range(3)]
    try:
        for sub in subs:
            assert len(sub.poll(100)) == 0  # each on the ring, at its start
        publish(cluster, stream, 2_000, size=200)
        busy, idle = subs[:2], subs[2]
        for sub in busy:  # the ring fills with what the idle one has not read, then moves on
            check_all(drain(sub, 2_000), 2_000)
        check_all(drain(idle, 2_000), 2_000)  # back: behind the ring, it reads alone
    finally:
        for sub in subs:
            sub.close()


def test_a_record_one_subscriber_publishes_again_stays_what_the_others_read(
    cluster, stream_factory
) -> None:
    stream, target = stream_factory(), stream_factory()
    with (
        subscriber(cluster, stream) as forwarder,
        subscriber(cluster, stream) as reader,
        Publisher(cluster, PublisherConfig(stream=target)) as pub,
    ):
        for sub in (forwarder, reader):
            assert len(sub.poll(100)) == 0  # both on the shared fetch
        publish(cluster, stream, 20)
        read = drain(forwarder, 20)
        pub.publish(Record(b"first"))  # the target's offsets run ahead of the source's
        offsets = [pub.publish(record) for record in read]  # a forward: stamped copies
        assert offsets == list(range(1, 21))
        assert [(r.stream, r.offset) for r in read] == [(stream.name, i) for i in range(20)]
        assert [(r.stream, r.offset) for r in drain(reader, 20)] == [
            (stream.name, i) for i in range(20)
        ]
        publish(cluster, stream, 30, first=20)
        for sub in (forwarder, reader):
            assert [r.offset for r in drain(sub, 10)] == list(range(20, 30))


def test_the_last_reader_but_one_goes_back_to_its_own_consumer(cluster, stream_factory) -> None:
    stream = stream_factory(partitions=2)
    publish(cluster, stream, 100)
    sub = subscriber(cluster, stream)
    with subscriber(cluster, stream) as other:
        check_all(drain(sub, 100), 100)
        check_all(drain(other, 100), 100)
        assert active()[stream.name] == 2
    assert stream.name not in active()
    with sub:
        publish(cluster, stream, 150, first=100)
        assert sorted(int(r.data[1:]) for r in drain(sub, 50)) == list(range(100, 150))
        assert sub._fetcher._ringed == set()


def test_seek_pause_and_latest_keep_their_meaning(cluster, stream_factory) -> None:
    stream = stream_factory(partitions=2)
    publish(cluster, stream, 100)
    with subscriber(cluster, stream) as sub, subscriber(cluster, stream) as other:
        first = drain(sub, 100)
        check_all(first, 100)
        check_all(drain(other, 100), 100)
        ends = {p: offsets[-1] + 1 for p, offsets in per_partition(first).items()}
        sub.seek(10, partition=0)  # below what the ring holds, or within it: read again
        assert [r.offset for r in drain(sub, ends[0] - 10)] == list(range(10, ends[0]))
        sub.pause([1])
        publish(cluster, stream, 140, first=100)
        with subscriber(cluster, stream, initial_offset_scheme=InitialOffsetScheme.LATEST) as late:
            assert sorted(int(r.data[1:]) for r in drain(other, 40)) == list(range(100, 140))
            zero = drain_until_quiet(sub)
            assert {r.partition for r in zero} == {0}
            assert [r.offset for r in zero] == list(range(ends[0], ends[0] + len(zero)))
            sub.resume()
            one = drain_until_quiet(sub)
            assert {r.partition for r in one} == {1}
            assert [r.offset for r in one] == list(range(ends[1], ends[1] + len(one)))
            assert len(zero) + len(one) == 40
            publish(cluster, stream, 150, first=140)
            assert sorted(int(r.data[1:]) for r in drain(late, 10)) == list(range(140, 150))


def drain_until_quiet(sub: Subscriber) -> list[Record]:
    """What ``sub`` reads until a poll finds nothing."""
    got: list[Record] = []
    while batch := sub.poll(1_000):
        got += batch
    return got


def test_settings_that_differ_and_zero_bytes_read_apart(cluster, stream_factory) -> None:
    stream = stream_factory()
    publish(cluster, stream, 50)
    uncommitted = {"isolation": "read_uncommitted"}
    with (
        subscriber(cluster, stream) as one,
        subscriber(cluster, stream) as two,
        subscriber(cluster, stream, **uncommitted) as three,
        subscriber(cluster, stream, **uncommitted) as four,
        subscriber(cluster, stream, shared_fetch_bytes=0) as alone,
        subscriber(cluster, stream, shared_fetch_bytes=0) as alone_too,
    ):
        for sub in (one, two, three, four, alone, alone_too):
            check_all(drain(sub, 50), 50)
        assert active()[stream.name] == 4  # two fetches of two readers each; none for alone
        assert alone._fetcher._ringed == alone_too._fetcher._ringed == set()


def test_subscribers_never_closed_let_the_shared_fetch_go(cluster, stream_factory) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    subs = [subscriber(cluster, stream) for _ in range(2)]
    for sub in subs:
        check_all(drain(sub, 10), 10)
    assert active()[stream.name] == 2
    del subs, sub
    gc.collect()
    assert stream.name not in active()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_shared_fetch_bytes_is_checked(stream_factory, bad) -> None:
    with pytest.raises((TypeError, ValueError), match="shared_fetch_bytes"):
        SubscriberConfig(stream=stream_factory(), shared_fetch_bytes=bad)


@pytest.mark.parametrize("while_paused", ["poll", "wait", "seek"])
def test_a_paused_subscriber_left_alone_resumes_where_its_delivery_stopped(
    cluster, stream_factory, while_paused
) -> None:
    stream = stream_factory(partitions=2)
    sub, other = subscriber(cluster, stream), subscriber(cluster, stream)
    try:
        for s in (sub, other):
            assert len(s.poll(100)) == 0  # both on the shared fetch, at its start
        publish(cluster, stream, 100)
        read = per_partition(drain(sub, 100))
        assert sub._fetcher._ringed == {0, 1}
        sub.pause()
        ends = {p: offsets[-1] + 1 for p, offsets in read.items()}
        if while_paused == "seek":
            sub.seek(10, partition=1)
            ends[1] = 10
        other.close()  # the last sharer but one: its own consumer again, its partitions paused
        if while_paused != "wait":
            assert len(sub.poll(500)) == 0
        publish(cluster, stream, 110, first=100)
        sub.resume()
        got = per_partition(drain(sub, 10 + 50 - ends[1]))
        assert got == {p: list(range(ends[p], ends[p] + len(got[p]))) for p in (0, 1)}
        assert sum(map(len, got.values())) == 10 + 50 - ends[1]
        assert sub._fetcher._ringed == set()
    finally:
        sub.close()
        other.close()


def test_pausing_while_the_shared_fetch_starts_or_stops_skips_and_repeats_nothing(
    cluster, stream_factory
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 50)
    with subscriber(cluster, stream) as sub:
        assert [r.offset for r in drain(sub, 50)] == list(range(50))  # alone
        sub.pause()
        with subscriber(cluster, stream) as other:
            assert [r.offset for r in drain(other, 50)] == list(range(50))  # the fetch starts
            assert len(sub.poll(500)) == 0  # paused: it stays with its own consumer
            assert sub._fetcher._ringed == set()
            sub.resume()
            publish(cluster, stream, 60, first=50)
            assert [r.offset for r in drain(sub, 10)] == list(range(50, 60))
            assert sub._fetcher._ringed == {0}  # joined once resumed
            assert [r.offset for r in drain(other, 10)] == list(range(50, 60))
            other.pause()
            sub.pause()
        assert stream.name not in active()  # the other one closed while paused
        publish(cluster, stream, 70, first=60)
        assert len(sub.poll(500)) == 0
        sub.resume()
        assert [r.offset for r in drain(sub, 10)] == list(range(60, 70))
        assert sub._fetcher._ringed == set()
