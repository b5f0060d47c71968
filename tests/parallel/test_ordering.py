"""The parallel receiver keeps each key's (or partition's) records in offset order, one at a
time, handles every record exactly once, and runs up to ``concurrency`` records at once."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Receiver,
    Record,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.receiving.parallel import ParallelReceiver
from tests.conftest import eventually
from tests.parallel.conftest import LEASE_MS, Log, fresh_group, publish_keyed

pytestmark = pytest.mark.kafka

EARLIEST = InitialOffsetScheme.EARLIEST


def _config(stream, grouped: bool, **extra) -> SubscriberConfig:
    if grouped:
        return SubscriberConfig(
            stream=stream, group=fresh_group(), lease_timeout_ms=LEASE_MS, **extra
        )
    return SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST, **extra)


def _check_exactly_once(log: Log, published: dict[tuple[int, int], bytes]) -> None:
    counts = Counter((p, o) for p, o, _ in log.done)
    assert set(counts) == set(published), "a record was lost or one not published appeared"
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
def test_key_order_at_concurrency_32_with_random_latency(cluster, stream_factory, grouped):
    stream = stream_factory(partitions=2, global_order=False)
    published = publish_keyed(cluster, stream, 1_500, keys=40)
    rng = random.Random(7)
    log = Log()

    def handler(record: Record) -> None:
        lane = (record.partition, record.key)
        log.start(record, lane)
        time.sleep(rng.random() * 0.004)
        log.end(record, lane)

    with Subscriber(cluster, _config(stream, grouped)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=32, ordering="key")
        assert isinstance(receiver, ParallelReceiver)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        metrics = receiver.metrics()
        assert metrics.in_flight == 0 and metrics.failed == 0 and metrics.abandoned == 0
        ends = {
            0: max(o for p, o in published if p == 0),
            1: max(o for p, o in published if p == 1),
        }
        eventually(lambda: receiver.metrics().safe == ends, 30)
        if grouped:
            eventually(lambda: sub.committed() == {p: o + 1 for p, o in ends.items()}, 60)
            assert receiver.metrics().confirmed == ends
        else:
            assert receiver.metrics().confirmed == {}  # an ungrouped subscriber confirms nothing
    assert not receiver.running
    _check_exactly_once(log, published)
    assert log.overlaps == [], "two records of one key ran at once"
    for lane, offsets in log.by_lane(lambda e: (e[0], e[2])).items():
        assert offsets == sorted(offsets), f"key {lane} out of order"
    assert 1 < log.most_at_once <= 32
    assert len(log.threads) > 1


def test_partition_order_runs_partitions_side_by_side(cluster, stream_factory):
    stream = stream_factory(partitions=3, global_order=False)
    published = publish_keyed(cluster, stream, 600, keys=30)
    log = Log()
    together = threading.Event()  # two partitions' records seen running at once

    def handler(record: Record) -> None:
        log.start(record, record.partition)
        # Hold each call until another partition's record runs beside it (once seen, calls go
        # on at once): side by side is then shown by the run, not by the machine's timing.
        # A receiver that ran one record at a time would time out here, every call.
        if log.running_now >= 2:
            together.set()
        together.wait(5)
        log.end(record, record.partition)

    with Subscriber(cluster, _config(stream, False)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=8, ordering="partition")
        eventually(lambda: log.count() >= len(published), 120)
    _check_exactly_once(log, published)
    assert log.overlaps == []
    for partition, offsets in log.by_lane(lambda e: e[0]).items():
        assert offsets == sorted(offsets), f"partition {partition} out of order"
    assert 1 < log.most_at_once <= 3  # one per partition at most
    assert receiver.metrics().finished == len(published)


def test_unordered_fills_every_worker(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 64, keys=1)  # one key: order would serialize
    log = Log()
    gate = threading.Barrier(16, timeout=60)

    def handler(record: Record) -> None:
        log.start(record, record.offset)
        gate.wait()  # passes only when 16 records run at once
        log.end(record, record.offset)

    with Subscriber(cluster, _config(stream, False)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=16, ordering="unordered")
        eventually(lambda: log.count() >= len(published), 120)
        assert receiver.metrics().failed == 0
    _check_exactly_once(log, published)
    assert log.most_at_once == 16


def test_async_handler_runs_on_one_loop_in_key_order(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 800, keys=20)
    log = Log()
    loops: set[int] = set()
    rng = random.Random(3)

    async def handler(record: Record) -> None:
        loops.add(id(asyncio.get_running_loop()))
        log.start(record, record.key)
        await asyncio.sleep(rng.random() * 0.01)
        log.end(record, record.key)

    with Subscriber(cluster, _config(stream, True)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=64)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
    _check_exactly_once(log, published)
    assert log.overlaps == []
    for key, offsets in log.by_lane(lambda e: e[2]).items():
        assert offsets == sorted(offsets), f"key {key} out of order"
    assert len(loops) == 1 and len(log.threads) == 1  # one event loop, on one thread
    assert 1 < log.most_at_once <= 20  # at most one per key


def test_concurrency_1_is_the_one_thread_receiver(cluster, stream_factory):
    """The default keeps today's receiver: one thread, nothing confirmed by itself."""
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 20, keys=3)
    seen: list[int] = []
    with Subscriber(cluster, _config(stream, True)) as sub:
        receiver = sub.attach_receiver(lambda r: seen.append(r.offset or 0))
        assert type(receiver) is Receiver
        eventually(lambda: len(seen) >= len(published), 60)
        assert receiver.metrics().finished == len(published)
        time.sleep(0.5)
        assert sub.committed() == {0: None}
    assert seen == sorted(o for _, o in published)


def test_bad_arguments_are_refused(cluster, stream_factory):
    with Subscriber(cluster, _config(stream_factory(), False)) as sub:
        for bad, error in [
            ({"concurrency": 0}, ValueError),
            ({"concurrency": 2.5}, TypeError),
            ({"concurrency": 4, "ordering": "random"}, ValueError),
            ({"concurrency": 4, "max_in_flight": 0}, ValueError),
            ({"concurrency": 4, "dead_letter": 42}, TypeError),
            ({"concurrency": 4, "retry": 3}, TypeError),
            ({"concurrency": 4, "auto_confirm": "yes"}, TypeError),
            ({"concurrency": 4, "resequencer": object()}, TypeError),
        ]:
            with pytest.raises(error):
                sub.attach_receiver(lambda r: None, **bad)
        with pytest.raises(ValueError):  # checked for the one-thread receiver too
            sub.attach_receiver(lambda r: None, ordering="random")
        receiver = sub.attach_receiver(lambda r: None, concurrency=4)  # nothing was left attached
        assert receiver.running


def test_a_handler_closing_its_own_subscriber_ends_the_receiver(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 200, keys=10)
    errors: list[object] = []
    config = _config(stream, True, error_handler=lambda s, e: errors.append((s, e)))
    sub = Subscriber(cluster, config)
    closed = threading.Event()

    def handler(record: Record) -> None:
        time.sleep(0.001)
        if record.offset == 50:
            sub.close()
            closed.set()

    receiver = sub.attach_receiver(handler, concurrency=8)
    assert closed.wait(120)
    eventually(lambda: not receiver.running, 60)
    assert sub.closed and errors == []
    assert receiver.metrics().in_flight == 0
    assert receiver.metrics().finished + receiver.metrics().abandoned <= len(published)
