"""The workloads, one per promise: what each publishes, runs, and how its history is checked.

``alo``
    at-least-once group subscribers with confirms. Promise: no acknowledged record lost, none
    stuck, key order kept (records of a partition first processed in offset order), no
    position confirmed past unfinished work. Duplicates are allowed and counted: they are
    bounded by what was read and not yet confirmed when a worker died or lost its lease.
``sql``
    ``SqlPositions``: each batch's rows and its positions in one PostgreSQL transaction.
    Promise: every acknowledged record in the table exactly once, in offset order per
    partition (the table's commit order), none stuck, through broker faults, worker kills and
    pauses, and database crashes.
``par``
    the parallel receiver with retry tiers (at-least-once, key order): every seventh record
    fails its first call and goes through the tiers while its key waits. Promise: no
    acknowledged record lost or stuck (each handled or dead-lettered), key order kept (a key's
    records first handled in publishing order); duplicates allowed and counted.
``archive``
    the archiver. Promise: the archive equals the stream: every acknowledged record archived
    at its place with its value, nothing archived that the stream does not hold, none stuck,
    through broker faults, archiver kills and pauses, and database crashes.
``durable``
    durable clients (one per worker slot, each reading every partition, confirming after each
    batch; a restarted slot reconnects the same client). Promise: each client reads every
    acknowledged record (none stuck), a partition's records first in offset order, and the
    seam holds: in each connection every record read before ``on_live`` is flagged replayed
    and lies below the connection's marker, every record after it is live. Duplicates (a
    batch read again after a kill or a lost lease) are allowed and counted.
``share``
    a share group (queues for Kafka) of two members that ack what they read. Promise: every
    acknowledged record acked by a member (none stuck). Records delivered again (a member
    killed or paused past its lock) are allowed and counted as duplicates; so are those
    delivered again without a higher ``delivery_count`` (after a share-partition leader
    change, which forgets the deliveries of records acquired then). A member logs ``acking``
    before it acks and ``ack`` once the ack returned; records of an ``acking`` whose member
    was killed before its ``ack`` count as acked when no member read them again (an ack that
    never reached the broker has them delivered again once their lock expires), counted as
    ``ack-unlogged``.
``outbox``
    the transactional outbox: a writer adds one row per database transaction, two relays
    publish them in Kafka transactions. Promise, read with ``read_committed``: every committed
    row in the stream exactly once, in commit order per key, none stuck.
``eos``
    exactly-once read-process-publish in Kafka transactions. Promise, read with
    ``read_committed``: every acknowledged input in the output exactly once, in key order, and
    nothing from an aborted transaction, none stuck.

"lost" counts acknowledged records missing from the stream itself; "stuck" those in the stream
that were never finished after the faults healed and the workers drained.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import sqlalchemy as sa
from confluent_kafka import TopicPartition

from bolide.facade import Cluster, Publisher, PublisherConfig, Record
from bolide.facade.errors import BrokerError, StoreError
from bolide.facade.kafka import committed_offsets, log_ends, probe_consumer
from bolide.stores import Outbox, SqlStore
from bolide.stores.schema import OUTBOX, RECORDS
from tests.chaos.history import Event, History
from tests.chaos.worker import ledger, stream

__all__ = ["WORKLOADS", "OutboxWriter", "Producer", "Workload", "scan"]

Scan = dict[tuple[int, int], tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class Workload:
    name: str
    partitions: int = 3
    workers: int = 2
    #: Per anomaly, whether the workload's promise allows it (counted, not failed).
    allowed: frozenset[str] = field(default_factory=frozenset)

    @property
    def topic(self) -> str:
        return f"chaos-{self.name}-in"

    @property
    def output(self) -> str:
        return f"chaos-{self.name}-out"

    @property
    def group(self) -> str:
        return f"chaos-{self.name}"

    @property
    def database(self) -> bool:
        """Whether the workload needs the campaign's PostgreSQL."""
        return self.name in ("sql", "archive", "durable", "outbox")

    @property
    def watched(self) -> str:
        """The stream whose partition leaders the nemesis favours: the one written."""
        return self.output if self.name == "outbox" else self.topic

    def worker_args(self, bootstrap: str, slot: int, db: str) -> list[str]:
        return [self.name, bootstrap, self.topic, self.output, str(self.partitions),
                self.group, str(slot), db]  # fmt: skip

    def done(self, events: list[Event]) -> set[str]:
        """The values whose processing is finished for good, from the history so far."""
        mine = [e for e in events if e["proc"].startswith(f"{self.name}-")]
        if self.name == "alo":
            return {e["value"] for e in mine if e["type"] == "read"}
        if self.name == "par":
            return {e["value"] for e in mine if e["type"] in ("read", "dead")}
        if self.name == "sql":
            return {v for e in mine if e["type"] == "db-commit" for v in e["values"]}
        if self.name == "outbox":
            return _relayed(events, self)
        if self.name == "share":
            acked = {v for e in mine if e["type"] == "ack" for v in e["values"]}
            return acked | _acked_unlogged(mine)
        if self.name == "durable":
            clients = [{e["value"] for e in mine if e["type"] == "read" and _slot(e) == slot}
                       for slot in range(1, self.workers + 1)]  # fmt: skip
            return set.intersection(*clients)
        if self.name == "archive":
            archived = _archived(mine)
            places = acknowledged(events, self)
            # A value acknowledged without its offset is found by value at the final check.
            return {v for v, (p, o) in places.items() if o is None or o < archived.get(p, 0)}
        committed = {e["txn"] for e in mine if e["type"] == "txn" and e["status"] == "commit"}
        return {e["value"] for e in mine if e["type"] == "read" and e.get("txn") in committed}


