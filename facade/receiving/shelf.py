"""``Shelf``: the records a parallel receiver keeps in its retry tiers, per key, in the order
they had on their source stream.

A key (a lane: the Kafka key, the partition, or the record itself for ``"unordered"``) is
*parked* while it has a record in a tier: its later records are shelved behind it (sent to
the same tier) instead of being handled, and only the lane's head, the record with the lowest
source offset, ever runs. A record runs once its copy has been read back from the tier's
stream (so its tier offset is known and can be confirmed) and, if it failed before, once its
delay has passed since that copy was written. A tier partition is confirmed up to its first
unfinished copy, with the finished copies above it (``confirm_points``; the finished set the
source's ledger writes too), so a restart reads every parked record again, skips the finished
copies, and rebuilds the same lanes.

A key stays parked after its last record in the tiers finished, until the group has confirmed
that record's copy: a restart before that calls it again, so every later record of the key
must come again after it, and only a copy behind it in a tier does (a record handled straight
from the source, its source offset confirmed, would not). A finished copy counts for its
tier's confirm at once, whatever tier its key's other copies are in: the tiers of a source
partition are confirmed together, from one reading of their copies, so a confirm that counts
a key's copy counts every copy the key finished before it too. A record run again after a
restart is thus never one whose later records are not.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

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

    def __lt__(self, other: Entry) -> bool:
        return self.origin < other.origin


class _Lane:
    __slots__ = ("entries", "running", "unconfirmed")

    def __init__(self) -> None:
        self.entries: list[Entry] = []  # sorted by origin
        # The last finished, while its copy is not confirmed (the earlier ones are confirmed
        # with it, or before it).
        self.unconfirmed: Entry | None = None
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
        self._fenced: set[int] = set()  # source partitions whose copies wait for a proof
        # (tier, partition): the position confirmed and the copies confirmed finished above it
        self._confirmed: dict[tuple[int, int], tuple[int, frozenset[int]]] = {}
        self._finished: dict[tuple[int, int], set[int]] = {}  # the same, found on ``hold``
        self._pending: set[tuple[int, Hashable]] = set()  # lanes with an ``unconfirmed`` entry
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
                head, last = held.entries[0], held.unconfirmed
                entry = Entry(record, partition, origin, lane, head.tier)
                if origin < head.origin:
                    if held.running or (last is not None and last.origin > origin):
                        entry.written = True
                        return entry
                    entry.tier = 0
            else:  # only a finished record not confirmed yet: behind its copy
                last = held.unconfirmed
                assert last is not None, "a lane holds entries or an unconfirmed one"
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
        source partition and offset set), ``due`` when it may run if it failed before. A copy
        of a partition not held (``hold`` to ``drop``) is not taken.

        Of two copies of a record (a restart reads back those not confirmed yet), the newer
        has more ``attempts``: each move writes one more, whatever the tier (a parked
        record's copy in a later tier is followed, when it fails, by one in the first)."""
        partition, origin = record.partition or 0, _offset(record)
        with self.lock:
            if partition not in self._owned:
                return  # read before its partition went: its next owner reads it again
            track = self._track(tier, partition, offset)
            track.last = offset
            track.add(offset)
            if offset in self._finished.get((tier, partition), ()):
                track.finish(offset)  # confirmed as finished: skipped, and confirmed again
                return
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
                        or entry.partition in self._fenced
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
        """``entry`` succeeded or was given up: its lane's next record may run, its copy is
        finished (``confirm_points``); the lane stays parked until that copy is confirmed
        (``confirmed``)."""
        with self.lock:
            if entry.dropped:
                return
            if self._origins.pop((entry.partition, entry.origin), None) is not None:
                self._parked[entry.partition] -= 1
            key = (entry.partition, entry.lane)
            lane = self._lanes[key]
            lane.entries.remove(entry)
            lane.running = False
            if entry.where is not None:  # else no copy in a tier to confirm
                self._finish(entry.tier, entry.partition, entry.where)
                lane.unconfirmed = entry
                self._pending.add(key)
            if lane.entries:
                self._maybe_ready(lane.entries[0])
            elif lane.unconfirmed is None:
                del self._lanes[key]

    def confirmed(self, points: Mapping[tuple[int, int], tuple[int, Iterable[int]]]) -> None:
        """The group confirmed each (tier, partition) of ``points``: that position, and the
        finished copies above it (what ``confirm_points`` gave). Keys whose finished copies
        all are confirmed are parked no more."""
        with self.lock:
            for point, (position, finished) in points.items():
                self._confirmed[point] = (position, frozenset(finished))
            for key in list(self._pending):
                lane = self._lanes[key]
                if lane.unconfirmed is None or not self._is_confirmed(lane.unconfirmed):
                    continue
                lane.unconfirmed = None
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

    def hold(
        self, partitions: list[int], finished: Mapping[tuple[int, int], set[int]] | None = None
    ) -> None:
        """Nothing of ``partitions`` runs until ``release``: their tiers are being read, and
        a key's head may be in a tier not read yet. ``finished``: per (tier, partition), the
        copies the group confirmed as finished above its confirmed position; read, they are
        skipped (and confirmed again as finished)."""
        with self.lock:
            self._loading.update(partitions)
            self._owned.update(partitions)
            self._finished.update(finished or {})

    def release(self, partitions: list[int]) -> None:
        """The tiers of ``partitions`` are read to their end: their lanes' heads may run."""
        with self.lock:
            self._loading.difference_update(partitions)
            for (partition, _), lane in self._lanes.items():
                if partition in partitions and lane.entries:
                    self._maybe_ready(lane.entries[0])

    def fence(self, partitions: Iterable[int]) -> None:
        """No copy of ``partitions`` starts until ``unfence`` (the ``Fence``'s hold, apart
        from the loads' and revokes')."""
        with self.lock:
            self._fenced.update(partitions)

    def unfence(self, partitions: Iterable[int]) -> None:
        """The ``Fence`` lets ``partitions`` go: their lanes' heads may run again."""
        parts = set(partitions)
        with self.lock:
            self._fenced -= parts
            for (partition, _), lane in self._lanes.items():
                if partition in parts and lane.entries:
                    self._maybe_ready(lane.entries[0])

    def confirm_points(
        self, read_to: Mapping[tuple[int, int], int] | None = None
    ) -> dict[tuple[int, int], tuple[int, list[int]]]:
        """Per (tier, partition) read with a copy finished: the position to confirm (its
        first unfinished copy, or past its last) and the finished copies above it. Read at
        once for every tier: a copy counted was finished after every earlier copy of its
        key, which is counted too (or below its position). ``read_to``: the tiers' reader's
        positions, everything consumed below them on the shelf: a tier partition with no
        unfinished copy is confirmed up to there, past the transaction markers that follow
        its copies (so its lag reads 0)."""
        read_to = read_to or {}
        with self.lock:
            points: dict[tuple[int, int], tuple[int, list[int]]] = {}
            for k, t in self._tracks.items():
                position = t.frontier()
                if not t.unfinished and read_to.get(k, 0) > position:
                    position = read_to[k]
                if t.done or position > t.first:
                    points[k] = (position, sorted(t.done))
            for k, position in read_to.items():
                if k not in self._tracks and k[1] in self._owned and k[1] not in self._loading:
                    points[k] = (position, [])
            return points

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
            for points in (self._confirmed, self._finished):
                for key in [k for k in points if k[1] in gone]:
                    del points[key]
            for partition in gone:
                self._parked.pop(partition, None)
            self._loading -= gone
            self._owned -= gone
            self._fenced -= gone

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

    def _is_confirmed(self, entry: Entry) -> bool:
        where = entry.where
        position, finished = self._confirmed.get((entry.tier, entry.partition), (0, frozenset()))
        return where is not None and (where < position or where in finished)

    def _let_go(self, entry: Entry) -> None:
        """The copy ``entry`` had in its tier is done with (confirmable)."""
        if entry.where is not None:
            self._finish(entry.tier, entry.partition, entry.where)
            entry.where = None

    def _finish(self, tier: int, partition: int, offset: int) -> None:
        """The copy at ``offset`` of ``tier`` is finished: a confirm counts it."""
        track = self._tracks.get((tier, partition))
        if track is not None:
            track.finish(offset)

    def _track(self, tier: int, partition: int, offset: int) -> Track:
        track = self._tracks.get((tier, partition))
        if track is None:
            track = self._tracks[(tier, partition)] = Track(partition, offset)
        return track


def _offset(record: Record) -> int:
    offset = record.offset
    assert offset is not None, "shelved records come from a stream"
    return offset
