"""``Publisher.close``: every record handed over resolves, also when the broker is gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from bolide.facade import (
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    StreamConfig,
)
from tests.conftest import eventually

pytestmark = pytest.mark.kafka

Calls = list[tuple[int | None, BaseException | None]]


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, so that stopping it disturbs no other test."""
    with EmbeddedBroker() as own:
        yield own


def orphaned_publisher(broker: EmbeddedBroker, **producer_config: object) -> Publisher:
    """A publisher whose broker has gone away after the topic was created."""
    stream = StreamConfig(name="gone")
    pub = Publisher(
        broker.cluster(), PublisherConfig(stream=stream, producer_config=producer_config)
    )
    pub.publish(Record(b"while-up"), 30)
    broker.kill()
    return pub


def test_close_fails_every_record_the_gone_broker_never_acknowledged(
    broker: EmbeddedBroker,
) -> None:
    pub = orphaned_publisher(broker)
    calls: dict[int, Calls] = {i: [] for i in range(50)}
    records = [Record(b"r%d" % i) for i in range(50)]
    futures = [
        pub.publish_async(r, callback=lambda o, e, i=i: calls[i].append((o, e)))
        for i, r in enumerate(records)
    ]
    pub.close(timeout_s=0.5)

    # Resolved by the time close returns: nobody is left to resolve them later.
    assert all(f.done() for f in futures)
    for record, future in zip(records, futures, strict=True):
        error = future.exception(0)
        assert isinstance(error, PublishError)
        assert error.record is record and error.stream == "gone"
        assert "closed" in str(error)
        assert record.offset is None
    for i in range(50):
        assert len(calls[i]) == 1, f"callback {i} called {len(calls[i])} times"
        offset, error = calls[i][0]
        assert offset is None and isinstance(error, PublishError)


def test_close_ends_a_publish_waiting_for_room_in_the_queue(broker: EmbeddedBroker) -> None:
    pub = orphaned_publisher(broker, **{"queue.buffering.max.messages": 5})
    futures: list[Future[int]] = []
    refused: list[PublishError] = []

    def publish_until_refused() -> None:
        # More records than the local queue holds: the last ones wait for room that never comes.
        try:
            for i in range(1_000):
                futures.append(pub.publish_async(Record(b"r%d" % i)))
        except PublishError as exc:
            refused.append(exc)

    thread = threading.Thread(target=publish_until_refused, daemon=True)
    thread.start()
    eventually(lambda: pub.flush(0) >= 5, 30)  # the queue is full: the thread waits for room
    pub.close(timeout_s=0.5)
    thread.join(30)

    assert not thread.is_alive(), "publish_async still waits for room after close"
    assert len(refused) == 1 and "closed" in str(refused[0])
    assert refused[0].record is not None
    assert futures and all(f.done() for f in futures)
    assert all(isinstance(f.exception(0), PublishError) for f in futures)


def test_publishes_racing_close_are_accepted_or_refused(cluster, stream_factory) -> None:
    pub = Publisher(cluster, PublisherConfig(stream=stream_factory()))
    accepted: list[list[Future[int]]] = [[] for _ in range(4)]
    refused: list[PublishError] = []
    calls: Calls = []
    start = threading.Barrier(5)

    def publish_until_refused(mine: list[Future[int]]) -> None:
        start.wait()
        try:
            while True:
                mine.append(
                    pub.publish_async(Record(b"x"), callback=lambda o, e: calls.append((o, e)))
                )
        except PublishError as exc:
            refused.append(exc)

    threads = [
        threading.Thread(target=publish_until_refused, args=(mine,), daemon=True)
        for mine in accepted
    ]
    for thread in threads:
        thread.start()
    start.wait()
    eventually(lambda: sum(f.done() for mine in accepted for f in mine[:100]) >= 100, 30)
    pub.close()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()

    futures = [f for mine in accepted for f in mine]
    assert len(refused) == 4
    assert all(f.done() for f in futures), "a record accepted during close was orphaned"
    assert len(calls) == len(futures)
    # A record accepted before close was flushed: on a live broker every one is delivered.
    assert all(f.exception(0) is None for f in futures)
