"""Exactly-once costs: each pattern against its at-least-once counterpart, in one run.

- transactional publish: ``with pub.transaction()`` around every ``--txn-size`` records
  (``PublisherConfig(transactional_id=...)``) against a plain idempotent publisher;
- read, process, publish: a grouped subscriber's batches published to an output stream with
  ``pub.confirm(sub)`` in one transaction each, against a plain publish and ``sub.confirm()``;
- SqlPositions confirm: a grouped subscriber's batches inserted into a SQL table with
  ``sub.confirm(conn=conn)`` in the same transaction, against the same inserts followed by a
  Kafka ``sub.confirm()``; on SQLite (a temporary file) and PostgreSQL (a fresh schema).

Rates are records/s; the ratio is exactly-once / baseline. Reading rates are timed from the
first record (the group join, a broker matter, is left out).

Run ``python -m benchmarks.bench_eos --help`` from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    bench_databases,
    markdown_table,
    positive_int,
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
from bolide.stores import SqlPositions, SqlStore

__all__ = ["Row", "bench", "main", "run"]

NAME = "eos"
LEASE_MS = 6_000


@dataclass
class Row:
    """One measure: the exactly-once pattern's records/s against its baseline's."""

    measure: str
    database: str
    records: int
    baseline: str
    baseline_rec_s: float
    eos_rec_s: float

    @property
    def ratio(self) -> float:
        """exactly-once / baseline."""
        return self.eos_rec_s / self.baseline_rec_s if self.baseline_rec_s else 0.0


def _stream(prefix: str) -> StreamConfig:
    return StreamConfig(name=f"bench-eos-{prefix}-{uuid.uuid4().hex[:8]}")


def _fill(cluster: Cluster, count: int, payload: int) -> StreamConfig:
    stream = _stream("in")
    body = b"x" * payload
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_many(Record(body) for _ in range(count)).result(120)
    return stream


def plain_publish(cluster: Cluster, count: int, payload: int, txn_size: int) -> float:
    """A plain idempotent publisher: records/s until the last is acknowledged."""
    body = b"x" * payload
    with Publisher(cluster, PublisherConfig(stream=_stream("plain"))) as pub:
        started = time.perf_counter()
        for _ in range(count):
            pub.produce(Record(body))
        pub.flush(120)
        return count / (time.perf_counter() - started)


def txn_publish(cluster: Cluster, count: int, payload: int, txn_size: int) -> float:
    """A transactional publisher, one transaction per ``txn_size`` records: records/s."""
    body = b"x" * payload
    config = PublisherConfig(stream=_stream("txn"), transactional_id=f"bench-{uuid.uuid4().hex}")
    with Publisher(cluster, config) as pub:
        started = time.perf_counter()
        for start in range(0, count, txn_size):
            with pub.transaction():
                for _ in range(min(txn_size, count - start)):
                    pub.produce(Record(body))
        return count / (time.perf_counter() - started)


def _consume(
    cluster: Cluster,
    stream: StreamConfig,
    count: int,
    handle: Callable[[Subscriber, list[Record]], None],
    *,
    batch: int,
    positions: SqlPositions | None = None,
) -> float:
    """Read ``count`` records in a fresh group, calling ``handle`` per batch: records/s."""
    config = SubscriberConfig(
        stream=stream,
        group=f"bench-{uuid.uuid4().hex[:8]}",
        lease_timeout_ms=LEASE_MS,
        max_batch=batch,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        positions=positions,
    )
    with Subscriber(cluster, config) as sub:
        got = 0
        started = None
        deadline = time.monotonic() + 120
        while got < count and time.monotonic() < deadline:
            records = list(sub.poll(200))
            if not records:
                continue
            if started is None:
                started = time.perf_counter()
            handle(sub, records)
            got += len(records)
        if got < count or started is None:
            raise RuntimeError(f"read {got} of {count} records")
        return count / (time.perf_counter() - started)


def read_process_publish(
    cluster: Cluster, stream: StreamConfig, count: int, batch: int, *, transactional: bool
) -> float:
    """Each batch published to an output stream and confirmed: in one transaction each, or
    a plain publish (flushed) followed by ``sub.confirm()``."""
    tid = f"bench-{uuid.uuid4().hex}" if transactional else None
    with Publisher(cluster, PublisherConfig(stream=_stream("out"), transactional_id=tid)) as pub:

        def in_transaction(sub: Subscriber, records: list[Record]) -> None:
            with pub.transaction():
                for r in records:
                    pub.produce(Record(r.data))
                pub.confirm(sub)

        def plain(sub: Subscriber, records: list[Record]) -> None:
            for r in records:
                pub.produce(Record(r.data))
            pub.flush(60)
            sub.confirm()

        return _consume(
            cluster, stream, count, in_transaction if transactional else plain, batch=batch
        )


def sql_sink(
    cluster: Cluster, stream: StreamConfig, url: str, count: int, batch: int, *, stored: bool
) -> float:
    """Each batch inserted into a table, then confirmed: in the same transaction
    (``SqlPositions``), or to Kafka after the database commit."""
    store = SqlStore(url)
    table = sa.Table(
        f"bench_sink_{uuid.uuid4().hex[:8]}",
        sa.MetaData(),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.Column("value", sa.LargeBinary),
    )
    table.create(store.engine)

    def rows(records: list[Record]) -> list[dict[str, object]]:
        return [
            {"kafka_partition": r.partition, "kafka_offset": r.offset, "value": r.data}
            for r in records
        ]

    def in_transaction(sub: Subscriber, records: list[Record]) -> None:
        with store.engine.begin() as conn:
            conn.execute(table.insert(), rows(records))
            sub.confirm(conn=conn)

    def then_kafka(sub: Subscriber, records: list[Record]) -> None:
        with store.engine.begin() as conn:
            conn.execute(table.insert(), rows(records))
        sub.confirm()

    try:
        if stored:
            return _consume(
                cluster, stream, count, in_transaction, batch=batch, positions=SqlPositions(store)
            )
        return _consume(cluster, stream, count, then_kafka, batch=batch)
    finally:
        store.close()


def _best(repeat: int, base: Callable[[], float], eos: Callable[[], float]) -> tuple[float, float]:
    """Best records/s of each side over ``repeat`` alternating runs."""
    best_base = best_eos = 0.0
    for _ in range(repeat):
        best_base = max(best_base, base())
        best_eos = max(best_eos, eos())
    return best_base, best_eos


def run(
    cluster: Cluster,
    *,
    records: int,
    payload: int,
    txn_size: int,
    batch: int,
    repeat: int,
    pg_url: str | None,
) -> list[Row]:
    """Measure every row; see the module docstring."""
    out: list[Row] = []
    base, eos = _best(
        repeat,
        lambda: plain_publish(cluster, records, payload, txn_size),
        lambda: txn_publish(cluster, records, payload, txn_size),
    )
    out.append(
        Row(f"publish, {txn_size} per transaction", "-", records, "plain publish", base, eos)
    )
    stream = _fill(cluster, records, payload)
    base, eos = _best(
        repeat,
        lambda: read_process_publish(cluster, stream, records, batch, transactional=False),
        lambda: read_process_publish(cluster, stream, records, batch, transactional=True),
    )
    out.append(
        Row(
            f"read-process-publish, {batch} per batch",
            "-",
            records,
            "publish, flush, sub.confirm()",
            base,
            eos,
        )
    )
    with bench_databases(pg_url, NAME) as dbs:
        for name, url in dbs:
            base, eos = _best(
                repeat,
                lambda url=url: sql_sink(cluster, stream, url, records, batch, stored=False),
                lambda url=url: sql_sink(cluster, stream, url, records, batch, stored=True),
            )
            out.append(
                Row(
                    f"insert + confirm, {batch} per batch",
                    name,
                    records,
                    "insert, commit, sub.confirm()",
                    base,
                    eos,
                )
            )
    return out


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    return markdown_table(
        ["measure", "database", "records", "baseline", "baseline rec/s", "exactly-once rec/s",
         "ratio"],
        [
            [r.measure, r.database, r.records, r.baseline, f"{r.baseline_rec_s:,.0f}",
             f"{r.eos_rec_s:,.0f}", f"{r.ratio:.2f}x"]
            for r in rows
        ],
    )  # fmt: skip


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=20_000, help="records (20000)")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes (100)")
    parser.add_argument(
        "--txn-size", type=positive_int, default=500, help="records per transaction (500)"
    )
    parser.add_argument("--batch", type=positive_int, default=500, help="records per poll (500)")
    parser.add_argument("--repeat", type=positive_int, default=2, help="runs, best kept (2)")


#: ``--quick``: 1,000 records, one run.
QUICK = ["--records", "1000", "--repeat", "1"]


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """The table, and each row as a ratio (no targets)."""
    params = {
        "records": args.records,
        "payload": args.payload,
        "txn_size": args.txn_size,
        "batch": args.batch,
        "repeat": args.repeat,
    }
    rows = run(context.cluster, **params, pg_url=context.pg_url)
    ratios = [
        Ratio(
            NAME,
            f"{r.measure}" + ("" if r.database == "-" else f" ({r.database})"),
            r.baseline,
            "records/s",
            r.baseline_rec_s,
            r.eos_rec_s,
        )
        for r in rows
    ]
    title = (
        f"exactly-once, {args.records:,} records of {args.payload} B; best of "
        f"{args.repeat}; {context.broker}"
    )
    data = {"params": params, "rows": [dict(asdict(r), ratio=round(r.ratio, 3)) for r in rows]}
    return Report(title, table(rows), ratios, data)


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__, database="--pg")

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
