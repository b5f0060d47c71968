"""A workload's worker process: reads its stream in a group and records what it does in the
history, until the stop file appears (or its parent dies).

Modes:

``alo``
    at-least-once: a grouped subscriber that records each record it processed (``read``),
    then confirms the batch (``confirm``, with the positions after it).
``sql``
    effects and positions in one database transaction: each batch's rows are inserted into the
    ledger table ``OUTPUT`` and its positions confirmed (``SqlPositions``) in the same
    transaction of the database ``DB`` (``db-commit``, once it returned).
``par``
    a parallel receiver keeping key order, with retry tiers: records whose number is a
    multiple of 7 fail their first call in each process (``read`` once handled, ``dead``
    when given up; ``assigned`` with the positions resumed, and ``revoked``). The tiers'
    transactional id is the slot's, so a restarted worker aborts the round its killed
    predecessor left open instead of leaving it to the transaction timeout.
``archive``
    the archiver copies the stream into the history store of the database ``DB`` (its own
    consumer group; a batch's rows in one transaction, then its offsets), recording the
    positions it reports (``archived``).
``durable``
    a durable client (``<GROUP>-<SLOT>``, registry in the database ``DB``) reading every
    partition: ``connect`` with its state and marker, ``read`` with ``replayed``, ``live`` once
    its replay is over, ``confirm`` after each batch. A slot's restarts reconnect the same
    client; while its killed predecessor's claim lasts the connect is refused, and retried.
``share``
    a member of the share group ``GROUP``: ``read`` each record it acquired (with its
    ``delivery_count``), then ``ack`` them all (``confirm``, which waits for the broker).
``outbox``
    a transactional outbox relay (``OUTPUT`` is the stream its rows name): each batch of rows
    published in a Kafka transaction of the slot's id, then marked sent; the rows still
    pending are recorded every second (``pending``).
``eos``
    exactly-once read-process-publish: each batch is published to the output stream and its
    input positions confirmed in one Kafka transaction (``txn`` events: ``begin``, then
    ``commit``, ``abort``, or ``in-doubt`` for a commit the cluster never answered). Output
    records carry their input's place (``in``) and their transaction (``txn``). The
    transactional id is the slot's, so a restarted worker fences its predecessor, and a
    paused one that wakes after its lease is fenced by the group.

Usage: ``python -m tests.chaos.worker MODE BOOTSTRAP TOPIC OUTPUT PARTITIONS GROUP SLOT DB
HISTORY PROC STOP`` (``DB``: a database URL, or ``-``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    RecordBatch,
    Retry,
    RetryTier,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.errors import (
    BolideError,
    DurableClientBusyError,
    StoreError,
    TransactionInDoubtError,
)
from bolide.stores import Archiver, ArchiverStats, Outbox, RelayConfig, SqlPositions, SqlStore
from tests.chaos.history import History
from tests.chaos.supervisor import PARENT_ENV

#: The subscribers' lease: a worker paused longer than this wakes up a zombie.
LEASE_MS = 4_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tests.chaos.worker")
    modes = ("alo", "archive", "durable", "eos", "outbox", "sql", "par", "share")
    parser.add_argument("mode", choices=modes)
    for name in ("bootstrap", "topic", "output"):
        parser.add_argument(name)
    parser.add_argument("partitions", type=int)
    for name in ("group", "slot", "db", "history", "proc", "stop"):
        parser.add_argument(name)
    return parser


def ledger(name: str) -> sa.Table:
    """The ``sql`` workload's table: one row per record processed, numbered in commit order,
    no unique key (a duplicate would show)."""
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.Column("value", sa.Text),
    )


def stream(name: str, partitions: int) -> StreamConfig:
    """The workloads' streams: replicated three times, two replicas in sync for a write."""
    return StreamConfig(
        name=name,
        partitions=partitions,
        global_order=False,
        replication_factor=3,
        min_insync_replicas=2,
    )


def _reporter(history: History) -> Callable[[str, BaseException | None], None]:
    """An error handler that keeps each report in the history (``error``): a failed
    positioning or a lost lease shows in the trace of an anomaly."""

    def report(summary: str, error: BaseException | None) -> None:
        detail = None if error is None else f"{type(error).__name__}: {error}"[:300]
        history.add("error", summary=summary[:300], error=detail)

    return report


def _subscriber(args: argparse.Namespace, history: History, **extra: Any) -> Subscriber:
    config = SubscriberConfig(
        stream=stream(args.topic, args.partitions),
        group=args.group,
        lease_timeout_ms=LEASE_MS,
        max_batch=50,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        **({"error_handler": _reporter(history)} | extra),
    )
    return Subscriber(Cluster(args.bootstrap), config)