WORKLOADS = {
    "alo": Workload("alo", allowed=frozenset({"duplicates"})),
    "archive": Workload("archive"),
    "durable": Workload("durable", allowed=frozenset({"duplicates"})),
    # A share-partition leader that changes forgets the deliveries of records acquired then:
    # they come again with the same count (Kafka's behaviour), counted, not failed.
    "share": Workload(
        "share", allowed=frozenset({"duplicates", "delivery-count-not-rising", "ack-unlogged"})
    ),
    "outbox": Workload("outbox"),
    "eos": Workload("eos"),
    "sql": Workload("sql"),
    "par": Workload("par", allowed=frozenset({"duplicates", "dead-lettered"})),
}


class _Source(threading.Thread):
    """What writes a workload's input at ``rate`` records per second until ``halt``."""

    def __init__(self, workload: Workload, history: History, rate: float):
        super().__init__(name=f"source-{workload.name}", daemon=True)
        self.workload = workload
        self.history = history
        self.interval = 1 / rate
        self.halt = threading.Event()


class Producer(_Source):
    """Publishes ``<workload>-<n>`` (keys ``k0``..``k7``) with ``acks=all`` and records each
    attempt: ``publish`` with ``status`` ``invoke``, then ``ok`` (and its place) or ``fail``."""

    def __init__(self, cluster: Cluster, workload: Workload, history: History, rate: float):
        super().__init__(workload, history, rate)
        self.cluster = cluster

    def _settled(self, value: str, offset: int | None, error: Any, partition: int) -> None:
        if error is None:
            self.history.add("publish", status="ok", value=value, p=partition, o=offset)
        else:
            self.history.add("publish", status="fail", value=value, error=str(error)[:200])

    def run(self) -> None:
        config = PublisherConfig(stream=stream(self.workload.topic, self.workload.partitions))
        with Publisher(self.cluster, config) as pub:
            n = 0
            while not self.halt.wait(self.interval):
                value = f"{self.workload.name}-{n}"
                record = Record(value.encode(), key=b"k%d" % (n % 8))
                self.history.add("publish", status="invoke", value=value)
                future = pub.publish_async(record)
                future.add_done_callback(
                    lambda f, v=value, r=record: self._settled(
                        v, None if f.exception() else f.result(), f.exception(), r.partition or 0
                    )
                )
                n += 1
            pub.flush(120)


class OutboxWriter(_Source):
    """Adds ``outbox-<n>`` rows (keys ``k0``..``k7``, bound for the workload's output stream),
    one per database transaction, and records each: ``publish`` ``invoke``, then ``ok`` once
    the transaction committed or ``fail``."""

    def __init__(self, db: str, workload: Workload, history: History, rate: float):
        super().__init__(workload, history, rate)
        self.db = db

    def run(self) -> None:
        try:
            self._write()
        except Exception as exc:  # the outbox refused a row for good: an anomaly
            self.history.add("writer-stopped", error=f"{type(exc).__name__}: {exc}"[:300])
            raise

    def _write(self) -> None:
        with SqlStore(self.db) as store:
            outbox, n = Outbox(store), 0
            while not self.halt.wait(self.interval):
                value = f"{self.workload.name}-{n}"
                self.history.add("publish", status="invoke", value=value)
                try:
                    with store.engine.begin() as conn:
                        record = Record(value.encode(), key=b"k%d" % (n % 8))
                        outbox.add(conn, self.workload.output, record)
                except (sa.exc.SQLAlchemyError, StoreError) as exc:
                    self.history.add("publish", status="fail", value=value, error=str(exc)[:200])
                else:
                    self.history.add("publish", status="ok", value=value)
                n += 1


