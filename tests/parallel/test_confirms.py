"""Confirms stay below the first unfinished record; backpressure pauses fetching; close
drains (or abandons past its deadline); a revoked partition's work is finished in time and
confirmed while owned, or abandoned unconfirmed."""

from __future__ import annotations

import threading
import time

import pytest

from bolide.facade import InitialOffsetScheme, Record, Subscriber, SubscriberConfig
from tests.conftest import eventually
from tests.parallel.conftest import LEASE_MS, Log, fresh_group, publish_keyed

pytestmark = pytest.mark.kafka


def _grouped(stream, group: str | None = None, **extra) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream, group=group or fresh_group(), lease_timeout_ms=LEASE_MS, **extra
    )


class Blocker:
    """Handles records at once, except those in ``held``, which wait for ``release``."""

    def __init__(self, held: set[int]) -> None:
        self.held = held
        self.release = threading.Event()
        self.entered = threading.Event()
        self.log = Log()

    def __call__(self, record: Record) -> None:
        self.log.start(record, record.key)
        if record.offset in self.held:
            self.entered.set()
            self.release.wait(120)
        self.log.end(record, record.key)


def test_confirm_stays_below_the_first_unfinished_record(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 50, keys=10)
    handler = Blocker(held={12})  # key k2: offsets 22, 32, 42 wait behind it
    with Subscriber(cluster, _grouped(stream)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=8)
        eventually(lambda: receiver.metrics().finished >= len(published) - 4, 120)
        time.sleep(1.0)  # several confirm rounds
        metrics = receiver.metrics()
        assert metrics.in_flight == 4 and metrics.safe == {0: 11}
        assert metrics.confirmed == {0: 11}
        eventually(lambda: sub.committed() == {0: 12}, 60)
        assert {o for _, o, _ in handler.log.done}.isdisjoint({12, 22, 32, 42})
        handler.release.set()
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        assert receiver.metrics().in_flight == 0


def test_auto_confirm_off_confirms_nothing(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 30, keys=3)
    with Subscriber(cluster, _grouped(stream)) as sub:
        receiver = sub.attach_receiver(lambda r: None, concurrency=4, auto_confirm=False)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        assert receiver.metrics().safe == {0: len(published) - 1}
        time.sleep(0.5)
        assert sub.committed() == {0: None} and receiver.metrics().confirmed == {}


def test_backpressure_bounds_what_is_in_flight(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 400, keys=400)
    gate = threading.Event()
    peak = {"in_flight": 0, "paused": False}
    log = Log()

    def handler(record: Record) -> None:
        log.start(record, record.offset)
        gate.wait(120)
        log.end(record, record.offset)

    config = _grouped(stream, max_batch=10)
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4, max_in_flight=40)
        eventually(lambda: receiver.metrics().paused, 120)
        deadline = time.monotonic() + 3  # it stays paused, far below the stream's 400 records
        while time.monotonic() < deadline:
            metrics = receiver.metrics()
            peak["in_flight"] = max(peak["in_flight"], metrics.in_flight)
            assert metrics.paused
            time.sleep(0.02)
        assert 40 <= peak["in_flight"] <= 40 + 10  # the limit plus at most one poll
        gate.set()
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        assert not receiver.metrics().paused
    assert sorted(o for _, o, _ in log.done) == sorted(o for _, o in published)


def test_close_drains_in_flight_work(cluster, stream_factory):
    stream = stream_factory()
    publish_keyed(cluster, stream, 200, keys=20)
    started = threading.Event()

    def handler(record: Record) -> None:
        started.set()
        time.sleep(0.02)

    sub = Subscriber(cluster, _grouped(stream, max_batch=20))
    receiver = sub.attach_receiver(handler, concurrency=4, max_in_flight=20)
    assert started.wait(120)
    time.sleep(0.1)
    receiver.close(timeout_s=120)  # stops fetching: what it had taken is finished
    metrics = receiver.metrics()
    assert not receiver.running and metrics.in_flight == 0 and metrics.abandoned == 0
    taken = metrics.finished
    assert 0 < taken <= 40  # at most max_in_flight plus one poll: the rest was never taken
    eventually(lambda: sub.committed() == {0: taken}, 60)  # exactly what was finished
    sub.close()


