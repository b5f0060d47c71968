"""``pause`` / ``resume``: Kafka's flow control on a subscriber's partitions, without loss."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable

import pytest

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
from tests.aio.adapter import Api
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _publish(cluster: Cluster, stream: StreamConfig, partition: int, values: list[bytes]) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for value in values:
            pub.publish_async(Record(value, partition=partition))
        assert pub.flush(30) == 0


def _read(sub: Subscriber, count: int) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
    got.extend(sub.poll(300))
    return got


def test_a_paused_partition_delivers_nothing_until_resumed_then_everything_once(
    api: Api, cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2)
    first = [b"a%d" % i for i in range(10)]
    _publish(cluster, stream, 0, first)
    _publish(cluster, stream, 1, [b"b%d" % i for i in range(10)])
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=4
    )
    with api.Subscriber(cluster, config) as sub:
        before = list(sub.poll(10_000))  # some records of either partition may come first
        sub.pause([1])
        assert sub.paused == frozenset({(stream.name, 1)})
        during = _read(sub, 10 - sum(1 for r in before if r.partition == 0))
        _publish(cluster, stream, 1, [b"b%d" % i for i in range(10, 15)])
        _publish(cluster, stream, 0, [b"a10"])
        during += _read(sub, 1)
        assert {r.partition for r in during} == {0}, "nothing of the paused partition"
        assert [r.data for r in before + during if r.partition == 0] == [*first, b"a10"]
        sub.resume()
        assert sub.paused == frozenset()
        delivered = [r.data for r in before if r.partition == 1]
        rest = _read(sub, 15 - len(delivered))
        assert [*delivered, *(r.data for r in rest)] == [b"b%d" % i for i in range(15)]


def test_a_grouped_subscriber_keeps_its_lease_while_paused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{uuid.uuid4().hex[:8]}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=6_000,
    )
    with Subscriber(cluster, config) as sub:
        eventually(sub.is_assigned, 60)
        sub.pause()
        assert sub.paused == frozenset({(stream.name, 0)})
        _publish(cluster, stream, 0, [b"x%d" % i for i in range(5)])
        for _ in range(5):
            assert len(sub.poll(200)) == 0
        assert sub.is_assigned()
        sub.resume([(stream.name, 0)])
        assert [r.data for r in _read(sub, 5)] == [b"x%d" % i for i in range(5)]


def test_a_partition_paused_when_its_lease_goes_is_fetched_again_when_it_comes_back(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    """A rebalance forgets the pause of a partition it takes away (Kafka's rule), also when
    the same member gets it straight back: librdkafka keeps the pause on a partition handed
    back, so a hold forgotten without a resume would stop it for good."""
    stream = stream_factory()
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{uuid.uuid4().hex[:8]}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=6_000,
    )
    _publish(cluster, stream, 0, [b"x%d" % i for i in range(5)])
    with Subscriber(cluster, config) as sub:
        eventually(sub.is_assigned, 60)
        sub.pause()
        sub.deactivate()
        assert sub.paused == frozenset()
        sub.reactivate()
        assert [r.data for r in _read(sub, 5)] == [b"x%d" % i for i in range(5)]


def test_pause_arguments_are_checked(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2)
    with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
        with pytest.raises(ValueError, match="partition 5"):
            sub.pause([5])
        with pytest.raises(ValueError, match="not this subscriber's stream"):
            sub.pause([("elsewhere", 0)])
        with pytest.raises(TypeError, match="iterable"):
            sub.pause(1)  # type: ignore[arg-type]
        assert sub.paused == frozenset()


def test_a_receivers_throttle_never_resumes_what_the_application_paused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    # Two reasons hold partition 1: the receiver's throttle (enough in flight) and the
    # application. The throttle letting go must leave it paused until the application resumes.
    stream = stream_factory(partitions=2)
    _publish(cluster, stream, 0, [b"a%d" % i for i in range(4)])
    gate, handled = threading.Event(), queue.Queue[bytes]()

    def handler(record: Record) -> None:
        gate.wait(60)
        handled.put(record.data)

    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=2
    )
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=2, max_in_flight=2)
        eventually(lambda: receiver.metrics().paused, 60)  # the throttle holds both partitions
        sub.pause([1])
        _publish(cluster, stream, 1, [b"b%d" % i for i in range(5)])
        gate.set()  # the throttle lets go
        _publish(cluster, stream, 0, [b"a4"])
        seen: list[bytes] = []
        eventually(lambda: seen.extend(_drain(handled)) or b"a4" in seen, 60)
        assert sorted(seen) == [b"a%d" % i for i in range(5)], "nothing of the paused partition"
        assert sub.paused == frozenset({(stream.name, 1)})
        sub.resume([1])
        eventually(lambda: seen.extend(_drain(handled)) or len(seen) >= 10, 60)
        assert [v for v in seen if v.startswith(b"b")] == [b"b%d" % i for i in range(5)]


def _drain(handled: queue.Queue[bytes]) -> list[bytes]:
    out = []
    while not handled.empty():
        out.append(handled.get())
    return out
