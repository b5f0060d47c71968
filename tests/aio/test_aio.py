"""What only the asyncio API has: cancellation, backpressure, many subscribers on one loop.

The behaviour both APIs share is tested once for both (the ``api`` fixture). Each test here
runs its own loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    OffsetLoadError,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    StreamConfig,
    SubscriberConfig,
)
from bolide.facade.aio import AsyncPublisher, AsyncSubscriber
from bolide.facade.aio._strand import POOL_THREADS

pytestmark = pytest.mark.kafka

EARLIEST = InitialOffsetScheme.EARLIEST
LEASE_MS = 4000


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def publish(cluster: Cluster, stream: StreamConfig, n: int, prefix: bytes = b"r") -> list[int]:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(prefix + b"%d" % i)) for i in range(n)]
        pub.flush()
        return [f.result(10) for f in futures]


async def read(sub: AsyncSubscriber, count: int, timeout_s: float = 20) -> list[Record]:
    got: list[Record] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            got.extend(await sub.poll(200))
    return got


async def wait_assigned(sub: AsyncSubscriber) -> None:
    async with asyncio.timeout(20):
        while not await sub.is_assigned():
            await asyncio.sleep(0.05)


class SlowSerde:
    """Decodes as bytes; the first decode signals and then takes its time, so that a poll
    step is still running when the test cancels its caller."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.decoded = 0

    def encode(self, value: Any, *, stream: str) -> bytes:
        return bytes(value)

    def decode(self, data: bytes, *, stream: str, partition: int | None, offset: int | None) -> Any:
        self.decoded += 1
        if not self.started.is_set():
            self.started.set()
            time.sleep(0.5)
        return data


def test_a_poll_cancelled_after_its_step_ran_loses_nothing_and_moves_nothing(
    cluster, stream_factory
):
    stream = stream_factory()
    offsets = publish(cluster, stream, 10)
    config = SubscriberConfig(stream=stream, group=f"g-{stream.name}", lease_timeout_ms=LEASE_MS)

    async def main() -> None:
        async with AsyncSubscriber(cluster, config) as sub:
            first = await read(sub, 3)
            await sub.confirm()
            confirmed = first[-1].offset + 1
            async with asyncio.timeout(20):
                while await sub.committed() != {0: confirmed}:
                    await asyncio.sleep(0.05)
            # The step runs on a helper thread while the loop is held up here: the poll's
            # records are in hand when it is cancelled, before its caller resumes.
            task = asyncio.create_task(sub.poll(5000))
            await asyncio.sleep(0)
            time.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await sub.confirm()  # nothing new was handed out: nothing new is confirmed
            await asyncio.sleep(0.5)
            assert await sub.committed() == {0: confirmed}
            rest = await read(sub, len(offsets) - len(first))
            assert [r.offset for r in first + rest] == offsets
            assert len(await sub.poll(200)) == 0

    run(main)


def test_a_poll_cancelled_while_its_step_runs_loses_nothing(cluster, stream_factory):
    stream = stream_factory()
    offsets = publish(cluster, stream, 5)
    serde = SlowSerde()
    config = SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST, serde=serde)

    async def main() -> None:
        async with AsyncSubscriber(cluster, config) as sub:
            task = asyncio.create_task(sub.poll(10_000))
            async with asyncio.timeout(20):
                while not serde.started.is_set():
                    await asyncio.sleep(0.01)
            task.cancel()  # the step is decoding its first record
            with pytest.raises(asyncio.CancelledError):
                await task
            got = await read(sub, len(offsets))
            assert [r.offset for r in got] == offsets
            assert [r.value for r in got] == [b"r%d" % i for i in range(5)]
            assert len(await sub.poll(200)) == 0

    run(main)


def test_leaving_an_async_for_loses_nothing_and_confirms_what_was_handed_out(
    cluster, stream_factory
):
    stream = stream_factory()
    offsets = publish(cluster, stream, 10)
    config = SubscriberConfig(stream=stream, group=f"g-{stream.name}", lease_timeout_ms=LEASE_MS)

    async def main() -> None:
        async with AsyncSubscriber(cluster, config) as sub:
            seen: list[int] = []
            async for record in sub:
                assert record.offset is not None
                seen.append(record.offset)
                if len(seen) == 3:
                    await sub.confirm()  # the third record, not the rest of its batch
                    break
            async with asyncio.timeout(20):
                while await sub.committed() != {0: seen[-1] + 1}:
                    await asyncio.sleep(0.05)

            async def consume_forever() -> None:
                async for record in sub:
                    assert record.offset is not None
                    seen.append(record.offset)
                    await asyncio.sleep(3600)  # cancelled while handling this one

            task = asyncio.create_task(consume_forever())
            async with asyncio.timeout(20):
                while len(seen) < 4:
                    await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            rest = await read(sub, len(offsets) - len(seen))
            assert seen + [r.offset for r in rest] == offsets

    run(main)


def test_async_for_ends_when_the_subscriber_closes(cluster, stream_factory):
    stream = stream_factory()

    async def main() -> None:
        sub = await AsyncSubscriber(cluster, SubscriberConfig(stream=stream)).open()
        seen: list[Record] = []

        async def consume() -> None:
            async for record in sub:
                seen.append(record)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        await sub.close()
        await asyncio.wait_for(task, 20)
        assert seen == [] and sub.closed
        with pytest.raises(IllegalSubscriberStateError):
            await sub.poll(10)

    run(main)