def scan(cluster: Cluster, topic: str, partitions: int) -> Scan:
    """Every committed record of ``topic``: ``{(partition, offset): (value, headers)}``, once
    no transaction is open on it (``_stable``)."""
    _stable(cluster, topic, partitions)
    consumer = probe_consumer(cluster, **{"isolation.level": "read_committed"})
    found: Scan = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        while len(ended) < partitions:
            msg = consumer.poll(5.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    ended.add(msg.partition())
                continue
            headers = {k: (v or b"").decode() for k, v in msg.headers() or []}
            found[(msg.partition(), msg.offset())] = ((msg.value() or b"").decode(), headers)
    finally:
        consumer.close()
    return found


def _stable(cluster: Cluster, topic: str, partitions: int, within_s: float = 120.0) -> None:
    """Wait (up to ``within_s``) until no transaction is open on ``topic``: each partition's
    last stable offset is its end. A ``read_committed`` reader stops at an open transaction,
    such as one a publisher abandoned to a call librdkafka kept waiting in, which the
    coordinator aborts after its ``transaction.timeout.ms`` (60 s by default)."""
    stable = probe_consumer(cluster, **{"isolation.level": "read_committed"})
    latest = probe_consumer(cluster, **{"isolation.level": "read_uncommitted"})
    parts = range(partitions)
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(BrokerError):  # asked again
                if log_ends(cluster, topic, parts, consumer=stable) == log_ends(
                    cluster, topic, parts, consumer=latest
                ):
                    return
            time.sleep(1.0)
        print(f"chaos: {topic}: a transaction is still open after {within_s:.0f} s; the check "
              "reads up to it (what is past it counts as lost)", file=sys.stderr)  # fmt: skip
    finally:
        stable.close()
        latest.close()


def _committed(cluster: Cluster, workload: Workload) -> dict[int, int]:
    """The group's committed positions, as a ``read_uncommitted`` reader sees them (answered
    at once, not after open transactions end)."""
    consumer = probe_consumer(
        cluster, **{"group.id": workload.group, "isolation.level": "read_uncommitted"}
    )
    try:
        asked = [TopicPartition(workload.topic, p) for p in range(workload.partitions)]
        return {tp.partition: tp.offset for tp in committed_offsets(consumer, asked, 60)}
    finally:
        consumer.close()


def acknowledged(events: Iterable[Event], workload: Workload) -> dict[str, tuple[int, int]]:
    prefix = f"{workload.name}-"
    return {
        e["value"]: (e.get("p", -1), e.get("o", -1))  # an outbox row has no place yet
        for e in events
        if e["type"] == "publish" and e["status"] == "ok" and e["value"].startswith(prefix)
    }


def _slot(event: Event) -> int:
    """The worker slot of a worker's event (``<workload>-<slot>.<incarnation>``)."""
    return int(event["proc"].rsplit("-", 1)[1].split(".")[0])


def _seam_breaks(events: list[Event]) -> int:
    """Reads on the wrong side of their connection's seam: before ``live`` unflagged or at
    or past the marker, after ``live`` flagged replayed."""
    breaks = 0
    by_proc: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_proc[e["proc"]].append(e)
    for mine in by_proc.values():
        marker: dict[str, int] = {}
        live = False
        for e in mine:
            if e["type"] == "connect":
                marker, live = e["marker"], False
            elif e["type"] == "live":
                live = True
            elif e["type"] == "read":
                below = e["o"] < marker.get(str(e["p"]), 0)
                breaks += e["replayed"] if live else not (e["replayed"] and below)
    return breaks


def check_durable(workload: Workload, events: list[Event], topic: Scan) -> dict[str, int]:
    acked = acknowledged(events, workload)
    written = set(in_stream(acked, topic))
    mine = [e for e in events if e["proc"].startswith("durable-")]
    stuck = duplicates = inversions = 0
    for slot in range(1, workload.workers + 1):
        reads = [e for e in mine if e["type"] == "read" and _slot(e) == slot]
        times = Counter(e["value"] for e in reads)
        stuck += sum(1 for v in written if v not in times)
        duplicates += sum(n - 1 for n in times.values())
        inversions += _first_read_inversions(reads)
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": stuck,
        "duplicates": duplicates,
        "out-of-order": inversions,
        "seam": _seam_breaks(mine),
    }


