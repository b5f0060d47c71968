"""The resequencer's state: per-partition holds on confirmation, open groups, and metrics.

A ``Hold`` keeps confirmation below one offset until what it guards has ended: one per open
group (at the group's first offset) and one per rejected record awaiting its dead letter.
Records finished on arrival need none, so the common path allocates nothing per record.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from bolide.facade.deadletter import DeadLetterSink, LetterDone, Reason
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record

__all__ = [
    "DeadLetter",
    "DeadLetterHandler",
    "DeadLetters",
    "Group",
    "GroupKey",
    "Hold",
    "ResequencerMetrics",
    "Track",
]

log = logging.getLogger("bolide.facade.resequencer.core")

DeadLetterHandler: TypeAlias = Callable[[Record, Reason], object]

GroupKey: TypeAlias = tuple[int | None, bytes]


@dataclass(frozen=True, slots=True)
class ResequencerMetrics:
    """A snapshot of a resequencer's counters.

    Attributes:
        open_groups: Groups with records seen but not yet finished.
        oldest_open_age_s: Age of the oldest open group (by the resequencer's clock), or
            ``None`` when no group is open.
        released: Sequenced records handed out in order (timeouts with ``"release"`` included).
        passed_through: Records without sequence headers, handed out at once.
        timed_out: Groups that did not complete within ``timeout_s``.
        duplicates: Records dropped because their sequence number was already seen.
        rejected: Records sent (or, without a target, dropped) as dead letters.
        dead_letter_failures: Dead letters the target failed to take; their offsets stay
            unfinished, so ``safe_offset`` holds before them.
        buffered: Records held now, waiting for their predecessors.
    """

    open_groups: int
    oldest_open_age_s: float | None
    released: int
    passed_through: int
    timed_out: int
    duplicates: int
    rejected: int
    dead_letter_failures: int
    buffered: int


class Track:
    """Per partition: the last offset seen and the holds on confirmation, in offset order.

    ``refused`` is the first record refused for want of room, with the hold that keeps
    confirmation below it until it is offered again and taken.
    """

    __slots__ = ("holds", "last", "refused")

    def __init__(self) -> None:
        self.holds: deque[Hold] = deque()
        self.last: int | None = None
        self.refused: tuple[int, Hold] | None = None

    def safe(self) -> int | None:
        """The highest offset below every hold (``None`` before anything was seen)."""
        return self.holds[0].prev if self.holds else self.last


class Hold:
    """Keeps confirmation below its offset until ``pending`` things (a group, letters) end."""

    __slots__ = ("pending", "prev", "track")

    def __init__(self, track: Track) -> None:
        self.track = track
        self.prev = track.last  # the highest offset below this one, if any
        self.pending = 1
        track.holds.append(self)

    def release(self) -> None:
        """One guarded thing ended; lift the holds at the front that have nothing left."""
        self.pending -= 1
        holds = self.track.holds
        while holds and holds[0].pending <= 0:
            holds.popleft()


class Group:
    """An open group: its records by number, and its hold on confirmation."""

    __slots__ = ("born", "count", "hold", "key", "next", "size", "slots", "waiting")

    def __init__(self, key: GroupKey, size: int, born: float, hold: Hold | None) -> None:
        self.key = key
        self.size = size
        self.born = born
        self.hold = hold
        self.count = 0  # batch mode: records in ``slots``
        self.slots: list[Record | None] = []  # batch mode: records by number (size <= capacity)
        self.next = 0  # stream mode: the next number to release
        self.waiting: dict[int, Record] = {}  # stream mode: records after a gap

    def held(self) -> list[Record]:
        """The records held, in sequence order."""
        if self.slots:
            return [r for r in self.slots if r is not None]
        return [self.waiting[n] for n in sorted(self.waiting)]


DeadLetter: TypeAlias = tuple[Record, Reason, str, Hold | None]


class DeadLetters:
    """Hands rejected records to the dead-letter target; each hold lifts once it took them.

    Sends happen outside the resequencer's lock; a ``Publisher`` target acknowledges on its
    own thread. A failed send leaves the hold in place: confirmation stays before the record.
    """

    def __init__(self, target: Publisher | DeadLetterHandler | None, lock: threading.RLock):
        self._sink: DeadLetterSink[Reason] | None = None
        if target is not None:
            self._sink = DeadLetterSink(target)
        self._lock = lock
        self.sent = 0
        self.failures = 0

    def send(self, dead: list[DeadLetter]) -> None:
        """Send each rejected record (without a target: log it and drop it)."""
        sink = self._sink
        for record, reason, detail, hold in dead:
            with self._lock:
                self.sent += 1
            if sink is None:
                log.warning("dropping rejected record %r: %s (%s)", record, reason.value, detail)
                continue
            done = self._done(record, hold)
            pending = sink.send_async(record, reason, done, reason=reason, detail=detail)
            if pending is not None:  # an async def target: no event loop here to await it
                if inspect.iscoroutine(pending):
                    pending.close()
                done(TypeError("the dead-letter function returned an awaitable"))

    def _done(self, record: Record, hold: Hold | None) -> LetterDone:
        """What to do once ``record``'s dead letter went (lift its hold) or failed (count it;
        its hold stays). Caller: the sending thread, or a publisher's delivery thread."""

        def done(error: BaseException | None) -> None:
            if error is not None:
                log.error("dead letter for %r not sent", record, exc_info=error)
                with self._lock:
                    self.failures += 1
            elif hold is not None:
                with self._lock:
                    hold.release()

        return done
