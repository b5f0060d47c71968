"""An exactly-once worker for the kill tests: reads a stream, processes each record, and is
SIGKILLed at random points.

Modes:

``sql``
    an ungrouped subscriber with ``SqlPositions``: each batch's records are inserted into
    ``TABLE`` (no unique key) and the positions confirmed in the same database transaction;
``txn``
    a grouped subscriber and a transactional publisher: each batch is published to ``OUTPUT``
    and its input positions confirmed in one Kafka transaction. Output records carry their
    input's place (``in``) and the run and transaction they were written in (``run``,
    ``txn``).

One line per committed batch, ``C <run> <txn> <records>``, written unbuffered after the
commit returned.

Usage: ``python -m tests.reliability.eos_worker MODE BOOTSTRAP TOPIC PARTITIONS NAME LOG RUN
[--db URL --table T] [--output TOPIC]``.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import time
from typing import TextIO

import sqlalchemy as sa

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
from bolide.stores import SqlPositions, SqlStore

LEASE_MS = 4_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eos_worker")
    parser.add_argument("mode", choices=("sql", "txn"))
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("partitions", type=int)
    parser.add_argument("name")
    parser.add_argument("log")
    parser.add_argument("run")
    parser.add_argument("--db", default=None)
    parser.add_argument("--table", default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--max-batch", type=int, default=50)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the work, per batch")
    return parser


def ledger_table(name: str) -> sa.Table:
    """The application's table: one row per processed record, and no unique key."""
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.Column("value", sa.LargeBinary),
    )


def stream_of(args: argparse.Namespace, name: str) -> StreamConfig:
    return StreamConfig(name=name, partitions=args.partitions, global_order=args.partitions == 1)


def run_sql(args: argparse.Namespace, out: TextIO) -> None:
    store = SqlStore(args.db)
    table = ledger_table(args.table)
    config = SubscriberConfig(
        stream=stream_of(args, args.topic),
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        max_batch=args.max_batch,
        positions=SqlPositions(store, group=args.name),
    )
    count = 0
    with Subscriber(Cluster(args.bootstrap), config) as sub:
        while True:
            batch = sub.poll(200)
            if not batch:
                continue
            time.sleep(args.delay_ms / 1000)
            with store.engine.begin() as conn:
                rows = [
                    {"kafka_partition": r.partition, "kafka_offset": r.offset, "value": r.data}
                    for r in batch
                ]
                conn.execute(table.insert(), rows)
                sub.confirm(conn=conn)
            count += 1
            out.write(f"C {args.run} {count} {len(batch)}\n")


def run_txn(args: argparse.Namespace, out: TextIO) -> None:
    cluster = Cluster(args.bootstrap)
    config = SubscriberConfig(
        stream=stream_of(args, args.topic),
        group=args.name,
        lease_timeout_ms=LEASE_MS,
        max_batch=args.max_batch,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
    )
    output = PublisherConfig(
        stream=stream_of(args, args.output), transactional_id=f"{args.name}-processor"
    )
    count = 0
    with Publisher(cluster, output) as pub, Subscriber(cluster, config) as sub:
        while True:
            batch = sub.poll(200)
            if not batch:
                continue
            count += 1
            time.sleep(args.delay_ms / 1000)
            with pub.transaction():
                for r in batch:
                    headers = [
                        ("in", f"{r.partition}:{r.offset}".encode()),
                        ("run", args.run.encode()),
                        ("txn", str(count).encode()),
                    ]
                    pub.publish_async(Record(r.data, key=r.key, headers=headers))
                pub.confirm(sub)
            out.write(f"C {args.run} {count} {len(batch)}\n")


def main() -> None:
    args = _parser().parse_args()
    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, for the test's report
    with open(args.log, "a", buffering=1, encoding="utf-8") as out:
        (run_sql if args.mode == "sql" else run_txn)(args, out)


if __name__ == "__main__":
    main()