def _acked_unlogged(events: list[Event]) -> set[str]:
    """Values a share member was acking (``acking``) when it was killed, before it logged
    ``ack``, that no member read again afterwards: the broker took the ack. An ack that never
    reached it leaves the records acquired, delivered again once their acquisition lock
    expires (seconds, well within the drain), and then read again here."""
    logged = {v for e in events if e["type"] == "ack" for v in e["values"]}
    last_read: dict[str, float] = {}
    for e in events:
        if e["type"] == "read":
            last_read[e["value"]] = max(e["t"], last_read.get(e["value"], 0.0))
    return {
        v
        for e in events
        if e["type"] == "acking"
        for v in e["values"]
        if v not in logged and last_read.get(v, 0.0) <= e["t"]
    }


def check_share(workload: Workload, events: list[Event], topic: Scan) -> dict[str, int]:
    acked = acknowledged(events, workload)
    written = set(in_stream(acked, topic))
    done = workload.done(events)
    mine = [e for e in events if e["proc"].startswith("share-")]
    reads = [e for e in events if e["type"] == "read" and e["proc"].startswith("share-")]
    times = Counter(e["value"] for e in reads)
    counts: dict[str, int] = {}
    not_rising = 0
    for e in reads:  # in each process's order; a value's deliveries across processes vary
        if e["deliveries"] <= counts.get(e["value"], 0):
            not_rising += 1
        counts[e["value"]] = max(e["deliveries"], counts.get(e["value"], 0))
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": sum(1 for v in written if v not in done),
        "duplicates": sum(n - 1 for n in times.values()),
        "delivery-count-not-rising": not_rising,
        "ack-unlogged": len(_acked_unlogged(mine) & written),
    }


def in_stream(acked: dict[str, tuple[int, int]], topic: Scan) -> dict[str, tuple[int, int]]:
    """The acknowledged values the stream holds, with their places. A value acknowledged
    without an offset (a retried batch the broker answered as a duplicate: librdkafka then
    cannot say where it went) is looked for by value."""
    placed = {v: place for v, place in acked.items() if topic.get(place, ("",))[0] == v}
    unplaced = {v for v, (_, offset) in acked.items() if offset is None}
    if unplaced:
        placed.update((v, place) for place, (v, _) in topic.items() if v in unplaced)
    return placed


def _relayed(events: list[Event], workload: Workload) -> set[str]:
    """Every acknowledged row once a relay found none pending after the last of them."""
    acked = [e for e in events if e["type"] == "publish" and e["status"] == "ok"
             and e["value"].startswith(f"{workload.name}-")]  # fmt: skip
    last = max((e["t"] for e in acked), default=0.0)
    relays = [e for e in events if e["type"] == "pending" and e["proc"].startswith("outbox-")]
    if any(e["count"] == 0 and e["t"] > last for e in relays):
        return {e["value"] for e in acked}
    return set()


def check_outbox(
    workload: Workload, events: list[Event], output: Scan, pending: set[str]
) -> dict[str, int]:
    """``pending``: the values of the rows still unsent. Key order by the rows' numbers: one
    writer commits them in that order, and a key stays on one partition."""
    acked = acknowledged(events, workload)
    times = Counter(value for value, _ in output.values())
    inversions, highest, seen = 0, dict[int, int](), set[str]()
    for _, (value, _) in sorted(output.items()):
        if value in seen:
            continue
        seen.add(value)
        number = int(value.rsplit("-", 1)[1])
        if number < highest.get(number % 8, -1):
            inversions += 1
        highest[number % 8] = max(number, highest.get(number % 8, -1))
    return {
        "acknowledged": len(acked),
        "lost": len(outbox_lost(acked, output, pending)),
        "stuck": sum(1 for v in acked if v in pending),
        "duplicates": sum(n - 1 for n in times.values() if n > 1),
        "out-of-order": inversions,
        "writer-stopped": sum(1 for e in events if e["type"] == "writer-stopped"),
    }


def outbox_lost(acked: Iterable[str], output: Scan, pending: set[str]) -> list[str]:
    """The ``acked`` rows (committed by the writer) neither in the stream nor ``pending``
    (still unsent)."""
    published = {value for value, _ in output.values()}
    return sorted(v for v in acked if v not in published and v not in pending)


