"""Retries with backoff, then the dead letter (a stream, or a function) or the error handler;
a key's later records wait until its failed record is finished."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Reason,
    Record,
    Retry,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.deadletter import DETAIL_HEADER, REASON_HEADER, SOURCE_HEADER
from tests.conftest import eventually
from tests.parallel.conftest import LEASE_MS, fresh_group, publish_keyed

pytestmark = pytest.mark.kafka


class Flaky:
    """A handler that fails the first ``failures`` calls of each record in ``bad`` (all calls
    when ``failures`` is None), and logs every call and every success."""

    def __init__(self, bad: set[int], failures: int | None) -> None:
        self.bad, self.failures = bad, failures
        self.lock = threading.Lock()
        self.calls: Counter[int] = Counter()
        self.events: list[tuple[str, bytes | None, int, float]] = []

    def __call__(self, record: Record) -> None:
        offset = record.offset or 0
        with self.lock:
            self.calls[offset] += 1
            calls = self.calls[offset]
            self.events.append(("call", record.key, offset, time.monotonic()))
        if offset in self.bad and (self.failures is None or calls <= self.failures):
            raise RuntimeError(f"boom {offset}")
        with self.lock:
            self.events.append(("ok", record.key, offset, time.monotonic()))


def _grouped(stream, **extra) -> SubscriberConfig:
    return SubscriberConfig(stream=stream, group=fresh_group(), lease_timeout_ms=LEASE_MS, **extra)


def test_retry_with_backoff_then_success_keeps_key_order(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 60, keys=3)
    handler = Flaky(bad={4, 10, 31}, failures=2)
    retry = Retry(attempts=3, backoff_s=0.05, max_backoff_s=0.2)
    errors: list[object] = []
    config = _grouped(stream, error_handler=lambda s, e: errors.append((s, e)))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=8, retry=retry)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        metrics = receiver.metrics()
    assert metrics.retried == 6 and metrics.failed == 0 and metrics.dead_lettered == 0
    assert errors == []
    assert all(handler.calls[o] == (3 if o in handler.bad else 1) for _, o in published)
    # The waits between calls of one record grow (with jitter, between half and all of it).
    calls = [t for kind, _, o, t in handler.events if kind == "call" and o == 4]
    assert calls[1] - calls[0] >= 0.025 and calls[2] - calls[1] >= 0.05
    # Per key, each record succeeded before the next one was first called.
    for key in {k for _, k, _, _ in handler.events}:
        ok = [o for kind, k, o, _ in handler.events if kind == "ok" and k == key]
        first_calls = []
        for kind, k, o, _ in handler.events:
            if kind == "call" and k == key and o not in first_calls:
                first_calls.append(o)
        assert ok == sorted(ok) == first_calls


def test_dead_letter_stream_gets_reason_and_origin(cluster, stream_factory):
    stream, dead_stream = stream_factory(), stream_factory()
    published = publish_keyed(cluster, stream, 40, keys=4)
    bad = {5, 17}
    handler = Flaky(bad=bad, failures=None)
    retry = Retry(attempts=2, backoff_s=0.01, max_backoff_s=0.05)
    errors: list[object] = []
    config = _grouped(stream, error_handler=lambda s, e: errors.append((s, e)))
    with (
        Publisher(cluster, PublisherConfig(stream=dead_stream)) as dead,
        Subscriber(cluster, config) as sub,
    ):
        receiver = sub.attach_receiver(handler, concurrency=4, retry=retry, dead_letter=dead)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        metrics = receiver.metrics()
    assert metrics.dead_lettered == 2 and metrics.retried == 2 and metrics.failed == 0
    assert errors == []
    with Subscriber(
        cluster,
        SubscriberConfig(stream=dead_stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST),
    ) as reader:
        letters: list[Record] = []
        eventually(lambda: letters.extend(reader.poll(200)) or len(letters) >= 2, 60)
    by_data = {r.data: r for r in letters}
    assert set(by_data) == {b"5", b"17"}
    for offset in bad:
        letter = by_data[b"%d" % offset]
        assert letter.key == published[(0, offset)]
        assert letter.header(REASON_HEADER) == Reason.FAILED.value.encode()
        detail = (letter.header(DETAIL_HEADER) or b"").decode()
        assert f"RuntimeError: boom {offset}" in detail and "2 attempts" in detail
        assert letter.header(SOURCE_HEADER) == f"{stream.name}/0/{offset}".encode()
    # The key's next record was called only after the failed one was dead-lettered.
    key = published[(0, 5)]
    later = [t for kind, k, o, t in handler.events if kind == "call" and k == key and o > 5]
    last_try = max(t for kind, _, o, t in handler.events if kind == "call" and o == 5)
    assert later and min(later) > last_try


def test_dead_letter_function_and_error_handler(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 30, keys=2)
    handler = Flaky(bad={3, 20}, failures=None)
    seen: list[tuple[int, BaseException]] = []
    failing_once = {"left": 1}

    def dead_letter(record: Record, error: BaseException) -> None:
        if record.offset == 20 and failing_once["left"]:
            failing_once["left"] -= 1
            raise OSError("dead-letter store down")  # tried again later
        seen.append((record.offset or 0, error))

    errors: list[tuple[str, BaseException | None]] = []
    config = _grouped(stream, error_handler=lambda s, e: errors.append((s, e)))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(
            handler,
            concurrency=4,
            retry=Retry(attempts=1, max_backoff_s=1),
            dead_letter=dead_letter,
        )
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        assert receiver.metrics().dead_lettered == 2
    assert sorted(o for o, _ in seen) == [3, 20]
    assert all(isinstance(e, RuntimeError) for _, e in seen)
    assert [type(e) for _, e in errors] == [OSError]  # the failed dead letter was reported


def test_without_dead_letter_the_error_handler_hears_and_confirms_move_on(
    cluster, stream_factory, caplog
):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 25, keys=5)
    handler = Flaky(bad={7}, failures=None)
    errors: list[tuple[str, BaseException | None]] = []
    config = _grouped(stream, error_handler=lambda s, e: errors.append((s, e)))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4, retry=Retry(attempts=2, backoff_s=0))
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        metrics = receiver.metrics()
    assert metrics.failed == 1 and metrics.retried == 1
    assert len(errors) == 1
    summary, error = errors[0]
    assert "offset=7" in summary
    assert "after 2 attempts" in summary and isinstance(error, RuntimeError)
    assert any("after 2 attempts" in r.getMessage() for r in caplog.records)


def test_retry_arguments():
    assert Retry().attempts == 3
    for bad, error in [
        ({"attempts": 0}, ValueError),
        ({"attempts": 1.5}, TypeError),
        ({"backoff_s": -1}, ValueError),
        ({"backoff_s": 2, "max_backoff_s": 1}, ValueError),
        ({"max_backoff_s": "5"}, TypeError),
    ]:
        with pytest.raises(error):
            Retry(**bad)
    retry = Retry(attempts=10, backoff_s=0.1, max_backoff_s=1.0)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.0), (60, 1.0)]:
        for _ in range(50):
            assert ceiling / 2 <= retry.delay(n) <= ceiling
    assert Retry(backoff_s=0, max_backoff_s=0).delay(3) == 0


def test_async_handler_retries_then_awaits_an_async_dead_letter(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 20, keys=2)
    calls: Counter[int] = Counter()
    letters: list[tuple[int, str]] = []

    async def handler(record: Record) -> None:
        calls[record.offset or 0] += 1
        if record.offset == 6:
            raise ValueError("never")

    async def dead_letter(record: Record, error: BaseException) -> None:
        letters.append((record.offset or 0, str(error)))

    with Subscriber(cluster, _grouped(stream)) as sub:
        receiver = sub.attach_receiver(
            handler, concurrency=4, retry=Retry(attempts=3, backoff_s=0.01), dead_letter=dead_letter
        )
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        metrics = receiver.metrics()
    assert letters == [(6, "never")]
    assert calls[6] == 3 and metrics.retried == 2 and metrics.dead_lettered == 1


def test_one_worker_with_retries_is_a_parallel_receiver(cluster, stream_factory):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 10, keys=2)
    handler = Flaky(bad={3}, failures=1)
    with Subscriber(cluster, _grouped(stream)) as sub:
        receiver = sub.attach_receiver(
            handler, retry=Retry(attempts=2, backoff_s=0.01), ordering="partition"
        )
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
    ok = [o for kind, _, o, _ in handler.events if kind == "ok"]
    assert ok == list(range(len(published)))  # one at a time, in offset order, 3 retried
    assert handler.calls[3] == 2


class Stop(BaseException):
    """A user's own BaseException (as KeyboardInterrupt or SystemExit are)."""


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_a_handler_raising_a_base_exception_fails_only_its_record(cluster, stream_factory, kind):
    """A BaseException (the handler's own CancelledError too) is that record's failure: the
    error handler hears it, the key's later records run, confirms pass it once reported."""
    import asyncio

    stream = stream_factory()
    published = publish_keyed(cluster, stream, 20, keys=2)  # key k0: 0, 2, 4, ...
    done: list[int] = []
    errors: list[tuple[str, BaseException | None]] = []
    raised = Stop("stop") if kind == "plain" else asyncio.CancelledError()

    def plain(record: Record) -> None:
        if record.offset == 4:
            raise raised
        done.append(record.offset or 0)

    async def coroutine(record: Record) -> None:
        await asyncio.sleep(0)
        if record.offset == 4:
            raise raised
        done.append(record.offset or 0)

    config = _grouped(stream, error_handler=lambda s, e: errors.append((s, e)))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(plain if kind == "plain" else coroutine, concurrency=4)
        eventually(lambda: receiver.metrics().finished >= len(published), 120)
        eventually(lambda: sub.committed() == {0: len(published)}, 60)
        assert receiver.metrics().failed == 1
    assert sorted(done) == [o for o in range(len(published)) if o != 4]
    assert [e for _, e in errors] == [raised]


def test_a_close_past_its_deadline_still_abandons_a_running_async_handler(cluster, stream_factory):
    """The receiver's own cancellation is not a failure: the record stays unconfirmed."""
    import asyncio

    stream = stream_factory()
    publish_keyed(cluster, stream, 6, keys=6)
    started = threading.Event()
    errors: list[BaseException | None] = []

    async def handler(record: Record) -> None:
        if record.offset == 3:
            started.set()
            await asyncio.sleep(3600)

    config = _grouped(stream, error_handler=lambda s, e: errors.append(e))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=4, ordering="unordered")
        assert started.wait(120)
        eventually(lambda: receiver.metrics().finished >= 5, 120)
        receiver.close(timeout_s=0)
        metrics = receiver.metrics()
        assert metrics.failed == 0 and metrics.abandoned >= 1
        eventually(lambda: sub.committed() == {0: 3}, 60)
    assert errors == []
