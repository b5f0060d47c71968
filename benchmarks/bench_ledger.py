"""The completion ledger: records run again when a parallel receiver's partition changes owner
while a slow record holds its head, and the commit metadata that saves them.

One partition of ``1 + ahead`` records; a grouped subscriber's parallel receiver
(``concurrency`` 32, unordered) blocks on record 0 and finishes the others. Once every record
above the head is finished and committed, the subscriber is closed at once (the head
abandoned) and a second member of the group takes the partition over and handles what it is
handed. Without a ledger the committed position stays at the head, so the next owner runs
every record above it again: that count is the "frontier only" column, read from the same run
(the records finished above the committed position when the partition moved). The "ledger"
column counts what the next owner really ran again. Also reported: the bytes of the commit
metadata that carried the finished set, for each position store (Kafka's group offsets and
``SqlPositions``).

Run from the repository root: ``python -m benchmarks.bench_ledger [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from benchmarks._common import (
    Context,
    Report,
    bench_databases,
    markdown_table,
    standalone,
    wait_until,
)
from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.consumer.ledger import decode_finished
from bolide.facade.kafka import probe_consumer
from bolide.stores import SqlPositions, SqlStore

NAME = "ledger"
CONCURRENCY = 32
_TIMEOUT_S = 300.0


class _Handler:
    """Holds record 0 until ``release``; notes every record it handles (and, with a store,
    writes each one's position in its own transaction, as an application's effects would)."""

    def __init__(self, confirm: Callable[[Record], None] | None) -> None:
        self.confirm = confirm
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.handled: set[int] = set()
        self.failed = 0  # a confirm refused (a busy database): the record runs again later

    def __call__(self, record: Record) -> None:
        offset = record.offset or 0
        if offset == 0 and not self.release.is_set():
            self.release.wait(_TIMEOUT_S)
            return  # abandoned: the next owner runs it
        try:
            if self.confirm is not None:
                self.confirm(record)
        except Exception:
            with self.lock:
                self.failed += 1
            raise
        with self.lock:
            self.handled.add(offset)

    def count(self) -> int:
        with self.lock:
            return len(self.handled)

    def settled(self, ahead: int) -> bool:
        """Every record above the head handled or failed."""
        with self.lock:
            return len(self.handled) + self.failed >= ahead


def _stored(cluster: Cluster, stream: str, group: str, store: SqlStore | None) -> tuple[int, str]:
    """The committed position of partition 0 and the metadata written with it."""
    if store is not None:
        position = SqlPositions(store).positions(group, stream).get(0, 0)
        return position, SqlPositions(store).finished(group, stream, [0]).get(0, "")
    probe = probe_consumer(cluster, **{"group.id": group})
    try:
        (tp,) = probe.committed([TopicPartition(stream, 0)], timeout=30)
    finally:
        probe.close()
    return max(tp.offset, 0), tp.metadata or ""


def _config(stream: StreamConfig, group: str, store: SqlStore | None) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream,
        group=group,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        positions=SqlPositions(store) if store is not None else None,
    )


def _handler(sub: Subscriber, store: SqlStore | None) -> _Handler:
    if store is None:
        return _Handler(None)

    def confirm(record: Record) -> None:
        with store.engine.begin() as conn:
            sub.confirm(record.offset, partition=record.partition, conn=conn)

    return _Handler(confirm)


def run_once(cluster: Cluster, ahead: int, store: SqlStore | None) -> dict[str, Any]:
    """One handover with a held head: what the next owner ran again, and the metadata size."""
    stream = StreamConfig(name=f"bench-ledger-{time.time_ns()}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(1 + ahead):
            pub.publish_async(Record(b"%d" % i))
        pub.flush(_TIMEOUT_S)
    group = f"bench-ledger-{time.time_ns()}"
    first = Subscriber(cluster, _config(stream, group, store))
    handler = _handler(first, store)
    receiver = first.attach_receiver(
        handler, concurrency=CONCURRENCY, ordering="unordered", max_in_flight=2 * ahead + 64
    )

    def all_committed() -> bool:
        position, text = _stored(cluster, stream.name, group, store)
        return len(decode_finished(position, text, where=NAME)) >= handler.count()

    wait_until(lambda: handler.settled(ahead), f"{NAME}: the records above the head", 300)
    wait_until(all_committed, f"{NAME}: the finished set committed", 300)
    position, text = _stored(cluster, stream.name, group, store)
    above = len(decode_finished(position, text, where=NAME))
    receiver.close(timeout_s=0)
    first.close()
    handler.release.set()
    second = Subscriber(cluster, _config(stream, group, store))
    again = _handler(second, store)
    again.release.set()
    try:
        receiver = second.attach_receiver(again, concurrency=CONCURRENCY, ordering="unordered")
        wait_until(lambda: _stored(cluster, stream.name, group, store)[0] > ahead,
                   f"{NAME}: the next owner reaches the end", 300)  # fmt: skip
        receiver.close()
    finally:
        second.close()
    return {
        "frontier_only": above,
        "ledger": len(again.handled & handler.handled),
        "metadata_bytes": len(text.encode()),
        "refused": handler.failed,
    }


def bench(context: Context) -> Report:
    """``run_all``'s entry: Kafka's group offsets, then ``SqlPositions`` on each database."""
    ahead = 50 if context.quick else 1_000
    rows: list[list[object]] = []
    data: dict[str, Any] = {"concurrency": CONCURRENCY, "ahead": ahead}

    def row(name: str, store: SqlStore | None) -> None:
        context.say(NAME, name)
        found = data[name] = run_once(context.cluster, ahead, store)
        rows.append([name, found["frontier_only"], found["ledger"], found["metadata_bytes"]])

    row("Kafka group offsets", None)
    with bench_databases(context.pg_url, NAME) as databases:
        for database, url in databases:
            with SqlStore(url) as store:
                row(f"SqlPositions ({database})", store)
    headers = [
        "positions",
        "run again, frontier only",
        "run again, ledger",
        "metadata bytes",
    ]
    title = (
        f"{NAME}: a partition changes owner with its head held and {ahead} records finished "
        f"above it (concurrency {CONCURRENCY}; {context.broker})"
    )
    return Report(title, markdown_table(headers, rows), [], data)


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
