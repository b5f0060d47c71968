"""``Board``: the parallel receiver's work, by partition and key, and the queue of what may run.

Each partition read in one assignment has a ``Track``: the offsets taken and not finished (a
heap whose top is the first unfinished one), the last offset taken, and the lanes. A lane is
one ordering key (a Kafka key, or the whole partition); while its head record is in flight,
the records behind it wait in the lane. A record whose lane is free is ready and goes to the
ready queue, which the workers drain; a record waiting for a retry sits in the delayed heap
until it is due, still holding its lane.

Confirmation never passes the first unfinished offset of a partition (``Track.safe``), the
rule of Confluent's Parallel Consumer and of ``Resequencer.safe_offset``. A revoked or re-read
partition's track is dropped: records queued there are abandoned at once, running ones are
waited for by the receiver (``settle``) and then abandoned too.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable

from bolide.facade.record import Record

__all__ = ["NO_LANE", "Board", "Item", "LaneOf", "Track"]

#: The lane of a record that waits for no other (``ordering="unordered"``).
NO_LANE: Hashable = object()

#: ``lane_of(record)``: the ordering key of a record within its partition.
LaneOf = Callable[[Record], Hashable]


class Item:
    """One record in flight: its track, its lane, the attempts so far, the final error."""

    __slots__ = ("attempt", "error", "lane", "record", "track")

    def __init__(self, record: Record, track: Track, lane: Hashable) -> None:
        self.record = record
        self.track = track
        self.lane = lane
        self.attempt = 0
        self.error: BaseException | None = None  # set once given up: only its dead letter runs


class Track:
    """One partition's records during one assignment (or until it is read again)."""

    __slots__ = (
        "busy",
        "count",
        "done",
        "first",
        "lanes",
        "last",
        "partition",
        "revoked",
        "settled",
        "unfinished",
    )

    def __init__(self, partition: int, first: int) -> None:
        self.partition = partition
        self.first = first  # the first offset taken: nothing below it is this track's to confirm
        self.last = first - 1  # the last offset taken
        self.unfinished: list[int] = []  # a heap; finished offsets leave it lazily via ``done``
        self.done: set[int] = set()  # finished, above the first unfinished one
        self.count = 0  # records in flight
        self.busy = 0  # records running now (handler or dead letter)
        self.lanes: dict[Hashable, deque[Item]] = {}  # lanes with their head in flight
        self.revoked = False
        self.settled = False

    def add(self, offset: int) -> None:
        heapq.heappush(self.unfinished, offset)
        self.count += 1

    def finish(self, offset: int) -> None:
        self.count -= 1
        heap = self.unfinished
        if heap[0] != offset:
            self.done.add(offset)
            return
        heapq.heappop(heap)
        done = self.done
        while heap and heap[0] in done:
            done.discard(heapq.heappop(heap))

    def frontier(self) -> int:
        """The first offset taken and not finished (after the last one taken when none is):
        a position that may stay there while later records finish (``done``)."""
        return self.unfinished[0] if self.unfinished else self.last + 1

    def safe(self) -> int | None:
        """The highest offset at and below which every record taken is finished, if any."""
        safe = self.frontier() - 1
        return safe if safe >= self.first else None

    def safe_with(self, offset: int) -> int | None:
        """``safe``, counting ``offset`` as finished: a handler confirming its own record in
        its own transaction (the record is finished exactly when that transaction commits)."""
        heap = self.unfinished
        if not heap or heap[0] != offset:
            return self.safe()
        safe = self.last
        done = self.done  # the heap's top is never done; below the next live one, at most these
        for candidate in heapq.nsmallest(len(done) + 2, heap):
            if candidate != offset and candidate not in done:
                safe = candidate - 1
                break
        return safe if safe >= self.first else None


