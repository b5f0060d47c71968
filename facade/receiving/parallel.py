"""The parallel receiver: many records in flight on one subscriber, in order per key.

``Subscriber.attach_receiver(handler, concurrency=32, ordering="key", ...)`` starts it (the
one-thread ``Receiver`` stays for ``concurrency=1`` without retries or dead letters). One
fetch thread polls the subscriber and puts each record in flight on the ``Board``
(``receiving/lanes.py``): behind the earlier records of its key ("key": the Kafka key, which is
the message group), of its partition ("partition"), or of nothing ("unordered"). Worker
threads, or coroutines on the receiver's own event loop for an ``async def`` handler
(``receiving/workers.py``), run the handler; a failure is retried with backoff (``Retry``) and
then sent to the dead letter, or reported, and only then is the record finished.

The fetch thread also confirms (``auto_confirm``): per partition, the highest offset at and
below which every record is finished (and, with a resequencer, no group is open), as
Confluent's Parallel Consumer does. It pauses fetching while ``max_in_flight`` records are in
flight and keeps calling the consumer, so the lease holds (``ReceiverHost.hold_fetching``). When a
partition is revoked, its queued records are dropped, running ones get half the lease to
finish, what is finished is confirmed synchronously while the partition is still owned, and
the rest is abandoned: never confirmed, read again by the next owner.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Literal, TypeAlias, TypedDict, cast

from bolide.facade.deadletter import DeadLetterTarget, check_dead_letter
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.receiver import (
    STOPS_RECEIVER,
    AsyncRecordHandler,
    Receiver,
    ReceiverHost,
    ReceiverMetrics,
    RecordHandler,
    is_async_handler,
    stopped_because,
)
from bolide.facade.receiving.feed import Feed
from bolide.facade.receiving.lanes import NO_LANE, Board, LaneOf
from bolide.facade.receiving.outcomes import Runner
from bolide.facade.receiving.tiers import RetryTiers
from bolide.facade.receiving.workers import AsyncWorkers, ThreadWorkers
from bolide.facade.record import RecordBatch
from bolide.facade.resequencer.core import Resequencer
from bolide.facade.retry import Retry
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["Ordering", "ParallelReceiver", "ReceiverOptions", "new_receiver"]

log = logging.getLogger("bolide.facade.parallel")  # the receiver's logger, tiers included

#: What a parallel receiver keeps in order: a key's records, a partition's, or nothing.
Ordering: TypeAlias = Literal["key", "partition", "unordered"]


class ReceiverOptions(TypedDict, total=False):
    """The keyword options of ``Subscriber.attach_receiver``; any of them but the defaults
    (or an ``async def`` handler) makes it a parallel receiver (docs/parallel.md).

    Attributes:
        concurrency: Records handled at once (threads, or coroutines of an async handler);
            default 1.
        ordering: ``"key"`` (default): a Kafka key's (message group's) records one at a time
            in offset order, records without a key as one key per partition; ``"partition"``:
            a partition's; ``"unordered"``: none.
        retry: Calls per record before it is given up (default: one call, no retry).
        dead_letter: Where a given-up record goes: a ``Publisher`` (its stream gets the record
            with ``bolide.reason``, ``bolide.reason.detail`` and ``bolide.source``) or
            ``fn(record, error)``; without one it is reported to the error handler and logged.
        auto_confirm: Confirm, per partition, the highest offset at and below which every
            record is finished (default ``True``; grouped subscribers only).
        max_in_flight: Fetching pauses at this many records in flight (one poll may add up
            to ``max_batch`` more) and resumes when half of them are finished; default 10,000.
        resequencer: Offered every record in offset order; what it releases is handled (a
            sequence group is one key), and confirms stay below its open groups.
    """

    concurrency: int
    ordering: Ordering
    retry: Retry | None
    dead_letter: DeadLetterTarget | None
    auto_confirm: bool
    max_in_flight: int
    resequencer: Resequencer | None


_ORDERINGS: dict[str, LaneOf] = {
    "key": lambda record: record.key,
    "partition": lambda record: 0,
    "unordered": lambda record: NO_LANE,
}
_STOP_CHECK_S = 0.1  # longest poll or wait of the fetch thread: a stop is seen within it
_CONFIRM_EVERY_S = 0.1  # confirms are sent at most this often (and on revoke and close)
_WAIT_S = 0.05  # while paused: how long the fetch thread waits for work to finish
#: A plain handler whose calls take less than this on average runs on the fetch thread while
#: nothing is in flight: handing a record to a worker costs more than such a call.
_INLINE_BELOW_S = 20e-6
#: Calls on the fetch thread that take longer than this, adding up to more than the budget,
#: hand the rest of their batch to the workers (one slow call may be the machine's doing).
_INLINE_SLOW_S = 1e-3
_INLINE_SLOW_BUDGET_S = 5e-3


def new_receiver(
    host: ReceiverHost,
    handler: RecordHandler | AsyncRecordHandler,
    poll_timeout_ms: int,
    *,
    concurrency: int = 1,
    ordering: Ordering = "key",
    retry: Retry | None = None,
    dead_letter: DeadLetterTarget | None = None,
    auto_confirm: bool = True,
    max_in_flight: int = 10_000,
    resequencer: Resequencer | None = None,
) -> Receiver:
    """The receiver ``Subscriber.attach_receiver`` starts.

    The one-thread ``Receiver`` (which confirms nothing by itself) for ``concurrency=1`` with
    no retry, dead letter, resequencer or ``async def`` handler; else a ``ParallelReceiver``.

    Args:
        host: What to read: the subscriber, as receivers see it.
        handler: ``fn(record)``, or an ``async def`` run on the receiver's own event loop.
        poll_timeout_ms: Longest wait of one poll (at most 100 ms is waited at a time).
        concurrency, ordering, retry, dead_letter, auto_confirm, max_in_flight, resequencer:
            See ``ReceiverOptions``.

    Raises:
        TypeError, ValueError: A bad argument.
    """
    _check(concurrency, ordering, retry, dead_letter, auto_confirm, max_in_flight, resequencer)
    simple = retry is None and dead_letter is None and resequencer is None
    if concurrency == 1 and simple and not is_async_handler(handler):
        return Receiver(host, cast(RecordHandler, handler), poll_timeout_ms)
    return ParallelReceiver(
        host,
        handler,
        poll_timeout_ms,
        concurrency=concurrency,
        ordering=ordering,
        retry=retry,
        dead_letter=dead_letter,
        auto_confirm=auto_confirm,
        max_in_flight=max_in_flight,
        resequencer=resequencer,
    )


def _check(*options: object) -> None:
    """Refuse bad receiver options (``ReceiverOptions``' order), whichever receiver they are
    for."""
    concurrency, ordering, retry, dead_letter, auto_confirm, max_in_flight, resequencer = options
    check_int("concurrency", concurrency, minimum=1, maximum=4_096)
    if ordering not in _ORDERINGS:
        raise ValueError(f"ordering must be 'key', 'partition' or 'unordered', not {ordering!r}")
    if retry is not None and not isinstance(retry, Retry):
        raise TypeError(f"retry must be a Retry or None, not {type(retry).__name__}")
    check_dead_letter(dead_letter)
    if not isinstance(auto_confirm, bool):
        raise TypeError(f"auto_confirm must be a bool, not {type(auto_confirm).__name__}")
    check_int("max_in_flight", max_in_flight, minimum=1)
    if resequencer is not None and not isinstance(resequencer, Resequencer):
        raise TypeError("resequencer must be a Resequencer or None")


class ParallelReceiver(Receiver):
    """Polls a subscriber and runs ``handler`` on up to ``concurrency`` records at once.

    Built by ``Subscriber.attach_receiver``; see that method for the arguments. ``metrics()``
    tells how far it got; ``close(timeout_s)`` stops fetching, lets in-flight records finish
    until the deadline, abandons the rest (unconfirmed), confirms and stops.
    """

    def __init__(
        self,
        host: ReceiverHost,
        handler: RecordHandler | AsyncRecordHandler,
        poll_timeout_ms: int,
        *,
        concurrency: int,
        ordering: Ordering,
        retry: Retry | None,
        dead_letter: DeadLetterTarget | None,
        auto_confirm: bool,
        max_in_flight: int,
        resequencer: Resequencer | None,
    ) -> None:
        super().__init__(host, cast(RecordHandler, handler), poll_timeout_ms)
        _check(concurrency, ordering, retry, dead_letter, auto_confirm, max_in_flight, resequencer)
        self._max_in_flight = max_in_flight
        self._resume_at = max_in_flight // 2
        # Kafka's group offsets only: positions kept in the application's database are
        # confirmed in its transactions (``metrics().safe`` says how far is finished).
        self._confirm = auto_confirm and host.membership.commits and host.config.positions is None
        self._confirmed: dict[int, int] = {}
        self._noted: dict[int, set[int]] = {}  # finished above the safe point, kept already
        self._confirm_lock = threading.Lock()
        self._revoke_wait_s = host.config.lease_timeout_ms / 2000
        self._deadline = math.inf  # of close: in-flight work left after it is abandoned
        self._paused = False
        self._board = Board(_ORDERINGS[ordering])
        lane_of, call = _ORDERINGS[ordering], self._handler
        self._halted = threading.Event()  # refused for good: reported once, stopping
        self._tiers = RetryTiers.of(host, retry, lane_of, (handler, call), dead_letter,
                                    concurrency, max_in_flight, self._halt)  # fmt: skip
        self._inline = resequencer is None and not is_async_handler(handler) and self._tiers is None
        self._feed = Feed(self._board, resequencer)
        run: RecordHandler | AsyncRecordHandler = self._handler  # with the process span
        if is_async_handler(handler):
            run = handler
            if TELEMETRY is not None:
                run = TELEMETRY.async_handler(host, cast(AsyncRecordHandler, handler))
        self._runner = Runner(
            self._board,
            run,
            retry if retry is not None else Retry(attempts=1),
            dead_letter,
            host.topic,
            host.report,
            cost=10 * _INLINE_BELOW_S,  # until calls are measured: hand records to workers
            tiers=self._tiers,
            halt=self._halt,
        )
        name = f"bolide-worker-{host.stream.name}"
        self._workers: ThreadWorkers | AsyncWorkers
        if is_async_handler(handler):
            self._workers = AsyncWorkers(self._board, self._runner.work_async, concurrency, name)
        else:
            self._workers = ThreadWorkers(self._board, self._runner.work, concurrency, name)

    def start(self) -> None:
        """Start the workers and the fetch thread."""
        self._host.take_over(self._on_revoke, self._limit)
        if self._tiers is not None:
            self._tiers.start()
        self._workers.start()
        super().start()

    # -- the fetch thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._fetch()
        finally:
            if not self._stop.is_set():  # ended on its own (the durable id was taken over)
                self._deadline = min(self._deadline, time.monotonic() + 30.0)
            self._drain()

    def _fetch(self) -> None:
        sub, board, feed = self._host, self._board, self._feed
        poll_ms = min(self._poll_timeout_ms, int(_STOP_CHECK_S * 1000))
        confirmed_at = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - confirmed_at >= _CONFIRM_EVERY_S:
                confirmed_at = now
                if self._confirm:
                    self._confirm_safe()
                if self._tiers is not None:
                    self._tiers.confirm()
            feed.tick()
            in_flight = board.in_flight + len(feed)
            if in_flight >= self._max_in_flight or (self._paused and in_flight > self._resume_at):
                self._pause()
                continue
            if self._paused:
                self._paused = False
                self._host.release_fetching()
            try:
                batch = sub.poll(poll_ms)
            except STOPS_RECEIVER as exc:
                sub.report(stopped_because(exc), exc)
                return
            except Exception as exc:
                if self._stop.is_set() or sub.closed:
                    return
                sub.report("receiver poll failed", exc)
                self._stop.wait(max(self._poll_timeout_ms / 1000, _STOP_CHECK_S))
                continue
            if self._tiers is not None:  # a partition's parked keys are known before its records
                batch = self._tiers.load(batch, self._serve)
            if not batch:
                continue
            if self._inline and self._runner.cost < _INLINE_BELOW_S and not board.in_flight:
                self._run_here(batch)
            else:
                feed.take(batch)

    def _run_here(self, batch: RecordBatch) -> None:
        """Handle a batch on the fetch thread (cheap calls, nothing in flight): the order of
        any ``ordering`` holds. A failure, or a slow call, hands the rest to the workers."""
        records, board, handler = list(batch), self._board, self._handler
        clock = time.perf_counter
        start = last = clock()
        slow = 0.0
        for index, record in enumerate(records):
            try:
                handler(record)
            except BaseException as exc:  # any raise fails the record only
                board.ran(records[:index])
                self._runner.failed(board.claim(record), exc)
                board.add(records[index + 1 :])
                return
            now = clock()
            if now - last > _INLINE_SLOW_S:
                slow += now - last
                if slow > _INLINE_SLOW_BUDGET_S:
                    self._runner.cost = now - last
                    board.ran(records[: index + 1])
                    board.add(records[index + 1 :])
                    return
            last = now
        board.ran(records, one_partition=len(self._host.assigned()) == 1)
        self._runner.cost += 0.2 * ((last - start) / len(records) - self._runner.cost)

    def _pause(self) -> None:
        """Stop fetching, keep the lease, wait a little for work to finish."""
        if not self._paused:
            self._paused = True
            log.debug("receiver of %s paused: %d in flight", self._host.topic, self._in())
        self._host.hold_fetching()
        self._serve()
        self._board.wait_below(self._resume_at + 1, _WAIT_S)

    def _serve(self) -> None:
        """Call the consumer without taking records: rebalances run, the lease holds."""
        host = self._host
        if not host.closed:  # an ungrouped subscriber's serve returns at once
            try:
                host.serve()
            except Exception as exc:
                if not host.closed:
                    host.report("receiver poll failed", exc)

    def _in(self) -> int:
        return self._board.in_flight + len(self._feed)

    def _drain(self) -> None:
        """Closing: finish in-flight work until the deadline, abandon the rest, confirm."""
        board, sub = self._board, self._host
        self._feed.clear()
        try:
            self._host.hold_fetching()
            confirmed_at = time.monotonic()
            while board.in_flight > 0 and time.monotonic() < self._deadline:
                self._host.hold_fetching()  # partitions assigned meanwhile too
                self._serve()
                board.wait_below(1, min(_WAIT_S, max(0.0, self._deadline - time.monotonic())))
                if self._confirm and time.monotonic() - confirmed_at >= _CONFIRM_EVERY_S:
                    confirmed_at = time.monotonic()
                    self._confirm_safe()
            board.stop()
            if self._confirm:
                self._confirm_safe()
            if board.in_flight > 0:
                self._workers.cancel()
                log.warning(
                    "receiver of %s closed with %d records unfinished; they are not confirmed",
                    sub.topic,
                    board.in_flight,
                )
            rewind = self._feed.rewind_points()
            board.abandon_all()
            if rewind and not sub.closed:
                sub.rewind(rewind)  # a later reader of this subscriber reads them again
            self._host.release_fetching()
        finally:
            board.stop()
            if self._tiers is not None:
                self._tiers.close(min(self._deadline, time.monotonic() + 5.0))
            sub.hand_back()

    # -- confirms and revokes ----------------------------------------------------------------

    def _limit(self, targets: dict[int, int], offset: int | None) -> dict[int, int]:
        """What a confirm of the subscriber may move to while this receiver runs: never past
        a record still unfinished. A confirm of one ``offset`` (a handler confirming its own
        record in its own transaction) counts that record as finished, and moves to the safe
        point that gives (past the records finished above it: the frontier jumps)."""
        limited: dict[int, int] = {}
        for p, target in targets.items():
            safe = self._feed.safe(p, self._board.safe_point(p, offset))
            if safe is not None:
                limited[p] = safe + 1 if offset is not None else min(target, safe + 1)
        return limited

    def _confirm_safe(
        self, only: dict[int, int | None] | None = None, done: dict[int, set[int]] | None = None
    ) -> None:
        """Confirm each partition's safe offset (or ``only``'s) if it moved, after keeping
        the records finished above it (``done``, else the board's) with its position."""
        sub = self._host
        with self._confirm_lock:
            if only is None:
                with self._board.lock:
                    tracks = self._board.tracks.items()
                    only = {p: t.safe() for p, t in tracks}
                    done = {p: set(t.done) for p, t in tracks}
                only = {p: self._feed.safe(p, s) for p, s in only.items()}
            held = sub.assigned()
            for partition, safe in only.items():
                if partition not in held:
                    continue  # given up meanwhile (a deactivate from another thread)
                self._note(partition, safe, (done or {}).get(partition, set()))
                if safe is None or safe <= self._confirmed.get(partition, -1):
                    continue
                try:
                    sub.confirm_finished(safe, partition)
                except ValueError:
                    continue  # repositioned since: that offset is no longer this reader's
                except IllegalSubscriberStateError:
                    return  # closed or deactivated
                self._confirmed[partition] = safe

    def _note(self, partition: int, safe: int | None, done: set[int]) -> None:
        """Keep the records of ``partition`` finished above ``safe`` that are not kept yet
        (``_confirm_lock`` held)."""
        noted = self._noted.setdefault(partition, set())
        if safe is not None:
            noted.difference_update([o for o in noted if o <= safe])
        fresh = done - noted
        if not fresh:
            return
        try:
            self._host.note_finished(partition, fresh)
        except IllegalSubscriberStateError:
            return  # closed or deactivated
        noted |= fresh

    def _on_revoke(self, partitions: list[int], lost: bool) -> None:
        """The subscriber gives ``partitions`` up (``lost``: another member may own them)."""
        try:
            self._revoke(partitions, lost)
        except Exception as exc:
            self._host.report("receiver failed to give up partitions", exc)

    def _revoke(self, partitions: list[int], lost: bool) -> None:
        board, feed = self._board, self._feed
        held = feed.forget(partitions)
        with self._confirm_lock:  # no confirm of these partitions from a stale snapshot
            tracks = [t for p in partitions if (t := board.revoke(p)) is not None]
        # A handler that closes its subscriber revokes from a worker: its own record cannot
        # finish while it waits, so it does not wait. Tier calls share the same deadline.
        wait_s = 0.0 if self._workers.owns(threading.current_thread()) else self._revoke_wait_s
        deadline = min(time.monotonic() + wait_s, self._deadline)
        if not lost and tracks:
            for track in tracks:
                board.wait_idle(track, max(0.0, deadline - time.monotonic()))
            if self._confirm:
                final = {t.partition: feed.bound(t.partition, t.safe(), held) for t in tracks}
                with board.lock:
                    done = {t.partition: set(t.done) for t in tracks}
                self._confirm_safe(final, done)  # synchronous: the partitions are still owned
        for track in tracks:
            board.settle(track)
        if self._tiers is not None:  # after the board: no worker shelves on them any more
            here = threading.current_thread() is self._thread
            self._tiers.revoke(partitions, lost, deadline, on_fetch_thread=here)
        with self._confirm_lock:
            for p in partitions:
                self._confirmed.pop(p, None)
                self._noted.pop(p, None)

    def _halt(self, summary: str, error: BaseException) -> None:
        """The broker refuses a write the receiver cannot do without (a retry tier's copy, a
        dead letter) for good: report it once and stop; what waits on it is not confirmed."""
        if self._halted.is_set():
            return
        self._halted.set()
        self._host.report(summary, error)
        self._deadline = min(self._deadline, time.monotonic() + self._revoke_wait_s)
        self._stop.set()

    # -- public ------------------------------------------------------------------------------

    def metrics(self) -> ReceiverMetrics:
        """In flight, finished, retried, dead-lettered, failed, abandoned; confirmed and safe
        offsets per partition."""
        board = self._board
        with board.lock:
            safe = {p: t.safe() for p, t in board.tracks.items()}
            counts = (
                board.finished,
                board.retried,
                board.dead_lettered,
                board.failed,
                board.abandoned,
            )
            in_flight = board.in_flight
        safe = {p: self._feed.safe(p, s) for p, s in safe.items()}
        with self._confirm_lock:
            confirmed = dict(self._confirmed)
        return ReceiverMetrics(
            in_flight=in_flight + len(self._feed),
            finished=counts[0],
            retried=counts[1],
            dead_lettered=counts[2],
            failed=counts[3],
            abandoned=counts[4],
            paused=self._paused,
            confirmed=confirmed,
            safe={p: s for p, s in safe.items() if s is not None},
            parked=0 if self._tiers is None else self._tiers.shelf.counts()[0],
        )

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Stop fetching, let in-flight records finish, confirm, and stop.

        Records still unfinished ``timeout_s`` seconds after the call are abandoned: not
        confirmed, so the next reader of their partition reads them again (async handlers
        are cancelled; a running plain handler cannot be, and its result is ignored).
        Called from a handler or a hook, it does not wait; the receiver stops on its own.

        Args:
            timeout_s: Longest wait; ``None`` waits for every record however long it takes.
        """
        if timeout_s is not None:
            timeout_s = max(0.0, float(timeout_s))
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        self._deadline = min(self._deadline, deadline)
        self._stop.set()
        current = threading.current_thread()
        if current is self._thread or self._workers.owns(current):
            return
        if self._thread.is_alive():
            self._thread.join(None if timeout_s is None else timeout_s + 5.0)
        self._workers.join(time.monotonic() + (1.0 if timeout_s is not None else 5.0))

    def __repr__(self) -> str:
        return f"ParallelReceiver(stream={self._host.topic!r}, running={self.running})"
