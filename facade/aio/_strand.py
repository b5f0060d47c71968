"""The threads behind the asyncio API: one shared pool, and a strand per client.

Every blocking call of every asyncio client in the process (a subscriber's poll steps, seek,
confirm, close; a publisher's open, flush, close) runs on one small shared pool of threads, so
a loop with hundreds of subscribers still has a handful of helper threads. A ``Strand`` runs
one client's calls one at a time, in the order they were made, as the sync client's lock
would; a call cancelled before it starts never runs, and a call cancelled while it runs
finishes, its outcome handed to its ``undo`` (a poll gives its records back). A call with an
``undo`` holds its strand until its caller has its outcome (or was cancelled and the undo
ran): no later call, another task's confirm say, ever sees an outcome nobody received.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

__all__ = ["POOL_THREADS", "Strand", "pool"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Threads of the shared pool: enough that a slow call (a close, a SQL read) does not hold up
#: every other client's polls, few enough that they do not grow with the clients.
POOL_THREADS = min(16, max(4, (os.cpu_count() or 1) * 2))

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's shared pool (threads start on demand, up to ``POOL_THREADS``)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="bolide-aio")
    return _pool


_PENDING, _RUNNING, _DONE, _CANCELLED = range(4)


class _Call(Generic[T]):
    """One call on a strand and the asyncio future waiting for it."""

    __slots__ = ("error", "fn", "future", "loop", "result", "state", "undo")

    def __init__(
        self,
        fn: Callable[[], T],
        undo: Callable[[T], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.fn = fn
        self.undo = undo
        self.loop = loop
        # No loop: queued by ``Strand.submit``, nobody waits.
        self.future: asyncio.Future[T] | None = loop.create_future() if loop else None
        self.state = _PENDING
        self.result: T | None = None
        self.error: BaseException | None = None


class Strand:
    """Runs one client's blocking calls in order, one at a time, on the shared pool."""

    __slots__ = ("_busy", "_calls", "_held", "_lock")

    def __init__(self) -> None:
        self._calls: deque[_Call[Any]] = deque()
        self._busy = False
        self._held: _Call[Any] | None = None  # done, its outcome not yet taken or undone
        self._lock = threading.Lock()  # also guards each call's state

    async def run(self, fn: Callable[[], T], undo: Callable[[T], None] | None = None) -> T:
        """Run ``fn()`` after the calls made before it; its result or exception.

        Cancelled before ``fn`` starts, it never runs. Cancelled while it runs (or after it
        returned, before the caller resumed), ``fn`` finishes and ``undo(result)`` runs next
        on the strand, ahead of any later call.
        """
        call = _Call(fn, undo, asyncio.get_running_loop())
        assert call.future is not None
        self._submit(call)
        try:
            result = await call.future
        except asyncio.CancelledError:
            self._cancel(call)
            raise
        except BaseException:
            self._release(call)
            raise
        self._release(call)  # the caller has it: later calls may run
        return result

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn()`` without waiting for it (its failure is the caller's to prevent)."""
        self._submit(_Call(fn))

    def _submit(self, call: _Call[Any]) -> None:
        with self._lock:
            self._calls.append(call)
            if self._busy:
                return
            self._busy = True
        pool().submit(self._drain)

    def _cancel(self, call: _Call[Any]) -> None:
        with self._lock:
            state = call.state
            call.state = _CANCELLED
            # Pending: it never runs. Running: the strand undoes it when it ends. Done: the
            # undo runs first, before anything queued after it.
            if state == _DONE and call.undo is not None and call.error is None:
                undo, result = call.undo, call.result
                self._calls.appendleft(_Call(lambda: undo(result)))
        self._release(call)

    def _release(self, call: _Call[Any]) -> None:
        """``call``'s outcome was taken (or undone): the strand goes on, if it waited."""
        with self._lock:
            if self._held is not call:
                return
            self._held = None
        pool().submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    self._busy = False
                    return
                call = self._calls.popleft()
                if call.state == _CANCELLED:
                    continue
                call.state = _RUNNING
            if self._run(call):
                return  # held: ``_release`` drains on

    def _run(self, call: _Call[Any]) -> bool:
        """Run ``call``; ``True`` when the strand now waits for its outcome to be taken."""
        error: BaseException | None = None
        try:
            result = call.fn()
        except BaseException as exc:
            result, error = None, exc
        if call.loop is None:  # queued by submit: nobody waits
            if error is not None:
                log.error("a queued call failed", exc_info=error)
            return False
        hold = call.undo is not None and error is None
        with self._lock:
            cancelled = call.state == _CANCELLED
            call.state = _DONE
            call.result, call.error = result, error
            if hold and not cancelled:
                self._held = call
        if cancelled:
            if call.undo is not None and error is None:
                call.undo(result)
            return False
        try:
            call.loop.call_soon_threadsafe(_settle, call)
        except RuntimeError:  # a closed loop: nobody is left to tell, nor to take it
            with self._lock:
                if self._held is call:
                    self._held = None
            return False
        return hold


def _settle(call: _Call[Any]) -> None:
    """On the loop: hand the outcome to the waiting caller, unless it was cancelled."""
    future = call.future
    if future is None or future.done():
        return  # cancelled: ``Strand.run`` saw the call done and undid it
    if call.error is not None:
        future.set_exception(call.error)
    else:
        future.set_result(call.result)
