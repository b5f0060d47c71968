"""``RetryTiers``: a parallel receiver's retry tiers on Kafka (``Retry(tiers=[RetryTier(...)])``).

Each tier is a stream with at least the source's partitions (created with as many); a record's
copy goes to the partition number it came from, so the member that owns a source partition owns
its tiers' too, and a key's copies stay in one partition of each tier, in their source order.
The work is split by job, each part with one owner:

- ``Shelf`` (``shelf.py``): the parked records per key, and which copy may run when;
- ``TierReader`` (``tier_reader.py``): the tiers' ``read_committed`` consumer, which loads a
  new partition's copies before its source records are handled, and reads on;
- ``TierWriter`` (``tier_writer.py``): every copy, move and dead letter, in Kafka
  transactions that carry the tiers' positions with the group's metadata, so Kafka fences a
  member that lost its partitions;
- ``Fence`` (``fence.py``): the partitions whose copies wait for proof that this member still
  owns them.

This module wires them and calls the handler on the copies that are due, on up to
``concurrency`` threads. A tier partition's confirm is its first unfinished copy, with the
finished copies above it in the commit's metadata (the source ledger's encoding). Parked
records are kept in memory: a source partition with ``limit`` of them is not fetched until
half of them are done (nothing is dropped: the source's records wait in Kafka).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import TopicPartition

from bolide.facade.config import StreamConfig
from bolide.facade.consumer.ledger import encode_finished
from bolide.facade.deadletter import DeadLetterSink, DeadLetterTarget, Reason, letter
from bolide.facade.errors import IllegalSubscriberStateError, StreamConfigMismatchError
from bolide.facade.kafka import admin_client, ensure_topic, partition_count, replica_count
from bolide.facade.receiver import (
    AsyncRecordHandler,
    ReceiverHost,
    RecordHandler,
    is_async_handler,
)
from bolide.facade.receiving.fence import Fence
from bolide.facade.receiving.lanes import NO_LANE, LaneOf
from bolide.facade.receiving.shelf import Entry, Shelf
from bolide.facade.receiving.tier_reader import OURS, Point, TierReader
from bolide.facade.receiving.tier_writer import Done, TierWriter, Write
from bolide.facade.record import Record, RecordBatch
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER, WRITER_HEADER, Retry

__all__ = ["RetryTiers", "to_confirm"]

log = logging.getLogger("bolide.facade.parallel")

_AGAIN_S = 1.0  # the tiers' thread waits this long after a failed read
_LOAD_BACKOFF_MAX_S = 1.0  # longest wait before loading again after a failed load
_TAKE_S = 0.05  # longest wait for a due copy (a stop is seen within it)
_IN_USE: set[str] = set()  # transactional ids of the tiers running in this process
_IN_USE_LOCK = threading.Lock()

_METADATA_S = 0.02  # the group's metadata is read again after this, on the next poll
_DELETE = {"cleanup.policy": "delete"}  # a tier never compacts: every copy counts

#: ``halt(summary, error)``: a refusal for good, reported once; the receiver stops.
Halt = Callable[[str, BaseException], None]


class RetryTiers:
    """The retry tiers of one parallel receiver (built by it when ``retry.tiers`` is set).

    Attributes:
        shelf: The parked records.
        moved: Copies written to a tier.
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
        halt: Halt,
    ) -> None:
        self._host = host
        # ``"unordered"``: a record is its own lane, so a failure parks nothing behind it.
        self._lane_of: Callable[[Record], Hashable] = lambda r: (
            (r.offset,) if lane_of(r) is NO_LANE else lane_of(r)
        )
        self._handler = handler
        self._sink = None if dead_letter is None else DeadLetterSink(dead_letter)
        self.topics = _tier_streams(host, retry)
        self.shelf = Shelf(len(self.topics))
        self.moved = 0
        self.overflows = 0
        self._limit = limit  # parked records per source partition, at most (about)
        self._full: set[int] = set()  # source partitions held for their parked records
        self._held: set[int] = set()  # those and the partitions whose tiers are loading
        # Source records fetched while their partition's tiers load: handed on with the
        # batch that follows the load, as the first records of their partition.
        self._waiting: dict[int, list[Record]] = {}
        self._waiting_lock = threading.Lock()
        self._id = _claim(retry.transactional_id or _transactional_id(host))
        try:
            self.fence, self.reader, self.writer = self._parts(retry, halt)
        except BaseException:
            _release(self._id)
            raise
        # The group's metadata (member, generation) the writer sends: read on the fetch
        # thread only, after its polls (librdkafka answers another thread only between them).
        self._metadata = host.group_metadata()
        self._metadata_at = time.monotonic()
        self._load_failures = 0  # failed loads in a row
        self._load_at = 0.0  # monotonic time of the next load, after a failed one
        # (tier, partition): the position and finished set last committed
        self._confirmed: dict[Point, tuple[int, str]] = {}
        self._confirm_lock = threading.Lock()
        self._calls = threading.Condition()  # tier calls running, per source partition
        self._running: Counter[int] = Counter()
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="bolide-retry")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bolide-tiers", daemon=True)
        self._reading_thread = threading.Thread(
            target=self._read, name="bolide-tiers-reader", daemon=True
        )

    def _parts(self, retry: Retry, halt: Halt) -> tuple[Fence, TierReader, TierWriter]:
        """The fence, the reader and the writer, each owning its part."""
        host = self._host
        lease_s = host.config.lease_timeout_ms / 1000
        fence = Fence(self.shelf.fence, self.shelf.unfence, self._prove)
        reader = TierReader(
            host,
            self.topics,
            [t.delay_s for t in retry.tiers],
            self.shelf,
            fence,
            self._lane_of,
            self._id,
            lookup_s=max(1.0, min(10.0, lease_s / 4)),
        )
        sink = [self._sink.stream] if self._sink is not None and self._sink.stream else []
        try:
            writer = self._writer(reader, fence, halt, lease_s, ", ".join([*self.topics, *sink]))
        except BaseException:
            reader.close()  # the transactional id refused, say: nothing is left open
            raise
        return fence, reader, writer

    def _writer(
        self, reader: TierReader, fence: Fence, halt: Halt, lease_s: float, streams: str
    ) -> TierWriter:
        host = self._host
        return TierWriter(
            host.cluster,
            self._id,
            group_metadata=lambda: self._metadata,
            offsets=self._offsets,
            fence=fence,
            held=self._reading,
            alive=lambda p: p in reader.loaded and p in host.assigned(),
            report=host.report,
            halt=halt,
            timeout_s=max(5.0, min(30.0, lease_s)),
            streams=streams,
        )

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
        halt: Halt,
    ) -> RetryTiers | None:
        """The tiers of ``retry``, or ``None`` without any. ``handlers``: the handler as
        given and as the receiver runs it (within its telemetry span); ``limit``: parked
        records per source partition at which its fetching pauses.

        Raises:
            TypeError: An ``async def`` handler (tiers call handlers on threads).
            IllegalSubscriberStateError: An ungrouped subscriber (tiers' offsets are the
                group's), or a transactional id another receiver of this process uses.
            StreamConfigMismatchError: A tier on the source stream itself (its copies would
                come back as new records, for ever), a tier stream with fewer partitions
                than the source, or one that compacts (a key's later copy would delete an
                earlier one).
            AuthorizationError: The user may not create or describe a tier stream, or use
                the transactional id.
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
        host.membership.needs_group(
            "retry tiers need a grouped subscriber: their offsets are the group's",
            stream=host.topic,
        )
        return cls(host, retry, lane_of, handlers[1], dead_letter, concurrency, limit, halt)

    def start(self) -> None:
        self.writer.start()
        self._reading_thread.start()
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
        headers = [h for h in record.headers if h[0] not in OURS]
        headers += [
            (ORIGIN_HEADER, f"{self._host.topic}/{entry.partition}/{entry.origin}".encode()),
            (ATTEMPTS_HEADER, str(entry.attempts).encode()),
            (WRITER_HEADER, self._id.encode()),
        ]
        copy = Record(record.data, key=record.key, headers=headers, partition=entry.partition)

        def written(error: BaseException | None) -> None:
            if error is None:
                self.moved += 1
            done(error)

        self.writer.write(Write(entry.partition, self.topics[tier], copy, written))

    # -- partitions (the receiver's fetch thread) ------------------------------------------

    def load(self, batch: RecordBatch, serve: Callable[[], None]) -> RecordBatch:
        """Read the tiers' copies of newly assigned partitions up to their end, so that their
        parked keys are known before any of the source's records is handled; return the
        records of ``batch`` that may be handled now. Those of a partition held but not loaded
        (the load failed, or it was revoked and assigned again meanwhile) are read again.
        A partition still loading is not fetched until its tiers are read (the other
        partitions go on meanwhile), and the records of it fetched already wait here: they
        are handed on, first, with the batch of the poll that finds the load done, as the
        records of the poll that started it were once the load returned. Called on the
        fetch thread after each poll."""
        self.refresh()
        if time.monotonic() >= self._load_at:
            try:
                points = self.reader.load(serve)
                self._load_failures = 0
                if points:  # a partition revoked during the load is not the tiers' any more
                    loaded = self.reader.loaded
                    with self._confirm_lock:
                        self._confirmed.update((k, v) for k, v in points.items() if k[1] in loaded)
            except Exception as exc:  # tried again after a backoff
                self._load_failed(exc)
        loading = self.reader.settle()  # the tiers read to their ends: their copies may run
        self._throttle(loading)
        held, loaded = self._host.assigned(), self.reader.loaded
        keep: list[Record] = []
        again: dict[int, int] = {}
        with self._waiting_lock:
            for partition in [p for p in self._waiting if p not in loading]:
                waited = self._waiting.pop(partition)
                if partition in loaded and partition in held:
                    keep.extend(waited)
                elif partition in held and waited:  # its load failed: read them again
                    again[partition] = waited[0].offset or 0
            kept_before = len(keep)
            for record in batch:
                partition = record.partition or 0
                if partition in loaded and partition in held:
                    if partition in loading:
                        self._waiting.setdefault(partition, []).append(record)
                    else:
                        keep.append(record)
                elif partition in held:
                    again.setdefault(partition, record.offset or 0)
        if again:
            self._host.rewind(again)
        unchanged = kept_before == 0 and len(keep) == len(batch)
        return batch if unchanged else RecordBatch(keep)

    def refresh(self) -> None:
        """Read the group's metadata again (on the fetch thread: a poll or a rebalance
        callback may have moved the generation), at most every ``_METADATA_S``."""
        now = time.monotonic()
        if now - self._metadata_at >= _METADATA_S:
            self._metadata, self._metadata_at = self._host.group_metadata(), now

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

    def _throttle(self, loading: set[int]) -> None:
        """Hold the source partitions with ``limit`` parked records, and those whose tiers
        are ``loading`` (their records stay in Kafka, the fetch of other partitions goes on);
        let go once half of the parked records are done, and once the load is."""
        parked, full = self.shelf.parked(), self._full
        over = {p for p, n in parked.items() if n >= self._limit} - full
        under = {p for p in full if parked.get(p, 0) <= self._limit // 2}
        if over:
            log.info("retry tiers: partitions %s not fetched: parked records", sorted(over))
        self._full = (full | over) - under
        held = self._full | loading
        if held - self._held:
            self._host.hold_parked(held - self._held)
        if self._held - held:
            self._host.release_parked(self._held - held)
        self._held = held

    def revoke(
        self, partitions: list[int], lost: bool, deadline: float, *, on_fetch_thread: bool
    ) -> None:
        """Give up the tiers of revoked source partitions.

        A graceful revoke waits, until the monotonic ``deadline`` (half the lease), for the
        tier calls of ``partitions`` that run and for the writes they made, and confirms
        what finished while the partitions are still owned, as for the source's records;
        what is still running then is left to the next owner, which calls it again. Then
        the reader lets go of their tier partitions and the shelf drops them under the
        reader's lock, which the tiers' thread holds from a read to its copies being on the
        shelf: no copy read before the revoke lands on the shelf after it."""
        gone = set(partitions) & self.reader.loaded
        if on_fetch_thread:  # a rebalance: the generation may have moved
            self._metadata_at = 0.0
            self.refresh()
        if gone and not lost:
            with self.shelf.lock:  # none of their copies starts from now on
                self.shelf.hold(sorted(gone))
            with self._calls:
                self._calls.wait_for(
                    lambda: not any(self._running[p] for p in gone),
                    max(0.0, deadline - time.monotonic()),
                )
            # The second round confirms what the first one's commits finished (a copy moved on,
            # a dead letter sent): the next owner starts after them.
            if self.writer.flush(gone, deadline):
                self.writer.flush(gone, deadline)
        self.writer.drop(partitions)
        with self.reader.lock:  # the tiers' thread reads while it holds it
            self.reader.revoke(set(partitions))
            self.shelf.drop(sorted(partitions))
        self.fence.forget(partitions)
        self._full -= set(partitions)  # a partition given up is not paused any more
        self._held -= set(partitions)
        with self._waiting_lock:  # never handled here: the next owner reads them
            for p in partitions:
                self._waiting.pop(p, None)
        with self._confirm_lock:
            for key in [k for k in self._confirmed if k[1] in gone or k[1] in partitions]:
                del self._confirmed[key]

    # -- the tiers' thread -----------------------------------------------------------------

    def _read(self) -> None:
        """The reader's thread: the tiers' copies onto the shelf."""
        while not self._stop.is_set():
            try:
                if not self.reader.read():
                    self._stop.wait(_AGAIN_S)
                elif not self.reader.loaded:
                    self._stop.wait(_TAKE_S)
                else:  # a thread waiting for the reader's lock takes it (locks are not fair)
                    time.sleep(0)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._host.report("retry tiers: reading failed; trying again", exc)
                self._stop.wait(_AGAIN_S)

    def _run(self) -> None:
        """The calls' thread: each copy that is due, at the head of its key, to the pool
        (a thread of its own, so that a key's next copy starts as soon as one ends)."""
        while not self._stop.is_set():
            entry = self.shelf.take(_TAKE_S)
            while entry is not None:
                self._start_call(entry)
                entry = self.shelf.take(0)

    def _start_call(self, entry: Entry) -> None:
        with self._calls:
            self._running[entry.partition] += 1
        try:
            self._pool.submit(self._call, entry)
        except RuntimeError:  # closing: the pool takes no more
            self._ended_call(entry.partition)

    def _ended_call(self, partition: int) -> None:
        with self._calls:
            self._running[partition] -= 1
            if self._running[partition] <= 0:
                del self._running[partition]
            self._calls.notify_all()

    def _call(self, entry: Entry) -> None:
        """Run the handler on a tier's record that is due (its value decoded by the
        subscriber's serde first); move it on if it fails."""
        try:
            failure = self._host.decode(entry.record)
            if failure is not None:
                self._give_up(entry, failure)  # it will not decode however often it is tried
                return
            self._handler(entry.record)
        except BaseException as exc:  # any raise fails the record only
            self._failed(entry, exc)
        else:
            self.shelf.done(entry)
        finally:
            self._ended_call(entry.partition)
            self.writer.want()

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
        """Copy ``entry`` to ``tier``; the writer tries until it is written or stops."""
        self.shelf.moving(entry, tier)

        def moved(exc: BaseException | None) -> None:
            if exc is None:
                self.shelf.moved(entry)

        self._write(entry, tier, moved)

    def _give_up(self, entry: Entry, error: BaseException) -> None:
        """Dead-letter ``entry`` (a stream's letter goes out in the tiers' transaction), or
        report it without a dead letter; then its key goes on."""
        record, sink = entry.record, self._sink
        detail = f"{type(error).__name__}: {error} (after {entry.attempts} attempts)"
        if sink is None:
            self._host.report(f"receiver handler failed on {record!r}: {detail}", error)
            self.shelf.done(entry)
            return
        source = f"{self._host.topic}/{entry.partition}/{entry.origin}"

        def sent(exc: BaseException | None) -> None:
            if exc is None:
                self.shelf.done(entry)
            elif not entry.dropped:
                self._host.report(f"dead letter for {record!r} failed; trying again", exc)
                self._later(lambda: self._give_up(entry, error), entry)

        if sink.stream is not None:
            dead = letter(record, Reason.FAILED, detail, source)
            self.writer.write(Write(entry.partition, sink.stream, dead, sent))
            return
        pending = sink.send_async(
            record, error, sent, reason=Reason.FAILED, detail=detail, source=source
        )
        if pending is not None:  # an async function under a plain handler cannot be awaited
            close = getattr(pending, "close", None)
            if close is not None:
                close()
            sent(TypeError("the dead-letter function returned an awaitable"))

    def _later(self, fn: Callable[[], None], entry: Entry) -> None:
        """Call ``fn()`` after a pause, unless closing or the entry's partition went."""

        def again() -> None:
            if not self._stop.is_set() and not entry.dropped:
                fn()

        timer = threading.Timer(_AGAIN_S, again)
        timer.daemon = True
        timer.start()

    # -- confirms (the writer's rounds) ------------------------------------------------------

    def confirm(self) -> None:
        """Ask the writer for a round: the tiers' confirms go out in its transactions."""
        self.writer.want()

    def _reading(self) -> set[int]:
        """The source partitions held whose tiers are read."""
        return set(self.reader.loaded) & set(self._host.assigned())

    def _prove(self) -> None:
        self.writer.want(proof=True)

    def _offsets(
        self, written: set[int], proof: bool
    ) -> tuple[list[TopicPartition], Callable[[], None]]:
        """What a round of the writer confirms: each tier partition up to its first
        unfinished copy, with the finished copies above it in the commit's metadata, where
        that changed. A source partition's tiers are confirmed together, from one reading of
        the shelf, or not at all while the finished set of one does not fit (``overflows``):
        a key's finished copy is never confirmed without its earlier ones in other tiers.
        With ``proof`` (writes, or the fence waiting) the round carries offsets even when
        none moved: the last confirm of the tier partitions written (or of any held), sent
        again, is what Kafka checks the group's generation on."""
        found = self.shelf.confirm_points(self.reader.positions())
        with self._confirm_lock:
            held = self._host.assigned()
            # Not a partition whose tiers are still loading: a copy finished above the
            # confirmed position and not read yet would be left out of the finished set.
            loading = self.reader.loading
            points = {
                k: point
                for k, point in found.items()
                if k[1] in held
                and k[1] in self.reader.loaded
                and k[1] not in loading
                and not self.fence.holds(k[1])
            }
            moved, unfit = to_confirm(points, self._confirmed)
            self.overflows += len(unfit)
            if proof:  # every written partition's tiers, else one held: what Kafka checks
                ours = {k for k in self._confirmed if k[1] in held and k[1] in self.reader.loaded}
                again = [k for k in ours if k[1] in written] or sorted(ours)[:1]
                for k in again:
                    moved.setdefault(k, self._confirmed[k])
        tps = [
            TopicPartition(self.topics[t], p, o, metadata=text)
            for (t, p), (o, text) in moved.items()
        ]

        def committed() -> None:
            loaded = self.reader.loaded  # a partition revoked meanwhile is not ours to note
            with self._confirm_lock:
                self._confirmed.update((k, v) for k, v in moved.items() if k[1] in loaded)
            # keys whose finished copies are all confirmed go on
            self.shelf.confirmed({k: points[k] for k in moved if k in points})

        return tps, committed

    # -- closing -----------------------------------------------------------------------------

    def close(self, deadline: float) -> None:
        """Stop reading and calling, confirm what is done until the monotonic ``deadline``
        (the receiver's close), close the tiers' clients."""
        self._stop.set()
        for thread in (self._thread, self._reading_thread):
            if thread.ident is not None:
                thread.join(5.0)
        # A running call is not waited for: its record is not confirmed, read again later.
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._waiting_lock:  # fetched, never handled: read again, not confirmed past
            waited, self._waiting = self._waiting, {}
        again = {p: records[0].offset or 0 for p, records in waited.items() if records}
        held = self._held  # fetched again by the subscriber (another receiver may follow)
        try:
            if again:
                self._host.rewind(again)
            if held:
                self._host.release_parked(held)
        except Exception as exc:
            self._host.report("retry tiers: resuming paused partitions failed", exc)
        try:
            if self._thread.ident is not None and deadline > time.monotonic():
                self.writer.flush(self.reader.loaded, deadline)
        finally:
            self.writer.close()
            self.reader.close()
            _release(self._id)


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
            topic_config=_DELETE,
        )
    if count < wanted:
        raise StreamConfigMismatchError(
            f"retry tier stream {name!r} has {count} partitions, fewer than the {wanted} of "
            f"{host.topic!r}: each copy goes to the partition number its record came from",
            stream=name,
        )
    return StreamConfig(name=name, topic_config=_DELETE)