def _read(history: History, batch: RecordBatch, **fields: str) -> dict[int, int]:
    after: dict[int, int] = {}
    for r in batch:
        value = (r.data or b"").decode()
        history.add("read", p=r.partition, o=r.offset, value=value, **fields)
        after[r.partition or 0] = (r.offset or 0) + 1
    return after


def run_alo(args: argparse.Namespace, history: History) -> None:
    with _subscriber(args, history) as sub:
        while not os.path.exists(args.stop):
            batch = sub.poll(200)
            if not len(batch):
                continue
            after = _read(history, batch)
            try:
                sub.confirm()
            except BolideError as exc:
                history.add("confirm-failed", error=type(exc).__name__)
                continue
            history.add("confirm", positions=after)


def run_eos(args: argparse.Namespace, history: History) -> None:
    cluster = Cluster(args.bootstrap)
    output = PublisherConfig(
        stream=stream(args.output, args.partitions), transactional_id=f"{args.group}-{args.slot}"
    )
    count = 0
    with Publisher(cluster, output) as pub, _subscriber(args, history) as sub:
        while not os.path.exists(args.stop):
            batch = sub.poll(200)
            if not len(batch):
                continue
            count += 1
            txn = f"{args.proc}:{count}"
            history.add("txn", status="begin", txn=txn)
            after = _read(history, batch, txn=txn)
            try:
                with pub.transaction():
                    for r in batch:
                        place = f"{r.partition}:{r.offset}".encode()
                        headers = [("in", place), ("txn", txn.encode())]
                        pub.publish_async(Record(r.data, key=r.key, headers=headers))
                    pub.confirm(sub)
            except TransactionInDoubtError as exc:  # committed or not: the next one settles it
                history.add("txn", status="in-doubt", txn=txn, error=type(exc).__name__)
                raise
            except BolideError as exc:
                history.add("txn", status="abort", txn=txn, error=type(exc).__name__)
                raise
            history.add("txn", status="commit", txn=txn, positions=after)


def run_sql(args: argparse.Namespace, history: History) -> None:
    """Each batch's rows and its positions (``SqlPositions``) in one database transaction."""
    store = SqlStore(args.db)
    table = ledger(args.output)
    with _subscriber(args, history, positions=SqlPositions(store)) as sub:
        while not os.path.exists(args.stop):
            batch = sub.poll(200)
            if not len(batch):
                continue
            after = _read(history, batch)
            rows = [
                {"kafka_partition": r.partition, "kafka_offset": r.offset,
                 "value": (r.data or b"").decode()}
                for r in batch
            ]  # fmt: skip
            with store.engine.begin() as conn:
                conn.execute(table.insert(), rows)
                sub.confirm(conn=conn)
            history.add("db-commit", values=[row["value"] for row in rows], positions=after)


