"""Receivers: one per subscriber, and a close that waits for the handler it interrupts."""

from __future__ import annotations

import threading

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    ReceiverAlreadyAttachedError,
    Record,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.receiver import Receiver
from tests.conftest import eventually
from tests.reliability.conftest import committed

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

#: Longer than the ten seconds a subscriber's close used to give its receiver before it
#: closed the consumer under a handler that was still running.
OUTLAST_OLD_JOIN_S = 12.0


@pytest.mark.slow
def test_close_waits_for_the_handler_before_closing_the_consumer(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"slow"))
    errors: list[tuple[str, BaseException | None]] = []
    scheme = InitialOffsetScheme.EARLIEST
    config = SubscriberConfig(
        stream=stream,
        initial_offset_scheme=scheme,
        error_handler=lambda summary, e: errors.append((summary, e)),
    )
    sub = Subscriber(cluster, config)
    entered, release = threading.Event(), threading.Event()
    seen_closed: list[bool] = []
    raised: list[BaseException] = []

    def handler(record: Record) -> None:
        entered.set()
        release.wait(120)
        seen_closed.append(sub.closed)
        try:
            sub.seek(0)  # works on the consumer, which must still be open
        except BaseException as exc:
            raised.append(exc)

    receiver = sub.attach_receiver(handler, poll_timeout_ms=50)
    assert entered.wait(60)
    closer = threading.Thread(target=sub.close, daemon=True)
    closer.start()
    closer.join(OUTLAST_OLD_JOIN_S)
    still_waiting, closed_meanwhile = closer.is_alive(), sub.closed
    release.set()
    closer.join(60)

    assert still_waiting, "close returned while the handler was still running"
    assert not closed_meanwhile, "the consumer was closed under a running handler"
    assert not closer.is_alive()
    assert seen_closed == [False] and raised == []
    assert sub.closed and not receiver.running
    assert errors == []


def test_a_handler_confirms_while_its_subscriber_closes(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"one"))
    errors: list[tuple[str, BaseException | None]] = []
    config = SubscriberConfig(
        stream=stream, group="g", error_handler=lambda summary, e: errors.append((summary, e))
    )
    sub = Subscriber(cluster, config)
    entered, release = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def handler(record: Record) -> None:
        entered.set()
        release.wait(120)
        try:
            sub.confirm()
        except BaseException as exc:
            raised.append(exc)

    receiver = sub.attach_receiver(handler, poll_timeout_ms=50)
    assert entered.wait(60)
    closer = threading.Thread(target=sub.close, daemon=True)
    closer.start()
    release.set()
    closer.join(60)

    assert not closer.is_alive() and not receiver.running
    assert raised == [] and errors == []
    assert committed(cluster, sub.group_id, stream.name, 1) == {0: 1}


def test_close_is_prompt_with_a_long_poll_timeout(cluster, stream_factory):
    """A receiver waiting in a long poll sees the stop at once; close need not outwait it."""
    sub = Subscriber(cluster, SubscriberConfig(stream=stream_factory()))
    receiver = sub.attach_receiver(lambda record: None, poll_timeout_ms=600_000)
    eventually(lambda: receiver.running)
    closer = threading.Thread(target=sub.close, daemon=True)
    closer.start()
    closer.join(60)  # far less than the poll timeout: close does not wait for the poll
    assert not closer.is_alive()
    assert sub.closed and not receiver.running


def test_a_handler_closing_its_own_subscriber_ends_the_receiver(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(5):
            pub.publish(Record(b"%d" % i))
    errors: list[tuple[str, BaseException | None]] = []
    config = SubscriberConfig(
        stream=stream, group="g", error_handler=lambda summary, e: errors.append((summary, e))
    )
    sub = Subscriber(cluster, config)
    handled: list[bytes] = []

    def handler(record: Record) -> None:
        handled.append(record.data)
        sub.close()

    receiver = sub.attach_receiver(handler, poll_timeout_ms=50)
    eventually(lambda: not receiver.running, 60)
    assert handled == [b"0"]  # nothing polled or handled after the close
    assert sub.closed and errors == []


def attach_when_both_ready(
    sub: Subscriber, start: threading.Barrier, outcomes: list[Receiver | BaseException]
) -> None:
    start.wait()
    try:
        outcomes.append(sub.attach_receiver(lambda record: None, poll_timeout_ms=10))
    except ReceiverAlreadyAttachedError as exc:
        outcomes.append(exc)


def test_concurrent_attach_starts_one_receiver(cluster, stream_factory):
    with Subscriber(cluster, SubscriberConfig(stream=stream_factory())) as sub:
        for _ in range(200):
            start = threading.Barrier(2)
            outcomes: list[Receiver | BaseException] = []
            threads = [
                threading.Thread(target=attach_when_both_ready, args=(sub, start, outcomes))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            receivers = {id(o): o for o in outcomes if isinstance(o, Receiver)}
            refused = [o for o in outcomes if isinstance(o, ReceiverAlreadyAttachedError)]
            for receiver in receivers.values():
                receiver.close()
            assert len(receivers) == 1 and len(refused) == 1, outcomes
            assert not any(r.running for r in receivers.values())