def lost_rows(db: str, workload: Workload, lost: list[str]) -> list[dict[str, Any]]:
    """The outbox rows of the ``lost`` values, as the database keeps them (claim, batch,
    where they were marked sent): what tells a loss's path."""
    c = OUTBOX.c
    columns = (c.id, c.payload, c.relay, c.batch, c.sent_ms, c.kafka_partition, c.kafka_offset)
    payloads = [v.encode() for v in lost]
    query = sa.select(*columns).where(c.stream == workload.output, c.payload.in_(payloads))
    names = [column.name for column in columns]
    return [
        {k: v.decode() if isinstance(v, bytes) else v for k, v in zip(names, row, strict=True)}
        for row in _select(db, query.order_by(c.id))
    ]


def _select(db: str, query: sa.Select[Any]) -> list[tuple[Any, ...]]:
    """The rows ``query`` finds in the campaign's database (a connection of its own)."""
    engine = sa.create_engine(db, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


def _unsent(db: str, workload: Workload) -> set[str]:
    c = OUTBOX.c
    query = sa.select(c.payload).where(c.stream == workload.output, c.sent_ms.is_(None))
    return {bytes(v or b"").decode() for (v,) in _select(db, query)}


def _first_read_inversions(reads: list[Event]) -> int:
    """Records of a partition whose first processing came after a later offset's."""
    seen: set[tuple[int, int]] = set()
    highest: dict[int, int] = {}
    inversions = 0
    for e in reads:
        place = (e["p"], e["o"])
        if place in seen:
            continue
        seen.add(place)
        if e["o"] < highest.get(e["p"], -1):
            inversions += 1
        highest[e["p"]] = max(highest.get(e["p"], -1), e["o"])
    return inversions


def check_alo(
    workload: Workload, events: list[Event], topic: Scan, positions: dict[int, int]
) -> dict[str, int]:
    acked = acknowledged(events, workload)
    reads = [e for e in events if e["type"] == "read" and e["proc"].startswith("alo-")]
    times = Counter(e["value"] for e in reads)
    written = set(in_stream(acked, topic))
    unread = [v for v in written if v not in times]
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "duplicates": sum(n - 1 for n in times.values()),
        "out-of-order": _first_read_inversions(reads),
        "confirmed-past-unfinished": sum(
            1 for v in unread if positions.get(acked[v][0], 0) > acked[v][1]
        ),
        "stuck": sum(1 for v in unread if positions.get(acked[v][0], 0) <= acked[v][1]),
    }


def check_eos(workload: Workload, events: list[Event], output: Scan, topic: Scan) -> dict[str, int]:
    acked = acknowledged(events, workload)
    aborted = {e["txn"] for e in events if e["type"] == "txn" and e["status"] == "abort"}
    inputs = Counter(headers.get("in", "") for _, headers in output.values())
    # One key keeps one input and one output partition, and one processor at a time: per
    # (output, input) partition pair, the inputs' offsets rise.
    runs: dict[tuple[int, str], list[int]] = defaultdict(list)
    for (out_partition, _), (_, headers) in sorted(output.items()):
        in_partition, offset = headers.get("in", "0:0").split(":")
        runs[(out_partition, in_partition)].append(int(offset))
    inversions = sum(sum(1 for a, b in pairwise(offsets) if b < a) for offsets in runs.values())
    written = in_stream(acked, topic)
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": sum(1 for p, o in written.values() if inputs[f"{p}:{o}"] == 0),
        "duplicates": sum(n - 1 for n in inputs.values() if n > 1),
        "out-of-order": inversions,
        "aborted-read": sum(1 for _, headers in output.values() if headers.get("txn") in aborted),
    }


def check_par(workload: Workload, events: list[Event], topic: Scan) -> dict[str, int]:
    """Key order by the records' numbers: one key's records are published in order."""
    acked = acknowledged(events, workload)
    written = set(in_stream(acked, topic))
    mine = [e for e in events if e["proc"].startswith("par-")]
    handled = Counter(e["value"] for e in mine if e["type"] == "read")
    dead = {e["value"] for e in mine if e["type"] == "dead"}
    seen: set[str] = set()
    highest: dict[str, int] = {}
    inversions = 0
    for e in mine:  # a record is finished when handled or given up: then its key flows on
        if e["type"] not in ("read", "dead") or e["value"] in seen:
            continue
        seen.add(e["value"])
        number = int(e["value"].rsplit("-", 1)[1])
        if number < highest.get(e["key"], -1):
            inversions += 1
        highest[e["key"]] = max(number, highest.get(e["key"], -1))
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": sum(1 for v in written if v not in handled and v not in dead),
        "duplicates": sum(n - 1 for n in handled.values()),
        "out-of-order": inversions,
        "dead-lettered": len(dead),
    }


