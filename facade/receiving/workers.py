"""The parallel receiver's workers: threads for plain handlers, an event loop for ``async def``.

Both take ready records from a ``Board`` and run ``run(item)`` on them, at most
``concurrency`` at a time; neither knows about Kafka, retries or dead letters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bolide.facade.receiving.lanes import Board, Item

__all__ = ["AsyncWorkers", "ThreadWorkers"]

log = logging.getLogger(__name__)


class ThreadWorkers:
    """``concurrency`` daemon threads, each running ``run(item)`` on the records it takes."""

    def __init__(
        self, board: Board, run: Callable[[Item], None], concurrency: int, name: str
    ) -> None:
        self._board = board
        self._run = run
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(concurrency)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _loop(self) -> None:
        take, run = self._board.take, self._run
        while True:
            item = take()
            if item is None:
                return
            try:
                run(item)
            except BaseException:  # run handles what a handler raises; this is a bug guard
                log.exception("receiver worker failed on %r", item.record)

    def owns(self, thread: threading.Thread) -> bool:
        """True when ``thread`` is one of the workers."""
        return thread in self._threads

    def cancel(self) -> None:
        """Nothing to cancel: a running call cannot be interrupted; its result is ignored."""

    def join(self, deadline: float) -> bool:
        """Wait until ``deadline`` (monotonic) for every worker to end; ``True`` if they did."""
        for thread in self._threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


class AsyncWorkers:
    """An event loop on its own thread running up to ``concurrency`` coroutines at once.

    A record's coroutine is ``run(item)``; the loop is the receiver's own, so a handler may
    create tasks and await anything there, but must not block it.
    """

    def __init__(
        self,
        board: Board,
        run: Callable[[Item], Coroutine[Any, Any, None]],
        concurrency: int,
        name: str,
    ) -> None:
        self._board = board
        self._run = run
        self._concurrency = concurrency
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots: asyncio.Semaphore  # made on the loop
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        board.on_ready = self._poke

    def start(self) -> None:
        self._thread.start()

    def _poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits for work
            self._loop.call_soon_threadsafe(self._wake.set)

    def _main(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._pump())
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _pump(self) -> None:
        board, wake = self._board, self._wake
        slots = self._slots = asyncio.Semaphore(self._concurrency)
        while True:
            await slots.acquire()
            item = board.take_nowait()
            while item is None and not board.stopped:
                wake.clear()
                item = board.take_nowait()
                if item is None:
                    due = board.due_in()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), 1.0 if due is None else due)
            if item is None:
                slots.release()
                break
            task = asyncio.ensure_future(self._run(item))
            self._tasks.add(task)
            task.add_done_callback(self._done)
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    def owns(self, thread: threading.Thread) -> bool:
        """True when ``thread`` is the loop's thread."""
        return thread is self._thread

    def cancel(self) -> None:
        """Cancel the coroutines still running (closing past its deadline)."""

        def cancel_all() -> None:
            for task in list(self._tasks):
                task.cancel()

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(cancel_all)

    def join(self, deadline: float) -> bool:
        """Wait until ``deadline`` (monotonic) for the loop to end; ``True`` if it did."""
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()