class Board:
    """The work of one parallel receiver; every method takes its lock.

    Workers wait on ``cond`` for ready records; the receiver's fetch thread waits on
    ``changed`` (records finished, a partition idle), so a finish wakes no idle worker.

    Args:
        lane_of: The ordering key of a record, or ``NO_LANE``.
        on_ready: Called (outside no lock in particular) when a record became ready, for a
            consumer that does not wait on ``cond`` (the event loop of async handlers).
    """

    def __init__(self, lane_of: LaneOf, on_ready: Callable[[], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.changed = threading.Condition(self.lock)
        self.tracks: dict[int, Track] = {}
        self.ready: deque[Item] = deque()
        self.delayed: list[tuple[float, int, Item]] = []
        self._ticket = 0  # ties in the delayed heap
        self._lane_of = lane_of
        self.on_ready = on_ready
        self.stopped = False
        self.in_flight = 0
        self.finished = 0
        self.retried = 0
        self.dead_lettered = 0
        self.failed = 0
        self.abandoned = 0

    # -- the fetch side ------------------------------------------------------------------

    def taken(self, records: Iterable[Record]) -> None:
        """Note records polled (before a resequencer holds some back): a partition read again
        from an offset at or below one taken before starts a new track."""
        with self.cond:
            for record in records:
                self._track(record).last = _offset(record)

    def add(self, records: Iterable[Record], *, taken: bool = False) -> int:
        """Put records in flight, each behind the records of its lane; return how many.

        Args:
            records: In offset order per partition (released resequenced groups excepted).
            taken: ``taken`` was already called for them (the resequencer's path).
        """
        lane_of = self._lane_of
        ready = self.ready
        count = 0
        with self.cond:
            for record in records:
                offset = _offset(record)
                if taken:
                    partition = record.partition or 0
                    track = self.tracks.get(partition) or self._track(record)
                else:
                    track = self._track(record)
                    track.last = offset
                track.add(offset)
                lane = lane_of(record)
                item = Item(record, track, lane)
                count += 1
                if lane is NO_LANE:
                    ready.append(item)
                    continue
                waiting = track.lanes.get(lane)
                if waiting is None:
                    track.lanes[lane] = deque()
                    ready.append(item)
                else:
                    waiting.append(item)
            self.in_flight += count
            if count:
                self.cond.notify(count)
        if count and self.on_ready is not None:
            self.on_ready()
        return count

    def ran(self, records: list[Record], *, one_partition: bool = False) -> None:
        """Note records the fetch thread handled itself, in offset order: finished already.
        ``one_partition``: they all come from one partition (no need to look at each)."""
        if not records:
            return
        with self.cond:
            first: dict[int, Record] = {}
            last: dict[int, int] = {}
            if one_partition:
                first[records[0].partition or 0] = records[0]
                last[records[0].partition or 0] = _offset(records[-1])
            for record in () if one_partition else records:
                partition = record.partition or 0
                if partition not in first:
                    first[partition] = record
                last[partition] = _offset(record)
            for partition, record in first.items():
                self._track(record).last = last[partition]
            self.finished += len(records)

    def claim(self, record: Record) -> Item:
        """Put one record in flight as running (it failed on the fetch thread): it holds its
        lane, and the caller retries it, dead-letters it or finishes it."""
        with self.cond:
            track = self._track(record)
            track.last = offset = _offset(record)
            track.add(offset)
            lane = self._lane_of(record)
            item = Item(record, track, lane)
            if lane is not NO_LANE:
                track.lanes[lane] = deque()
            track.busy += 1
            self.in_flight += 1
            return item

    def _track(self, record: Record) -> Track:
        partition = record.partition or 0
        offset = _offset(record)
        track = self.tracks.get(partition)
        if track is None or offset <= track.last:
            if track is not None:  # repositioned (a seek, or read again after a reset)
                self._drop(track)
                self._settle(track)
            track = self.tracks[partition] = Track(partition, offset)
        return track

    def safe_point(self, partition: int, counting: int | None = None) -> int | None:
        """The safe offset of ``partition`` (``Track.safe``), ``counting`` one record as
        finished (``Track.safe_with``); ``None`` when nothing of it is safe or on the board."""
        with self.lock:
            track = self.tracks.get(partition)
            if track is None:
                return None
            return track.safe() if counting is None else track.safe_with(counting)

    def unfinished_from(self) -> dict[int, int]:
        """Per partition with records unfinished: the lowest of them (where to read again)."""
        with self.lock:
            return {p: t.unfinished[0] for p, t in self.tracks.items() if t.unfinished}

    def revoke(self, partition: int) -> Track | None:
        """Take ``partition`` out of play: its queued records are abandoned now, its running
        ones go on (``settle`` abandons those still running). Returns its track, if any."""
        with self.cond:
            track = self.tracks.pop(partition, None)
            if track is not None:
                self._drop(track)
            return track

    def _drop(self, track: Track) -> None:
        track.revoked = True
        dropped = track.count - track.busy
        track.lanes.clear()
        self.in_flight -= dropped
        self.abandoned += dropped
        self.changed.notify_all()

    def settle(self, track: Track) -> None:
        """Abandon what still runs on a revoked track; its later results are ignored."""
        with self.cond:
            self._settle(track)

    def _settle(self, track: Track) -> None:
        if not track.settled:
            track.settled = True
            self.in_flight -= track.busy
            self.abandoned += track.busy

    def wait_idle(self, track: Track, timeout_s: float) -> bool:
        """Wait until nothing runs on ``track``; ``False`` if something still does."""
        with self.cond:
            return self.changed.wait_for(lambda: track.busy == 0, timeout_s)

    def wait_below(self, limit: int, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for fewer than ``limit`` records in flight."""
        with self.cond:
            self.changed.wait_for(lambda: self.in_flight < limit or self.stopped, timeout_s)

    # -- the worker side -----------------------------------------------------------------

    def take(self, timeout_s: float | None = None) -> Item | None:
        """The next ready record, marked running; ``None`` once stopped (or after the wait)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while not self.stopped:
                item = self._next()
                if item is not None:
                    return item
                wait = self._due_in()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self.cond.wait(wait)
            return None

    def take_nowait(self) -> Item | None:
        """The next ready record, marked running, or ``None``."""
        with self.cond:
            return None if self.stopped else self._next()

    def due_in(self) -> float | None:
        """Seconds until the next delayed record is due (``None``: none waits)."""
        with self.cond:
            return self._due_in()

    def _next(self) -> Item | None:
        ready, delayed = self.ready, self.delayed
        if delayed and delayed[0][0] <= time.monotonic():
            now = time.monotonic()
            while delayed and delayed[0][0] <= now:
                ready.append(heapq.heappop(delayed)[2])
        while ready:
            item = ready.popleft()
            if not item.track.revoked:
                item.track.busy += 1
                return item
        return None

    def _due_in(self) -> float | None:
        return max(0.0, self.delayed[0][0] - time.monotonic()) if self.delayed else None

    def finish(self, item: Item, *, outcome: str = "finished") -> None:
        """``item`` is finished (``outcome``: ``"dead_lettered"`` or ``"failed"`` counted too);
        the next record of its lane becomes ready."""
        nxt: Item | None = None
        with self.cond:
            track = item.track
            track.busy -= 1
            track.finish(_offset(item.record))
            self.changed.notify_all()
            if track.settled:
                return
            self.in_flight -= 1
            self.finished += 1
            if outcome == "dead_lettered":
                self.dead_lettered += 1
            elif outcome == "failed":
                self.failed += 1
            nxt = self._pass(item)
        if nxt is not None and self.on_ready is not None:
            self.on_ready()

    def pass_lane(self, item: Item) -> None:
        """The next record of ``item``'s lane may run now, before ``item`` is finished: its
        place in its key's order is kept elsewhere (a copy queued behind the key's parked
        records). ``finish`` then only marks its offset."""
        with self.cond:
            nxt = self._pass(item)
        if nxt is not None and self.on_ready is not None:
            self.on_ready()

    def _pass(self, item: Item) -> Item | None:
        """Hand ``item``'s lane to its next record (once: the item keeps no lane after)."""
        track, lane = item.track, item.lane
        item.lane = NO_LANE
        if track.revoked or lane is NO_LANE:
            return None
        waiting = track.lanes.get(lane)
        if not waiting:
            if waiting is not None:
                del track.lanes[lane]
            return None
        nxt = waiting.popleft()
        self.ready.append(nxt)
        self.cond.notify()
        return nxt

    def later(self, item: Item, delay_s: float, *, retry: bool = True) -> None:
        """Run ``item`` again after ``delay_s`` (it keeps its lane); a revoked one is dropped."""
        with self.cond:
            track = item.track
            track.busy -= 1
            if track.revoked:
                if not track.settled:
                    self.in_flight -= 1
                    self.abandoned += 1
                self.changed.notify_all()
                return
            if retry:
                self.retried += 1
            self._ticket += 1
            heapq.heappush(self.delayed, (time.monotonic() + delay_s, self._ticket, item))
            self.cond.notify()
        if self.on_ready is not None:
            self.on_ready()

    def stop(self) -> None:
        """Wake every waiting worker; ``take`` returns ``None`` from now on."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
            self.changed.notify_all()
        if self.on_ready is not None:
            self.on_ready()

    def abandon_all(self) -> None:
        """Closing: drop every track; what runs is abandoned."""
        with self.cond:
            for partition in list(self.tracks):
                track = self.tracks.pop(partition)
                self._drop(track)
                self._settle(track)
            self.ready.clear()
            self.delayed.clear()
            self.changed.notify_all()


def _offset(record: Record) -> int:
    offset = record.offset
    assert offset is not None, "records in flight come from a stream"
    return offset
