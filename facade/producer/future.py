"""A ``concurrent.futures.Future`` that costs little until someone waits on it.

A plain ``Future`` builds a ``threading.Condition`` (about ten objects for the garbage collector)
in its constructor. A publisher makes one future per record and most are never waited on one by
one, so with tens of thousands in flight the collector, not Kafka, sets the publish rate.
``DeliveryFuture`` creates its condition on first use (``result``, ``wait``, callbacks, repr) and
resolves without it when nobody has asked.

It relies on the attributes ``concurrent.futures.Future`` has kept since Python 3.2
(``_condition``, ``_state``, ``_result``, ``_exception``, ``_waiters``, ``_done_callbacks``,
the last two only ever used under ``_condition``, so they are made with it); the state names
are read off futures driven through the public API.
Creating the condition and resolving without it exclude each other (one small lock), so a
waiter either finds the future finished or is woken by ``Future.set_result`` as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

__all__ = ["DeliveryFuture"]


def _states() -> tuple[str, str, str, str]:
    """Future's state names (running, finished, cancelled, cancelled and notified), read off
    futures driven through the public API rather than imported from its private module."""
    done: Any = Future()
    done.set_running_or_notify_cancel()
    running = done._state
    done.set_result(None)
    cancelled: Any = Future()
    cancelled.cancel()
    cancelled_state = cancelled._state
    cancelled.set_running_or_notify_cancel()
    return running, done._state, cancelled_state, cancelled._state


RUNNING, FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED = _states()
_CANCELLED = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED})
_OVER = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})

#: Guards creating a condition against resolving without one (uncontended in practice).
_CREATE = threading.Lock()


class DeliveryFuture(Future[int]):
    """A running future for one record's offset; its condition is made on first use."""

    # Until the condition exists nobody waits or listens: the lists of waiters and callbacks
    # are made with it (every use of them takes the condition first), and until then these
    # empty tuples stand in, so that a future nobody waits on is one object for the collector.
    _waiters: Any = ()
    _done_callbacks: Any = ()
    _result: Any = None
    _exception: BaseException | None = None
    _cond: threading.Condition | None = None
    _state = RUNNING  # a record handed to the producer can no longer be cancelled

    def __init__(self) -> None:
        """Future.__init__ is skipped on purpose: no condition yet, and every field starts
        at its class default (a subclass need not call this)."""

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]  # an attribute in Future
        cond = self._cond
        if cond is None:
            with _CREATE:
                cond = self._cond
                if cond is None:
                    self._waiters = []
                    self._done_callbacks: list[Callable[[Future[int]], object]] = []
                    cond = self._cond = threading.Condition()
        return cond

    # The state only moves forward and is read atomically: no condition needed to look at it.
    def done(self) -> bool:
        """True once resolved."""
        return self._state in _OVER

    def running(self) -> bool:
        """True until resolved (a delivery future is never pending or cancelled)."""
        return self._state == RUNNING

    def cancelled(self) -> bool:
        """Always false: a record handed to the producer cannot be taken back."""
        return self._state in _CANCELLED

    def result(self, timeout: float | None = None) -> int:
        """The offset; a successful future answers without building its condition."""
        if self._state == FINISHED and self._exception is None:
            return cast(int, self._result)  # set before the state
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The failure or ``None``; a finished future answers without its condition."""
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def set_result(self, result: int) -> None:
        """Resolve with ``result``; without the condition when nobody waits or listens yet."""
        with _CREATE:
            if self._cond is None:
                # Whoever creates the condition later reads the state after this.
                self._result = result
                self._state = FINISHED
                return
        super().set_result(result)
