"""Receiver: a background thread that polls a subscriber and hands each record to a callback."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from bolide.facade.errors import DurableClientBusyError
from bolide.facade.record import Record
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

if TYPE_CHECKING:
    from bolide.facade.subscriber import Subscriber

__all__ = ["Receiver", "RecordHandler"]

log = logging.getLogger(__name__)

RecordHandler = Callable[[Record], None]

#: Longest single wait of the receiver's poll, whatever ``poll_timeout_ms`` says: a stop is
#: seen within it, so closing never waits for a long poll.
_STOP_CHECK_MS = 100


class Receiver:
    """Polls ``subscriber`` and calls ``handler(record)`` per record.

    Each poll waits up to ``poll_timeout_ms`` for records, and at most 100 ms, so that a stop
    is seen promptly.

    An exception in the handler is logged (and reported to the subscriber's error handler); the
    thread carries on with the next record. Closing the subscriber stops the receiver: it waits
    for the handler call in progress to return, so the handler never finds its consumer closed
    under it, and no record is polled or handled after that call.
    """

    def __init__(
        self, subscriber: Subscriber, handler: RecordHandler, poll_timeout_ms: int
    ) -> None:
        if not callable(handler):
            raise TypeError("handler must be callable")
        check_int("poll_timeout_ms", poll_timeout_ms)
        self._subscriber = subscriber
        self._handler = handler
        if TELEMETRY is not None:  # each call in a process span, timed
            self._handler = TELEMETRY.handler(subscriber, handler)
        self._poll_timeout_ms = poll_timeout_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"bolide-receiver-{subscriber.stream.name}", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._subscriber.poll(min(self._poll_timeout_ms, _STOP_CHECK_MS))
            except DurableClientBusyError as exc:
                self._subscriber._report("receiver stopped: the durable id is taken", exc)
                return
            except Exception as exc:
                if self._stop.is_set() or self._subscriber.closed:
                    return  # closed under the poll: nothing more to read
                self._subscriber._report("receiver poll failed", exc)
                # Back off, also with poll_timeout_ms=0: a lasting failure must not spin.
                self._stop.wait(max(self._poll_timeout_ms / 1000, 0.1))
                continue
            for record in batch:
                if self._stop.is_set():
                    return
                try:
                    self._handler(record)
                except Exception as exc:
                    log.exception("receiver handler raised on %r", record)
                    self._subscriber._report(f"receiver handler raised on {record!r}", exc)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait until it has ended.

        The thread ends once the current poll (at most 100 ms) or the current handler call
        returns; no record is handled after that. Called from inside the handler, ``close``
        does not wait: the thread ends when the handler returns.

        Args:
            timeout_s: Longest wait; ``None`` (the default, and what ``Subscriber.close`` uses)
                waits for the handler however long it runs.
        """
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
