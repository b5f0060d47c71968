"""``Tiers``: a parallel receiver's retry tiers on Kafka (``Retry(tiers=[RetryTier(...)])``).

Each tier is a stream with at least the source's partitions (created with as many); a record's
copy goes to the partition number it came from, so the member that owns a source partition owns
its tiers' too, and a key's copies stay in one partition of each tier, in their source order. That
member reads the tiers' partitions itself (a consumer of its own, assigned by hand) and
confirms their offsets through the subscriber's consumer, in the same group and generation
as the source's: a member that lost the partition cannot confirm them any more. A tier
partition's confirm is its first unfinished copy, with the finished copies above it in the
commit's metadata (the source ledger's encoding). When a member gets a partition it reads the
tiers' copies up to their end first (``load``), skipping those confirmed as finished, so the
keys parked before a restart stay parked; only then are the source's records handled.

The ``Shelf`` decides what runs; this module moves copies in and out of Kafka and calls the
handler on the tiers' records when they are due, on up to ``concurrency`` threads. Parked
records are kept in memory: a source partition with ``limit`` of them is not fetched until
half of them are done (nothing is dropped: the source's records wait in Kafka).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from bolide.facade.config import PublisherConfig, StreamConfig
from bolide.facade.consumer.ledger import decode_finished, encode_finished
from bolide.facade.deadletter import DeadLetterTarget, Reason, letter
from bolide.facade.errors import IllegalSubscriberStateError, StreamConfigMismatchError
from bolide.facade.kafka import CONSUMER_DEFAULTS, admin_client, partition_count, replica_count
from bolide.facade.publisher import Publisher
from bolide.facade.receiver import (
    AsyncRecordHandler,
    ReceiverHost,
    RecordHandler,
    is_async_handler,
)
from bolide.facade.receiving.lanes import NO_LANE, LaneOf
from bolide.facade.receiving.shelf import Entry, Shelf
from bolide.facade.record import Record, RecordBatch, record_from_message
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER, WRITER_HEADER, Retry

__all__ = ["Tiers", "to_confirm"]

log = logging.getLogger("bolide.facade.parallel")

_READ_S = 0.05  # longest wait of one read of the tiers (a stop is seen within it)
_AGAIN_S = 1.0  # a copy that could not be written is tried again after this
_LOAD_BACKOFF_MAX_S = 1.0  # longest wait before loading again after a failed load
_OURS = frozenset((ORIGIN_HEADER, ATTEMPTS_HEADER, WRITER_HEADER))

#: ``done(error)``: the copy of a source record is in its tier (``None``) or failed.
Done = Callable[[BaseException | None], None]

Point = tuple[int, int]  # (tier, source partition): one tier partition


class Tiers:
    """The retry tiers of one parallel receiver (built by it when ``retry.tiers`` is set).

    Attributes:
        overflows: Confirms of a source partition's tiers left out because a finished set
            did not fit the commit's metadata (they go out once it fits again).
    """

    def __init__(
        self,
        host: ReceiverHost,
        retry: Retry,
        lane_of: LaneOf,
        handler: RecordHandler,
        dead_letter: DeadLetterTarget | None,
        concurrency: int,
        limit: int,
    ) -> None:
        self._host = host
        # ``"unordered"``: a record is its own lane, so a failure parks nothing behind it.
        self._lane_of: LaneOf = lambda r: (r.offset,) if lane_of(r) is NO_LANE else lane_of(r)
        self._handler = handler
        self._dead_letter = dead_letter
        self._delays = [t.delay_s for t in retry.tiers]
        self.topics = [t.stream_for(host.topic) for t in retry.tiers]
        self._tier_of = {name: i for i, name in enumerate(self.topics)}
        self.shelf = Shelf(len(self.topics))
        self.moved = 0  # copies written to a tier
        self._limit = limit  # parked records per source partition, at most (about)
        self._full: set[int] = set()  # source partitions held for their parked records
        self._publishers = [
            Publisher(host.cluster, PublisherConfig(stream=_tier_stream(host, t)))
            for t in self.topics
        ]
        # A confirmed offset out of range (the copies past it deleted) reads from the first
        # copy left: the default (latest) would skip those.
        settings = {
            "group.id": f"{host.group_id}.tiers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        self._reader = Consumer(host.cluster.client_config(CONSUMER_DEFAULTS, settings))
        self._reader_lock = threading.Lock()
        self._loaded: set[int] = set()
        self._revokes = 0  # revokes so far: a load that saw one meanwhile starts again
        lease_s = host.config.lease_timeout_ms / 1000
        self._lookup_s = max(1.0, min(10.0, lease_s / 4))  # one lookup of a load, at most
        self._load_failures = 0  # failed loads in a row
        self._load_at = 0.0  # monotonic time of the next load, after a failed one
        self._ends: dict[tuple[str, int], int] = {}  # tier partition: its end when loaded
        self._fenced: set[int] = set()  # source partitions a newer owner writes copies of
        self._member = ""  # the member id when partitions last came: on every copy written
        self._admin: AdminClient | None = None  # asks the group who owns a partition
        # (tier, partition): the position and finished set last committed
        self._confirmed: dict[Point, tuple[int, str]] = {}
        self._confirm_lock = threading.Lock()
        self.overflows = 0
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="bolide-retry")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bolide-tiers", daemon=True)

    @classmethod
    def of(
        cls,
        host: ReceiverHost,
        retry: Retry | None,
        lane_of: LaneOf,
        handlers: tuple[RecordHandler | AsyncRecordHandler, RecordHandler],
        dead_letter: DeadLetterTarget | None,
        concurrency: int,
        limit: int,
    ) -> Tiers | None:
        """The tiers of ``retry``, or ``None`` without any. ``handlers``: the handler as
        given and as the receiver runs it (within its telemetry span); ``limit``: parked
        records per source partition at which its fetching pauses.

        Raises:
            TypeError: An ``async def`` handler (tiers call handlers on threads).
            IllegalSubscriberStateError: An ungrouped subscriber (tiers' offsets are the
                group's).
            StreamConfigMismatchError: A tier on the source stream itself (its copies would
                come back as new records, for ever), or a tier stream with fewer partitions
                than the source.
        """
        if retry is None or not retry.tiers:
            return None
        for tier in retry.tiers:
            if tier.stream_for(host.topic) == host.topic:
                raise StreamConfigMismatchError(
                    f"retry tier stream {host.topic!r} is the receiver's own stream: each copy "
                    "would be read again as a new record; give the tier a stream of its own",
                    stream=host.topic,
                )
        if is_async_handler(handlers[0]):
            raise TypeError("retry tiers take a plain handler, not an async def one")
        if not host.grouped:
            raise IllegalSubscriberStateError(
                "retry tiers need a grouped subscriber: their offsets are the group's",
                stream=host.topic,
            )
        return cls(host, retry, lane_of, handlers[1], dead_letter, concurrency, limit)

    def start(self) -> None:
        self._thread.start()

    # -- the source side (the receiver's workers) -------------------------------------------

    def divert(self, record: Record, done: Done) -> bool:
        """Shelve ``record`` behind its parked key (``done`` once its copy is written), or
        ``False``: its key is not parked, the handler runs."""
        entry = self.shelf.divert(record, self._lane_of(record))
        if entry is None:
            return False
        if entry.written or entry.where is not None:
            done(None)  # read again after a restart: its copy is in a tier already
            return True

        def written(error: BaseException | None) -> None:
            entry.written = error is None
            done(error)

        self._write(entry, entry.tier, written)
        return True

    def shelve(self, record: Record, attempts: int, done: Done) -> None:
        """``record`` failed its last call in the worker: copy it to the first tier."""
        entry = self.shelf.shelve(record, self._lane_of(record), attempts)
        if entry is None:  # its partition was revoked: the next owner reads it again
            done(None)
            return

        def written(error: BaseException | None) -> None:
            entry.written = error is None
            done(error)

        self._write(entry, 0, written)

    def _write(self, entry: Entry, tier: int, done: Done) -> None:
        record = entry.record
        headers = [h for h in record.headers if h[0] not in _OURS]
        headers += [
            (ORIGIN_HEADER, f"{self._host.topic}/{entry.partition}/{entry.origin}".encode()),
            (ATTEMPTS_HEADER, str(entry.attempts).encode()),
        ]
        if self._member:
            headers.append((WRITER_HEADER, self._member.encode()))
        copy = Record(record.data, key=record.key, headers=headers, partition=entry.partition)

        def written(_: int | None, error: BaseException | None) -> None:
            if error is None:
                self.moved += 1
            done(error)

        try:
            self._publishers[tier].publish_async(copy, callback=written)
        except Exception as exc:
            done(exc)

    # -- partitions (the receiver's fetch thread) ------------------------------------------

    def load(self, batch: RecordBatch, serve: Callable[[], None]) -> RecordBatch:
        """Read the tiers' copies of newly assigned partitions up to their end, so that their
        parked keys are known before any of the source's records is handled; return the
        records of ``batch`` that may be handled now. Those of a partition held but not loaded
        (the load failed, or it was revoked and assigned again meanwhile) are read again."""
        if time.monotonic() >= self._load_at:
            try:
                self._load(serve)
                self._load_failures = 0
            except Exception as exc:  # tried again after a backoff
                self._load_failed(exc)
        self._throttle()
        held, loaded = self._host.assigned(), self._loaded
        keep: list[Record] = []
        again: dict[int, int] = {}
        for record in batch:
            partition = record.partition or 0
            if partition in loaded and partition in held:
                keep.append(record)
            elif partition in held:
                again.setdefault(partition, record.offset or 0)
        if again:
            self._host.rewind(again)
        return batch if len(keep) == len(batch) else RecordBatch(keep)

    def _load(self, serve: Callable[[], None]) -> None:
        """Read the tiers of the partitions held but not loaded up to their ends. Each
        lookup waits a quarter of the lease at most and the consumer is served after it, so
        a slow broker costs a retry on the next poll, not the lease; a rebalance meanwhile
        leaves the load to the next poll."""
        new = sorted(set(self._host.assigned()) - self._loaded)
        if not new:
            return
        tps = [TopicPartition(t, p) for t in self.topics for p in new]
        looked_up = self._look_up(tps, serve)
        if looked_up is None:
            return  # the lookups may predate the new owner's commits
        found, ranges = looked_up
        self._member = self._host.member_id()
        committed: dict[tuple[str, int], int] = {}
        finished: dict[tuple[int, int], set[int]] = {}
        for tp in found:
            committed[(tp.topic, tp.partition)] = tp.offset
            if tp.offset >= 0 and tp.metadata:
                where = f"{tp.topic} committed offsets"
                finished[(self._tier_of[tp.topic], tp.partition)] = decode_finished(
                    tp.offset, tp.metadata, where=where
                )
        self.shelf.hold(new, finished)
        ends: dict[tuple[str, int], int] = {}
        with self._reader_lock:
            for tp in tps:
                key = (tp.topic, tp.partition)
                low, high = ranges[key]
                self._ends[key] = high
                start = committed.get(key, -1)
                tp.offset = start if start >= low else low
                if high > tp.offset:
                    ends[key] = high
            self._reader.incremental_assign(tps)
        self._loaded.update(new)
        while ends and not self._stop.is_set():
            if not self._read():
                self._stop.wait(_READ_S)
            with self._reader_lock:  # what was consumed is on the shelf: ``_read`` holds it
                at = self._reader.position([TopicPartition(t, p) for t, p in ends])
            for tp in at:
                key = (tp.topic, tp.partition)
                if (
                    tp.offset >= ends[key]
                    or tp.partition not in self._loaded
                    or tp.partition in self._fenced
                ):
                    del ends[key]  # read to the end, revoked or lost meanwhile
            serve()
        self.shelf.release([p for p in new if p not in self._fenced])

    def _look_up(
        self, tps: list[TopicPartition], serve: Callable[[], None]
    ) -> tuple[list[TopicPartition], dict[tuple[str, int], tuple[int, int]]] | None:
        """The committed offsets and the log range of tier partitions ``tps``, the consumer
        served after each lookup; ``None`` when a revoke came meanwhile."""
        revokes, wait_s = self._revokes, self._lookup_s
        found = self._host.committed_to(tps, timeout_s=wait_s)
        serve()
        # The reader's metadata first: one answered by a node that had restarted and not
        # caught up can lack a tier partition, and the reader asks again only every few
        # minutes, while every lookup of it fails with "Unknown partition".
        for topic in self.topics:
            with self._reader_lock:
                self._reader.list_topics(topic, timeout=wait_s)
        serve()
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in tps:
            with self._reader_lock:
                ranges[(tp.topic, tp.partition)] = self._reader.get_watermark_offsets(
                    tp, timeout=wait_s
                )
            serve()
        return None if self._revokes != revokes else (found, ranges)

    def _load_failed(self, error: BaseException) -> None:
        """Wait before the next load (Kafka's ``retry.backoff.ms`` and its maximum: 100 ms
        doubling to 1 s) and report the failures that bring their run to a power of two, so
        that a load failing for minutes does not flood the error handler."""
        self._load_failures += 1
        n = self._load_failures
        self._load_at = time.monotonic() + min(_LOAD_BACKOFF_MAX_S, 0.1 * 2.0 ** min(n - 1, 16))
        if n & (n - 1) == 0:
            times = "" if n == 1 else f" ({n} times in a row)"
            self._host.report(
                f"retry tiers: reading the tiers of new partitions failed{times}", error
            )

    def _throttle(self) -> None:
        """Hold the source partitions with ``limit`` parked records (their records stay in
        Kafka, the fetch of other partitions goes on); let go once half of them are done."""
        parked, full = self.shelf.parked(), self._full
        over = {p for p, n in parked.items() if n >= self._limit} - full
        under = {p for p in full if parked.get(p, 0) <= self._limit // 2}
        if over:
            log.info("retry tiers: partitions %s not fetched: parked records", sorted(over))
            self._host.hold_parked(over)
        if under:
            self._host.release_parked(under)
        self._full = (full | over) - under

    def revoke(self, partitions: list[int], lost: bool) -> None:
        """Give up the tiers of revoked source partitions (confirming them unless lost).

        The reader lets go of their tier partitions and the shelf drops them under the
        reader's lock, which the tiers' thread holds from a read to its copies being on the
        shelf: no copy read before the revoke lands on the shelf after it, to run on a member
        that no longer owns its partition while the new owner runs the key's earlier records.
        A partition whose load failed midway is on the shelf too, so every revoked one goes."""
        self._revokes += 1
        gone = set(partitions) & self._loaded
        if gone and not lost:
            self.confirm(only=gone)
        self._loaded -= gone
        self._full -= gone  # a partition given up is not paused any more
        with self._reader_lock:  # the tiers' thread fences and reads while it holds it
            if gone:
                fenced, self._fenced = self._fenced & gone, self._fenced - gone
                if fenced:
                    self._reader.resume([TopicPartition(t, p) for t in self.topics for p in fenced])
                self._reader.incremental_unassign(
                    [TopicPartition(t, p) for t in self.topics for p in gone]
                )
            self.shelf.drop(sorted(partitions))
            for end in [k for k in self._ends if k[1] in gone]:
                del self._ends[end]
        with self._confirm_lock:
            for key in [k for k in self._confirmed if k[1] in gone]:
                del self._confirmed[key]

    # -- the tiers' thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._read():
                    self._stop.wait(_AGAIN_S)
                entry = self.shelf.take(_READ_S)
                while entry is not None:
                    self._pool.submit(self._call, entry)
                    entry = self.shelf.take(0)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._host.report("retry tiers failed; trying again", exc)
                self._stop.wait(_AGAIN_S)

    def _read(self) -> bool:
        """One read of the tiers: each copy read goes on the shelf before the lock is let go
        (so ``load`` knows that what its reader consumed is on the shelf). ``False`` when a
        copy could not be taken (reported; read again from it later)."""
        if not self._loaded:
            self._stop.wait(_READ_S)
            return True
        with self._reader_lock:
            for msg in self._reader.consume(500, timeout=_READ_S):
                if msg.error() is not None:
                    continue
                try:
                    self._arrived(msg)
                except Exception as exc:
                    where = TopicPartition(
                        msg.topic() or "", msg.partition() or 0, msg.offset() or 0
                    )
                    self._reader.seek(where)  # this copy and the rest of the batch come again
                    self._host.report(f"retry tiers: could not take the copy at {where}", exc)
                    return False
        return True

    def _arrived(self, msg: Message) -> None:
        tier = self._tier_of.get(msg.topic() or "")
        copy = record_from_message(msg)
        origin = (copy.header(ORIGIN_HEADER) or b"").decode(errors="replace").rsplit("/", 2)
        if tier is None or len(origin) != 3 or origin[0] != self._host.topic:
            return
        try:
            partition, offset = int(origin[1]), int(origin[2])
            attempts = int(copy.header(ATTEMPTS_HEADER) or b"0")
        except ValueError:
            return
        if partition in self._fenced or self._newer_owner(msg, copy, partition):
            return  # another member's to handle: it reads it from the confirmed offsets
        record = Record(copy.data, key=copy.key, headers=_theirs(copy.headers))
        record.stream, record.partition, record.offset = self._host.topic, partition, offset
        record.timestamp_ms = copy.timestamp_ms
        serde = self._host.config.serde
        if serde is not None and record.data is not None:
            record.value = serde.decode(
                record.data, stream=self._host.topic, partition=partition, offset=offset
            )
        due = (copy.timestamp_ms or 0) / 1000 + self._delays[tier]
        lane: Hashable = self._lane_of(record)
        self.shelf.arrived(tier, copy.offset or 0, record, attempts, due, lane)

    def _newer_owner(self, msg: Message, copy: Record, partition: int) -> bool:
        """Whether ``copy`` shows that another member owns ``partition`` now: this member
        lost it and has not heard yet (it was paused, or its application stopped polling,
        past its lease). A copy that another member wrote after this one loaded the tiers
        makes it ask the group (once stable) who owns the partition: when another member
        does, the partition's copies are not handled here any more (what ran or is on the
        shelf stays as it is; nothing is confirmed or counted finished) until the rebalance
        gives it up. The copies of a member that lost the partition before this one got it
        are handled as ever, as are all when the group cannot tell."""
        if (msg.offset() or 0) < self._ends.get((msg.topic() or "", msg.partition() or 0), 0):
            return False
        writer = (copy.header(WRITER_HEADER) or b"").decode(errors="replace")
        if not writer or writer == self._member:
            return False
        owner = self._owner_of(partition)
        if owner is None or owner == self._member:
            return False
        self._fenced.add(partition)
        self.shelf.hold([partition])
        self._reader.pause([TopicPartition(t, partition) for t in self.topics])
        log.warning(
            "retry tiers: member %s owns partition %d of %s now, this member (%s) not: "
            "the copies in its tiers are left to that member",
            owner, partition, self._host.topic, self._member,
        )  # fmt: skip
        return True

    def _owner_of(self, partition: int) -> str | None:
        """The member the group gives source ``partition`` to, once it is stable (``None``
        while it is not, or when it cannot be asked: the copy is handled as before, and the
        next copy of another member asks again, through a new admin client)."""
        if self._admin is None:
            self._admin = admin_client(self._host.cluster)
        group = self._host.group_id
        try:
            described = self._admin.describe_consumer_groups([group], request_timeout=10)
            found = described[group].result(15)
        except Exception as exc:  # NOT_COORDINATOR for good was seen from one client
            self._admin = None
            self._host.report("retry tiers: could not ask the group who owns a partition", exc)
            return None
        if found.state != ConsumerGroupState.STABLE:
            return None
        for member in found.members:
            held = member.assignment.topic_partitions if member.assignment else []
            if any(tp.topic == self._host.topic and tp.partition == partition for tp in held):
                return str(member.member_id)
        return None

    def _call(self, entry: Entry) -> None:
        """Run the handler on a tier's record that is due; move it on if it fails."""
        try:
            self._handler(entry.record)
        except BaseException as exc:  # any raise fails the record only
            self._failed(entry, exc)
        else:
            self.shelf.done(entry)

    def _failed(self, entry: Entry, error: BaseException) -> None:
        if entry.dropped:
            return  # its partition was revoked: the next owner calls it again
        ran_before = entry.attempts > 0
        entry.attempts += 1
        tier = entry.tier + 1 if ran_before else 0  # a parked record starts at the first tier
        log.info("retry of %r failed (attempt %d): %r", entry.record, entry.attempts, error)
        if tier < len(self.topics):
            self._move(entry, tier)
        else:
            self._give_up(entry, error)

    def _move(self, entry: Entry, tier: int) -> None:
        """Copy ``entry`` to ``tier``; a failed write is tried again (the call is not)."""
        self.shelf.moving(entry, tier)

        def moved(exc: BaseException | None) -> None:
            if exc is None:
                self.shelf.moved(entry)
            else:
                self._host.report(f"could not move {entry.record!r} to a retry tier", exc)
                self._later(self._move, entry, tier)

        self._write(entry, tier, moved)

    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` after a pause, unless closing or the entry's partition went."""

        def again() -> None:
            if not self._stop.is_set() and not args[0].dropped:
                fn(*args)

        timer = threading.Timer(_AGAIN_S, again)
        timer.daemon = True
        timer.start()

    def _give_up(self, entry: Entry, error: BaseException) -> None:
        record, target = entry.record, self._dead_letter
        detail = f"{type(error).__name__}: {error} (after {entry.attempts} attempts)"
        if target is None:
            self._host.report(f"receiver handler failed on {record!r}: {detail}", error)
            self.shelf.done(entry)
            return

        def sent(_: Any, exc: BaseException | None) -> None:
            if exc is None:
                self.shelf.done(entry)
            else:
                self._host.report(f"dead letter for {record!r} failed; trying again", exc)
                self._later(self._give_up, entry, error)

        if isinstance(target, Publisher):
            source = f"{self._host.topic}/{entry.partition}/{entry.origin}"
            try:
                target.publish_async(letter(record, Reason.FAILED, detail, source), callback=sent)
            except Exception as exc:
                sent(None, exc)
            return
        try:
            target(record, error)
        except Exception as exc:
            sent(None, exc)
        else:
            sent(None, None)

    def confirm(self, only: set[int] | None = None) -> None:
        """Confirm each tier partition up to its first unfinished copy, with the finished
        copies above it in the commit's metadata, if that changed. A source partition's
        tiers are confirmed together, from one reading of the shelf, or not at all while the
        finished set of one does not fit (``overflows``): a key's finished copy is never
        confirmed without its earlier ones in other tiers. The commit takes the subscriber's
        lock, so no lock of these tiers is held meanwhile."""
        with self._confirm_lock:
            held = self._host.assigned()
            points = {
                k: point
                for k, point in self.shelf.confirm_points().items()
                if (only is None or k[1] in only) and k[1] in held and k[1] not in self._fenced
            }
            moved, unfit = to_confirm(points, self._confirmed)
            self.overflows += len(unfit)
        if not moved:
            return
        tps = [
            TopicPartition(self.topics[t], p, o, metadata=text)
            for (t, p), (o, text) in moved.items()
        ]
        try:
            self._host.commit_to(tps)
        except Exception as exc:  # the next round tries again
            self._host.report("retry tiers: confirm failed", exc)
            return
        with self._confirm_lock:
            self._confirmed.update(moved)
        # keys whose finished copies are all confirmed go on
        self.shelf.confirmed({k: points[k] for k in moved})

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop reading and calling, confirm what is done, close the tiers' clients."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(5.0)
        # A running call is not waited for: its record is not confirmed, read again later.
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._full:  # fetched again by the subscriber (another receiver may follow)
            try:
                self._host.release_parked(self._full)
            except Exception as exc:
                self._host.report("retry tiers: resuming paused partitions failed", exc)
        try:
            self.confirm()
        finally:
            with self._reader_lock:
                self._reader.close()
            for publisher in self._publishers:
                publisher.close()


def to_confirm(
    points: Mapping[Point, tuple[int, list[int]]], sent: Mapping[Point, tuple[int, str]]
) -> tuple[dict[Point, tuple[int, str]], set[int]]:
    """Of ``points`` (``Shelf.confirm_points``), the confirms to commit, each a position and
    its finished set encoded: those not ``sent`` already, of the source partitions whose
    tiers' finished sets all fit; and the source partitions left out because one did not (a
    key's copy is never confirmed without its earlier ones)."""
    texts: dict[Point, tuple[int, str]] = {}
    unfit: set[int] = set()
    for key, (position, finished) in points.items():
        text = encode_finished(position, finished)
        if text is None:
            unfit.add(key[1])
        else:
            texts[key] = (position, text)
    moved = {k: text for k, text in texts.items() if k[1] not in unfit and text != sent.get(k)}
    return moved, unfit


def _tier_stream(host: ReceiverHost, name: str) -> StreamConfig:
    """Tier stream ``name``: created when missing with the source's partition count and as
    many replicas as the source has (and its ``min_insync_replicas``): once the source is
    confirmed past a record, its copy is all there is of it, and a tier partition that dies
    with its only broker would stop every copy bound to it; an existing one needs at least as
    many partitions (a copy goes to the partition number of its source record; partitions
    past the source's stay unused)."""
    wanted = host.partitions
    admin = admin_client(host.cluster)
    count = partition_count(admin, name)
    if count is None:
        source = replica_count(admin, host.topic)
        return StreamConfig(
            name=name,
            partitions=wanted,
            global_order=wanted == 1,
            replication_factor=max(source or 1, host.stream.replication_factor),
            min_insync_replicas=host.stream.min_insync_replicas,
        )
    if count < wanted:
        raise StreamConfigMismatchError(
            f"retry tier stream {name!r} has {count} partitions, fewer than the {wanted} of "
            f"{host.topic!r}: each copy goes to the partition number its record came from",
            stream=name,
        )
    return StreamConfig(name=name)


def _theirs(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in headers if k not in _OURS]