def test_a_cancelled_publish_is_still_delivered_and_its_offset_recorded(cluster, stream_factory):
    stream = stream_factory()

    async def main() -> None:
        async with AsyncPublisher(cluster, PublisherConfig(stream=stream)) as pub:
            record = Record(b"cancelled")
            task = asyncio.create_task(pub.publish(record))
            await asyncio.sleep(0)  # handed to the producer; now waiting for the ack
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await pub.flush()
            assert record.offset == 0
            cancelled_future = pub.publish_nowait(Record(b"second"))
            cancelled_future.cancel()
            assert await pub.publish(Record(b"third")) == 2
        config = SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST)
        async with AsyncSubscriber(cluster, config) as sub:
            got = await read(sub, 3)
        assert [r.data for r in got] == [b"cancelled", b"second", b"third"]

    run(main)


def test_publish_waits_for_room_without_blocking_the_loop(cluster, stream_factory):
    stream = stream_factory()
    # A tiny local queue that holds records for a while: it fills at once.
    config = PublisherConfig(
        stream=stream,
        producer_config={"queue.buffering.max.messages": 5, "linger.ms": 300},
    )

    async def main() -> None:
        ticks = 0
        stop = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        async with AsyncPublisher(cluster, config) as pub:
            futures = [pub.publish_nowait(Record(b"n%d" % i)) for i in range(5)]
            with pytest.raises(PublishError, match="queue is full") as info:
                pub.publish_nowait(Record(b"refused"))
            assert info.value.retriable and info.value.record.data == b"refused"
            ticker = asyncio.create_task(tick())
            await asyncio.sleep(0)
            before = ticks
            offsets = await pub.publish_many([Record(b"m%d" % i) for i in range(40)])
            waited_ticks = ticks - before
            stop.set()
            await ticker
            assert [await f for f in futures] == list(range(5))
        assert offsets == list(range(5, 45))
        assert waited_ticks > 0  # the loop kept running while publish waited for room
        async with AsyncSubscriber(
            cluster, SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST)
        ) as sub:
            got = await read(sub, 45)
        assert [r.data for r in got] == [b"n%d" % i for i in range(5)] + [
            b"m%d" % i for i in range(40)
        ]

    run(main)


def test_a_closed_or_unopened_client_refuses_calls(cluster, stream_factory):
    stream = stream_factory()

    async def main() -> None:
        pub = AsyncPublisher(cluster, PublisherConfig(stream=stream))
        with pytest.raises(PublishError, match="not open"):
            pub.publish_nowait(Record(b"x"))
        async with pub:
            pass
        with pytest.raises(PublishError, match="closed"):
            await pub.publish(Record(b"late"))
        with pytest.raises(TypeError):
            AsyncSubscriber(cluster, "config")  # type: ignore[arg-type]
        none = InitialOffsetScheme.NONE
        bad = AsyncSubscriber(
            cluster,
            SubscriberConfig(stream=stream, group=f"g-{stream.name}", initial_offset_scheme=none),
        )
        with pytest.raises(OffsetLoadError):
            await bad.open()
        with pytest.raises(IllegalSubscriberStateError, match="did not open"):
            await bad.poll(10)
        assert bad.closed

    run(main)


@pytest.mark.slow
def test_two_hundred_subscribers_share_one_loop_and_a_few_threads(cluster, stream_factory):
    stream = stream_factory()
    count, records = 200, 5
    # Many idle consumers: a longer broker-side wait keeps their fetch requests few.
    config = SubscriberConfig(
        stream=stream, consumer_config={"fetch.wait.max.ms": 500, "fetch.queue.backoff.ms": 50}
    )

    async def main() -> None:
        threads_before = threading.active_count()
        subs = [AsyncSubscriber(cluster, config) for _ in range(count)]
        await asyncio.gather(*(s.open() for s in subs))
        received: list[list[bytes]] = [[] for _ in subs]

        async def listen(sub: AsyncSubscriber, sink: list[bytes]) -> None:
            async for record in sub:
                sink.append(record.data)
                if len(sink) == records:
                    return

        tasks = [asyncio.create_task(listen(s, r)) for s, r in zip(subs, received, strict=True)]
        async with AsyncPublisher(cluster, PublisherConfig(stream=stream)) as pub:
            await pub.publish_many([Record(b"m%d" % i) for i in range(records)])
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        threads_during = threading.active_count()
        await asyncio.gather(*(s.close() for s in subs))
        assert all(r == [b"m%d" % i for i in range(records)] for r in received)
        # The helper pool, not a thread per subscriber.
        assert threads_during - threads_before <= POOL_THREADS

    run(main)


def test_a_cancelled_open_leaves_nothing_open(cluster, stream_factory):
    stream = stream_factory()

    async def main() -> None:
        sub = AsyncSubscriber(cluster, SubscriberConfig(stream=stream))
        task = asyncio.create_task(sub.open())
        await asyncio.sleep(0)
        time.sleep(1.0)  # the open runs on its helper thread meanwhile
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(IllegalSubscriberStateError, match="closed"):
            await sub.poll(10)  # runs after the cancelled open was undone
        assert sub.closed
        async with AsyncSubscriber(cluster, SubscriberConfig(stream=stream)) as again:
            await again.open()  # a second open of an open subscriber changes nothing
            assert len(await again.poll(10)) == 0

    run(main)
