"""``TierReader``: reads a receiver's retry tiers onto its shelf.

A consumer of its own, ``read_committed`` (a copy is there once its transaction committed,
and never when its writer was fenced), assigned by hand the tier partitions of the source
partitions held. When a member gets a partition, ``load`` starts reading its tiers' copies,
skipping the copies confirmed as finished, and ``settle`` tells when they are read up to their
log ends: none of the source partition's records is handled before, so the keys parked before
are parked again. The log end, not the last stable offset: a transaction the last owner left
open may hold copies of a parked key, and the partition waits until it ends (committed, or
aborted by Kafka within its transaction timeout) while the other partitions go on. A copy
another writer made past what was loaded puts its partition behind the ``Fence`` until this
member proves its generation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from bolide.facade.consumer.ledger import decode_finished
from bolide.facade.kafka import CONSUMER_DEFAULTS, admin_client
from bolide.facade.receiver import ReceiverHost
from bolide.facade.receiving.fence import Fence
from bolide.facade.receiving.shelf import Shelf
from bolide.facade.record import Record, record_from_message
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER, WRITER_HEADER

__all__ = ["OURS", "Point", "TierReader"]

log = logging.getLogger("bolide.facade.parallel")

READ_S = 0.05  # longest wait of one read of the tiers (a stop is seen within it)
_READ_MAX = 500  # copies taken in one read, at most
#: The headers the tiers add to a copy (the handler never sees them).
OURS = frozenset((ORIGIN_HEADER, ATTEMPTS_HEADER, WRITER_HEADER))

Point = tuple[int, int]  # (tier, source partition): one tier partition


class TierReader:
    """The tiers' consumer and what it has loaded.

    Args:
        host: The receiver's subscriber.
        topics: The tiers' streams, first tier first.
        delays: Each tier's delay in seconds.
        shelf: Where copies read go.
        fence: Holds partitions with another writer's copies.
        lane_of: A record's lane (its key, for ``ordering="key"``).
        writer: This receiver's writer name (its transactional id), on each of its copies.
        lookup_s: Longest wait of one lookup of a load.

    Attributes:
        loaded: Source partitions whose tiers are read (from their load to their revoke).
        loading: Those of ``loaded`` whose tiers are not read to their log ends yet, with
            the tier partitions left and their ends.
        revokes: Revokes so far (a load that saw one meanwhile starts again).
    """

    def __init__(
        self,
        host: ReceiverHost,
        topics: list[str],
        delays: list[float],
        shelf: Shelf,
        fence: Fence,
        lane_of: Callable[[Record], Hashable],
        writer: str,
        lookup_s: float,
    ) -> None:
        self._host = host
        self._topics = topics
        self._tier_of = {name: i for i, name in enumerate(topics)}
        self._delays = delays
        self._shelf = shelf
        self._fence = fence
        self._lane_of = lane_of
        self._writer = writer
        self._lookup_s = lookup_s
        # A confirmed offset out of range (the copies past it deleted) reads from the first
        # copy left: the default (latest) would skip those.
        settings = {
            "group.id": f"{host.group_id}.tiers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
        self._consumer = Consumer(host.cluster.client_config(CONSUMER_DEFAULTS, settings))
        self._admin = admin_client(host.cluster)  # log ends: the consumer's stop at open txns
        # Held from a read to its copies being on the shelf (``revoke`` drops them under it).
        self.lock = threading.Lock()
        self.loaded: set[int] = set()
        self.revokes = 0
        self._ends: dict[tuple[str, int], int] = {}  # tier partition: its end when loaded
        # Partitions revoked, with the assignment that held them: a revoke heard from another
        # thread (``deactivate``) comes before they leave ``assigned``, and that assignment's
        # tiers must not be loaded again meanwhile; a new assignment's are.
        self._revoked: dict[int, int | None] = {}
        self._after_read: dict[Point, int] = {}  # the positions after the last read (``positions``)
        self.loading: dict[int, dict[tuple[str, int], int]] = {}
        self._told: dict[int, float] = {}  # loading partition: when its wait is told (0: told)

    def load(self, serve: Callable[[], None]) -> dict[Point, tuple[int, str]] | None:
        """Start reading the tiers of the partitions held but not loaded (``settle`` tells
        when they are read to their ends); return each new tier partition's confirmed point
        (position and metadata as found), or ``None`` when a revoke came meanwhile (the next
        poll loads again). Each lookup waits ``lookup_s`` at most and the consumer is served
        after it, so a slow broker costs a retry, not the lease.

        Raises:
            KafkaException: A lookup failed (tried again after a backoff).
        """
        host, revoked = self._host, self._revoked
        new = sorted(
            p
            for p in set(host.assigned()) - self.loaded
            if p not in revoked or revoked[p] != host.holding(p)
        )
        if not new:
            return {}
        tps = [TopicPartition(t, p) for t in self._topics for p in new]
        looked_up = self._look_up(tps, serve)
        if looked_up is None:
            return None  # the lookups may predate the new owner's commits
        found, ranges = looked_up
        points: dict[Point, tuple[int, str]] = {}
        finished: dict[Point, set[int]] = {}
        committed: dict[tuple[str, int], tuple[int, str]] = {}
        for tp in found:
            committed[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")
            if tp.offset >= 0 and tp.metadata:
                where = f"{tp.topic} committed offsets"
                point = (self._tier_of[tp.topic], tp.partition)
                finished[point] = decode_finished(tp.offset, tp.metadata, where=where)
        self._shelf.hold(new, finished)
        ends: dict[tuple[str, int], int] = {}
        with self.lock:
            for tp in tps:
                key = (tp.topic, tp.partition)
                low, high = ranges[key]
                self._ends[key] = high
                start, metadata = committed.get(key, (-1, ""))
                tp.offset = start if start >= low else low
                point = (self._tier_of[tp.topic], tp.partition)
                points[point] = (tp.offset, metadata if start >= low else "")
                if high > tp.offset:
                    ends[key] = high
            self._consumer.incremental_assign(tps)
            self.loaded.update(new)
            told = time.monotonic() + self._lookup_s
            for p in new:
                self._revoked.pop(p, None)
                self.loading[p] = {k: end for k, end in ends.items() if k[1] == p}
                self._told[p] = told
        self.settle()
        return points

    def settle(self) -> set[int]:
        """Let the copies of the partitions whose tiers are now read to their log ends run
        (the shelf's release; the fence keeps a hold of its own); return those still
        loading. Reads the reader's positions after its last read, not the consumer under
        the lock, which the reader's thread takes again as soon as it lets go. A
        ``read_committed`` consumer stops at a transaction still open: a wait is told once,
        when it lasts longer than a lookup."""
        if not self.loading:
            return set()
        at, tier_of = self._after_read, self._tier_of  # every copy below is on the shelf
        done = [
            p
            for p, ends in list(self.loading.items())
            if all(at.get((tier_of[t], q), -1) >= end for (t, q), end in ends.items())
        ]
        for p in done:
            self.loading.pop(p, None)
            self._told.pop(p, None)
        if done:
            self._shelf.release(done)
        now, waiting = time.monotonic(), set(self.loading)
        late = sorted(p for p in waiting if 0 < self._told.get(p, 0) < now)
        if late:
            self._told.update(dict.fromkeys(late, 0.0))
            log.info(
                "retry tiers: loading the tiers of partitions %s waits for a transaction still "
                "open (a last owner's, ended by Kafka within its transaction timeout at most); "
                "the other partitions go on",
                late,
            )
        return waiting

    def _look_up(
        self, tps: list[TopicPartition], serve: Callable[[], None]
    ) -> tuple[list[TopicPartition], dict[tuple[str, int], tuple[int, int]]] | None:
        """The committed offsets and the log range of tier partitions ``tps``, the consumer
        served after each lookup; ``None`` when a revoke came meanwhile."""
        revokes, wait_s = self.revokes, self._lookup_s
        found = self._host.committed_to(tps, timeout_s=wait_s)
        serve()
        # The reader's metadata first: one answered by a node that had restarted and not
        # caught up can lack a tier partition, and the reader asks again only every few
        # minutes, while every lookup of it fails with "Unknown partition".
        for topic in self._topics:
            with self.lock:
                self._consumer.list_topics(topic, timeout=wait_s)
            serve()
            # The admin client's too: it sends each lookup of a log end to the leader it last
            # heard of, and a leader that died never answers to correct it.
            self._admin.list_topics(topic, timeout=wait_s)
            serve()
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in tps:
            with self.lock:
                low, _ = self._consumer.get_watermark_offsets(tp, timeout=wait_s)
            ranges[(tp.topic, tp.partition)] = (low, -1)
            serve()
        for key, end in self._log_ends(tps, wait_s).items():
            ranges[key] = (ranges[key][0], end)
        serve()
        return None if self.revokes != revokes else (found, ranges)

    def _log_ends(self, tps: list[TopicPartition], wait_s: float) -> dict[tuple[str, int], int]:
        """The log end offsets of ``tps``, open transactions' records included (the
        consumer's own watermark is the last stable offset, before them).

        Raises:
            KafkaException: A lookup failed. librdkafka answers a partition whose leader did
                not reply with no error and no offset (-1001); taken as an end, it would
                let the partition's records run before its tiers were read.
        """
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # the client's stubs
        asked = {TopicPartition(tp.topic, tp.partition): latest for tp in tps}
        futures = self._admin.list_offsets(
            asked, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=wait_s
        )
        ends = {(tp.topic, tp.partition): f.result(wait_s).offset for tp, f in futures.items()}
        unanswered = sorted(f"{t}[{p}]" for (t, p), end in ends.items() if end < 0)
        if unanswered:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"the log end of {', '.join(unanswered)} is unknown: no answer of its leader",
                )
            )
        return ends

    def read(self) -> bool:
        """One read of the tiers: each copy read goes on the shelf before the lock is let go
        (so ``load`` knows that what was consumed is on the shelf). ``False`` when a copy
        could not be taken (reported; read again from it later)."""
        if not self.loaded:
            return True
        with self.lock:
            # The wait ends with the first copy (a batch's size alone would end it), the rest
            # of what is there comes without one.
            msgs = self._consumer.consume(1, timeout=READ_S)
            if msgs:
                msgs += self._consumer.consume(_READ_MAX - 1, timeout=0)
            for index, msg in enumerate(msgs):
                if msg.error() is not None:
                    continue
                try:
                    self._arrived(msg)
                except Exception as exc:
                    self._again(msgs[index:])
                    where = f"{msg.topic()}[{msg.partition()}] at {msg.offset()}"
                    self._host.report(f"retry tiers: could not take the copy of {where}", exc)
                    return False
            self._after_read = self._positions()
        return True

    def _again(self, msgs: list[Message]) -> None:
        """Read ``msgs`` again: each tier partition from its first one (the lock held)."""
        first: dict[tuple[str, int], int] = {}
        for msg in msgs:
            if msg.error() is None:
                first.setdefault((msg.topic() or "", msg.partition() or 0), msg.offset() or 0)
        for (topic, partition), offset in first.items():
            self._consumer.seek(TopicPartition(topic, partition, offset))

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
        if self._another_writer(msg, copy):
            self._fence.suspect([partition])
        record = Record(
            copy.data, key=copy.key, headers=[h for h in copy.headers if h[0] not in OURS]
        )
        record.stream, record.partition, record.offset = self._host.topic, partition, offset
        record.timestamp_ms = copy.timestamp_ms
        due = (copy.timestamp_ms or 0) / 1000 + self._delays[tier]
        self._shelf.arrived(tier, copy.offset or 0, record, attempts, due, self._lane_of(record))

    def positions(self) -> dict[Point, int]:
        """Where the reader stood after its last read, in each tier partition it reads:
        every copy below is on the shelf (read without waiting for a read under way)."""
        return dict(self._after_read)

    def _positions(self) -> dict[Point, int]:
        tps = [TopicPartition(t, p) for t in self._topics for p in sorted(self.loaded)]
        return {
            (self._tier_of[tp.topic], tp.partition): tp.offset
            for tp in self._consumer.position(tps)
            if tp.offset >= 0
        }

    def _another_writer(self, msg: Message, copy: Record) -> bool:
        """Whether ``copy`` was written by another receiver after this one loaded its tier
        partition: the partition may have moved to that receiver's member."""
        if (msg.offset() or 0) < self._ends.get((msg.topic() or "", msg.partition() or 0), 0):
            return False
        writer = (copy.header(WRITER_HEADER) or b"").decode(errors="replace")
        return bool(writer) and writer != self._writer

    def revoke(self, gone: set[int]) -> None:
        """Stop reading the tiers of revoked source partitions (the lock held by the caller,
        with the shelf's drop: no copy read before lands after)."""
        self.revokes += 1
        for p in gone:
            self._revoked[p] = self._host.holding(p)
        gone &= self.loaded
        self.loaded -= gone
        for p in gone:
            self.loading.pop(p, None)
            self._told.pop(p, None)
        if gone:
            self._consumer.incremental_unassign(
                [TopicPartition(t, p) for t in self._topics for p in gone]
            )
        for end in [k for k in self._ends if k[1] in gone]:
            del self._ends[end]
        self._after_read = {k: v for k, v in self._after_read.items() if k[1] not in gone}

    def close(self) -> None:
        with self.lock:
            self._consumer.close()
