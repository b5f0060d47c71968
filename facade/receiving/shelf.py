"""``Shelf``: the records a parallel receiver keeps in its retry tiers, per key, in the order
they had on their source stream.

A key (a lane: the Kafka key, the partition, or the record itself for ``"unordered"``) is
*parked* while it has a record in a tier: its later records are shelved behind it (sent to
the same tier) instead of being handled, and only the lane's head, the record with the lowest
source offset, ever runs. A record runs once its copy has been read back from the tier's
stream (so its tier offset is known and can be confirmed) and, if it failed before, once its
delay has passed since that copy was written. Tier offsets are confirmed per tier partition
up to the first unfinished one (``Track.safe``), so a restart reads every parked record again
and rebuilds the same lanes.

A key stays parked after its last record in the tiers finished, until the group has confirmed
that record's copy: a restart before that calls it again, so every later record of the key
must come again after it, and only a copy behind it in a tier does (a record handled straight
from the source, its source offset confirmed, would not). For the same reason a finished copy
counts as done for its tier's confirm only once the key's earlier finished copies are
confirmed, or lie below it in the same tier partition.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Hashable

from bolide.facade.receiving.lanes import Track
from bolide.facade.record import Record

__all__ = ["Entry", "Shelf"]


class Entry:
    """One record on the shelf: where it came from, which tier holds it, how far it got."""

    __slots__ = (
        "attempts",
        "dropped",
        "due",
        "lane",
        "moving",
        "origin",
        "partition",
        "record",
        "settled",
        "tier",
        "where",
        "written",
    )

    def __init__(
        self, record: Record, partition: int, origin: int, lane: Hashable, tier: int
    ) -> None:
        self.record = record  # as the handler sees it: the source's stream, partition, offset
        self.partition = partition
        self.origin = origin  # the offset on the source stream: the order within the lane
        self.lane = lane
        self.tier = tier
        self.attempts = 0  # handler calls so far
        self.where: int | None = None  # the offset of its copy in its tier, once read back
        self.due = 0.0  # wall-clock seconds from which it may run
        self.dropped = False  # its partition was revoked: results are ignored
        self.written = False  # its copy is in its tier (acknowledged)
        self.moving: int | None = None  # the tier its copy is being written to
        self.settled = False  # finished, and its copy counted done for the tier's confirm

    def __lt__(self, other: Entry) -> bool:
        return self.origin < other.origin


class _Lane:
    __slots__ = ("entries", "pending", "running")

    def __init__(self) -> None:
        self.entries: list[Entry] = []  # sorted by origin
        self.pending: list[Entry] = []  # finished, their copies not confirmed yet, in order
        self.running = False


class Shelf:
    """Parked records of one receiver, for ``tiers`` tiers; every method takes its lock."""

    def __init__(self, tiers: int) -> None:
        self.lock = threading.Condition()
        self._tiers = tiers
        self._lanes: dict[tuple[int, Hashable], _Lane] = {}
        self._origins: dict[tuple[int, int], Entry] = {}
        self._tracks: dict[tuple[int, int], Track] = {}  # (tier, partition): tier offsets
        self._due: list[tuple[float, int, Entry]] = []
        self._ticket = itertools.count()
        self._loading: set[int] = set()  # source partitions whose tiers are still being read
        self._owned: set[int] = set()  # source partitions held (from ``hold`` to ``drop``)
        self._confirmed: dict[tuple[int, int], int] = {}  # (tier, partition): offset confirmed
        self._pending: set[tuple[int, Hashable]] = set()  # lanes with a ``pending`` entry
        self._parked: Counter[int] = Counter()  # records on the shelf per source partition

    # -- records coming from the source stream ---------------------------------------------

    def divert(self, record: Record, lane: Hashable) -> Entry | None:
        """The shelf's entry for a source record whose key is parked (its ``tier`` is the
        one of the key's head; ``written`` or ``where`` set when it is on the shelf already,
        read again after a restart), else ``None``: the handler runs.

        A record read again below its key's head, while that head waits, is shelved before
        it (in the first tier): the head may be a copy its writer made after a later record
        of the key, the earlier ones never handled (a member that had lost the partition, or
        a track given up), so it runs first, and at worst once more. Below a head that runs
        or ran already it was finished before the head failed: a ``written`` entry, not
        shelved, says so (running it now would put it after the head)."""
        partition, origin = record.partition or 0, _offset(record)
        with self.lock:
            entry = self._origins.get((partition, origin))
            if entry is not None:
                return entry
            held = self._lanes.get((partition, lane))
            if partition not in self._owned or held is None:
                return None
            if held.entries:
                head = held.entries[0]
                entry = Entry(record, partition, origin, lane, head.tier)
                if origin < head.origin:
                    if held.running or (held.pending and held.pending[-1].origin > origin):
                        entry.written = True
                        return entry
                    entry.tier = 0
            else:  # only finished records not confirmed yet: behind their copies
                last = held.pending[-1]
                entry = Entry(record, partition, origin, lane, last.tier)
                if origin <= last.origin:
                    entry.written = True
                    return entry
            self._insert(entry)
            return entry

    def shelve(self, record: Record, lane: Hashable, attempts: int) -> Entry | None:
        """A source record failed its last call in the worker: its entry, in the first tier
        (``None`` when its partition is not held any more)."""
        partition, origin = record.partition or 0, _offset(record)
        with self.lock:
            if partition not in self._owned:
                return None
            entry = self._origins.get((partition, origin))
            if entry is None:
                entry = Entry(record, partition, origin, lane, 0)
                self._insert(entry)
            entry.attempts = attempts
            return entry

    # -- records read back from a tier -----------------------------------------------------

    def arrived(
        self, tier: int, offset: int, record: Record, attempts: int, due: float, lane: Hashable
    ) -> None:
        """A copy at ``offset`` of tier ``tier`` was read; ``record`` is the original (its
        source partition and offset set), ``due`` when it may run if it failed before.

        Of two copies of a record (a restart reads back those not confirmed yet), the newer
        has more ``attempts``: each move writes one more, whatever the tier (a parked
        record's copy in a later tier is followed, when it fails, by one in the first)."""
        partition, origin = record.partition or 0, _offset(record)
        with self.lock:
            track = self._track(tier, partition, offset)
            track.last = offset
            track.add(offset)
            entry = self._origins.get((partition, origin))
            if entry is None:  # read after a restart: the lane is rebuilt from the tiers
                entry = Entry(record, partition, origin, lane, tier)
                self._insert(entry)
            elif entry.moving == tier:  # its new copy, read before its delivery report came
                self._let_go(entry)
                entry.tier, entry.moving = tier, None
            elif attempts < entry.attempts or (
                attempts == entry.attempts and entry.where is not None
            ):
                track.finish(offset)  # an older copy, left behind by a crash: superseded
                return
            else:  # a newer copy: it moved on before a crash
                self._let_go(entry)
                entry.tier = tier
            entry.written = True
            entry.where = offset
            entry.attempts = max(entry.attempts, attempts)
            entry.due = due if entry.attempts else 0.0
            self._maybe_ready(entry)

    def take(self, timeout_s: float) -> Entry | None:
        """The next lane head that may run now, marked running (``None`` after the wait)."""
        with self.lock:
            deadline = time.monotonic() + timeout_s
            while True:
                now = time.time()
                while self._due and self._due[0][0] <= now:
                    entry = heapq.heappop(self._due)[2]
                    lane = self._lanes.get((entry.partition, entry.lane))
                    if (
                        entry.dropped
                        or entry.partition in self._loading
                        or lane is None
                        or lane.running
                        or not lane.entries
                        or lane.entries[0] is not entry
                    ):
                        continue  # ``release`` or ``done`` offers it again when it may run
                    lane.running = True
                    return entry
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                wait = min(left, self._due[0][0] - now) if self._due else left
                self.lock.wait(max(wait, 0.001))

    def done(self, entry: Entry) -> None:
        """``entry`` succeeded or was given up: its lane's next record may run; the lane
        stays parked until its copy is confirmed (``confirmed``)."""
        with self.lock:
            if entry.dropped:
                return
            if self._origins.pop((entry.partition, entry.origin), None) is not None:
                self._parked[entry.partition] -= 1
            key = (entry.partition, entry.lane)
            lane = self._lanes[key]
            lane.entries.remove(entry)
            lane.running = False
            if entry.where is None:  # no copy in a tier to confirm
                entry.settled = True
            else:
                lane.pending.append(entry)
                self._pending.add(key)
                self._settle(lane)
            if lane.entries:
                self._maybe_ready(lane.entries[0])
            elif not lane.pending:
                del self._lanes[key]

    def confirmed(self, points: dict[tuple[int, int], int]) -> None:
        """The group confirmed each (tier, partition) of ``points`` up to that offset: keys
        whose finished copies all are confirmed are parked no more."""
        with self.lock:
            for point, offset in points.items():
                self._confirmed[point] = max(offset, self._confirmed.get(point, -1))
            for key in list(self._pending):
                lane = self._lanes[key]
                while lane.pending and self._is_confirmed(lane.pending[0]):
                    lane.pending.pop(0)
                self._settle(lane)
                if not lane.pending:
                    self._pending.discard(key)
                    if not lane.entries:
                        del self._lanes[key]

    def moving(self, entry: Entry, tier: int) -> None:
        """``entry`` failed in its tier; its copy is being written to ``tier``."""
        with self.lock:
            entry.moving = tier

    def moved(self, entry: Entry) -> None:
        """The copy ``moving`` announced is acknowledged: ``entry`` stays the head of its
        lane and runs again once that copy is read back and due."""
        with self.lock:
            if entry.dropped:
                return
            self._lanes[(entry.partition, entry.lane)].running = False
            if entry.moving is None:  # the copy was read back already (``arrived``)
                self._maybe_ready(entry)
                return
            self._let_go(entry)
            entry.tier, entry.moving = entry.moving, None
            entry.written = True

    # -- partitions and confirms -----------------------------------------------------------

    def hold(self, partitions: list[int]) -> None:
        """Nothing of ``partitions`` runs until ``release``: their tiers are being read, and
        a key's head may be in a tier not read yet."""
        with self.lock:
            self._loading.update(partitions)
            self._owned.update(partitions)

    def release(self, partitions: list[int]) -> None:
        """The tiers of ``partitions`` are read to their end: their lanes' heads may run."""
        with self.lock:
            self._loading.difference_update(partitions)
            for (partition, _), lane in self._lanes.items():
                if partition in partitions and lane.entries:
                    self._maybe_ready(lane.entries[0])

    def safe_points(self) -> dict[tuple[int, int], int]:
        """Per (tier, partition) read: the offset at and below which every copy is done."""
        with self.lock:
            points = {k: t.safe() for k, t in self._tracks.items()}
        return {k: s for k, s in points.items() if s is not None}

    def drop(self, partitions: list[int]) -> None:
        """Forget the lanes and tier offsets of revoked source ``partitions``."""
        gone = set(partitions)
        with self.lock:
            for key in [k for k in self._lanes if k[0] in gone]:
                for entry in self._lanes.pop(key).entries:
                    entry.dropped = True
                    self._origins.pop((entry.partition, entry.origin), None)
                self._pending.discard(key)
            for key in [k for k in self._tracks if k[1] in gone]:
                del self._tracks[key]
                self._confirmed.pop(key, None)
            for partition in gone:
                self._parked.pop(partition, None)
            self._loading -= gone
            self._owned -= gone

    def counts(self) -> tuple[int, int]:
        """Records on the shelf, and keys (lanes) parked."""
        with self.lock:
            return len(self._origins), len(self._lanes)

    def parked(self) -> dict[int, int]:
        """Records on the shelf per source partition."""
        with self.lock:
            return {p: n for p, n in self._parked.items() if n}

    # -- inside the lock -------------------------------------------------------------------

    def _insert(self, entry: Entry) -> None:
        lane = self._lanes.setdefault((entry.partition, entry.lane), _Lane())
        bisect.insort(lane.entries, entry)
        self._origins[(entry.partition, entry.origin)] = entry
        self._parked[entry.partition] += 1

    def _maybe_ready(self, entry: Entry) -> None:
        lane = self._lanes.get((entry.partition, entry.lane))
        if lane is None or lane.running or entry.where is None:
            return
        if not lane.entries or lane.entries[0] is not entry:
            return
        heapq.heappush(self._due, (entry.due, next(self._ticket), entry))
        self.lock.notify()

    def _settle(self, lane: _Lane) -> None:
        """Count finished copies done for their tier's confirm, in the lane's order: the
        first, and each behind it in the same tier partition (a confirm passes them after
        it); one in another tier waits until those before it are confirmed. Of a run of
        such copies only the last is kept: its confirm is theirs (a key flowing through a
        tier whose confirm is held up keeps one entry, not one per record)."""
        kept: list[Entry] = []
        for entry in lane.pending:
            where = entry.where
            assert where is not None, "a pending entry has a copy"
            before = kept[-1] if kept else None
            if before is not None:
                if not before.settled or before.tier != entry.tier or where <= (before.where or 0):
                    kept.append(entry)  # waits until those before it are confirmed
                    continue
                kept.pop()  # confirmed no later than ``entry``
            if not entry.settled:
                entry.settled = True
                track = self._tracks.get((entry.tier, entry.partition))
                if track is not None:
                    track.finish(where)
            kept.append(entry)
        lane.pending = kept

    def _is_confirmed(self, entry: Entry) -> bool:
        confirmed = self._confirmed.get((entry.tier, entry.partition), -1)
        return entry.settled and entry.where is not None and entry.where <= confirmed

    def _let_go(self, entry: Entry) -> None:
        """The copy ``entry`` had in its tier is done with (confirmable)."""
        if entry.where is not None:
            track = self._tracks.get((entry.tier, entry.partition))
            if track is not None:
                track.finish(entry.where)
            entry.where = None

    def _track(self, tier: int, partition: int, offset: int) -> Track:
        track = self._tracks.get((tier, partition))
        if track is None:
            track = self._tracks[(tier, partition)] = Track(partition, offset)
        return track


def _offset(record: Record) -> int:
    offset = record.offset
    assert offset is not None, "shelved records come from a stream"
    return offset
