"""The asyncio API behind sync-shaped calls, so that one test body checks both APIs.

``SYNC`` and ``aio_api(loop)`` are the two values of the ``api`` fixture (tests/conftest.py):
``api.Publisher(cluster, config)`` and ``api.Subscriber(cluster, config)`` are the sync classes,
or adapters that run an ``AsyncPublisher`` / ``AsyncSubscriber`` on one event loop in a
background thread (as a service's loop would hold many clients) and wait for each coroutine.
Only the calls the asyncio API has are adapted; a test of anything else (receivers) stays
sync-only.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    RecordBatch,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.aio import AsyncPublisher, AsyncSubscriber
from bolide.facade.durable import DurableSession

__all__ = ["SYNC", "Api", "LoopThread", "aio_api"]

T = TypeVar("T")


class LoopThread:
    """An event loop running in a thread of its own; ``run(coro)`` waits for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-aio-loop")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass(frozen=True)
class Api:
    """Which API a test runs: ``name`` is ``"sync"`` or ``"aio"``."""

    name: str
    Publisher: Callable[[Cluster, PublisherConfig], Any]
    Subscriber: Callable[[Cluster, SubscriberConfig], Any]

    def __repr__(self) -> str:
        return self.name


SYNC = Api("sync", Publisher, Subscriber)


def aio_api(loop: LoopThread) -> Api:
    """The asyncio API on ``loop``, with the sync API's shape."""
    return Api(
        "aio",
        lambda cluster, config: AioPublisher(loop, cluster, config),
        lambda cluster, config: AioSubscriber(loop, cluster, config),
    )


class AioPublisher:
    """``Publisher``'s calls over an ``AsyncPublisher``."""

    def __init__(self, loop: LoopThread, cluster: Cluster, config: PublisherConfig) -> None:
        self._loop = loop
        self.aio = AsyncPublisher(cluster, config)
        loop.run(self.aio.open())

    def publish(self, record: Record | Any, timeout_s: float | None = 30.0) -> int:
        return self._loop.run(asyncio.wait_for(self.aio.publish(record), timeout_s))

    def publish_async(
        self,
        record: Record | Any,
        callback: Callable[[int | None, BaseException | None], None] | None = None,
    ) -> Future[int]:
        result: Future[int] = Future()
        result.set_running_or_notify_cancel()

        def done(answer: asyncio.Future[int]) -> None:
            error = answer.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(answer.result())
            if callback is not None:
                callback(None if error is not None else answer.result(), error)

        async def start() -> None:
            try:
                answer = self.aio.publish_nowait(record)
            except PublishError as exc:
                if not exc.retriable:
                    raise
                # The local queue is full: wait for room as the sync publisher does.
                answer = asyncio.ensure_future(self.aio.publish(record))
            answer.add_done_callback(done)

        self._loop.run(start())
        return result

    def produce(self, record: Record | Any, on_delivery: Any = None) -> None:
        self.publish_async(record, on_delivery)

    def flush(self, timeout_s: float = 10.0) -> int:
        return self._loop.run(self.aio.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> None:
        self._loop.run(self.aio.close(timeout_s))

    def __enter__(self) -> AioPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def stream(self) -> Any:
        return self.aio.stream

    @property
    def group(self) -> str | None:
        return self.aio.publisher.group

    @property
    def partitions(self) -> int:
        return self.aio.publisher.partitions


class AioSubscriber:
    """``Subscriber``'s calls over an ``AsyncSubscriber``."""

    def __init__(self, loop: LoopThread, cluster: Cluster, config: SubscriberConfig) -> None:
        self._loop = loop
        self.aio = AsyncSubscriber(cluster, config)
        loop.run(self.aio.open())

    def poll(self, timeout_ms: int) -> RecordBatch:
        return self._loop.run(self.aio.poll(timeout_ms))

    def seek(self, offset: int, partition: int | None = None) -> None:
        self._loop.run(self.aio.seek(offset, partition))

    def confirm(self, offset: int | None = None, partition: int | None = None) -> None:
        self._loop.run(self.aio.confirm(offset, partition))

    def seek_to_time(self, timestamp_ms: int, partition: int | None = None) -> None:
        self._loop.run(self.aio.seek_to_time(timestamp_ms, partition))

    def pause(self, partitions: Any = None) -> None:
        self._loop.run(self.aio.pause(partitions))

    def resume(self, partitions: Any = None) -> None:
        self._loop.run(self.aio.resume(partitions))

    @property
    def paused(self) -> frozenset[tuple[str, int]]:
        return self.aio.paused

    def committed(self, timeout_s: float = 10.0) -> dict[int, int | None]:
        return self._loop.run(self.aio.committed(timeout_s))

    def is_assigned(self) -> bool:
        return self._loop.run(self.aio.is_assigned())

    def deactivate(self) -> None:
        self._loop.run(self.aio.deactivate())

    def reactivate(self) -> None:
        self._loop.run(self.aio.reactivate())

    def close(self, keep_alive: bool = True) -> None:
        self._loop.run(self.aio.close(keep_alive))

    def __enter__(self) -> AioSubscriber:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._loop.run(self.aio.__aexit__(*exc_info))

    @property
    def closed(self) -> bool:
        return self.aio.closed

    @property
    def durable(self) -> DurableSession | None:
        return self.aio.durable

    @property
    def marker(self) -> dict[int, int]:
        return self.aio.marker

    @property
    def config(self) -> SubscriberConfig:
        return self.aio.config

    @property
    def stream(self) -> Any:
        return self.aio.stream

    @property
    def scheme(self) -> Any:
        return self.aio.subscriber.scheme
