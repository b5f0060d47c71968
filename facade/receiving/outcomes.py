"""``Runner``: what a parallel receiver's worker does with a record, and after a failure.

It calls the handler; a failure is retried after ``Retry.delay`` (the record keeps its lane,
so its key's later records wait), and after the last attempt the record goes to the dead
letter (a stream's ``Publisher``: the record with ``bolide.reason=failed``, the detail and
``bolide.source``; or ``fn(record, error)``), or, without one, to the error handler and the
log. Only then is it finished. A dead letter that fails is reported and tried again later.

Any ``BaseException`` a handler raises is a failure of its record (not retried: it asks to
stop, not to try again): ``asyncio.CancelledError`` raised by the handler itself,
``KeyboardInterrupt``, ``SystemExit`` or a user's own; the record is dead-lettered or
reported, so its key flows on. Only the receiver's own cancellation of an ``async def``
handler (a close past its deadline) leaves the record unfinished: abandoned, read again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from bolide.facade.consumer.positions import Report
from bolide.facade.deadletter import DeadLetterSink, DeadLetterTarget, Reason
from bolide.facade.receiver import AsyncRecordHandler, RecordHandler, refused_for_good
from bolide.facade.receiving.lanes import Board, Item
from bolide.facade.receiving.tiers import RetryTiers
from bolide.facade.retry import Retry

__all__ = ["Runner"]

log = logging.getLogger("bolide.facade.parallel")


class Runner:
    """Runs one receiver's handler on the records its workers take from ``board``.

    Attributes:
        cost: Mean seconds per successful handler call (a moving average), which tells the
            receiver whether a call is cheaper than handing the record to a worker.
    """

    def __init__(
        self,
        board: Board,
        handler: RecordHandler | AsyncRecordHandler,
        retry: Retry,
        dead_letter: DeadLetterTarget | None,
        topic: str,
        report: Report,
        cost: float,
        tiers: RetryTiers | None = None,
        halt: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self._board = board
        self._handler = handler
        self._retry = retry
        self._sink = None if dead_letter is None else DeadLetterSink(dead_letter)
        self._topic = topic
        self._report = report
        self._letter_retry_s = max(retry.max_backoff_s, 1.0)
        self._tiers = tiers
        self._halt = halt
        self.cost = cost

    def work(self, item: Item) -> None:
        error = item.error
        tiers = self._tiers
        if error is None and tiers is not None and tiers.divert(item.record, self._copied(item)):
            # Its key is parked in a retry tier: it waits there, behind the key's head, and its
            # copy is queued behind the key's earlier ones, so the key's next record may come.
            self._board.pass_lane(item)
            return
        if item.track.settled:
            # Its partition was given up since it was taken (the shelf let go of its parked
            # keys too): the next owner reads it again, behind whatever its key has parked.
            self._board.finish(item)
            return
        if error is None:
            started = time.perf_counter()
            try:
                cast(RecordHandler, self._handler)(item.record)
            except BaseException as exc:  # any raise fails the record only
                self.failed(item, exc)
                return
            self.cost += 0.05 * (time.perf_counter() - started - self.cost)
            self._board.finish(item)
            return
        self.failed(item, error)

    def failed(self, item: Item, error: BaseException) -> None:
        """A call failed (or a dead letter is due again): retry, or give the record up."""
        if item.error is None and isinstance(error, Exception) and self._again(item, error):
            return
        pending = self._give_up(item, error)
        if pending is not None:  # an async dead-letter function under a plain handler
            self._letter_done(item, TypeError("the dead-letter function returned an awaitable"))
            if inspect.iscoroutine(pending):
                pending.close()

    async def work_async(self, item: Item) -> None:
        error = item.error
        if error is None:
            try:
                await cast(Awaitable[None], self._handler(item.record))
            except BaseException as exc:  # any raise fails the record only
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and task and task.cancelling():
                    raise  # the receiver cancelled it (closing): abandoned, read again
                error = exc
            else:
                self._board.finish(item)
                return
            if isinstance(error, Exception) and self._again(item, error):
                return
        pending = self._give_up(item, error)
        if pending is not None:
            try:
                await pending
            except Exception as exc:
                self._letter_done(item, exc)
            else:
                self._letter_done(item, None)

    def _again(self, item: Item, error: Exception) -> bool:
        """Schedule a retry if attempts are left; ``False`` when the record is given up."""
        item.attempt += 1
        if item.attempt >= self._retry.attempts:
            return False
        log.info("receiver handler raised on %r (attempt %d): %r", item.record, item.attempt, error)
        self._board.later(item, self._retry.delay(item.attempt))
        return True

    def _give_up(self, item: Item, error: BaseException) -> Awaitable[Any] | None:
        """Hand a record that failed its last attempt to the dead letter (or report it); the
        record is finished once the dead letter took it. Returns what an async dead-letter
        function still has to do."""
        item.error = error
        record, sink = item.record, self._sink
        attempts = max(item.attempt, 1)
        if self._tiers is not None:
            self._tiers.shelve(record, attempts, self._copied(item))
            self._board.pass_lane(item)  # its key is parked: its next records queue behind it
            return None
        if sink is None:
            summary = f"receiver handler failed on {record!r} after {attempts} attempts"
            log.error("%s: %r", summary, error)
            self._report(summary, error)
            self._board.finish(item, outcome="failed")
            return None
        detail = f"{type(error).__name__}: {error} (after {attempts} attempts)"
        source = f"{self._topic}/{record.partition}/{record.offset}"
        return sink.send_async(
            record,
            error,
            lambda exc: self._letter_done(item, exc),
            reason=Reason.FAILED,
            detail=detail,
            source=source,
        )

    def _copied(self, item: Item) -> Callable[[BaseException | None], None]:
        """What to do once a record's copy is in its retry tier (committed): it is finished,
        and may be confirmed past (its lane was passed on when the copy was queued). A copy
        that cannot be written stops the receiver (the tiers' writer tries again until the
        broker refuses it for good): the record stays unfinished, never confirmed, read
        again."""

        def copied(error: BaseException | None) -> None:
            if error is None:
                self._board.finish(item)
            else:
                log.warning("%r not copied to its retry tier: %r", item.record, error)

        return copied

    def _letter_done(self, item: Item, error: BaseException | None) -> None:
        if error is None:
            self._board.finish(item, outcome="dead_lettered")
            return
        if self._halt is not None and refused_for_good(error):
            # The record stays unfinished: never confirmed, read again by the next reader.
            self._halt("dead letters are refused for good; the receiver stops", error)
            return
        self._report(
            f"dead letter for {item.record!r} failed; trying again in {self._letter_retry_s} s",
            error,
        )
        self._board.later(item, self._letter_retry_s, retry=False)