def check_sql(
    workload: Workload, events: list[Event], rows: list[tuple[int, int, str]], topic: Scan
) -> dict[str, int]:
    """``rows``: the ledger's ``(partition, offset, value)`` in commit order (its ``id``).
    A record's effects are counted by its place, not its value: an acknowledged publish can
    be in the stream twice (librdkafka's idempotent producer across a leader change,
    confluentinc/librdkafka#4953), and each copy is a record of its own."""
    acked = acknowledged(events, workload)
    written = in_stream(acked, topic)
    times = Counter(value for _, _, value in rows)
    effects = Counter((partition, offset) for partition, offset, _ in rows)
    inversions, highest = 0, dict[int, int]()
    for partition, offset, _ in rows:
        if offset < highest.get(partition, -1):
            inversions += 1
        highest[partition] = max(offset, highest.get(partition, -1))
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": sum(1 for v in written if times[v] == 0),
        "duplicates": sum(n - 1 for n in effects.values() if n > 1),
        "out-of-order": inversions,
    }


def _archived(events: Iterable[Event]) -> dict[int, int]:
    """The highest position the archivers reported per partition (archived below it)."""
    highest: dict[int, int] = {}
    for e in events:
        if e["type"] == "archived":
            for p, o in e["positions"].items():
                highest[int(p)] = max(o, highest.get(int(p), 0))
    return highest


def check_archive(
    workload: Workload, events: list[Event], rows: dict[tuple[int, int], str], topic: Scan
) -> dict[str, int]:
    """``rows``: the archive of the workload's stream, ``{(partition, offset): value}``."""
    acked = acknowledged(events, workload)
    written = in_stream(acked, topic)
    return {
        "acknowledged": len(acked),
        "lost": len(acked) - len(written),
        "stuck": sum(1 for place in written.values() if place not in rows),
        "mismatched": sum(
            1 for place, value in rows.items() if topic.get(place, (None,))[0] != value
        ),
    }


def _archive_rows(db: str, workload: Workload) -> dict[tuple[int, int], str]:
    c = RECORDS.c
    query = sa.select(c.kafka_partition, c.kafka_offset, c.payload).where(
        c.stream == workload.topic
    )
    rows: list[tuple[int, int, bytes | None]] = _select(db, query)
    return {(p, o): bytes(v or b"").decode() for p, o, v in rows}


def _ledger_rows(db: str, workload: Workload) -> list[tuple[int, int, str]]:
    table = ledger(workload.output)
    query = sa.select(table.c.kafka_partition, table.c.kafka_offset, table.c.value)
    return _select(db, query.order_by(table.c.id))


def check(
    cluster: Cluster,
    workload: Workload,
    events: list[Event],
    db: str | None,
    evidence: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Read the workload's streams (its group's positions, its table) and count its anomalies;
    what explains one goes into ``evidence`` (an ``outbox`` loss: the lost rows)."""
    topic = scan(cluster, workload.topic, workload.partitions)
    if workload.name == "outbox" and db is not None:
        output = scan(cluster, workload.output, workload.partitions)
        pending = _unsent(db, workload)
        found = check_outbox(workload, events, output, pending)
        if found["lost"] and evidence is not None:
            lost = outbox_lost(acknowledged(events, workload), output, pending)
            evidence[f"{workload.name}-lost-rows"] = lost_rows(db, workload, lost)
        return found
    if workload.name == "durable":
        return check_durable(workload, events, topic)
    if workload.name == "share":
        return check_share(workload, events, topic)
    if workload.name == "archive" and db is not None:
        return check_archive(workload, events, _archive_rows(db, workload), topic)
    if workload.name == "sql" and db is not None:
        return check_sql(workload, events, _ledger_rows(db, workload), topic)
    if workload.name == "par":
        return check_par(workload, events, topic)
    if workload.name == "eos":
        output = scan(cluster, workload.output, workload.partitions)
        return check_eos(workload, events, output, topic)
    positions = _committed(cluster, workload)
    return check_alo(workload, events, topic, positions)
