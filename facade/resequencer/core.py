"""Resequencer: releases the records of a sequence group in order, whatever order they came in.

A sequence group's records (docs/concepts.md) carry three headers (``resequencer.sequence``):
the group id, its size and a 0-based sequence number. ``publish_sequence`` stamps them and keys
the records by group, so a group lands on one partition, read by one member of a subscriber
group. Records without those headers pass straight through.

Crash safety needs no distributed hash table: ``safe_offset(partition)`` never passes the first
offset of an unfinished group, so a subscriber that confirms only up to it leaves every such
group in Kafka, for the next owner to re-read and finish after a failover.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Literal

from bolide.facade.deadletter import Reason, check_dead_letter
from bolide.facade.errors import ResequencerFullError
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record
from bolide.facade.resequencer.sequence import (
    SEQUENCE_GROUP_HEADER,
    Invalid,
    publish_sequence,
    scan_sequence,
)
from bolide.facade.resequencer.state import (
    DeadLetter,
    DeadLetterHandler,
    DeadLetters,
    Group,
    GroupKey,
    Hold,
    ResequencerMetrics,
    Track,
)
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int, check_seconds

__all__ = ["DeadLetterHandler", "Reason", "Resequencer", "ResequencerMetrics", "publish_sequence"]

log = logging.getLogger(__name__)

#: Wake-up interval of a blocking ``offer``, so timeouts can make room while it waits.
_WAIT_SLICE_S = 0.05


class Resequencer:
    """Releases the records of each group in sequence order (0, 1, ..., size - 1).

    Args:
        mode: ``"batch"`` releases a group once complete, ``"stream"`` each record in turn.
        timeout_s: A group must complete within this many seconds of its first record.
        capacity: Most records held at once (all groups together). In batch mode a group
            larger than this can never complete and is rejected (reason ``too_large``).
        on_timeout: ``"release"`` hands out what a timed-out group holds, in order;
            ``"dead_letter"`` sends it to ``dead_letter`` with reason ``timeout``.
        dead_letter: Where rejected records go: a ``Publisher`` (the dead-letter stream; the
            record keeps its key, data and headers and gains ``bolide.reason`` and
            ``bolide.reason.detail``) or a callable ``fn(record, reason)``. Without one,
            rejected records are logged and dropped.
        clock: Monotonic seconds; inject one in tests.

    A group is identified by its id within a partition. Records must reach ``offer`` in offset
    order per partition, as a subscriber delivers them; an offset at or below one already seen
    means the partition is being read again from an earlier position (a new lease), so its
    state is forgotten first, exactly as ``forget(partition)`` does. The last ``capacity``
    (at least 1,024) finished groups are remembered: their stragglers count as duplicates, or
    as late (dead letter) when the group timed out.

    Thread safety: every method may be called from any thread; ``offer`` from a ``Receiver``
    callback while another thread calls ``tick()``. Dead letters are sent outside the lock.
    """

    def __init__(
        self,
        mode: Literal["batch", "stream"] = "batch",
        timeout_s: float = 30.0,
        capacity: int = 10_000,
        on_timeout: Literal["release", "dead_letter"] = "release",
        dead_letter: Publisher | DeadLetterHandler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("batch", "stream"):
            raise ValueError(f"mode must be 'batch' or 'stream', got {mode!r}")
        check_seconds("timeout_s", timeout_s)
        check_int("capacity", capacity, minimum=1)
        if on_timeout not in ("release", "dead_letter"):
            raise ValueError(f"on_timeout must be 'release' or 'dead_letter', got {on_timeout!r}")
        check_dead_letter(dead_letter, "reason")
        if on_timeout == "dead_letter" and dead_letter is None:
            raise ValueError("on_timeout='dead_letter' needs a dead_letter target")
        if not callable(clock):
            raise TypeError("clock must be a callable returning seconds")
        self.mode = mode
        self.timeout_s = float(timeout_s)
        self.capacity = capacity
        self.on_timeout = on_timeout
        self.dead_letter = dead_letter
        self._batch = mode == "batch"
        self._clock = clock
        self._lock = threading.RLock()
        self._room = threading.Condition(self._lock)
        self._waiters = 0
        self._groups: dict[GroupKey, Group] = {}  # oldest first
        self._deadline = math.inf  # no group can time out before this
        self._finished: dict[GroupKey, bool] = {}  # oldest first; value: timed out
        self._finished_max = max(capacity, 1_024)
        self._tracks: dict[int, Track] = {}
        self._buffered = 0
        self._released = 0
        self._passed = 0
        self._timed_out = 0
        self._duplicates = 0
        self._letters = DeadLetters(dead_letter, self._lock)
        if TELEMETRY is not None:
            TELEMETRY.watch_resequencer(self)

    # -- public API ------------------------------------------------------------------------

    def offer(self, record: Record, *, timeout_s: float | None = 0.0) -> list[Record]:
        """Take one record; return the records it (and any timeouts) released, in order:
        groups that timed out first, then by sequence number. A record that would wait while
        ``capacity`` records are held is refused, at once with ``timeout_s=0`` (the default),
        else after up to ``timeout_s`` seconds (``None``: forever) waiting for room. Records
        that need no room (pass-through, next in sequence, duplicates, rejects) are taken.

        Raises:
            TypeError: ``record`` is not a Record.
            ResequencerFullError: No room; the record was not taken, offer it again later.
        """
        if not isinstance(record, Record):
            raise TypeError(f"record must be a Record, not {type(record).__name__}")
        seq = scan_sequence(record)
        out: list[Record] = []
        dead: list[DeadLetter] = []
        try:
            with self._lock:
                now = self._clock()
                if now >= self._deadline:
                    self._expire_locked(now, out, dead)
                if self._buffered >= self.capacity and self._needs_room(record, seq):
                    self._wait_for_room(record, seq, timeout_s, out, dead)
                track = self._track(record)
                if seq is None:
                    self._passed += 1
                    out.append(record)
                elif isinstance(seq, tuple):
                    raw, size, number = seq
                    group = self._groups.get((record.partition, raw))
                    if group is None or size != group.size:
                        group = self._open(record, seq, group, track, dead)
                    if group is None:  # a duplicate, late or rejected record
                        pass
                    elif self._batch:  # the common path, inline
                        slots = group.slots
                        if slots[number] is None:
                            slots[number] = record
                            group.count += 1
                            self._buffered += 1
                            if group.count == size:
                                self._close(group, out, timed_out=False)
                        else:
                            self._duplicates += 1
                    else:
                        self._stream(group, record, number, out)
                else:
                    self._reject(record, seq.reason, seq.detail, track, dead)
                if track is not None:
                    track.last = record.offset
        finally:
            if dead:
                self._letters.send(dead)
        return out

    def _track(self, record: Record) -> Track | None:
        """The offsets seen on ``record``'s partition (a new track after a rewind)."""
        partition, offset = record.partition, record.offset
        if partition is None or offset is None:
            return None
        track = self._tracks.get(partition)
        if track is None or (track.last is not None and offset <= track.last):
            self._check_rewind(record)
            track = self._tracks[partition] = Track()
        elif track.refused is not None and track.refused[0] == offset:
            track.refused[1].release()  # refused before, taken now
            track.refused = None
        return track

    def expire(self, now: float | None = None) -> list[Record]:
        """Time out groups older than ``timeout_s`` at ``now`` (default: the clock).

        Returns:
            Records released by the ``"release"`` policy, each group in sequence order.
        """
        out: list[Record] = []
        dead: list[DeadLetter] = []
        try:
            with self._lock:
                self._expire_locked(self._clock() if now is None else now, out, dead)
        finally:
            self._letters.send(dead)
        return out

    def tick(self) -> list[Record]:
        """Check timeouts now; call it periodically when records may stop arriving."""
        return self.expire()

    def safe_offset(self, partition: int) -> int | None:
        """The highest offset of ``partition`` that may be confirmed, or ``None``.

        Every record at or below it was released, passed through or rejected (and its dead
        letter acknowledged), and it is below the first offset of every unfinished group.
        In stream mode a group's released prefix is held back too until the group finishes,
        so a new owner re-reads the whole group. Call it after handling what ``offer`` gave.
        """
        with self._lock:
            track = self._tracks.get(partition)
            return None if track is None else track.safe()

    def forget(self, partition: int) -> int:
        """Drop everything held for ``partition`` (revoked: its new owner re-reads it).

        Returns:
            How many buffered records were dropped.
        """
        with self._lock:
            return self._forget_locked(partition)

    @property
    def is_full(self) -> bool:
        """True when ``capacity`` records are held: an offer that must wait would be refused."""
        with self._lock:
            return self._buffered >= self.capacity

    def metrics(self) -> ResequencerMetrics:
        """A snapshot of the counters (see ``ResequencerMetrics``)."""
        with self._lock:
            oldest = next(iter(self._groups.values()), None)
            return ResequencerMetrics(
                open_groups=len(self._groups),
                oldest_open_age_s=None if oldest is None else self._clock() - oldest.born,
                released=self._released,
                passed_through=self._passed,
                timed_out=self._timed_out,
                duplicates=self._duplicates,
                rejected=self._letters.sent,
                dead_letter_failures=self._letters.failures,
                buffered=self._buffered,
            )

    def __repr__(self) -> str:
        return (
            f"Resequencer(mode={self.mode!r}, open_groups={len(self._groups)}, "
            f"buffered={self._buffered}/{self.capacity})"
        )

    # -- room -------------------------------------------------------------------------------

    def _needs_room(self, record: Record, seq: tuple[bytes, int, int] | Invalid | None) -> bool:
        """Would ``offer`` hold this record (rather than release, drop or reject it)?"""
        if not isinstance(seq, tuple):
            return False
        raw, size, number = seq
        key = (record.partition, raw)
        track = self._tracks.get(record.partition) if record.partition is not None else None
        last = None if track is None else track.last
        if last is not None and record.offset is not None and record.offset <= last:
            return True  # read again: the partition's state goes first, then decide
        group = self._groups.get(key)
        if group is None:
            if key in self._finished:
                return False
            if self._batch:
                return 1 < size <= self.capacity
            return number != 0
        if size != group.size:
            return False
        if self._batch:
            return group.slots[number] is None and group.count + 1 < size
        return number > group.next and number not in group.waiting

    def _wait_for_room(
        self,
        record: Record,
        seq: tuple[bytes, int, int] | Invalid | None,
        timeout_s: float | None,
        out: list[Record],
        dead: list[DeadLetter],
    ) -> None:
        """Wait (up to ``timeout_s``) until the record needs no room or room was made."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
        ):
            raise TypeError("timeout_s must be a number of seconds or None")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._check_rewind(record)
            if self._buffered < self.capacity or not self._needs_room(record, seq):
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                # Expiry that freed nothing released nothing: ``out`` is empty here.
                self._hold_refused(record)
                raise ResequencerFullError(
                    f"resequencer holds {self._buffered} records (capacity {self.capacity}); "
                    "the record was not taken",
                    stream=record.stream,
                    partition=record.partition,
                    offset=record.offset,
                )
            self._waiters += 1
            try:
                self._room.wait(
                    _WAIT_SLICE_S if remaining is None else min(remaining, _WAIT_SLICE_S)
                )
            finally:
                self._waiters -= 1
            self._expire_locked(self._clock(), out, dead)

    def _hold_refused(self, record: Record) -> None:
        """Keep confirmation below a refused record until it is offered again and taken.

        A caller that drops the error (a ``Receiver`` logs it and reads on) would otherwise
        confirm past a record nobody handled.
        """
        partition, offset = record.partition, record.offset
        if partition is None or offset is None:
            return
        track = self._tracks.get(partition)
        if track is None:
            track = self._tracks[partition] = Track()
        if track.refused is None:
            track.refused = (offset, Hold(track))

    def _freed(self, count: int) -> None:
        self._buffered -= count
        if self._waiters:
            self._room.notify_all()

    # -- positions ------------------------------------------------------------------------

    def _check_rewind(self, record: Record) -> None:
        partition, offset = record.partition, record.offset
        if partition is None or offset is None:
            return
        track = self._tracks.get(partition)
        if track is not None and track.last is not None and offset <= track.last:
            log.info(
                "partition %s read again from offset %s (last seen %s): forgetting its state",
                partition,
                offset,
                track.last,
            )
            self._forget_locked(partition)

    def _forget_locked(self, partition: int) -> int:
        dropped = 0
        for key in [k for k in self._groups if k[0] == partition]:
            group = self._groups.pop(key)
            dropped += group.count + len(group.waiting)
        for key in [k for k in self._finished if k[0] == partition]:
            del self._finished[key]
        self._tracks.pop(partition, None)
        if dropped:
            self._freed(dropped)
        return dropped

    # -- the core --------------------------------------------------------------------------

    def _reject(
        self,
        record: Record,
        reason: Reason,
        detail: str,
        track: Track | None,
        dead: list[DeadLetter],
    ) -> None:
        hold = Hold(track) if track is not None and self.dead_letter is not None else None
        dead.append((record, reason, detail, hold))

    def _open(
        self,
        record: Record,
        seq: tuple[bytes, int, int],
        group: Group | None,
        track: Track | None,
        dead: list[DeadLetter],
    ) -> Group | None:
        """The group for a record whose group is not open or whose size differs from it.

        Returns ``None`` when the record was dealt with: a duplicate of a finished group, a
        late record of a timed-out one, or a reject.
        """
        raw, size, _number = seq
        if group is not None:
            detail = f"size {size} differs from the group's size {group.size}"
            self._reject(record, Reason.SIZE_MISMATCH, detail, track, dead)
            return None
        key = (record.partition, raw)
        timed_out = self._finished.get(key)
        if timed_out is not None:
            if timed_out:
                detail = f"group {raw.decode(errors='replace')!r} already timed out"
                self._reject(record, Reason.LATE, detail, track, dead)
            else:
                self._duplicates += 1
            return None
        try:
            raw.decode()  # once per group: the group id must be UTF-8
        except UnicodeDecodeError:
            detail = f"{SEQUENCE_GROUP_HEADER} is not UTF-8: {raw[:40]!r}"
            self._reject(record, Reason.MALFORMED, detail, track, dead)
            return None
        if self._batch and size > self.capacity:
            detail = f"group size {size} exceeds the capacity {self.capacity}"
            self._reject(record, Reason.TOO_LARGE, detail, track, dead)
            return None
        born = self._clock()
        group = Group(key, size, born, None if track is None else Hold(track))
        if self._batch:
            group.slots = [None] * size
        if not self._groups:
            self._deadline = born + self.timeout_s
        self._groups[key] = group
        return group

    def _stream(self, group: Group, record: Record, number: int, out: list[Record]) -> None:
        """Stream mode: release the record and its waiting successors, or let it wait."""
        waiting = group.waiting
        if number < group.next or number in waiting:
            self._duplicates += 1
            return
        if number != group.next:
            waiting[number] = record
            self._buffered += 1
            return
        out.append(record)
        following = number + 1
        if waiting:
            while following in waiting:
                out.append(waiting.pop(following))
                following += 1
            if following > number + 1:
                self._freed(following - number - 1)
        self._released += following - number
        group.next = following
        if following == group.size:
            self._close(group, out, timed_out=False)

    def _close(self, group: Group, out: list[Record], *, timed_out: bool) -> None:
        """Finish a group: hand out what it holds, in order, and lift its hold."""
        del self._groups[group.key]
        finished = self._finished
        finished[group.key] = timed_out
        if len(finished) > self._finished_max:
            del finished[next(iter(finished))]
        held = group.slots if group.count == group.size else group.held()
        if held:
            out.extend(held)  # type: ignore[arg-type]  # a full batch holds no None
            self._released += len(held)
            self._freed(len(held))
        if group.hold is not None:
            group.hold.release()

    def _expire_locked(self, now: float, out: list[Record], dead: list[DeadLetter]) -> None:
        limit = now - self.timeout_s
        groups = self._groups
        while groups:
            group = next(iter(groups.values()))
            if group.born > limit:
                self._deadline = group.born + self.timeout_s
                return
            self._timed_out += 1
            if self.on_timeout == "dead_letter":
                held = group.held()
                missing = group.size - group.next - len(held)
                detail = (
                    f"group {group.key[1].decode(errors='replace')!r} timed out after "
                    f"{self.timeout_s}s with {missing} missing"
                )
                hold = group.hold
                for rec in held:
                    if hold is not None:
                        hold.pending += 1
                    dead.append((rec, Reason.TIMEOUT, detail, hold))
                group.slots = []
                group.waiting = {}
                group.count = 0
                self._freed(len(held))
            self._close(group, out, timed_out=True)
        self._deadline = math.inf