def run_archive(args: argparse.Namespace, history: History) -> None:
    """The archiver in its own thread; this one waits for the stop file, or for the archiver
    to stop by itself (then ``stop`` raises what stopped it, and the process exits)."""

    def progress(stats: ArchiverStats) -> None:
        history.add("archived", positions={str(p): o for (_, p), o in stats.positions.items()})

    settings = {"session.timeout.ms": LEASE_MS, "heartbeat.interval.ms": LEASE_MS // 4}
    with SqlStore(args.db) as store:
        archiver = Archiver(
            Cluster(args.bootstrap), store, [stream(args.topic, args.partitions)],
            group=args.group, batch_size=50, consumer_config=settings, progress=progress,
            progress_interval_s=0.5, error_handler=lambda summary, error: None,
        )  # fmt: skip
        archiver.start()
        started = False
        try:
            while not os.path.exists(args.stop):
                closed = archiver.health(lag=False).closed
                if closed and started:
                    break
                started = started or not closed
                time.sleep(0.2)
        finally:
            archiver.stop(60)


def _durable(args: argparse.Namespace, history: History, store: SqlStore) -> Subscriber:
    """Connect the slot's durable client, again while another connection still holds it."""
    config = SubscriberConfig(
        stream=stream(args.topic, args.partitions), durable_id=f"{args.group}-{args.slot}",
        durable_registry=store, durable_timeout_s=3600, lease_timeout_ms=LEASE_MS,
        max_batch=50, initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        on_live=lambda: history.add("live"), error_handler=lambda summary, error: None,
    )  # fmt: skip
    while True:
        try:
            sub = Subscriber(Cluster(args.bootstrap), config)
        except DurableClientBusyError:
            if os.path.exists(args.stop):
                raise
            time.sleep(1.0)
            continue
        assert sub.durable is not None
        history.add("connect", state=sub.durable.state, marker=sub.marker)
        return sub


def run_durable(args: argparse.Namespace, history: History) -> None:
    """A durable client: read, record, confirm, until the stop file."""
    with SqlStore(args.db) as store, _durable(args, history, store) as sub:
        while not os.path.exists(args.stop):
            batch = sub.poll(200)
            for r in batch:
                history.add("read", p=r.partition, o=r.offset, value=(r.data or b"").decode(),
                            replayed=r.replayed)  # fmt: skip
            if len(batch):
                sub.confirm()


def run_share(args: argparse.Namespace, history: History) -> None:
    """A share group member: read, record, ack everything read, until the stop file."""
    config = SubscriberConfig(
        stream=stream(args.topic, args.partitions), share_group=args.group, max_batch=50,
        error_handler=lambda summary, error: None,
    )  # fmt: skip
    with Subscriber(Cluster(args.bootstrap), config) as sub:
        while not os.path.exists(args.stop):
            batch = sub.poll(200)
            values = [(r.data or b"").decode() for r in batch]
            for r, value in zip(batch, values, strict=True):
                history.add("read", p=r.partition, o=r.offset, value=value,
                            deliveries=r.delivery_count)  # fmt: skip
            if values:
                history.add("acking", values=values)  # killed from here on: ack unknown
                sub.confirm()
                history.add("ack", values=values)


def run_outbox(args: argparse.Namespace, history: History) -> None:
    """A relay in its own thread; this one records the pending rows every second and exits
    when the relay stops by itself (``close`` raises what stopped it)."""
    config = RelayConfig(
        transactional_id=f"{args.group}-{args.slot}", batch_size=50,
        error_handler=lambda summary, error: None,
    )  # fmt: skip
    with SqlStore(args.db) as store:
        outbox = Outbox(store)
        with outbox.relay(Cluster(args.bootstrap), config) as relay:
            while not os.path.exists(args.stop) and relay.running:
                # The database may be away: the relay outlives that, and so does this.
                with contextlib.suppress(StoreError):
                    history.add("pending", count=outbox.pending(args.output))
                time.sleep(1.0)


def run_par(args: argparse.Namespace, history: History) -> None:
    """A parallel receiver (key order) with retry tiers: every seventh record fails its first
    call in each process and goes through the tiers while its key waits behind it. Its error
    reports go to the history (``error``), so that a stall or a lost lease shows its cause."""
    failed: set[str] = set()
    lock = threading.Lock()

    def handler(r: Record) -> None:
        value = (r.data or b"").decode()
        with lock:
            if int(value.rsplit("-", 1)[1]) % 7 == 0 and value not in failed:
                failed.add(value)
                raise RuntimeError("the first call fails")
        history.add("read", value=value, key=(r.key or b"").decode())

    def dead(r: Record, error: BaseException) -> None:
        value, key = (r.data or b"").decode(), (r.key or b"").decode()
        history.add("dead", value=value, key=key, error=type(error).__name__)

    report = _reporter(history)
    subs: list[Subscriber] = []

    def positions() -> dict[str, int | None]:
        health = subs[0].health(lag=False) if subs else None
        return {} if health is None else {str(h.partition): h.position for h in health.partitions}

    def assigned(parts: list[int]) -> None:  # where each partition resumes, for the trace
        history.add("assigned", partitions=parts, positions=positions())

    def revoked(parts: list[int]) -> None:
        history.add("revoked", partitions=parts)

    tiers = [RetryTier(delay_s=0.5), RetryTier(delay_s=1.0)]
    hooks = {"on_assign": assigned, "on_revoke": revoked}
    with _subscriber(args, history, error_handler=report, **hooks) as sub:
        subs.append(sub)
        sub.attach_receiver(
            handler, concurrency=8, max_in_flight=200, dead_letter=dead,
            retry=Retry(
                attempts=1, backoff_s=0, tiers=tiers,
                transactional_id=f"{args.group}.retry-tiers.{args.slot}",
            ),
        )  # fmt: skip
        while not os.path.exists(args.stop):
            time.sleep(0.1)


def _orphan_watch(parent: int) -> None:
    """Exit when the campaign that started this process (``parent``) is gone, also when it
    died before this process got here: nothing outlives a run."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)


def main() -> None:
    args = _parser().parse_args()
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    threading.Thread(target=_orphan_watch, args=(parent,), name="orphan-watch", daemon=True).start()
    history = History(Path(args.history), args.proc)
    history.add("start", mode=args.mode, pid=os.getpid())
    try:
        modes = {
            "alo": run_alo, "archive": run_archive, "durable": run_durable, "eos": run_eos,
            "outbox": run_outbox, "sql": run_sql, "par": run_par, "share": run_share,
        }  # fmt: skip
        modes[args.mode](args, history)
    except BaseException as exc:
        history.add("exit", error=f"{type(exc).__name__}: {exc}"[:300])
        raise
    history.add("exit", error=None)
    history.close()


if __name__ == "__main__":
    main()
