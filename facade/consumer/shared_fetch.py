"""The shared fetch: the ungrouped subscribers of one stream in one process read one consumer.

Meteor's design on Kafka. While two or more such subscribers of a stream (with the same
cluster, isolation, consumer settings and ring size) are open, a ``SharedFetch`` runs one
consumer on every partition of the stream, in a thread of its own, and keeps what it read in a
bounded ring per partition: a record is fetched and built once, however many subscribers read
it (a lone subscriber reads alone: the hand-over between threads would only cost it). Each
subscriber keeps its own positions and reads the ring from there (``RingReader``). A
subscriber whose position is not in the ring (it started before it, fell behind what the ring
still holds, or sought elsewhere) reads with its own consumer, as it would alone, and goes
back to the ring once its position is in it again.

A ring lets its oldest records go only once every reader of the ring read past them; while one
is full of records a reader still needs, the shared consumer takes nothing (its client stops
fetching once its own queue is full, as for any consumer not polled; pausing would drop what it
prefetched). A reader that has not read for ``_STALL_S`` no longer counts: a subscriber that
stops polling does not hold the others back, and reads alone once it comes back behind the
ring.

Records read from the ring are the same objects for every subscriber of the process: they are
read-only (a serde or a durable client changes records, so those never share).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer.client import consumer_config, group_id
from bolide.facade.consumer.positions import Positions
from bolide.facade.kafka import new_client
from bolide.facade.kafka.compat import FetchGaps
from bolide.facade.record import Record, SharedRecord, record_from_message

__all__ = ["RingReader", "SharedFetch", "active", "reader"]

log = logging.getLogger("bolide.facade.subscriber")

_BATCH = 2_000  # most messages the shared consumer takes per call
_WAIT_S = 0.1  # its longest wait for one (how soon it sees that it should stop)
_OVERHEAD = 128  # bytes counted per record on top of its key and value
_MIN_RING = 64 << 10  # a partition's ring holds at least this many bytes
_STALL_S = 2.0  # a reader this long without a read no longer holds a ring's records

_shares: dict[tuple[Any, ...], _Share] = {}
_shares_lock = threading.RLock()  # a collected reader may leave from inside a locked call


class _Ring:
    """What the shared consumer read of one partition, oldest first, bounded in bytes.

    The lists only grow at the end; the oldest records are let go a whole append at a time
    (``head`` moves), and the lists are cut once half of them is let go.
    """

    __slots__ = (
        "bytes",
        "chunks",
        "dropped",
        "end",
        "failed",
        "head",
        "offsets",
        "readers",
        "records",
    )

    def __init__(self, start: int) -> None:
        self.offsets: list[int] = []
        self.records: list[Record] = []
        self.chunks: deque[tuple[int, int]] = deque()  # (index after the append, its bytes)
        self.dropped = 0  # items cut from the lists' fronts: index = absolute index - dropped
        self.head = 0  # absolute index of the oldest record kept
        self.bytes = 0
        self.end = start  # the next offset the shared consumer reads
        self.failed = False  # the shared consumer gave the partition up
        self.readers: dict[int, tuple[int, float]] = {}  # reader: (its next offset, last read)

    def covers(self, offset: int) -> bool:
        """True when a reader at ``offset`` reads on from the ring (waiting at its end)."""
        lo = self.head - self.dropped
        first = self.offsets[lo] if lo < len(self.offsets) else self.end
        return first <= offset <= self.end

    def read(self, offset: int, count: int) -> tuple[list[Record], int]:
        """Up to ``count`` records from ``offset`` on (the ring covers it), and the offset of
        the last one (read from the ring's own list: a record's fields are the reader's)."""
        at = bisect_left(self.offsets, offset, self.head - self.dropped)
        records = self.records[at : at + count]
        return records, self.offsets[at + len(records) - 1] if records else -1

    def add(self, offsets: list[int], records: list[Record], size: int) -> None:
        """Append one fetch of records (offsets above ``end``)."""
        self.offsets += offsets
        self.records += records
        self.end = offsets[-1] + 1
        self.chunks.append((self.dropped + len(self.offsets), size))
        self.bytes += size

    def trim(self, limit: int, now: float) -> bool:
        """Let the oldest appends go while the ring holds more than ``limit`` bytes and every
        reader (that read within ``_STALL_S``) is past them; True when it is still over with
        an append a reader needs (the last append alone never holds the shared consumer)."""
        if self.bytes <= limit:
            return False
        needed = self.end
        for reader, (at, seen) in list(self.readers.items()):
            if now - seen > _STALL_S:
                del self.readers[reader]  # stopped reading: it reads alone when it comes back
            elif at < needed:
                needed = at
        while self.bytes > limit and len(self.chunks) > 1:
            after, size = self.chunks[0]
            if self.offsets[after - self.dropped - 1] >= needed:
                break  # a reader still needs it
            self.chunks.popleft()
            self.head = after
            self.bytes -= size
        cut = self.head - self.dropped
        if cut > len(self.offsets) // 2:
            del self.offsets[:cut]
            del self.records[:cut]
            self.dropped = self.head
        return self.bytes > limit and len(self.chunks) > 1

    def fail(self) -> None:
        """Nothing is read here any more: readers go back to their own consumers."""
        self.failed = True
        self.offsets, self.records, self.chunks = [], [], deque()
        self.bytes = self.head = self.dropped = 0
        self.readers.clear()


class SharedFetch:
    """One consumer reading every partition of a stream into rings, for the subscribers of the
    process (``join``). ``cond`` guards the rings and is notified after each append."""

    def __init__(
        self, cluster: Cluster, config: SubscriberConfig, starts: Mapping[int, int]
    ) -> None:
        self.topic = config.single.name
        self.cond = threading.Condition()
        self.seq = 0  # appends so far: a reader waits for it to change
        self.rings = {p: _Ring(offset) for p, offset in sorted(starts.items())}
        self._limit = max(_MIN_RING, config.shared_fetch_bytes // max(1, len(starts)))
        self.full: set[int] = set()  # partitions whose rings are full: nothing is taken
        self.room = threading.Event()  # a reader read from a ring while one was full
        self._stop = threading.Event()
        # The readers' own settings (a throwaway group that never commits; a partition out of
        # range is an error, which sends it back to its readers' own consumers).
        settings = consumer_config(cluster, config, group_id(config), member={})  # no lease
        self._consumer = new_client(Consumer, settings, "consumer_config")
        self._gaps = FetchGaps(self.topic, cluster.fetch_gap_settle_ms / 1000)
        self._gaps.expected.update(starts)
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        self._thread = threading.Thread(
            target=self._run, name=f"bolide-shared-fetch-{self.topic}", daemon=True
        )
        self._thread.start()

    def wait(self, seq: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for an append after ``seq``."""
        with self.cond:
            self.cond.wait_for(lambda: self.seq != seq, timeout)

    def forget(self, reader: int) -> None:
        """``reader`` is gone: it holds no ring's records any more."""
        with self.cond:
            for ring in self.rings.values():
                ring.readers.pop(reader, None)
        self.room.set()

    def stop(self, wait: bool) -> None:
        """Stop the thread (which closes the consumer), waiting for it when ``wait``; readers
        go back to their own consumers."""
        self._stop.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(10.0)
        self._mark_failed(self.rings)

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                if self.full:
                    self.room.wait(_WAIT_S)
                    self.room.clear()
                    self._release()
                    continue
                # One message waited for, then what has arrived (a batch call waits for all).
                msgs = consumer.consume(1, _WAIT_S)
                if msgs:
                    self._add(msgs + consumer.consume(_BATCH - 1, 0))
        except Exception:
            log.exception("the shared fetch of %s stopped; its readers read alone", self.topic)
            self._fail(list(self.rings))
        finally:
            consumer.close()

    def _add(self, msgs: list[Message]) -> None:
        """Build each message's record once and append them to their partitions' rings."""
        topic, gaps = self.topic, self._gaps
        settle = gaps.settle_s > 0  # the embedded broker's fetch skips (compat.FetchGaps)
        runs: dict[int, tuple[list[int], list[Record], list[int]]] = {}
        skipped: set[int] = set()
        failed: list[int] = []
        for msg in msgs:
            partition = msg.partition()
            err = msg.error()
            if err is not None:
                eof = err.code() == KafkaError._PARTITION_EOF
                if partition is not None and partition >= 0 and not eof:
                    log.warning("shared fetch of %s[%d]: %s", topic, partition, err.str())
                    failed.append(partition)
                continue
            if partition is None or partition in skipped:
                continue
            if settle and gaps.refetch(self._consumer, msg):
                skipped.add(partition)  # read again from the expected offset
                continue
            # A SharedRecord is published as a copy (record.unshared)
            record = record_from_message(msg, topic, SharedRecord)
            run = runs.get(partition)
            if run is None:
                run = runs[partition] = ([], [], [0])
            run[0].append(record.offset)  # type: ignore[arg-type]  # consumed: set
            run[1].append(record)
            run[2][0] += len(record.data or b"") + len(record.key or b"") + _OVERHEAD
        with self.cond:
            for partition, (offsets, records, size) in runs.items():
                ring = self.rings.get(partition)
                if ring is None or ring.failed:
                    continue
                if offsets[0] < ring.end:  # never twice: keep what lies past the end
                    keep = bisect_left(offsets, ring.end)
                    offsets, records = offsets[keep:], records[keep:]
                if offsets:
                    ring.add(offsets, records, size[0])
            now = time.monotonic()
            self.full = {
                p for p in runs if p in self.rings and self.rings[p].trim(self._limit, now)
            }
            self.seq += 1
            self.cond.notify_all()
        if failed:
            self._fail(failed)

    def _release(self) -> None:
        """Take again once the readers made room in the full rings (or stopped reading)."""
        now = time.monotonic()
        with self.cond:
            self.full = {p for p in self.full if self.rings[p].trim(self._limit, now)}

    def _fail(self, partitions: Collection[int]) -> None:
        """The shared consumer gives ``partitions`` up (its thread only)."""
        self._mark_failed(partitions)
        with contextlib.suppress(KafkaException, RuntimeError):  # stopping: nothing to pause
            self._consumer.pause([TopicPartition(self.topic, p) for p in partitions])

    def _mark_failed(self, partitions: Collection[int]) -> None:
        with self.cond:
            for p in partitions:
                if p in self.rings:
                    self.rings[p].fail()
            self.seq += 1
            self.cond.notify_all()


class _Share:
    """The open subscribers of the process that may share a fetch (one key), and the fetch
    while there are two or more of them."""

    __slots__ = ("cluster", "config", "feed", "key", "readers")

    def __init__(self, key: tuple[Any, ...], cluster: Cluster, config: SubscriberConfig) -> None:
        self.key, self.cluster, self.config = key, cluster, config
        self.readers = 0
        self.feed: SharedFetch | None = None

    def start(self, starts: Mapping[int, int]) -> SharedFetch | None:
        """The running fetch, started at ``starts`` (partition: offset) if there is none and
        two readers or more; ``None`` for a lone reader."""
        if self.readers < 2:
            return None
        with _shares_lock:
            if self.feed is None and self.readers >= 2:
                self.feed = SharedFetch(self.cluster, self.config, starts)
            return self.feed

    def leave(self, reader: int, wait: bool) -> None:
        """``reader`` closed (``wait``: for the fetch to stop, if it does) or was collected;
        below two readers the fetch stops."""
        with _shares_lock:
            self.readers -= 1
            feed = self.feed
            stopping = feed is not None and self.readers < 2
            if stopping:
                self.feed = None
            if self.readers == 0 and _shares.get(self.key) is self:
                del _shares[self.key]
        if feed is not None:
            feed.forget(reader)
            if stopping:
                feed.stop(wait)


def reader(cluster: Cluster, config: SubscriberConfig, positions: Positions) -> RingReader:
    """A subscriber of ``config`` (ungrouped, plain) joins its stream's share."""
    settings = tuple(sorted((k, repr(v)) for k, v in config.consumer_config.items()))
    key = (cluster, config.single.name, config.isolation, config.shared_fetch_bytes, settings)
    with _shares_lock:
        share = _shares.get(key)
        if share is None:
            share = _shares[key] = _Share(key, cluster, config)
        share.readers += 1
    return RingReader(share, positions)


def active() -> dict[str, int]:
    """Readers per stream of the shared fetches running in the process (summed over fetches
    of one stream with different settings)."""
    out: dict[str, int] = {}
    with _shares_lock:
        for share in _shares.values():
            if share.feed is not None:
                topic = share.config.single.name
                out[topic] = out.get(topic, 0) + share.readers
    return out


class RingReader:
    """One subscriber's reads from a ``SharedFetch``; its caller holds the subscriber's lock.

    A partition is read from the ring (``ringed``: held for ``"shared"``, so the subscriber's
    own consumer does not fetch it) while the ring covers its position, and by the own
    consumer (from the delivery position) otherwise.
    """

    __slots__ = (
        "__weakref__",
        "_feed",
        "_left",
        "_positions",
        "_share",
        "_turn",
        "ringed",
    )

    def __init__(self, share: _Share, positions: Positions) -> None:
        self._share = share
        self._feed: SharedFetch | None = None  # the fetch of the last take
        # Leaves once: on close, or when a subscriber never closed is collected.
        self._left = weakref.finalize(self, share.leave, id(self), False)
        self._positions = positions
        self._turn = 0  # the partition read first rotates: none waits behind the others
        self.ringed: set[int] = set()  # never replaced: a hot loop may hold it

    def take(self, out: list[Record], read: dict[int, int], limit: int) -> tuple[bool, int, bool]:
        """Move records from the ring into ``out`` (up to ``limit`` in all), positions with
        them, and move partitions between the ring and the own consumer. Call it only with
        nothing queued: a partition's queued messages would be read twice.

        Returns:
            Whether it took any, the append count to wait on, and whether every partition
            the own consumer could fetch is read from the ring (nothing to fetch alone).
        """
        positions, ringed = self._positions, self.ringed
        state, expected = positions.state, positions.gaps.expected
        nexts = state.nexts()
        feed = self._share.feed
        if feed is None:
            if ringed:  # the fetch stopped: back to the own consumer
                self._leave(list(ringed))
            if self._share.readers < 2:
                return False, 0, False
            starts = {p: max(0, expected.get(p, at)) for p, at in nexts.items()}
            feed = self._share.start(starts)
            if feed is None:
                return False, 0, False
        self._feed = feed
        others = positions.holds.held_except("shared")
        joining: list[int] = []
        leaving: list[int] = []
        took, alone, me, now = False, True, id(self), time.monotonic()
        with feed.cond:
            seq = feed.seq
            rings = list(feed.rings.items())
            self._turn = (self._turn + 1) % len(rings)
            for partition, ring in rings[self._turn :] + rings[: self._turn]:
                if partition in others:
                    continue
                at = nexts.get(partition)
                if at is None or ring.failed or not ring.covers(at):
                    alone = False
                    ring.readers.pop(me, None)
                    if partition in ringed:
                        leaving.append(partition)
                    continue
                if partition not in ringed:
                    joining.append(partition)
                room = limit - len(out)
                records, last = ring.read(at, room) if room > 0 else ([], -1)
                if records:
                    out += records
                    read[partition] = last
                    expected[partition] = at = last + 1
                    state.delivered(partition, at)
                    took = True
                ring.readers[me] = (at, now)
        if took and feed.full:
            feed.room.set()
        if joining:
            ringed.update(joining)
            positions.holds.hold(joining, "shared")
        if leaving:
            self._leave(leaving)
        return took, seq, alone

    def wait(self, seq: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the ring to grow after ``seq``."""
        if self._feed is not None:
            self._feed.wait(seq, timeout)

    def close(self) -> None:
        """The subscriber closes: one reader fewer."""
        if self._left.detach() is not None:
            self._share.leave(id(self), True)

    def _leave(self, partitions: list[int]) -> None:
        """Hand ``partitions`` back to the own consumer, from where the subscriber stands.

        Every one is positioned, also one another reason still holds (the application's
        ``pause``): the own consumer stands where it was when the partition went to the ring,
        and a later ``resume`` would fetch on from there, delivering again what the ring
        delivered.
        """
        self.ringed.difference_update(partitions)
        self._positions.holds.release(partitions, "shared")
        self._positions.restart(partitions)
