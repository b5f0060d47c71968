"""Helpers every part of bolide may import, the facade and ``bolide.stores`` alike.

``Closing`` is the one context-manager shape every closeable bolide object shares: ``with obj:``
calls ``obj.close()`` on exit. ``HookLock`` is a re-entrant lock that runs user callbacks only
after it is let go.

A subscriber holds its lock while it talks to the consumer; user code (error handlers,
``on_assign``, ``on_live``) called there could wait for another thread that needs the same
lock, and deadlock. Callbacks raised while the lock is held are queued instead and run, in
order, by the thread that releases it last, before its public call returns.

This module imports nothing else from bolide, so that any layer can use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["Closing", "HookLock"]

log = logging.getLogger(__name__)


class Closing:
    """A base for objects released by ``close()``: ``with obj: ...`` closes them on exit.

    What ``close()`` returns (an outbox relay's statistics, say) is ignored on exit.
    """

    __slots__ = ()

    def close(self) -> object:
        """Release what the object holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class HookLock:
    """A re-entrant lock with a queue of callbacks run after the outermost release."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self._queued: list[Callable[[], None]] = []
        self._handed: list[Callable[[], None]] = []  # see hand_over
        self._handed_lock = threading.Lock()

    def __enter__(self) -> HookLock:
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth:
            self._lock.release()
            return
        self._owner = None
        queued, self._queued = self._queued, []
        self._lock.release()
        for call in queued:
            try:
                call()
            except Exception:
                log.exception("callback raised")
        if self._handed:
            self._run_handed()

    def hand_over(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` holding the lock: now when it is free (or this thread holds it),
        else in the holder's thread as it lets go, so the caller never waits for it.

        For calls into a client whose methods are serialized (confluent-kafka waits in a loop
        for a call of another thread to end): a thread polling in slices would keep one out
        indefinitely; handed over, the call runs between two slices.
        """
        with self._handed_lock:
            self._handed.append(callback)
        self._run_handed()

    def _run_handed(self) -> None:
        # Whoever fails to take the lock leaves the calls to the holder, which looks again
        # after letting go: a call handed over is never left behind.
        while True:
            with self._handed_lock:
                if not self._handed:
                    return
            if not self._lock.acquire(blocking=False):
                return
            try:
                owner, self._owner = self._owner, threading.get_ident()
                self._depth += 1
                with self._handed_lock:
                    calls, self._handed = self._handed, []
                for call in calls:
                    try:
                        call()
                    except Exception:
                        log.exception("callback raised")
            finally:
                self._depth -= 1
                self._owner = owner
                self._lock.release()

    def held(self) -> bool:
        """True when the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def call(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` now, or after the outermost release when this thread holds the lock."""
        if self.held():
            self._queued.append(callback)
        else:
            callback()
