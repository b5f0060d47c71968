"""Archiver: tails streams into the history store, at least once in, exactly once in the table.

Each batch is written in one database transaction, and only after that transaction commits are
the Kafka offsets committed. Killed at any moment, the archiver restarts from the last committed
offsets: records written but not yet committed in Kafka are read again and skipped by the
table's primary key, so no row is lost and none is duplicated. The next batch is read from Kafka
and decoded while the current one is written, on a writer thread of its own (``_pipeline``).

The archive's parts beside it: the archiver's Kafka offsets (``_offsets``), the writer thread
(``_pipeline``), and the typed archive of schema-typed streams (``_typed``, public as
``bolide.stores.typed_archive``); a capacity trims Kafka through
``bolide.facade.kafka.deletion``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from bolide.facade.config import Cluster, ErrorHandler, StreamConfig
from bolide.facade.errors import (
    BrokerError,
    IncompatibleBrokerError,
    StoreError,
    TopicRecreatedError,
)
from bolide.facade.health import Health, measure
from bolide.facade.kafka import (
    CONSUMER_DEFAULTS,
    ensure_topic,
    topic_id,
    topic_identity,
)
from bolide.facade.kafka.deletion import require_delete_records
from bolide.facade.ports import ArchiveStore, HistoryStore, Incarnations
from bolide.facade.record import Record, record_from_message
from bolide.facade.support import Closing
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int
from bolide.stores.archive._offsets import TP, ArchiveOffsets, log_commit_errors, reached
from bolide.stores.archive._pipeline import BatchWriter
from bolide.stores.archive._typed import RejectHandler, write_typed

__all__ = [
    "Archiver",
    "ArchiverStats",
    "ProgressCallback",
    "RejectHandler",
    "write_typed",
]

log = logging.getLogger("bolide.stores.archiver")

#: Archiver consumer defaults (over CONSUMER_DEFAULTS): a restarted archiver takes over the
#: partitions of a killed one after the session timeout, so keep it shorter than Kafka's 45 s.
ARCHIVER_CONSUMER_DEFAULTS: dict[str, Any] = {
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 10_000,
}

#: Batches read ahead, waiting behind the one being written (one more may be in the reader's
#: hands): enough to keep the database busy, few enough to bound memory at a few batches.
WRITE_AHEAD = 2

#: A batch handed to the writer, and what writing it gave: the new rows, and the records whose
#: typed rows the database refused (with why).
Batch = dict[str, list[Record]]
Rejected = list[tuple[list[Record], StoreError]]


@dataclass(frozen=True)
class ArchiverStats:
    """A snapshot of an archiver's progress (what the progress callback receives).

    Attributes:
        records: Records read from Kafka and written to the store in this run.
        inserted: Of those, rows new to the table (the rest were already archived).
        batches: Transactions committed.
        elapsed_s: Seconds since the run started.
        records_per_s: Throughput since the previous snapshot.
        lag: Records behind the end of the streams (an estimate while following).
        caught_up: The run reached the end it was asked to reach.
        retries: Database writes that failed and were retried, and (a ``start()``-ed
            archiver) runs started again after a broker or database that did not answer.
        typed_rejected: Records left out of their typed table because the database refused
            their row (or the table's change); the raw archive keeps them.
        queued: Records read from Kafka and handed to the writer, not yet written.
        positions: Next offset to archive, per ``(stream, partition)``: every record before
            it is in the table.
    """

    records: int = 0
    inserted: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    records_per_s: float = 0.0
    lag: int | None = None
    caught_up: bool = False
    retries: int = 0
    typed_rejected: int = 0
    queued: int = 0
    positions: dict[TP, int] = field(default_factory=dict)


ProgressCallback = Callable[[ArchiverStats], None]


def _passing(error: BrokerError | StoreError) -> bool:
    """Whether running again may get past ``error``: a broker that did not answer (not one
    that cannot serve bolide), a database error marked retriable."""
    if isinstance(error, StoreError):
        return error.retriable
    return not isinstance(error, IncompatibleBrokerError)


class Archiver(Closing):
    """Copies streams from Kafka into a history store, in its own consumer group.

    Args:
        cluster: Where the streams live.
        store: The history store (``SqlStore``) that receives the records.
        streams: The streams to archive; a stream's ``store``, when set, must be ``store``.
        group: The consumer group; its committed offsets are the archive's position.
        batch_size: Most records per transaction.
        consumer_config: librdkafka consumer settings, passed through.
        progress: ``fn(ArchiverStats)`` called about every ``progress_interval_s``.
        progress_interval_s: Seconds between progress calls.
        max_backoff_s: Longest wait between retries of a failed database write, or of a
            ``start()``-ed archiver's run after a broker or database that did not answer.
        serdes: Serdes by stream name (``AvroSerde``, ``ProtobufSerde``, ``JsonSchemaSerde``):
            those streams also fill their typed table (``bolide.stores.archive._typed``) in
            the same transaction. Needs a SqlStore.
        error_handler: ``fn(summary, error)`` for failures the archiver goes on after (typed
            rows the database refuses; a broker or database that does not answer, after
            which a ``start()``-ed archiver runs again with backoff up to ``max_backoff_s``)
            and for the one that stops a ``start()``-ed archiver; logs if unset.

    A stream with ``capacity=N`` is trimmed in Kafka to about N records per partition once
    they are archived, with DeleteRecords.

    Raises:
        BrokerError: A stream has a capacity and the broker cannot delete records.
        SchemaOutOfDateError: The store's schema is behind (run ``bolide db upgrade``).
    """

    def __init__(
        self,
        cluster: Cluster,
        store: HistoryStore,
        streams: Sequence[StreamConfig],
        *,
        group: str = "bolide-archiver",
        batch_size: int = 2_000,
        consumer_config: Mapping[str, Any] | None = None,
        progress: ProgressCallback | None = None,
        progress_interval_s: float = 1.0,
        max_backoff_s: float = 5.0,
        serdes: Mapping[str, Any] | None = None,
        error_handler: ErrorHandler | None = None,
    ) -> None:
        _check_arguments(cluster, store, streams, group, batch_size, progress, error_handler)
        self.serdes = dict(serdes or {})
        unknown = set(self.serdes) - {s.name for s in streams}
        if unknown:
            raise ValueError(f"serdes name streams the archiver does not read: {sorted(unknown)}")
        self.cluster = cluster
        self.store = store
        self._put = self._writes_to(store)  # before any topic is made: bad input changes nothing
        self.streams = {s.name: s for s in streams}
        self.group = group
        self.batch_size = batch_size
        self.progress = progress
        self.error_handler = error_handler
        self.progress_interval_s = progress_interval_s
        self.max_backoff_s = max_backoff_s
        self._restarts = 0  # runs started again after a passing error (counted in retries)
        self._consumer_config = dict(consumer_config or {})
        self._partitions: list[TP] = []
        for stream in self.streams.values():
            count = ensure_topic(cluster, stream)
            self._partitions.extend((stream.name, p) for p in range(count))
            if stream.capacity is not None:
                require_delete_records(cluster, stream.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._offsets = ArchiveOffsets(cluster, self.streams, self._partitions, self._trimmable)
        self._topics = _Topics(isinstance(store, Incarnations))
        self.stats = ArchiverStats()
        self._stats_lock = threading.Lock()  # the writer thread counts retries
        # The run in progress: its writer thread, the records handed to it and not yet
        # finished (read by the loop and the revoke callback, both on the run's thread).
        self._writer: BatchWriter[Batch, tuple[int, Rejected]] | None = None
        self._queued = 0
        self._meter = _Meter(time.monotonic())
        # What health() reports: the partitions held, the positions, the last poll.
        self._held: set[TP] = set()
        self._positions: dict[TP, int] = {}
        self._running = False
        self._last_poll_ms: int | None = None
        if TELEMETRY is not None:
            TELEMETRY.watch(self)

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        """Archive in a background thread until ``stop()``."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the archiver is already running")
        self._stop.clear()
        self._error = None
        self._thread = threading.Thread(target=self._serve, name="bolide-archiver", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """``run`` until ``stop()``: after a passing error (a broker or database that does not
        answer, at start or later) run again with backoff, from the committed positions (the
        archive is idempotent on stream, partition and offset); stop on any other error."""
        delay, self._restarts = 0.5, 0
        while True:
            try:
                self.run(until_caught_up=False)
                return
            except (BrokerError, StoreError) as exc:
                if not _passing(exc) or self._stop.is_set():
                    self._stopped_by(exc)
                    return
                self._restarts += 1
                self._count(retries=1)  # seen now, even while each run fails at its start
                self._report_error(
                    f"the archiver failed ({exc}); starting again in {delay:.1f}s", exc
                )
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.max_backoff_s)
            except BaseException as exc:
                self._stopped_by(exc)
                return

    def _stopped_by(self, exc: BaseException) -> None:
        """``exc`` ended the background run: kept for ``stop()`` to raise, and reported."""
        log.error("archiver stopped by an error", exc_info=exc)
        self._error = exc
        if self.error_handler is not None:
            self._report_error("the archiver stopped", exc)

    def stop(self, timeout_s: float = 30.0) -> ArchiverStats:
        """Stop once the batches read are written (a failing write is not retried again);
        re-raise what stopped the thread, if anything."""
        self._stop.set()
        writer = self._writer
        if writer is not None:
            writer.halt.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"the archiver did not stop within {timeout_s}s")
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.stats

    def health(self, *, lag: bool = True) -> Health:
        """Whether it runs and holds partitions, its last poll, and the lag of each held
        partition (log end minus the next offset to archive; read unless ``lag=False``)."""
        positions = dict(self._positions)
        at = {tp: positions.get(tp) for tp in sorted(self._held)} if self._running else {}
        return measure(
            self.cluster,
            "archiver",
            self.group,
            tuple(sorted(self.streams)),
            at,
            closed=not self._running,
            last_poll_ms=self._last_poll_ms,
            lag=lag,
        )

    def close(self, timeout_s: float = 30.0) -> ArchiverStats:
        """``stop()``, under the name ``with archiver:`` calls on exit."""
        return self.stop(timeout_s)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, until_caught_up: bool = True) -> ArchiverStats:
        """Archive until the streams' ends as of now (or until ``stop()``).

        Args:
            until_caught_up: Return once every record published before the call is archived;
                ``False`` follows the streams until ``stop()``.

        Returns:
            The final statistics.
        """
        while True:
            try:
                return self._run(until_caught_up)
            except _Recreated as recreated:  # its old topic's batches are all written
                log.info("%s recreated: archiving its new topic from the start", recreated)

    def _run(self, until_caught_up: bool) -> ArchiverStats:
        """One run of ``run``, with one consumer.

        Raises:
            _Recreated: A stream's topic was deleted and created again meanwhile: the run
                ends (what was read of the old topic is written) and ``run`` starts again.
        """
        offsets = self._offsets
        offsets.open(self._new_consumer())  # it owns the run's consumer, and closes it
        started = time.monotonic()
        meter = self._meter = _Meter(started)
        self._running = True
        writer = self._writer = BatchWriter(self._write, depth=WRITE_AHEAD, name="bolide-archive")
        self._queued = 0
        try:
            recreated = self._identify()
            positions = self._positions = offsets.committed(self._topics.ids)
            # A commit of another topic (one a member made on the old topic after it was
            # replaced) is no position in this one.
            recreated |= offsets.foreign
            if recreated:  # archived from the new topics' starts
                positions.update(offsets.restart(recreated))
            target = offsets.ends() if until_caught_up else None
            self._set_stats(ArchiverStats(positions=dict(positions), retries=self._restarts))
            if target is not None and reached(positions, target):
                self._report(meter, positions, target, caught_up=True, force=True)
                return self.stats
            # A first report at once (what is left to do), before the group is joined.
            self._report(meter, positions, target, caught_up=False, force=True)
            offsets.subscribe(sorted(self.streams), self._on_assign, self._on_revoke)
            self._follow(writer, target)
            # What was handed over is written before the run ends (or the write's error raised).
            self._finish(writer, wait=True)
            done = target is not None and reached(positions, target)
            if done:
                offsets.settle()
            self._report(meter, positions, target, caught_up=done, force=done)
        finally:
            self._running = False
            self._held.clear()
            self._writer = None
            try:  # after an error: the batches not yet written are read again later
                writer.close()
            finally:
                offsets.close()
            self._set_stats(replace(self.stats, elapsed_s=time.monotonic() - started))
        return self.stats

    def _follow(
        self, writer: BatchWriter[Batch, tuple[int, Rejected]], target: dict[TP, int] | None
    ) -> None:
        """Read and hand batches to the writer until the target is archived or ``stop()``;
        commit the offsets of each written batch as it comes back."""
        positions, meter, offsets = self._positions, self._meter, self._offsets
        last_refresh = time.monotonic()
        while not self._stop.is_set():
            messages = offsets.consume(self.batch_size, 0.2)
            self._last_poll_ms = int(time.time() * 1000)
            suspects = self._suspects(messages, positions)
            if suspects:
                self._check_identity(writer, suspects)
            records = self._records(messages)
            if records:
                self._hand_over(writer, records)
            self._finish(writer)
            if time.monotonic() - self._topics.checked_at > _IDENTITY_CHECK_S:
                self._check_identity(writer, set(self.streams))
            if not messages and not self._queued and time.monotonic() - last_refresh > 1.0:
                # Idle, every record read is archived: step over offsets that hold no record
                # (transaction markers), and learn the commits of other group members.
                last_refresh = time.monotonic()
                positions.update(offsets.past_markers(positions))
                if target is not None:
                    for tp, offset in offsets.refresh().items():
                        positions[tp] = max(positions.get(tp, 0), offset)
            if target is not None and reached(positions, target):
                return
            self._report(meter, positions, target, caught_up=False)

    def _new_consumer(self) -> Consumer:
        """The group member that reads the streams (the cluster's settings win over the
        archiver's defaults, ``consumer_config`` over both)."""
        settings = self.cluster.settings
        return Consumer(
            self.cluster.client_config(
                CONSUMER_DEFAULTS,
                {k: v for k, v in ARCHIVER_CONSUMER_DEFAULTS.items() if k not in settings},
                {
                    "group.id": self.group,
                    "client.id": f"bolide-archiver-{self.group}",
                    "on_commit": log_commit_errors,
                },
                self._consumer_config,
            )
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._held.update((tp.topic, tp.partition) for tp in partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Write what was read before the partitions go, and commit it: the next owner starts
        after it, so a batch is never half written by one member and half by another."""
        self._held.difference_update((tp.topic, tp.partition) for tp in partitions)
        writer = self._writer
        if writer is not None and self._queued:
            self._finish(writer, wait=True, raising=False)  # the loop raises later
            self._offsets.settle()

    def _records(self, messages: list[Message]) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {}
        refetching: set[tuple[str | None, int | None]] = set()
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise BrokerError(f"the archiver's consumer failed: {err.str()}")
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("archiver read error: %s", err.str())
                continue
            where = (msg.topic(), msg.partition())
            if where in refetching:
                continue
            if self._offsets.refetch(msg):
                refetching.add(where)  # the rest of this partition comes again, in order
                continue
            rec = record_from_message(msg)
            out.setdefault(str(rec.stream), []).append(rec)
        return out

    def _hand_over(self, writer: BatchWriter[Batch, tuple[int, Rejected]], records: Batch) -> None:
        """Give ``records`` to the writer, finishing written batches while it has no room; on
        ``stop()`` meanwhile, drop them (never written nor committed: read again later)."""
        while not writer.put(records, timeout_s=0.2):
            self._finish(writer)
            if self._stop.is_set():
                return
        self._queued += sum(len(r) for r in records.values())

    def _finish(
        self,
        writer: BatchWriter[Batch, tuple[int, Rejected]],
        *,
        wait: bool = False,
        raising: bool = True,
    ) -> None:
        """Count the batches the writer has written and commit their offsets (after waiting
        for every batch handed over, with ``wait``); then raise the writer's error, if any."""
        if wait:
            writer.drain()
        for records, (inserted, rejected) in writer.take():
            self._positions.update(self._archived(records, inserted, rejected))
        if raising and writer.failure is not None:
            self._queued = 0  # dropped by the failure
            raise writer.failure

    def _archived(self, records: Batch, inserted: int, rejected: Rejected) -> dict[TP, int]:
        """A batch is in the database: count it, commit its offsets, then trim."""
        nexts: dict[TP, int] = {}
        for stream, recs in records.items():
            for rec in recs:
                tp = (stream, int(rec.partition or 0))
                nexts[tp] = max(nexts.get(tp, 0), int(rec.offset or 0) + 1)
        count = sum(len(r) for r in records.values())
        self._queued -= count
        self._meter.add(count)
        if TELEMETRY is not None:
            TELEMETRY.archive(self.group, records)
        self._count(records=count, inserted=inserted, batches=1)
        self._rejected(rejected)  # committed: count and report them once
        self._offsets.archived(nexts)
        return nexts

    def _write(self, records: Batch, halt: threading.Event) -> tuple[int, Rejected]:
        """Write one batch in one transaction, with retries and backoff until ``halt`` (the
        writer thread); Kafka offsets wait until this returns."""
        delay = 0.1
        while True:
            rejected: Rejected = []
            try:
                return self._put(records, rejected), rejected
            except StoreError as exc:
                if not exc.retriable or halt.is_set():
                    raise
                self._count(retries=1)
                log.warning("archive write failed, retrying in %.1fs: %s", delay, exc)
                if halt.wait(delay):
                    raise
                delay = min(delay * 2, self.max_backoff_s)

    def _writes_to(self, store: HistoryStore) -> Callable[[Batch, Rejected], int]:
        """The write for the store's kind, chosen once: a SQL archive writes every stream of
        a batch in one transaction (typed tables and topic incarnations too), any other
        store stream by stream.

        Raises:
            ValueError: Serdes without a SQL archive (typed tables live in its database).
            SchemaOutOfDateError: The SQL archive's schema is behind.
        """
        if not isinstance(store, ArchiveStore):
            if self.serdes:
                raise ValueError("serdes need a SqlStore: typed tables live in its database")
            return self._put_plain
        store.check_schema()
        return functools.partial(self._put_archive, store)

    def _put_archive(self, archive: ArchiveStore, records: Batch, rejected: Rejected) -> int:
        """A SQL archive's write: every stream of the batch, its typed rows and each
        stream's incarnation key, in one transaction."""
        also = self._typed(records, rejected)
        keys = {s: self._topics.keys[s] for s in records if s in self._topics.keys}
        return archive.store_batches(records, also=also, stored_as=keys)

    def _put_plain(self, records: Batch, rejected: Rejected) -> int:
        """Another history store's write: each stream's records."""
        return sum(self.store.store_all(s, recs) for s, recs in records.items())

    # -- topic incarnations ----------------------------------------------------------------

    def _identify(self) -> set[str]:
        """Learn which topic each stream is now and record it in the store; returns the
        streams whose topic is another than the one this archiver (or the store) archived
        before: deleted and created again (reported once, each)."""
        recreated: set[str] = set()
        for name in self.streams:
            identity = topic_identity(self.cluster, name) if self._topics.kept else None
            if identity is None:  # no topic (yet), or no ids: the current incarnation's rows
                self._topics.keys.pop(name, None)
                self._topics.ids[name] = None
                continue
            assert isinstance(self.store, Incarnations)
            current, retired = self.store.identify(name, identity)
            before = self._topics.keys.get(name)
            self._topics.keys[name], self._topics.ids[name] = current.stored_as, identity.topic_id
            if retired is None and (before is None or before == current.stored_as):
                continue
            recreated.add(name)
            self._repartition(name)
            old = retired.topic_id if retired is not None else "?"
            self._report_error(
                f"{name!r} was deleted and created again (topic id {old} -> "
                f"{identity.topic_id}): its new topic is archived apart, from offset 0",
                TopicRecreatedError(
                    "topic recreated", stream=name, old_topic_id=old, topic_id=identity.topic_id
                ),
            )
        self._topics.checked_at = time.monotonic()
        return recreated

    def _suspects(self, messages: list[Message], positions: dict[TP, int]) -> set[str]:
        """Streams whose topic may have changed: a record below the position archived (the
        offsets went back), or the client's own word for it."""
        found: set[str] = set()
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() in _TOPIC_CHANGED:
                    found.add(str(msg.topic()))
                continue
            if (msg.offset() or 0) < positions.get((str(msg.topic()), msg.partition() or 0), 0):
                found.add(str(msg.topic()))
        return found & set(self.streams)

    def _check_identity(
        self, writer: BatchWriter[Batch, tuple[int, Rejected]], streams: set[str]
    ) -> None:
        """Ask Kafka which topic ``streams`` are; if one changed, write what was read of the
        old topic and end the run (``_Recreated``), which starts again on the new one."""
        self._topics.checked_at = time.monotonic()
        try:
            now = {name: topic_id(self.cluster, name) for name in sorted(streams)}
        except BrokerError as exc:  # asked again at the next check
            log.warning("could not check which topics %s are: %s", sorted(streams), exc)
            return
        # A topic id met where none was (a topic that was missing) counts as a change too.
        changed = [n for n, i in now.items() if i is not None and i != self._topics.ids.get(n)]
        if not changed:
            return
        self._finish(writer, wait=True)
        self._offsets.forget(changed)  # never commit the old topic's offsets on the new one
        raise _Recreated(", ".join(changed))

    def _repartition(self, name: str) -> None:
        """A recreated topic may have another partition count: read what it has now."""
        count = ensure_topic(self.cluster, self.streams[name])
        self._partitions[:] = [tp for tp in self._partitions if tp[0] != name] + [
            (name, p) for p in range(count)
        ]

    def _trimmable(self, wanted: dict[TP, int]) -> dict[TP, int]:
        """Of the trims ``wanted`` (a capacity's), what may go: never past the archived
        frontier of the topic incarnation being archived, and nothing of a stream whose topic
        is no longer the one archived (checked just before the delete). Housekeeping: when
        Kafka or the database does not answer, nothing goes (the next batch asks again)."""
        try:
            return self._within_archive(wanted)
        except (BrokerError, StoreError) as exc:
            log.warning("trim skipped: %s", exc)
            return {}

    def _within_archive(self, wanted: dict[TP, int]) -> dict[TP, int]:
        allowed: dict[TP, int] = {}
        moved = {
            name
            for name in {name for name, _ in wanted}
            if self._topics.ids.get(name) is not None
            and topic_id(self.cluster, name) != self._topics.ids[name]
        }
        for (name, p), cut in wanted.items():
            if name in moved:
                continue
            key = self._topics.keys.get(name)
            which = {} if key is None else {"stored_as": key}
            largest = self.store.largest_offset(name, p, **which)
            frontier = -1 if largest is None else largest
            if min(cut, frontier + 1) > 0:
                allowed[(name, p)] = min(cut, frontier + 1)
        return allowed

    def _count(self, **more: int) -> None:
        """Add to the counters of ``stats`` (the loop and the writer thread both count)."""
        with self._stats_lock:
            now = self.stats
            self.stats = replace(now, **{k: getattr(now, k) + v for k, v in more.items()})

    def _set_stats(self, stats: ArchiverStats) -> None:
        with self._stats_lock:
            self.stats = stats

    def _typed(self, records: Batch, rejected: Rejected) -> Callable[[Any], None] | None:
        """Write the typed tables of streams with a serde, in the store's transaction; the
        records whose typed rows the database refuses go to ``rejected``."""
        typed = {s: recs for s, recs in records.items() if s in self.serdes and recs}
        if not typed:
            return None

        def reject(recs: list[Record], error: StoreError) -> None:
            rejected.append((recs, error))

        def write(conn: Any) -> None:
            for stream, recs in typed.items():
                serde, key = self.serdes[stream], self._topics.keys.get(stream)
                write_typed(conn, stream, recs, serde, on_reject=reject, stored_as=key)

        return write

    def _rejected(self, rejected: Rejected) -> None:
        """Count and report typed rows the database refused, once their batch is committed."""
        for recs, error in rejected:
            self._count(typed_rejected=len(recs))
            self._report_error(str(error), error)

    def _report_error(self, summary: str, error: BaseException | None) -> None:
        handler = self.error_handler
        if handler is None:
            log.warning("%s", summary)
            return
        try:
            handler(summary, error)
        except Exception:
            log.exception("archiver error handler raised")

    # -- progress ---------------------------------------------------------------------------

    def _report(
        self,
        meter: _Meter,
        positions: dict[TP, int],
        target: dict[TP, int] | None,
        *,
        caught_up: bool,
        force: bool = False,
    ) -> None:
        now = time.monotonic()
        if not force and now - meter.last_report < self.progress_interval_s:
            return
        lag = (
            None
            if target is None
            else sum(max(0, e - positions.get(tp, 0)) for tp, e in target.items())
        )
        with self._stats_lock:
            self.stats = replace(
                self.stats,
                elapsed_s=now - meter.started,
                records_per_s=meter.rate(now),
                lag=lag,
                caught_up=caught_up,
                queued=self._queued,
                positions=dict(positions),
            )
        if self.progress is not None:
            try:
                self.progress(self.stats)
            except Exception:
                log.exception("archiver progress callback raised")

    def __repr__(self) -> str:
        return f"Archiver(streams={sorted(self.streams)!r}, group={self.group!r}, {self.store!r})"


#: Seconds between checks, while idle, that each stream is still the topic archived.
_IDENTITY_CHECK_S = 5.0
#: The consumer's word that a topic it reads is not the one it was (KIP-516).
_TOPIC_CHANGED = {
    getattr(KafkaError, name)
    for name in ("UNKNOWN_TOPIC_ID", "INCONSISTENT_TOPIC_ID")
    if hasattr(KafkaError, name)
}


class _Topics:
    """The topic incarnation each stream is archived into (``bolide.stores.incarnations``):
    its rows' key, the topic id met (``None``: a broker that reports no ids) and when it was
    last asked. Changed only while the writer holds no batch, so a batch is written under the
    key it was read with."""

    def __init__(self, kept: bool) -> None:
        self.kept = kept  # the store keeps incarnations (else rows by stream name only)
        self.keys: dict[str, str] = {}
        self.ids: dict[str, str | None] = {}
        self.checked_at = 0.0


class _Recreated(Exception):
    """A stream's topic was deleted and created again during a run."""


class _Meter:
    """Records per second between progress reports."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.last_report = started
        self._count = 0

    def add(self, count: int) -> None:
        self._count += count

    def rate(self, now: float) -> float:
        span = max(now - self.last_report, 1e-6)
        rate = self._count / span
        self._count = 0
        self.last_report = now
        return rate


def _check_arguments(
    cluster: object,
    store: object,
    streams: Sequence[object],
    group: object,
    batch_size: object,
    progress: object,
    error_handler: object,
) -> None:
    """Refuse bad ``Archiver`` arguments with a typed error, before anything is touched."""
    if not isinstance(cluster, Cluster):
        raise TypeError("cluster must be a Cluster")
    if not isinstance(store, HistoryStore):
        raise TypeError("store must implement HistoryStore (e.g. SqlStore)")
    if isinstance(streams, StreamConfig) or not streams:
        raise ValueError("streams must be a non-empty list of StreamConfig")
    for stream in streams:
        if not isinstance(stream, StreamConfig):
            raise TypeError(f"streams must hold StreamConfig, not {type(stream).__name__}")
        if stream.store is not None and not _same_store(stream.store, store):
            raise ValueError(f"stream {stream.name!r} has another store than the archiver's")
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty string")
    check_int("batch_size", batch_size, minimum=1)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    if error_handler is not None and not callable(error_handler):
        raise TypeError("error_handler must be callable")


def _same_store(a: HistoryStore, b: HistoryStore) -> bool:
    if a is b:
        return True
    return isinstance(a, ArchiveStore) and a.same_store(b)
