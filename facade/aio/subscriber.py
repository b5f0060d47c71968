"""``AsyncSubscriber``: a ``Subscriber`` driven from an asyncio loop without blocking it.

The semantics are the sync subscriber's own (it is wrapped, not re-implemented): initial offset
schemes, the splice, leases, durable clients, serdes, dead letters, message groups, errors.
What changes is where the work runs. Every call that may block (a poll step, seek, confirm,
close, a rebalance callback, a spliced SQL read) runs on the process's small shared pool of
helper threads, in order per subscriber (``Strand``). A poll never waits there: each step
takes what the consumer already fetched (``consume(..., 0)``) and, when there is nothing, the
coroutine sleeps on the loop, from 1 ms up to ``_MAX_WAIT_S`` between steps while the stream is
quiet and back to none as soon as records flow. So hundreds of subscribers share one loop and a
handful of threads.

Cancelling a ``poll`` (or an ``async for``) loses nothing and moves no position: a step that
ran is given back (``Fetcher.give_back``) and its records are returned by the next poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Self, TypeVar

from bolide.facade.aio._strand import Strand
from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer.client import group_id
from bolide.facade.consumer.lifecycle import check_arguments
from bolide.facade.consumer.membership import membership_of
from bolide.facade.durable import DurableSession
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.ports import Polled, SubscriberLike
from bolide.facade.record import Record, RecordBatch
from bolide.facade.subscriber import Subscriber
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["AsyncSubscriber"]

T = TypeVar("T")

_MIN_WAIT_S = 0.001  # first wait after an empty step
_MAX_WAIT_S = 0.05  # longest wait between steps on a quiet stream
_ITER_POLL_MS = 1000  # each poll of ``async for`` (it goes on until the subscriber closes)


class AsyncSubscriber:
    """Reads records from one stream on an asyncio loop; ``Subscriber``'s API as coroutines.

    Args:
        cluster: Where the stream lives.
        config: Stream, subscriber group, initial offset scheme and the other settings.

    Open it with ``async with`` (or ``await open()``): that creates the ``Subscriber`` and
    raises what its constructor raises (``InvalidInitialOffsetSchemeError``,
    ``OffsetLoadError``, ``StreamConfigMismatchError``, ``BrokerError``). The callbacks of the
    config (``error_handler``, ``on_assign``, ``on_revoke``, ``on_live``, ``on_expired``) are
    plain functions called on a helper thread, as a sync subscriber calls them on its polling
    thread; ``loop.call_soon_threadsafe`` reaches the loop from there. A subscriber belongs to
    the loop that uses it.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        check_arguments(cluster, config)
        self.cluster = cluster
        self.config = config
        if config.stream is None:
            raise ValueError(
                "AsyncSubscriber reads one stream: give stream=, or read several streams with "
                "one AsyncSubscriber each"
            )
        if config.share_group is not None:
            raise ValueError(
                "AsyncSubscriber does not read share groups: use ShareSubscriber (its receiver "
                "runs async def handlers)"
            )
        self.stream = config.stream
        self.topic = config.stream.name
        # The same choice its Subscriber makes (in a group or not), for ``repr`` before it.
        self.membership = membership_of(config, group_id(config))
        self._strand = Strand()
        self._sub: Subscriber | None = None
        self._closed = False
        self._failure: BaseException | None = None  # what the constructor raised
        self._held: _Held | None = None  # the batch ``async for`` is handing out
        self._wait = 0.0  # the current wait between empty steps

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> Self:
        """Create the subscriber (once); raises what ``Subscriber(...)`` raises.

        Any other call opens it too. A cancelled open leaves nothing open.
        """
        await self._strand.run(self._open, undo=_abandon)
        return self

    def _open(self) -> Subscriber | None:
        """On the strand: the subscriber if this call created it (a cancelled open closes
        it again), else ``None``."""
        created = self._sub is None
        sub = self._ensure()
        return sub if created else None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # As ``with Subscriber``: leaving by an exception commits nothing new for a durable
        # client (its last batch is delivered again on reconnect).
        self._give_back_held()
        await self._strand.run(lambda: self._close(lambda sub: sub.__exit__(exc_type, exc, tb)))

    async def close(self, keep_alive: bool = True) -> None:
        """Leave the subscriber group and release the consumer (``Subscriber.close``).

        An ``async for`` over this subscriber in another task ends; a waiting ``poll``
        returns what it has.
        """
        self._give_back_held()
        await self._strand.run(lambda: self._close(lambda sub: sub.close(keep_alive)))

    def _ensure(self) -> Subscriber:
        """On the strand: the subscriber, created on first use; its constructor's error is
        raised as it was the first time, then as ``IllegalSubscriberStateError``."""
        sub = self._sub
        if sub is not None:
            return sub
        if self._failure is not None:
            raise IllegalSubscriberStateError(
                f"subscriber did not open: {self._failure}", stream=self.topic
            ) from self._failure
        if self._closed:
            raise IllegalSubscriberStateError("subscriber is closed", stream=self.topic)
        try:
            sub = self._sub = Subscriber(self.cluster, self.config)
        except BaseException as exc:
            self._failure = exc
            raise
        return sub

    def _close(self, close: Callable[[Subscriber], None]) -> None:
        self._closed = True  # nothing opens after a close
        if self._sub is not None:
            close(self._sub)

    # -- reading -----------------------------------------------------------------------------

    async def poll(self, timeout_ms: int) -> RecordBatch:
        """Read the next records, waiting at most ``timeout_ms`` for the first one.

        Returns as soon as at least one record is available, with up to ``max_batch`` records
        (``Subscriber.poll``). The loop is never blocked. Cancelled, it loses nothing: what it
        had read is returned by the next poll, and ``confirm()`` does not reach it.

        Raises:
            ValueError: ``timeout_ms`` is negative.
            IllegalSubscriberStateError: The subscriber is closed (or was never opened).
        """
        batch, _ = await self._poll(timeout_ms)
        return batch

    async def _poll(self, timeout_ms: int) -> tuple[RecordBatch, dict[int, int]]:
        """``poll``, with ``last_read`` as it was before the batch."""
        check_int("timeout_ms", timeout_ms)
        self._give_back_held()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        first = True
        while True:
            polled = await self._call(_first_step if first else _next_step, undo=_give_back)
            first = False
            if polled.error is not None:
                raise polled.error
            batch = polled.batch
            if batch is None:
                return RecordBatch(), {}  # closed by another task while waiting
            if batch:
                self._wait = 0.0
                if TELEMETRY is not None and self._sub is not None:
                    TELEMETRY.delivered(self._sub, batch)
                return batch, polled.last_read
            remaining = deadline - loop.time()
            if remaining <= 0:
                return batch, polled.last_read
            self._wait = min(max(self._wait * 2, _MIN_WAIT_S), _MAX_WAIT_S)
            await asyncio.sleep(min(self._wait, remaining))

    def __aiter__(self) -> AsyncSubscriber:
        return self

    async def __anext__(self) -> Record:
        """The next record; waits as long as it takes, and ends when the subscriber closes.

        Records are handed out one at a time from each polled batch; ``confirm()`` confirms up
        to the last one handed out. Leaving the loop (``break``, an exception, cancellation)
        loses nothing: the rest of the batch is returned by the next poll.
        """
        held = self._held
        if held is not None:
            record = held.next()
            if record is not None:
                return record
            self._held = None
        while True:
            if self.closed:
                raise StopAsyncIteration
            try:
                batch, before = await self._poll(_ITER_POLL_MS)
            except IllegalSubscriberStateError:
                if self.closed:
                    raise StopAsyncIteration from None
                raise
            if batch:
                held = self._held = _Held(batch, before)
                record = held.next()
                assert record is not None
                return record

    def _give_back_held(self) -> None:
        """Give the rest of the batch ``async for`` was handing out back to the subscriber,
        ahead of any later call: the next poll returns it."""
        held, self._held = self._held, None
        if held is None or self._sub is None:
            return
        polled = held.rest()
        if polled.batch:
            sub = self._sub
            self._strand.submit(lambda: sub.give_back(polled))

    async def _call(
        self,
        fn: Callable[[Subscriber], T],
        undo: Callable[[Subscriber, T], None] | None = None,
    ) -> T:
        """Run ``fn(subscriber)`` on the strand (opening first if need be)."""

        def run() -> T:
            return fn(self._ensure())

        def back(result: T) -> None:
            if undo is not None and self._sub is not None:
                undo(self._sub, result)

        return await self._strand.run(run, back if undo is not None else None)

    # -- the rest of the subscriber API, as coroutines ---------------------------------------

    async def seek(self, offset: int, partition: int | None = None) -> None:
        """Move an ungrouped subscriber to ``offset`` (``Subscriber.seek``)."""
        self._give_back_held()
        await self._call(lambda sub: sub.seek(offset, partition))

    async def seek_to_time(self, timestamp_ms: int, partition: int | None = None) -> None:
        """Move an ungrouped subscriber to the first record at or after ``timestamp_ms``
        (``Subscriber.seek_to_time``)."""
        self._give_back_held()
        await self._call(lambda sub: sub.seek_to_time(timestamp_ms, partition))

    async def pause(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Stop delivering ``partitions`` until ``resume`` (``Subscriber.pause``); what
        ``async for`` was handing out of them is held back too."""
        self._give_back_held()
        await self._call(lambda sub: sub.pause(partitions))

    async def resume(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Deliver paused ``partitions`` again (``Subscriber.resume``)."""
        await self._call(lambda sub: sub.resume(partitions))

    @property
    def paused(self) -> frozenset[tuple[str, int]]:
        """The paused partitions, as ``(stream, partition)`` pairs."""
        sub = self._sub
        return sub.paused if sub is not None else frozenset()

    async def confirm(
        self, offset: int | None = None, partition: int | None = None, *, conn: Any = None
    ) -> None:
        """Confirm records up to ``offset`` (``Subscriber.confirm``, ``conn`` included); without
        arguments, up to the last record handed out (by ``poll``, or one at a time by
        ``async for``). It runs after the calls made before it, a cancelled poll's undo too."""
        held = self._held
        read = held.read_view() if held is not None else None
        await self._call(lambda sub: sub.confirm_read(offset, partition, conn=conn, read=read))

    async def committed(self, timeout_s: float = 10.0) -> dict[int, int | None]:
        """The group's confirmed positions (``Subscriber.committed``)."""
        return await self._call(lambda sub: sub.committed(timeout_s))

    async def is_assigned(self) -> bool:
        """True when this subscriber holds the lease (``Subscriber.is_assigned``)."""
        self._give_back_held()
        return await self._call(lambda sub: sub.is_assigned())

    async def deactivate(self) -> None:
        """Give up the lease (``Subscriber.deactivate``)."""
        self._give_back_held()
        await self._call(lambda sub: sub.deactivate())

    async def reactivate(self) -> None:
        """Seek the lease again (``Subscriber.reactivate``)."""
        self._give_back_held()
        await self._call(lambda sub: sub.reactivate())

    @property
    def subscriber(self) -> Subscriber:
        """The sync ``Subscriber`` behind this one, once open: its attributes (``scheme``,
        ``partitions``, ``group_id``) and, from a callback on the helper thread only, its
        methods (a synchronous ``confirm`` inside ``on_revoke``).

        Raises:
            IllegalSubscriberStateError: Not open yet.
        """
        sub = self._sub
        if sub is None:
            raise IllegalSubscriberStateError("subscriber is not open", stream=self.topic)
        return sub

    @property
    def closed(self) -> bool:
        """True after ``close`` (or a failed open)."""
        sub = self._sub
        return sub.closed if sub is not None else self._closed or self._failure is not None

    @property
    def durable(self) -> DurableSession | None:
        """A durable client's connection state (marker, live, state), else ``None``."""
        sub = self._sub
        return sub.durable if sub is not None else None

    @property
    def marker(self) -> dict[int, int]:
        """A durable client's marker: partition -> first offset not replayed (else empty)."""
        sub = self._sub
        return sub.marker if sub is not None else {}

    def __repr__(self) -> str:
        return f"AsyncSubscriber(stream={self.topic!r}, {self.membership.label()})"


def _first_step(sub: SubscriberLike) -> Polled:
    # A deadline already past: the step takes what is fetched and never waits.
    return sub.poll_step(first=True)


def _next_step(sub: SubscriberLike) -> Polled:
    return sub.poll_step(first=False)


def _give_back(sub: SubscriberLike, polled: Polled) -> None:
    sub.give_back(polled)


def _abandon(sub: Subscriber | None) -> None:
    if sub is not None:
        sub.close()


class _Held:
    """A polled batch that ``async for`` hands out one record at a time."""

    __slots__ = ("_index", "_read", "_records")

    def __init__(self, batch: RecordBatch, before: dict[int, int]) -> None:
        self._records = list(batch)
        self._index = 0
        self._read = dict(before)  # last_read as if only the records handed out were polled

    def next(self) -> Record | None:
        if self._index >= len(self._records):
            return None
        record = self._records[self._index]
        self._index += 1
        if record.partition is not None and record.offset is not None:
            self._read[record.partition] = record.offset
        return record

    def read_view(self) -> dict[int, int]:
        """The last record handed out per partition (what ``confirm()`` confirms)."""
        return dict(self._read)

    def rest(self) -> Polled:
        """The records not handed out, to give back."""
        return Polled(RecordBatch(self._records[self._index :]), None, dict(self._read))
