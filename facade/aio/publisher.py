"""``AsyncPublisher``: a ``Publisher`` whose acknowledgements are asyncio futures.

Records go to the sync publisher's producer on the loop thread (``produce`` never waits there);
delivery reports arrive on the publisher's delivery thread and resolve the futures through
``loop.call_soon_threadsafe``, one wake-up of the loop for every burst of reports. When the
producer's local queue is full, ``publish`` waits on the loop for the next delivery report
(backpressure) while ``publish_nowait`` refuses at once. Opening, ``flush`` and ``close`` run
on the shared helper pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable
from functools import partial
from types import TracebackType
from typing import Any, Self

from bolide.facade.aio._strand import Strand
from bolide.facade.config import Cluster, PublisherConfig
from bolide.facade.errors import PublishError
from bolide.facade.ports import PublisherLike
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record

__all__ = ["AsyncPublisher"]

_ROOM_WAIT_S = 0.05  # longest wait for a delivery report before trying a full queue again

_Answer = tuple["asyncio.Future[int]", int | None, BaseException | None]


class AsyncPublisher:
    """Publishes records to one stream from an asyncio loop; ``Publisher``'s semantics.

    Args:
        cluster: Where the stream lives.
        config: The stream and publisher settings.

    Open it with ``async with`` (or ``await open()``). A publisher belongs to the loop that
    opened it. A serde's ``encode`` runs on the loop thread.
    """

    def __init__(self, cluster: Cluster, config: PublisherConfig) -> None:
        if not isinstance(cluster, Cluster):
            raise TypeError("cluster must be a Cluster")
        if not isinstance(config, PublisherConfig):
            raise TypeError("config must be a PublisherConfig")
        self.cluster = cluster
        self.config = config
        self.stream = config.stream
        self._strand = Strand()
        self._pub: Publisher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answers: deque[_Answer] = deque()  # delivery reports not yet handed to the loop
        self._waking = False  # a hand-over to the loop is scheduled
        self._room: asyncio.Event | None = None
        self._waiting = 0  # publish calls waiting for room

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> Self:
        """Create the publisher (once; the topic is created on first use).

        A cancelled open leaves nothing open.
        """
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        await self._strand.run(self._create, undo=self._abandon)
        return self

    def _create(self) -> Publisher | None:
        """On the strand: a new publisher, or ``None`` when it is open already."""
        if self._pub is not None:
            return None
        self._pub = Publisher(self.cluster, self.config)
        return self._pub

    def _abandon(self, pub: Publisher | None) -> None:
        if pub is not None:
            pub.close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self, timeout_s: float = 10.0) -> None:
        """Flush and stop (``Publisher.close``); when it returns, every future is resolved."""
        pub = self._pub
        if pub is None:
            return
        await self._strand.run(lambda: pub.close(timeout_s))
        self._hand_over()

    async def flush(self, timeout_s: float = 10.0) -> int:
        """Wait until every record sent so far is acknowledged; return how many remain."""
        pub = self._publisher()
        remaining = await self._strand.run(lambda: pub.flush(timeout_s))
        self._hand_over()
        return remaining

    # -- publishing --------------------------------------------------------------------------

    def publish_nowait(self, record: Record | Any) -> asyncio.Future[int]:
        """Publish without waiting; the future resolves to the record's offset.

        Args:
            record: A ``Record``; bytes; or, with a serde, any object the serde encodes.

        Returns:
            A future of the offset, failing with ``PublishError``. Cancelling it does not take
            the record back: its delivery goes on and stamps the record's offset.

        Raises:
            TypeError: ``record`` is neither a Record nor something the serde encodes.
            PublishError: The publisher is closed (or not open); or its local queue is full
                (``retriable``; ``await publish(...)`` waits for room instead).
        """
        pub = self._publisher()
        rec = record if type(record) is Record else pub.to_record(record)
        future = self._future()
        if self._waiting or not pub.offer(rec, partial(self._answer, future)):
            raise PublishError(
                "the publisher's local queue is full (queue.buffering.max.messages or "
                "queue.buffering.max.kbytes); await publish() waits for room",
                record=rec,
                stream=self.stream.name,
                retriable=True,
            )
        return future

    async def publish(self, record: Record | Any) -> int:
        """Publish and wait for the acknowledgement; the record's offset.

        When the producer's local queue is full, waits (on the loop) for room first.
        Cancelled while it waits for room, nothing is published; cancelled while it waits
        for the acknowledgement, the delivery goes on and stamps the record's offset.

        Raises:
            TypeError: ``record`` is neither a Record nor something the serde encodes.
            PublishError: The broker did not accept the record, or the publisher is closed.
        """
        pub = self._publisher()
        rec = record if type(record) is Record else pub.to_record(record)
        return await self._send(pub, rec)

    async def publish_many(self, records: Iterable[Record | Any]) -> list[int]:
        """Publish a batch and wait for every acknowledgement; the offsets, in order.

        Records keep their order. If any fails, raises that record's ``PublishError`` once
        every record has its answer (``Publisher.publish_many``).

        Cancelled (while it waits for room, or for the acknowledgements), the records already
        handed to the producer are still delivered, each ``Record`` stamped with its offset as
        its acknowledgement arrives; the rest are never sent and keep ``offset`` ``None``. So
        the caller knows which went (pass ``Record`` objects to keep hold of them).

        Raises:
            TypeError: A record is neither a Record nor something the serde encodes (nothing
                of the batch is published).
            PublishError: A record failed, or the publisher is closed.
        """
        pub = self._publisher()
        recs = [r if type(r) is Record else pub.to_record(r) for r in records]
        futures = [await self._enqueue(pub, rec) for rec in recs]
        answers = await asyncio.gather(*futures, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return [a for a in answers if isinstance(a, int)]

    async def _send(self, pub: PublisherLike, rec: Record) -> int:
        return await (await self._enqueue(pub, rec))

    async def _enqueue(self, pub: PublisherLike, rec: Record) -> asyncio.Future[int]:
        """Hand ``rec`` to the producer, waiting on the loop while its queue is full."""
        future = self._future()
        answer = partial(self._answer, future)
        while not pub.offer(rec, answer):
            await self._wait_for_room()
        return future

    async def _wait_for_room(self) -> None:
        room = self._room
        assert room is not None
        room.clear()
        self._waiting += 1
        try:
            # A delivery report frees room; the timeout covers room freed without one.
            async with asyncio.timeout(_ROOM_WAIT_S):
                await room.wait()
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1

    # -- delivery reports --------------------------------------------------------------------

    def _answer(self, future: asyncio.Future[int], offset: int | None, error: Any) -> None:
        """On the delivery thread: queue the answer, wake the loop once per burst."""
        self._answers.append((future, offset, error))
        if not self._waking:
            self._waking = True
            loop = self._loop
            assert loop is not None
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
                loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        """On the loop: resolve the futures answered so far; a waiting ``publish`` retries."""
        self._waking = False
        answers = self._answers
        while answers:
            future, offset, error = answers.popleft()
            if future.done():
                continue  # cancelled by its caller; the record is stamped all the same
            if error is not None:
                future.set_exception(error)
            else:
                assert offset is not None
                future.set_result(offset)
        if self._waiting and self._room is not None:
            self._room.set()

    def _future(self) -> asyncio.Future[int]:
        loop = self._loop
        assert loop is not None
        return loop.create_future()

    def _publisher(self) -> Publisher:
        pub = self._pub
        if pub is None:
            raise PublishError(
                "publisher is not open: use `async with AsyncPublisher(...)` or await open()",
                stream=self.stream.name,
            )
        return pub

    @property
    def publisher(self) -> Publisher:
        """The sync ``Publisher`` behind this one, once open (``group``, ``partitions``)."""
        return self._publisher()

    def __repr__(self) -> str:
        return f"AsyncPublisher(stream={self.stream.name!r}, group={self.config.group!r})"
