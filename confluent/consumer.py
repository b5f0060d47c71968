"""``Consumer`` and ``DeserializingConsumer``: confluent-kafka's consumers, reading below Kafka's
log start from bolide's history store.

The history is read through the facade's splice (``bolide.facade.history.HistoryCursor``): a
partition whose position lies below the first offset Kafka holds is assigned in Kafka at that
log start and kept paused there while its archived records are handed out from the store, in
offset order; once they are out, Kafka takes over from the log start. What the store holds is
the topic's as it is now (its topic id, docs/history.md): an older topic of the same name is
never handed out.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import confluent_kafka
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from bolide.facade.cluster import Cluster
from bolide.facade.config import StreamConfig
from bolide.facade.errors import BolideError, ClusterMismatchError
from bolide.facade.history import HistoryCursor
from bolide.facade.kafka import topic_identity
from bolide.facade.record import Record
from bolide.stores import SqlStore

__all__ = ["HISTORY", "Consumer", "DeserializingConsumer"]

log = logging.getLogger("bolide.confluent")

#: The one bolide setting: the SQLAlchemy URL of the history store.
HISTORY = "bolide.history"
#: The settings of a consumer that its admin requests (topic ids) need too.
_CONNECTION = (
    "security.",
    "sasl.",
    "ssl.",
    "socket.",
    "broker.",
    "oauth",
    "enable.ssl.",
    "client.dns.",
)
#: librdkafka's commit (its typing overloads on literal arguments that are passed through here).
_RAW_COMMIT: Any = confluent_kafka.Consumer.commit
#: How often, while archived records are handed out, librdkafka is served (seconds).
_SERVE_S = 0.1
_PAGE = 500
_TIMEOUT_S = 30.0

TP = tuple[str, int]


class Consumer(confluent_kafka.Consumer):
    """``confluent_kafka.Consumer`` that hands out archived records below Kafka's log start.

    Args:
        config: confluent-kafka's configuration, plus ``"bolide.history"``: the SQLAlchemy URL
            of the history store (``sqlite:///bolide.db``, ``postgresql+psycopg://...``).
            Without it, this is confluent-kafka's consumer, unchanged.

    Raises:
        ValueError: A ``bolide.*`` setting other than ``bolide.history``.
        SchemaOutOfDateError: The store's tables are missing or behind (``bolide db
            upgrade``).
        ClusterMismatchError: The store archived its streams from another Kafka cluster.
    """

    def __init__(self, config: Mapping[str, Any], /, **kwargs: Any) -> None:
        settings = dict(config)
        unknown = sorted(k for k in settings if k.startswith("bolide.") and k != HISTORY)
        if unknown:
            raise ValueError(
                f"unknown settings {unknown}: the one bolide setting is {HISTORY!r}, the "
                "SQLAlchemy URL of the history store"
            )
        url = settings.pop(HISTORY, None)
        super().__init__(settings, **kwargs)
        self._history: _History | None = None
        if url is not None:
            try:
                self._history = _History(self, str(url), settings)
            except BaseException:
                super().close()  # refused: no consumer is left behind
                raise
        self._sync()

    def _sync(self) -> None:
        """While no archived record waits, the consumer is a ``_Direct``: ``poll`` and
        ``consume`` are librdkafka's own, and it costs what confluent-kafka's does; while one
        waits, a ``Consumer``, whose ``poll`` and ``consume`` hand it out. A subclass (such as
        ``DeserializingConsumer``, which wraps ``poll``) keeps its class."""
        if type(self) not in (Consumer, _Direct):
            return
        history = self._history
        self.__class__ = Consumer if history is not None and history.busy else _Direct

    # -- reading ---------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """``Consumer.poll``: the next archived record while a partition reads below Kafka's
        log start, else Kafka's next message."""
        history = self._history
        if history is not None:
            found = history.take(1)
            if not history.busy:
                self._sync()
            if found:
                return found[0]
        return confluent_kafka.Consumer.poll(self, -1 if timeout is None else timeout)

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """``Consumer.consume``: archived records first, while partitions read below Kafka's
        log start, then Kafka's messages."""
        history = self._history
        if history is not None:
            found = history.take(num_messages)
            if not history.busy:
                self._sync()
            if found:
                return found
        return confluent_kafka.Consumer.consume(
            self, num_messages, -1 if timeout is None else timeout
        )

    # -- assignment ------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Any = None,
        on_revoke: Any = None,
        on_lost: Any = None,
    ) -> None:
        """``Consumer.subscribe``; the partitions assigned read from the archive first where
        their position lies below Kafka's log start."""
        history = self._history
        if history is None:
            hooks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
            super().subscribe(topics, **{k: v for k, v in hooks.items() if v is not None})
            return
        super().subscribe(
            topics,
            on_assign=history.on_assign(on_assign),
            on_revoke=history.on_revoke(on_revoke),
            # confluent-kafka calls on_revoke for lost partitions when no on_lost is given
            on_lost=history.on_revoke(on_lost if on_lost is not None else on_revoke),
        )

    def assign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.assign``; a partition whose position lies below Kafka's log start reads
        from the archive first."""
        history = self._history
        if history is None:
            super().assign(partitions)
            return
        history.assigning(partitions, incremental=False)
        self._sync()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.incremental_assign``, with the archive below Kafka's log start."""
        history = self._history
        if history is None:
            super().incremental_assign(partitions)
            return
        history.assigning(partitions, incremental=True)
        self._sync()

    def unassign(self) -> None:
        """``Consumer.unassign``: the archive's reads go too."""
        if self._history is not None:
            self._history.drop(None)
            self._sync()
        super().unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.incremental_unassign``: those partitions' archive reads go too."""
        if self._history is not None:
            self._history.drop([(tp.topic, tp.partition) for tp in partitions])
            self._sync()
        super().incremental_unassign(partitions)

    def seek(self, partition: TopicPartition) -> None:
        """``Consumer.seek``; an offset below Kafka's log start that the archive holds is read
        from the archive."""
        history = self._history
        if history is None or not history.seek(partition):
            super().seek(partition)
        self._sync()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """``Consumer.position``: a partition reading from the archive is where that read is."""
        found = super().position(partitions)
        history = self._history
        return found if history is None else history.positions(found)

    def pause(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.pause``: archived records of those partitions wait too."""
        if self._history is not None:
            self._history.pause([(tp.topic, tp.partition) for tp in partitions])
            self._sync()
        super().pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.resume``; a partition still reading from the archive stays paused in
        Kafka until that read is done."""
        history = self._history
        if history is None:
            super().resume(partitions)
            return
        kafka = history.resume([(tp.topic, tp.partition) for tp in partitions])
        self._sync()
        if kafka:
            super().resume(kafka)

    def commit(
        self,
        *,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> Any:
        """``Consumer.commit``; a bare ``commit()`` commits the positions after the archived
        records handed out too (as it commits those librdkafka stored for its own)."""
        history = self._history
        if message is not None or offsets is not None or history is None:
            kwargs: dict[str, Any] = {"asynchronous": asynchronous}
            if message is not None:
                kwargs["message"] = message
            if offsets is not None:
                kwargs["offsets"] = offsets
            return _RAW_COMMIT(self, **kwargs)
        archived = history.commit_handed(None, asynchronous=asynchronous)
        try:
            return _RAW_COMMIT(self, asynchronous=asynchronous)
        except KafkaException as exc:
            if archived and exc.args[0].code() == KafkaError._NO_OFFSET:
                return None  # only archived records were handed out since the last commit
            raise

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """``Consumer.offsets_for_times``; a time before Kafka's log start finds the archived
        record, when the archive holds one at or after it below the log start."""
        found = super().offsets_for_times(partitions, -1 if timeout is None else timeout)
        history = self._history
        return found if history is None else history.times(partitions, found)

    def get_watermark_offsets(
        self,
        partition: TopicPartition,
        timeout: float | None = None,
        cached: bool = False,
        *,
        archive: bool = False,
    ) -> tuple[int, int]:
        """``Consumer.get_watermark_offsets``; with ``archive=True`` the low mark is the
        archive's first offset where it reaches below Kafka's."""
        low, high = super().get_watermark_offsets(
            partition, -1 if timeout is None else timeout, cached
        )
        history = self._history
        first = None if not archive or history is None else history.first(*_place(partition))
        return (low if first is None else min(low, first), high)

    def close(self) -> None:
        """``Consumer.close``; the archive's reads and the history store's connections go
        too."""
        history = self._history
        try:
            if history is not None:
                if history.auto_commit:  # as librdkafka commits its own on close
                    history.commit_handed(None, asynchronous=False)
                history.drop(None)
                self._sync()
            confluent_kafka.Consumer.close(self)
        finally:
            if history is not None:
                history.close()

    def __exit__(self, *exc: object) -> None:
        """``with Consumer(...)`` closes it, the history store's connections included."""
        self.close()

    # -- what _History calls -----------------------------------------------------------------

    def _kafka_assign(self, partitions: list[TopicPartition], *, incremental: bool) -> None:
        if incremental:
            confluent_kafka.Consumer.incremental_assign(self, partitions)
        else:
            confluent_kafka.Consumer.assign(self, partitions)

    def _kafka_seek(self, partition: TopicPartition) -> None:
        confluent_kafka.Consumer.seek(self, partition)

    def _kafka_pause(self, partitions: list[TopicPartition]) -> None:
        confluent_kafka.Consumer.pause(self, partitions)

    def _kafka_resume(self, partitions: list[TopicPartition]) -> None:
        if partitions:
            confluent_kafka.Consumer.resume(self, partitions)


class _Direct(Consumer):
    """A ``Consumer`` while no archived record waits: librdkafka's ``poll`` and ``consume``
    themselves (``Consumer._sync`` switches between the two)."""

    poll = confluent_kafka.Consumer.poll  # type: ignore[assignment]
    consume = confluent_kafka.Consumer.consume  # type: ignore[assignment]


_Direct.__name__ = _Direct.__qualname__ = "Consumer"


class DeserializingConsumer(confluent_kafka.DeserializingConsumer, Consumer):  # type: ignore[misc]
    """``confluent_kafka.DeserializingConsumer`` that hands out archived records below Kafka's
    log start too, its key and value deserializers run on them as on Kafka's."""


class _History:
    """A consumer's reads from the history store: a splice cursor per topic, the records read
    from it and not handed out yet (a page at a time, per partition), where Kafka takes over
    from each partition reading the archive (its log start, where the partition is held
    paused meanwhile), and the partitions the application paused."""

    def __init__(self, consumer: Consumer, url: str, settings: Mapping[str, Any]) -> None:
        self._consumer = consumer
        self._store = SqlStore(url)
        try:
            self._store.check_schema()
            self._check_cluster()
            self._cluster = _cluster(settings)
        except BaseException:
            self._store.close()
            raise
        # Archived records handed out count as librdkafka counts its own: with the offset
        # store automatic, their positions are committed by a bare commit(), by auto-commit
        # (every auto.commit.interval.ms), on a revoke and on close.
        self._auto_store = _true(settings.get("enable.auto.offset.store", True))
        self._auto_commit = _true(settings.get("enable.auto.commit", True))
        self._commit_every_s = float(settings.get("auto.commit.interval.ms", 5000)) / 1000
        self._committed_at = time.monotonic()
        self._handed: dict[TP, int] = {}  # position after the last archived record handed out
        self._reset = str(settings.get("auto.offset.reset", "largest")).lower()
        strategy = str(settings.get("partition.assignment.strategy", ""))
        protocol = str(settings.get("group.protocol", "classic")).lower()
        #: The group hands partitions over one by one (cooperative-sticky, or KIP-848).
        self._incremental = protocol == "consumer" or "cooperative" in strategy
        self._cursors: dict[str, HistoryCursor] = {}
        self._ready: deque[Message] = deque()  # read from the archive, not handed out yet
        self._queued: Counter[TP] = Counter()  # of those, per partition
        self._done: set[TP] = set()  # archive reads over: Kafka takes over once none is queued
        self._kafka: deque[Message] = deque()  # Kafka's, fetched while serving callbacks
        self._served = time.monotonic()
        self._stops: dict[TP, int] = {}  # where Kafka takes over (its log start)
        self._user_paused: set[TP] = set()
        self._parked: dict[TP, tuple[int, int]] = {}  # archive reads the application paused
        self._assigned = 0  # assignments made: an on_assign hook that made one is not redone

    def _check_cluster(self) -> None:
        """Refuse a store every stream of which it archived from another cluster.

        Raises:
            ClusterMismatchError: The store's streams live on another cluster.
        """
        current = [i for i in self._store.incarnations() if i.current]
        if not current:
            return
        cluster_id = self._consumer.list_topics(timeout=_TIMEOUT_S).cluster_id
        if cluster_id and all(i.cluster_id != cluster_id for i in current):
            theirs = sorted({i.cluster_id for i in current})
            raise ClusterMismatchError(
                f"{HISTORY} holds the archive of Kafka cluster {', '.join(theirs)}, and this "
                f"consumer talks to cluster {cluster_id}: point {HISTORY} at this cluster's "
                "archive, or let a stream's history go on here with `bolide db adopt STREAM "
                f"--cluster-id {cluster_id}`",
                stream=current[0].stream,
                stored_cluster_id=theirs[0],
                cluster_id=str(cluster_id),
            )

    def close(self) -> None:
        self._store.close()

    @property
    def auto_commit(self) -> bool:
        """``enable.auto.commit`` with the offset store automatic."""
        return self._auto_commit and self._auto_store

    @property
    def busy(self) -> bool:
        """Some partition has archived records to hand out (or Kafka's wait, fetched while
        they were)."""
        return (
            bool(self._ready)
            or bool(self._kafka)
            or any(c.reading() for c in self._cursors.values())
        )

    # -- what is read ----------------------------------------------------------------------

    def _cursor(self, topic: str) -> HistoryCursor:
        cursor = self._cursors.get(topic)
        if cursor is None:
            cursor = self._cursors[topic] = HistoryCursor(
                StreamConfig(name=topic, global_order=False, store=self._store)
            )
            self._identify(cursor)
        return cursor

    def _identify(self, cursor: HistoryCursor) -> None:
        """The cursor reads the archive of the topic as it is now, never an older one's.
        Kafka or the store not answering (or a store this user may only read) leaves it on
        the incarnation it knew: reported, never raised into a rebalance."""
        try:
            identity = topic_identity(self._cluster, cursor.stream.name)
            if identity is not None:
                cursor.identify(identity)
        except BolideError as exc:
            log.warning("which topic %s is could not be recorded: %s", cursor.stream.name, exc)

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` records: Kafka's fetched meanwhile (other partitions'), else the
        archive's, each partition's in offset order. About every 100 ms librdkafka is served
        (rebalances, errors, ``max.poll.interval.ms``) and what it fetched kept for the next
        call; a partition whose archive read is over resumes in Kafka once none of its
        records is left to hand out."""
        if time.monotonic() - self._served > _SERVE_S:
            self._serve()
        if self._kafka:
            kafka = self._kafka
            return [kafka.popleft() for _ in range(min(limit, len(kafka)))]
        ready = self._ready
        if not ready:
            self._fill()
        out = [ready.popleft() for _ in range(min(limit, len(ready)))]
        for m in out:
            self._queued[(str(m.topic()), int(m.partition() or 0))] -= 1
        self._note_offsets(out)
        if self._done:
            self._hand_over([w for w in self._done if self._queued[w] <= 0])
        return out

    def _serve(self) -> None:
        """Serve librdkafka's callbacks; keep what it fetched of the partitions Kafka reads."""
        self._served = time.monotonic()
        self._kafka.extend(confluent_kafka.Consumer.consume(self._consumer, _PAGE, 0))

    def _note_offsets(self, handed: list[Message]) -> None:
        """Note the positions after ``handed`` (librdkafka's automatic offset store does the
        same for its own records); auto-commit commits them every interval."""
        if not handed or not self._auto_store:
            return
        for m in handed:
            self._handed[(str(m.topic()), int(m.partition() or 0))] = int(m.offset() or 0) + 1
        if self._auto_commit and time.monotonic() - self._committed_at > self._commit_every_s:
            self.commit_handed(None, asynchronous=True)

    def commit_handed(self, partitions: Iterable[TP] | None, *, asynchronous: bool) -> bool:
        """Commit the positions after the archived records handed out (of ``partitions``);
        whether there were any. A commit refused is reported, as librdkafka's own are
        (the records are read again)."""
        self._committed_at = time.monotonic()
        wanted = self._handed if partitions is None else {
            w: self._handed[w] for w in partitions if w in self._handed
        }  # fmt: skip
        if not wanted:
            return False
        offsets = [TopicPartition(t, p, o) for (t, p), o in wanted.items()]
        for where in list(wanted):
            self._handed.pop(where, None)
        try:
            _RAW_COMMIT(self._consumer, offsets=offsets, asynchronous=asynchronous)
        except KafkaException as exc:
            log.warning("committing the archived records handed out failed: %s", exc)
        return True

    def _fill(self) -> None:
        """Read the next page of each topic's partitions reading from the archive."""
        for topic, cursor in self._cursors.items():
            if not cursor.reading():
                continue
            for record in cursor.read(_PAGE):
                self._ready.append(_message(topic, record))
                self._queued[(topic, int(record.partition or 0))] += 1
            self._done.update((topic, p) for p in cursor.finished())
            for p, first, stop in cursor.gaps():
                log.warning("%s[%d]: offsets %d..%d are in neither the archive nor Kafka",
                            topic, p, first, stop - 1)  # fmt: skip

    def _hand_over(self, finished: list[TP]) -> None:
        """Kafka takes over ``finished`` partitions: where its log start moved on during the
        archive read, the archive is read on up to it first (else Kafka is moved there, not
        left to ``auto.offset.reset``)."""
        for where in finished:
            self._done.discard(where)
            stop = self._stops.pop(where, None)
            tp = TopicPartition(*where)
            try:
                low = self._low(tp)
                if stop is not None and low > stop:
                    cursor = self._cursor(where[0])
                    self._consumer._kafka_seek(TopicPartition(where[0], where[1], low))
                    if cursor.covers(where[1], stop, low):
                        cursor.open(where[1], stop, low)
                        self._stops[where] = low
                        continue
            except (KafkaException, BolideError) as exc:
                log.warning("%s[%d]: Kafka takes over where it stands: %s", *where, exc)
            if where not in self._user_paused:
                self._consumer._kafka_resume([tp])

    def first(self, topic: str, partition: int) -> int | None:
        """The archive's first offset of ``partition``."""
        return self._cursor(topic).first_offset(partition)

    def _set_aside(self, where: TP) -> tuple[int, int] | None:
        """Stop ``where``'s archive read: ``(next offset to hand out, stop)`` if it had one."""
        topic, p = where
        ready = [m for m in self._ready if (m.topic(), m.partition()) == where]
        if ready:
            self._ready = deque(m for m in self._ready if (m.topic(), m.partition()) != where)
        self._queued.pop(where, None)
        self._done.discard(where)
        cursor = self._cursors.get(topic)
        span = None if cursor is None else cursor.span(p)
        if cursor is not None:
            cursor.close(p)
        stop = self._stops.get(where)
        if ready:
            last = int(ready[-1].offset() or 0) + 1
            return (int(ready[0].offset() or 0), stop if stop is not None else last)
        return span

    # -- assignment ------------------------------------------------------------------------

    def assigning(self, partitions: list[TopicPartition], *, incremental: bool) -> None:
        """Assign ``partitions`` in Kafka; those whose position lies below Kafka's log start,
        where the archive holds records, at the log start, paused, their archive read open."""
        self._assigned += 1
        if not incremental:
            self.drop(None)
        for topic in {tp.topic for tp in partitions} & set(self._cursors):
            self._identify(self._cursors[topic])  # asked again on every assignment
        opened: list[TopicPartition] = []
        assignment = []
        for tp in partitions:
            try:
                start = self._opens(tp)
            except (KafkaException, BolideError) as exc:  # assigned as librdkafka would
                log.warning("%s[%d]: not read from the archive: %s", tp.topic, tp.partition, exc)
                start = None
            if start is None:
                assignment.append(tp)
            else:
                where = TopicPartition(tp.topic, tp.partition, start)
                assignment.append(where)
                opened.append(where)
        self._consumer._kafka_assign(assignment, incremental=incremental)
        if opened:
            self._consumer._kafka_pause(opened)

    def _opens(self, tp: TopicPartition) -> int | None:
        """Open the archive read of ``tp`` when its position lies below Kafka's log start and
        the archive holds records there; Kafka's log start, where it then takes over."""
        wanted = tp.offset
        if wanted in (OFFSET_INVALID, OFFSET_STORED):
            wanted = self._committed(tp)
        low = self._low(tp)
        cursor = self._cursor(tp.topic)
        if wanted in (OFFSET_INVALID, OFFSET_STORED):
            if self._reset not in ("earliest", "smallest", "beginning"):
                return None
            wanted = OFFSET_BEGINNING
        if wanted == OFFSET_BEGINNING:
            first = cursor.first_offset(tp.partition)
            wanted = first if first is not None else low
        if wanted < 0 or wanted >= low or not cursor.covers(tp.partition, wanted, low):
            return None
        cursor.open(tp.partition, wanted, low)
        self._stops[(tp.topic, tp.partition)] = low
        return low

    def _committed(self, tp: TopicPartition) -> int:
        found = self._consumer.committed([TopicPartition(tp.topic, tp.partition)], _TIMEOUT_S)
        return int(found[0].offset) if found else OFFSET_INVALID

    def _low(self, tp: TopicPartition) -> int:
        marks = confluent_kafka.Consumer.get_watermark_offsets(
            self._consumer, TopicPartition(tp.topic, tp.partition), _TIMEOUT_S, False
        )
        if marks is None:
            raise KafkaException(f"no watermarks of {tp.topic}[{tp.partition}]")
        return int(marks[0])

    def on_assign(self, hook: Any) -> Any:
        """The ``on_assign`` the consumer subscribes with: the application's, then the
        assignment (the application's own, when it made one; else the partitions given, as
        librdkafka would assign them)."""

        def assigned(consumer: Any, partitions: list[TopicPartition]) -> None:
            before = self._assigned
            try:
                if hook is not None:
                    hook(consumer, partitions)
            finally:  # the hook's error is the application's to see, the assignment is made
                if self._assigned == before:
                    self.assigning(partitions, incremental=self._incremental)
                self._consumer._sync()

        return assigned

    def on_revoke(self, hook: Any) -> Any:
        """The ``on_revoke`` (or ``on_lost``) the consumer subscribes with: the application's,
        then the partitions' archive reads go (librdkafka unassigns them as it would)."""

        def revoked(consumer: Any, partitions: list[TopicPartition]) -> None:
            gone = [(tp.topic, tp.partition) for tp in partitions]
            try:
                if hook is not None:
                    hook(consumer, partitions)
                if self._auto_commit:  # as librdkafka commits its own before a revoke
                    self.commit_handed(gone, asynchronous=False)
            finally:  # never read on from the archive what another member owns now
                self.drop(gone)
                self._consumer._sync()

        return revoked

    def drop(self, partitions: Iterable[TP] | None) -> None:
        """Forget the archive reads of ``partitions`` (every one with ``None``), and the
        positions handed out there."""
        if partitions is None:
            partitions = {*self._stops, *self._parked, *self._user_paused}
            partitions |= {(str(m.topic()), int(m.partition() or 0)) for m in self._ready}
            for topic, cursor in self._cursors.items():
                partitions |= {(topic, p) for p in cursor.reading()}
        for where in list(partitions):
            self._handed.pop(where, None)
            self._set_aside(where)
            self._stops.pop(where, None)
            self._user_paused.discard(where)
            self._parked.pop(where, None)

    def seek(self, tp: TopicPartition) -> bool:
        """Move ``tp`` into the archive when the offset (or ``OFFSET_BEGINNING``, or
        ``OFFSET_STORED``: the committed one) lies below Kafka's log start and the archive
        holds it (True); else end its archive read (False: Kafka seeks)."""
        where = (tp.topic, tp.partition)
        cursor, low = self._cursor(tp.topic), self._low(tp)  # asked before anything changes
        offset = tp.offset
        if offset == OFFSET_STORED:
            offset = self._committed(tp)
        if offset == OFFSET_BEGINNING:
            first = cursor.first_offset(tp.partition)
            offset = first if first is not None else OFFSET_BEGINNING
        inside = 0 <= offset < low and cursor.covers(tp.partition, offset, low)
        if inside:
            self._consumer._kafka_seek(TopicPartition(tp.topic, tp.partition, low))
            self._consumer._kafka_pause([TopicPartition(tp.topic, tp.partition)])
        self._set_aside(where)
        self._parked.pop(where, None)
        self._stops.pop(where, None)
        if inside:
            self._stops[where] = low
            if where in self._user_paused:  # it waits, where the seek put it
                self._parked[where] = (offset, low)
            else:
                cursor.open(tp.partition, offset, low)
            return True
        if where not in self._user_paused:
            self._consumer._kafka_resume([TopicPartition(tp.topic, tp.partition)])
        return False

    def positions(self, found: list[TopicPartition]) -> list[TopicPartition]:
        """Kafka's positions, where a partition reading from the archive is where that read
        is (or was, when the application paused it)."""
        out = []
        for tp in found:
            where = (tp.topic, tp.partition)
            parked = self._parked.get(where)
            ready = next((m for m in self._ready if (m.topic(), m.partition()) == where), None)
            cursor = self._cursors.get(tp.topic)
            at = cursor.position(tp.partition) if cursor is not None else None
            if ready is not None:
                at = int(ready.offset() or 0)
            elif parked is not None:
                at = parked[0]
            out.append(tp if at is None else TopicPartition(tp.topic, tp.partition, at))
        return out

    def pause(self, partitions: list[TP]) -> None:
        """The application pauses ``partitions``: an archive read among them is set aside
        where it stands (until ``resume``)."""
        for where in partitions:
            self._user_paused.add(where)
            span = self._set_aside(where)
            if span is not None:
                self._parked[where] = span

    def resume(self, partitions: list[TP]) -> list[TopicPartition]:
        """The application resumes ``partitions``: an archive read set aside goes on (Kafka
        stays paused there until it is done); the rest are returned to resume in Kafka."""
        kafka = []
        for topic, p in partitions:
            self._user_paused.discard((topic, p))
            parked = self._parked.pop((topic, p), None)
            if parked is not None:
                self._cursor(topic).open(p, *parked)
            elif (topic, p) not in self._stops:
                kafka.append(TopicPartition(topic, p))
        return kafka

    def times(
        self, asked: Sequence[TopicPartition], found: list[TopicPartition]
    ) -> list[TopicPartition]:
        """``offsets_for_times`` answers, with the archive's for times before Kafka's log
        start."""
        out = []
        for want, tp in zip(asked, found, strict=True):
            low = self._low(tp)
            if tp.offset >= 0 and tp.offset > low:
                out.append(tp)
                continue
            cursor = self._cursor(tp.topic)
            offset = self._store.offset_for_time(
                tp.topic, tp.partition, want.offset, before=low, **_which(cursor)
            )
            out.append(tp if offset is None else TopicPartition(tp.topic, tp.partition, offset))
        return out


def _which(cursor: HistoryCursor) -> dict[str, str]:
    return {} if cursor.stored_as is None else {"stored_as": cursor.stored_as}


def _true(value: object) -> bool:
    """A librdkafka boolean setting's value (``True``, ``"true"``...)."""
    return str(value).lower() not in ("false", "0")


def _place(tp: TopicPartition) -> TP:
    return (tp.topic, tp.partition)


def _message(topic: str, record: Record) -> Message:
    """An archived record as the ``confluent_kafka.Message`` Kafka would have handed out."""
    stamp = record.timestamp_ms
    return Message(
        topic=topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.data,
        headers=list(record.headers) or None,
        timestamp=(TIMESTAMP_CREATE_TIME, stamp) if stamp is not None else (0, 0),
    )


def _cluster(settings: Mapping[str, Any]) -> Cluster:
    """The cluster the consumer talks to, for the admin requests that name topics' ids.

    Raises:
        ValueError: Neither ``bootstrap.servers`` nor ``metadata.broker.list`` is set.
    """
    connection = {k: v for k, v in settings.items() if k.startswith(_CONNECTION)}
    servers = settings.get("bootstrap.servers") or settings.get("metadata.broker.list")
    if not servers:
        raise ValueError(f"{HISTORY} needs bootstrap.servers (or metadata.broker.list)")
    return Cluster(str(servers), **connection)