def _tier_streams(host: ReceiverHost, retry: Retry) -> list[str]:
    """The tiers' streams, each made or checked (``_tier_stream``).

    Raises:
        StreamConfigMismatchError: A tier stream with fewer partitions than the source, or
            one that compacts.
    """
    names = [t.stream_for(host.topic) for t in retry.tiers]
    for name in names:
        try:
            ensure_topic(host.cluster, _tier_stream(host, name))
        except StreamConfigMismatchError as exc:
            raise StreamConfigMismatchError(
                f"{exc} (a retry tier keeps every copy until it is confirmed: "
                "cleanup.policy=compact would delete a key's earlier copies)",
                stream=name,
            ) from exc
    return names


def _transactional_id(host: ReceiverHost) -> str:
    """A receiver's own transactional id: ``<group>.retry-tiers.<group.instance.id>`` for a
    static member (its next start fences this one's open transaction), else with a random
    suffix; grant the ACL on the prefix ``<group>.retry-tiers.``."""
    instance = host.config.consumer_config.get("group.instance.id")
    return f"{host.group_id}.retry-tiers.{instance or uuid.uuid4().hex[:16]}"


def _claim(transactional_id: str) -> str:
    """Reserve ``transactional_id`` for one receiver of this process.

    Raises:
        IllegalSubscriberStateError: Another running receiver uses it: each would fence the
            other's transactions.
    """
    with _IN_USE_LOCK:
        if transactional_id in _IN_USE:
            raise IllegalSubscriberStateError(
                f"retry tiers' transactional id {transactional_id!r} is used by another "
                "running receiver: each would fence the other's writes; give each its own "
                "(Retry(transactional_id=...))"
            )
        _IN_USE.add(transactional_id)
    return transactional_id


def _release(transactional_id: str) -> None:
    with _IN_USE_LOCK:
        _IN_USE.discard(transactional_id)
