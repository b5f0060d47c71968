"""A cancelled asyncio poll never lets another task's confirm pass what it had read: its
records go back to the subscriber before any later call on it runs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from bolide.facade import InitialOffsetScheme, SubscriberConfig
from bolide.facade.aio import AsyncSubscriber
from tests.aio.test_aio import LEASE_MS, publish, read, run

pytestmark = pytest.mark.kafka


class Counting:
    """Decodes as bytes and signals once ``count`` records were decoded."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.decoded = 0
        self.all = threading.Event()

    def encode(self, value: Any, *, stream: str) -> bytes:
        return bytes(value)

    def decode(self, data: bytes, *, stream: str, partition: int | None, offset: int | None) -> Any:
        self.decoded += 1
        if self.decoded >= self.count:
            self.all.set()
        return data


def test_another_tasks_confirm_waits_for_a_cancelled_polls_give_back(cluster, stream_factory):
    stream = stream_factory()
    offsets = publish(cluster, stream, 10)
    serde = Counting(6)  # the first poll's 3, then the cancelled poll's 3
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{stream.name}",
        lease_timeout_ms=LEASE_MS,
        serde=serde,
        max_batch=3,  # the first poll leaves records for the cancelled one
    )

    async def main() -> None:
        async with AsyncSubscriber(cluster, config) as sub:
            first = await read(sub, 3)
            assert len(first) == 3
            await sub.confirm()
            confirmed = first[-1].offset + 1
            async with asyncio.timeout(20):
                while await sub.committed() != {0: confirmed}:
                    await asyncio.sleep(0.05)
            poll = asyncio.create_task(sub.poll(5000))
            other = asyncio.create_task(sub.confirm())  # queued on the strand behind the poll
            await asyncio.sleep(0)  # both start; neither can resume while the loop is held
            # Holding the loop: the poll's step reads on a helper thread, and its caller
            # cannot resume before it is cancelled.
            assert serde.all.wait(30)
            time.sleep(0.5)
            poll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await poll
            await other  # ran after the give-back: nothing new was handed out
            await asyncio.sleep(0.5)
            assert await sub.committed() == {0: confirmed}
            rest = await read(sub, len(offsets) - len(first))
            assert [r.offset for r in first + rest] == offsets

    run(main)


def test_a_cancelled_publish_many_tells_which_records_went(cluster, stream_factory):
    """Cancelled while waiting for room: what the producer took is delivered and stamped with
    its offset; what it never took keeps ``offset`` None and is never sent."""
    from bolide.facade import PublisherConfig, Record
    from bolide.facade.aio import AsyncPublisher

    stream = stream_factory()
    config = PublisherConfig(stream=stream, producer_config={"queue.buffering.max.messages": 1})
    records = [Record(b"%d" % i) for i in range(200)]

    async def main() -> None:
        async with AsyncPublisher(cluster, config) as pub:
            task = asyncio.create_task(pub.publish_many(records))
            await asyncio.sleep(0)  # the first record is taken; the next waits for room
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await pub.flush()
        sent = [r for r in records if r.offset is not None]
        assert sent and sent == records[: len(sent)], "a prefix went, in order"
        assert [r.offset for r in sent] == list(range(len(sent)))
        subscriber = SubscriberConfig(
            stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST
        )
        async with AsyncSubscriber(cluster, subscriber) as sub:
            got = await read(sub, len(sent))
            assert len(await sub.poll(500)) == 0
        assert [r.data for r in got] == [r.data for r in sent]

    run(main)