def test_close_abandons_what_outlives_its_deadline(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 30, keys=3)
    handler = Blocker(held={7})
    with Subscriber(cluster, _grouped(stream)) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4)
        eventually(lambda: receiver.metrics().finished >= len(published) - 8, 120)
        receiver.close(timeout_s=0.5)
        metrics = receiver.metrics()
        assert not receiver.running
        assert metrics.in_flight == 0 and metrics.abandoned == 8  # 7 and its key's 7 after it
        eventually(lambda: sub.committed() == {0: 7}, 60)
        handler.release.set()
    assert all(o not in (10, 13, 16) for _, o, _ in handler.log.done)


def test_a_revoked_partition_finishes_in_time_and_the_rest_is_read_again(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 40, keys=4)
    handler = Blocker(held={9})  # k1: 13, 17, ... wait behind 9
    group = fresh_group()
    # A longer lease than the other tests: the revoke waits half of it for running records.
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=10_000)
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4)
        assert handler.entered.wait(120)
        eventually(lambda: receiver.metrics().finished >= 32, 120)  # all but key k1's 8
        threading.Timer(0.5, handler.release.set).start()  # well within the revoke's wait
        sub.deactivate()  # revokes partition 0 while it is owned
        metrics = receiver.metrics()
        # 9 finished in time and was confirmed; its key's later records had not started.
        assert 9 in {o for _, o, _ in handler.log.done}
        assert metrics.abandoned == 7 and metrics.in_flight == 0
        assert sub.committed() == {0: 13}  # synchronous: at once
    again = Log()
    with Subscriber(cluster, _grouped(stream, group)) as sub:
        receiver = sub.attach_receiver(
            lambda r: (again.start(r, r.key), again.end(r, r.key)), concurrency=4
        )
        eventually(lambda: sub.committed() == {0: len(published)}, 120)
    # Only key k1's abandoned records run again: the others above 13 finished, and the
    # revoke's commit carried them with the position (the completion ledger).
    assert sorted(o for _, o, _ in again.done) == list(range(13, len(published), 4))


def test_ungrouped_subscriber_keeps_safe_offsets(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 30, keys=3)
    handler = Blocker(held={4})
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4)
        eventually(lambda: receiver.metrics().finished >= len(published) - 9, 120)
        assert receiver.metrics().safe == {0: 3} and receiver.metrics().confirmed == {}
        handler.release.set()
        eventually(lambda: receiver.metrics().safe == {0: len(published) - 1}, 60)


def test_a_seek_back_starts_the_partition_over(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 30, keys=3)
    log = Log()

    def handler(record: Record) -> None:
        log.start(record, record.key)
        time.sleep(0.001)
        log.end(record, record.key)

    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        sub.seek(10)
        eventually(lambda: receiver.metrics().finished >= 2 * len(published) - 10, 120)
        assert receiver.metrics().safe == {0: len(published) - 1}
        assert receiver.metrics().in_flight == 0 and receiver.running
    handled = sorted(o for _, o, _ in log.done)
    assert handled == sorted([*range(len(published)), *range(10, len(published))])


def test_a_receiver_attached_after_a_close_reads_the_abandoned_records_first(
    cluster, stream_factory
):
    """Records a closed receiver abandoned are read again by the next receiver of the same
    subscriber: no confirm, by it or by hand, passes them before they are finished."""
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 20, keys=4)
    blocker = Blocker(held={5})
    config = _grouped(stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(cluster, config) as sub:
        try:
            first = sub.attach_receiver(blocker, concurrency=4, ordering="unordered")
            eventually(lambda: first.metrics().finished >= len(published) - 1, 120)
            assert blocker.entered.is_set()
            first.close(timeout_s=0)  # offset 5 still runs: abandoned
            assert first.metrics().abandoned >= 1
            sub.confirm()  # by hand: still nothing at or past the abandoned record
            eventually(lambda: sub.committed() == {0: 5}, 60)
            again = Log()

            def handle(record: Record) -> None:
                again.start(record, record.key)
                again.end(record, record.key)

            second = sub.attach_receiver(handle, concurrency=4, ordering="unordered")
            eventually(lambda: sub.committed() == {0: len(published)}, 60)
            assert 5 in {o for _, o, _ in again.done}
            second.close()
        finally:
            blocker.release.set()
