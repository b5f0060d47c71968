"""``BatchWriter``: the archiver's database side, in a thread of its own.

The archiver's loop alone touches the Kafka consumer: it reads and decodes a batch, hands it
over with ``put`` and reads the next one while this thread writes the last. Batches are written
one at a time, in the order handed over, each in its own transaction; ``take`` gives back the
written ones in that order, and only then does the loop commit their Kafka offsets. At most
``depth`` batches wait behind the one being written, so a slow database holds the reader back
instead of filling memory.

The first error ends the thread: the batches behind it are dropped, never written (their offsets
are never committed, so the next run reads them again), and ``failure`` holds the error for the
loop to raise.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BatchWriter"]

Batch = TypeVar("Batch")
Result = TypeVar("Result")


class BatchWriter(Generic[Batch, Result]):
    """Writes handed-over batches in order, on one background thread.

    The reader calls every method (one thread); the writer thread only runs ``write``.

    Args:
        write: ``write(batch, halt)`` writes one batch and returns what the reader needs to
            finish it; it gives up retrying once ``halt`` is set.
        depth: Most batches waiting behind the one being written.
        name: The thread's name.
    """

    def __init__(
        self, write: Callable[[Batch, threading.Event], Result], *, depth: int, name: str
    ) -> None:
        self._write = write
        self._depth = depth
        #: Set by ``close()`` (and by the archiver's ``stop()``): a failing write stops retrying.
        self.halt = threading.Event()
        self._changed = threading.Condition()
        self._waiting: deque[Batch] = deque()
        self._writing = False
        self._written: deque[tuple[Batch, Result]] = deque()
        self._closed = False
        #: What stopped the thread, if anything.
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def put(self, batch: Batch, timeout_s: float) -> bool:
        """Hand ``batch`` over once there is room for it.

        Returns:
            ``False`` without taking it when there was no room within ``timeout_s``, when
            written batches wait to be taken (take them, then put again) or when the writer
            has failed or is closed.
        """
        with self._changed:
            self._changed.wait_for(self._room_or_news, timeout_s)
            if self._closed or len(self._waiting) >= self._depth:
                return False
            self._waiting.append(batch)
            self._changed.notify_all()
            return True

    def _room_or_news(self) -> bool:
        return self._closed or bool(self._written) or len(self._waiting) < self._depth

    def take(self) -> list[tuple[Batch, Result]]:
        """The batches written since the last call, in the order handed over, with what
        ``write`` returned for each."""
        with self._changed:
            written = list(self._written)
            self._written.clear()
            return written

    def drain(self) -> None:
        """Wait until every batch handed over is written (or dropped by a failure)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._waiting and not self._writing)

    def close(self) -> None:
        """Drop the batches still waiting, let the one being written end (a failing write
        stops retrying) and end the thread."""
        self.halt.set()
        with self._changed:
            self._closed = True
            self._waiting.clear()
            self._changed.notify_all()
        self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or bool(self._waiting))
                if self._closed:
                    return
                batch = self._waiting.popleft()
                self._writing = True
            try:
                result = self._write(batch, self.halt)
            except BaseException as exc:  # raised in the reader, by the archiver's loop
                with self._changed:
                    self.failure = exc
                    self._closed = True
                    self._writing = False
                    self._waiting.clear()
                    self._changed.notify_all()
                return
            with self._changed:
                self._written.append((batch, result))
                self._writing = False
                self._changed.notify_all()
