"""History store throughput: bolide's writes and reads against the databases' own bulk paths.

For SQLite (a temporary file) and PostgreSQL (a fresh schema), with the same rows, into the
same tables. The write ceiling is the database's bulk path, all rows in one transaction:
PostgreSQL's binary ``COPY`` (psycopg 3 ``write_row``) and SQLite's plain ``sqlite3``
``executemany`` (WAL). Against it:

- ingest: ``SqlStore.store_all`` in batches (the archiver's write path: idempotent inserts that
  report the new rows), target >= 0.5x;
- archive: the ``Archiver`` end to end from Kafka, timed from its first committed batch to
  caught up (the group join, a broker matter, is left out), target >= 0.5x;
- Core: a plain SQLAlchemy Core ``executemany`` per batch, for reference;
- spliced read: a subscriber reading half from SQL, against a plain Kafka read, target >= 0.9x;
- durable replay: a durable client's first connect replaying the whole stream, half from SQL,
  against the same plain Kafka read, target >= 0.9x (reads are timed from their first batch, so
  the durable client's group join, a broker matter, is left out);
- read: ``SqlStore.read`` in keyset pages, building ``Record`` objects, against one plain Core
  ``SELECT`` of the same rows and headers.

Run ``python -m benchmarks.bench_store --help`` from the repository root, or ``bolide bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
from bolide.stores import Archiver, SqlStore
from bolide.stores.durable_registry import SqlDurableRegistry
from bolide.stores.schema import HEADERS, RECORDS

__all__ = ["Row", "archive_stream", "bench", "main", "run"]

NAME = "store"


@dataclass
class Row:
    """One measured operation: bolide's rows/s against a ceiling's, with the target ratio."""

    database: str
    operation: str
    rows: int
    bolide_rows_s: float
    ceiling_rows_s: float
    ceiling: str
    target_ratio: float | None = None

    @property
    def ratio(self) -> float:
        """bolide / ceiling."""
        return self.bolide_rows_s / self.ceiling_rows_s if self.ceiling_rows_s else 0.0

    @property
    def target(self) -> str:
        """The target for this row, or ``""``."""
        return "" if self.target_ratio is None else f">= {self.target_ratio}x"

    @property
    def met(self) -> bool | None:
        """Whether the target holds; ``None`` when the row has no target."""
        return None if self.target_ratio is None else self.ratio >= self.target_ratio


def make_records(count: int, payload: int, headers: int, partition: int = 0) -> list[Record]:
    """Records as if published: offsets 0..count-1, a key, ``headers`` headers each."""
    out = []
    body = b"x" * payload
    for i in range(count):
        rec = Record(body, key=f"key-{i % 100}".encode())
        rec.headers = [(f"h{j}", f"value-{i}-{j}".encode()) for j in range(headers)]
        rec.partition, rec.offset, rec.timestamp_ms = partition, i, 1_700_000_000_000 + i
        out.append(rec)
    return out


def _core_rows(stream: str, records: Sequence[Record]) -> tuple[list[dict[str, Any]], list[Any]]:
    rows = [
        {
            "stream": stream,
            "kafka_partition": r.partition,
            "kafka_offset": r.offset,
            "timestamp_ms": r.timestamp_ms,
            "key": r.key,
            "payload": r.data,
        }
        for r in records
    ]
    headers = [
        {
            "stream": stream,
            "kafka_partition": r.partition,
            "kafka_offset": r.offset,
            "header_index": i,
            "name": name,
            "value": value,
        }
        for r in records
        for i, (name, value) in enumerate(r.headers)
    ]
    return rows, headers


def core_ingest(engine: sa.Engine, stream: str, records: Sequence[Record], batch: int) -> float:
    """Plain Core executemany of the same rows, one transaction per batch; rows/s."""
    started = time.perf_counter()
    for i in range(0, len(records), batch):
        rows, headers = _core_rows(stream, records[i : i + batch])
        with engine.begin() as conn:
            conn.execute(sa.insert(RECORDS), rows)
            if headers:
                conn.execute(sa.insert(HEADERS), headers)
    return len(records) / (time.perf_counter() - started)


def _bulk_rows(
    stream: str, records: Sequence[Record]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rows = [(stream, r.partition, r.offset, r.timestamp_ms, r.key, r.data) for r in records]
    headers = [
        (stream, r.partition, r.offset, i, name, value)
        for r in records
        for i, (name, value) in enumerate(r.headers)
    ]
    return rows, headers


def pg_copy_ingest(engine: sa.Engine, stream: str, records: Sequence[Record]) -> float:
    """PostgreSQL's bulk path: binary COPY of every row (psycopg 3), one transaction; rows/s."""
    columns = "stream, kafka_partition, kafka_offset"
    started = time.perf_counter()
    rows, headers = _bulk_rows(stream, records)
    with engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cursor:
            with cursor.copy(
                f"COPY bolide_records ({columns}, timestamp_ms, key, payload)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int4", "int8", "int8", "bytea", "bytea"])
                for row in rows:
                    copy.write_row(row)
            with cursor.copy(
                f"COPY bolide_record_headers ({columns}, header_index, name, value)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int4", "int8", "int4", "text", "bytea"])
                for row in headers:
                    copy.write_row(row)
        raw.commit()
    return len(records) / (time.perf_counter() - started)


def sqlite_bulk_ingest(path: str, stream: str, records: Sequence[Record]) -> float:
    """SQLite's bulk path: plain ``sqlite3`` executemany, WAL, one transaction; rows/s."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        started = time.perf_counter()
        rows, headers = _bulk_rows(stream, records)
        with conn:  # one transaction
            conn.executemany(
                "INSERT INTO bolide_records (stream, kafka_partition, kafka_offset,"
                " timestamp_ms, key, payload) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.executemany(
                "INSERT INTO bolide_record_headers (stream, kafka_partition, kafka_offset,"
                " header_index, name, value) VALUES (?, ?, ?, ?, ?, ?)",
                headers,
            )
        return len(records) / (time.perf_counter() - started)
    finally:
        conn.close()


def store_ingest(store: SqlStore, stream: str, records: Sequence[Record], batch: int) -> float:
    """``SqlStore.store_all`` per batch; rows/s."""
    started = time.perf_counter()
    for i in range(0, len(records), batch):
        store.store_all(stream, records[i : i + batch])
    return len(records) / (time.perf_counter() - started)


def core_read(engine: sa.Engine, stream: str) -> float:
    """One plain Core SELECT of a partition's rows and headers; rows/s."""
    r, h = RECORDS.c, HEADERS.c
    started = time.perf_counter()
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.kafka_offset, r.timestamp_ms, r.key, r.payload)
            .where(r.stream == stream, r.kafka_partition == 0)
            .order_by(r.kafka_offset)
        ).all()
        conn.execute(
            sa.select(h.kafka_offset, h.name, h.value)
            .where(h.stream == stream, h.kafka_partition == 0)
            .order_by(h.kafka_offset, h.header_index)
        ).all()
    return len(rows) / (time.perf_counter() - started)


def store_read(store: SqlStore, stream: str, page: int) -> float:
    """``SqlStore.read`` in keyset pages of ``page``; rows/s."""
    started = time.perf_counter()
    position, total = 0, 0
    while True:
        got = store.read(stream, 0, position, page)
        if not got:
            break
        total += len(got)
        position = (got[-1].offset or 0) + 1
    return total / (time.perf_counter() - started)


def archive(
    cluster: Cluster, store: SqlStore, records: Sequence[Record], batch: int
) -> tuple[float, int, str]:
    """Publish ``records`` to a fresh stream, archive them; rows/s after the first batch."""
    stream = StreamConfig(name=f"bench-store-{uuid.uuid4().hex[:10]}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for rec in records:
            fresh = Record(rec.data, key=rec.key, headers=rec.headers)
            pub.publish_async(fresh)
        pub.flush(120)
    rate, archived = archive_stream(cluster, store, stream, batch)
    return rate, archived, stream.name


def archive_stream(
    cluster: Cluster, store: SqlStore, stream: StreamConfig, batch: int
) -> tuple[float, int]:
    """Archive what ``stream`` holds with a new ``Archiver`` group; (rows/s timed from its
    first committed batch to caught up, rows archived). The group join, a broker matter, is
    left out."""
    marks: list[tuple[float, int]] = []
    archiver = Archiver(
        cluster,
        store,
        [stream],
        group=f"bench-{uuid.uuid4().hex[:8]}",
        batch_size=batch,
        consumer_config={"session.timeout.ms": 4000, "heartbeat.interval.ms": 500},
        progress=lambda s: marks.append((time.perf_counter(), s.records)),
        progress_interval_s=0.0,
    )
    archiver.run(until_caught_up=True)
    first = next((m for m in marks if m[1] > 0), None)
    end = marks[-1]
    if first is None or end[1] <= first[1]:
        return 0.0, end[1]
    return (end[1] - first[1]) / (end[0] - first[0]), end[1]


def _read_all(cluster: Cluster, config: SubscriberConfig, count: int) -> float:
    """Records/s of a subscriber reading ``count`` records, timed from its first batch."""
    with Subscriber(cluster, config) as sub:
        deadline = time.perf_counter() + 120
        seen = 0
        while seen == 0 and time.perf_counter() < deadline:
            seen = len(sub.poll(1_000))
        started = time.perf_counter()
        rest = 0
        while seen + rest < count and time.perf_counter() < deadline:
            rest += len(sub.poll(1_000))
        elapsed = time.perf_counter() - started
        if seen + rest < count:
            raise RuntimeError(f"read {seen + rest} of {count} records within 120 s")
        if config.durable_id is not None:
            sub.close(keep_alive=False)
        return rest / elapsed if elapsed > 0 else 0.0


def spliced_read(
    cluster: Cluster, store: SqlStore, url: str, topic: str, count: int, repeat: int
) -> tuple[float, float, float]:
    """Best records/s of a plain Kafka read, a spliced read and a durable replay of ``topic``.

    The spliced reader's cluster takes Kafka's log start to be half the topic (its
    ``log_start_overrides``, since the embedded broker never trims), so it reads the first half
    from SQL; the durable client (a new one each run, so it replays everything) likewise.
    """
    trimmed = cluster.replace(log_start_overrides={topic: {0: count // 2}})
    earliest = InitialOffsetScheme.EARLIEST
    plain = SubscriberConfig(stream=StreamConfig(name=topic), initial_offset_scheme=earliest)
    spliced_stream = StreamConfig(name=topic, store=store)
    spliced = SubscriberConfig(stream=spliced_stream, initial_offset_scheme=earliest)
    best_plain = best_spliced = best_durable = 0.0
    with SqlDurableRegistry(url) as registry:
        for _ in range(repeat):
            best_plain = max(best_plain, _read_all(cluster, plain, count))
            best_spliced = max(best_spliced, _read_all(trimmed, spliced, count))
            durable = SubscriberConfig(
                stream=spliced_stream,
                durable_id=f"bench-{uuid.uuid4().hex[:8]}",
                durable_registry=registry,
                lease_timeout_ms=4_000,
            )
            best_durable = max(best_durable, _read_all(trimmed, durable, count))
    return best_plain, best_spliced, best_durable


def _alternate(
    repeat: int, core: Callable[[int], float], ours: Callable[[int], float]
) -> tuple[float, float]:
    """Best rows/s of each side over ``repeat`` alternating runs."""
    best_core = best_ours = 0.0
    for i in range(repeat):
        best_core = max(best_core, core(i))
        best_ours = max(best_ours, ours(i))
    return best_core, best_ours


def run(
    *,
    records: int,
    payload: int,
    headers: int,
    batch: int,
    repeat: int,
    pg_url: str | None,
    cluster: Cluster | None,
) -> list[Row]:
    """Measure every operation on every database; return the rows of the table."""
    data = make_records(records, payload, headers)
    out: list[Row] = []
    with bench_databases(pg_url, NAME, upgrade=False) as dbs:
        for name, url in dbs:
            out.extend(_measure(name, url, data, batch, repeat, cluster))
    return out


def _empty(engine: sa.Engine) -> None:
    """Empty the history tables, so every write run starts from the same state."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("TRUNCATE bolide_record_headers, bolide_records"))
        else:
            conn.execute(sa.delete(HEADERS))
            conn.execute(sa.delete(RECORDS))


def _measure(
    name: str,
    url: str,
    data: Sequence[Record],
    batch: int,
    repeat: int,
    cluster: Cluster | None,
) -> list[Row]:
    out: list[Row] = []
    with SqlStore(url) as store:
        store.upgrade()
        engine = store.engine
        if name == "postgresql":
            label = "binary COPY"

            def bulk(_: int) -> float:
                _empty(engine)
                return pg_copy_ingest(engine, "bulk", data)
        else:
            label = "sqlite3 executemany"
            path = str(engine.url.database)

            def bulk(_: int) -> float:
                _empty(engine)
                return sqlite_bulk_ingest(path, "bulk", data)

        def ours(_: int) -> float:
            _empty(engine)
            return store_ingest(store, "ours", data, batch)

        def core(_: int) -> float:
            _empty(engine)
            return core_ingest(engine, "core", data, batch)

        # Alternate the sides run by run, so drift in the machine's load hits them alike; each
        # run starts from empty tables (the key's hash index slows as the tables grow).
        bulk_w, ours_w = _alternate(repeat, bulk, ours)
        out.append(Row(name, f"ingest (batches of {batch})", len(data), ours_w, bulk_w, label, 0.5))
        if cluster is not None:
            _empty(engine)
            rate, count, stream = archive(cluster, store, data, batch)
            out.append(Row(name, "archive from Kafka", count, rate, bulk_w, label, 0.5))
            plain_rate, spliced_rate, durable_rate = spliced_read(
                cluster, store, url, stream, count, repeat
            )
            out.append(
                Row(name, "spliced read (half SQL)", count, spliced_rate, plain_rate, "Kafka", 0.9)
            )
            out.append(
                Row(
                    name, "durable replay (half SQL)", count, durable_rate, plain_rate, "Kafka", 0.9
                )
            )
        else:
            _empty(engine)
            stream = "ours"
            store_ingest(store, stream, data, batch)
        core_r, ours_r = _alternate(
            repeat,
            lambda _: core_read(engine, stream),
            lambda _: store_read(store, stream, 1_000),
        )
        out.append(
            Row(name, "history read (pages of 1000)", len(data), ours_r, core_r, "Core SELECT")
        )
        core_w = max(core(i) for i in range(repeat))
        out.append(Row(name, f"plain Core executemany ({batch})", len(data), core_w, bulk_w, label))
    return out


def table(rows: Sequence[Row]) -> str:
    """The Markdown table of ``rows``."""
    return markdown_table(
        [
            "database",
            "operation",
            "rows",
            "bolide rows/s",
            "ceiling",
            "ceiling rows/s",
            "ratio",
            "target",
            "met",
        ],
        [
            [
                r.database,
                r.operation,
                r.rows,
                f"{r.bolide_rows_s:,.0f}",
                r.ceiling,
                f"{r.ceiling_rows_s:,.0f}",
                f"{r.ratio:.2f}x",
                r.target,
                "" if r.met is None else ("yes" if r.met else "NO"),
            ]
            for r in rows
        ],
    )


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records", type=positive_int, default=100_000, help="rows per run (100000)"
    )
    parser.add_argument("--payload", type=int, default=100, help="payload bytes (100)")
    parser.add_argument("--headers", type=int, default=1, help="headers per record (1)")
    parser.add_argument(
        "--batch", type=positive_int, default=2_000, help="rows per transaction (2000)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="runs per measure, best kept (3)"
    )
    parser.add_argument("--no-kafka", action="store_true", help="skip the archiver measure")


#: ``--quick``: 2,000 records in batches of 500, one run.
QUICK = ["--records", "2000", "--batch", "500", "--repeat", "1"]


def _report(context: Context, args: argparse.Namespace) -> Report:
    """Every row, those with a target also as ratios."""
    params: dict[str, Any] = {
        "records": args.records,
        "payload": args.payload,
        "headers": args.headers,
        "batch": args.batch,
        "repeat": args.repeat,
    }
    context.say(NAME, str(params))
    started = time.monotonic()
    cluster = None if args.no_kafka else context.cluster
    rows = run(**params, pg_url=context.pg_url, cluster=cluster)
    ratios = [
        Ratio(
            NAME,
            f"{r.database}: {r.operation}",
            r.ceiling,
            "rows/s",
            r.ceiling_rows_s,
            r.bolide_rows_s,
            r.target_ratio,
        )
        for r in rows
        if r.target_ratio is not None
    ]
    title = (
        f"history store, {args.records:,} records of {args.payload} B with "
        f"{args.headers} header(s); best of {args.repeat}; {context.broker}, "
        f"{time.monotonic() - started:.0f} s"
    )
    data = {
        "params": params,
        "rows": [
            dict(asdict(r), ratio=round(r.ratio, 3), target=r.target, met=r.met) for r in rows
        ],
    }
    return Report(title, table(rows), ratios, data)


COMMAND = Command(
    NAME,
    _report,
    _options,
    QUICK,
    __doc__,
    database="--pg",
    uses_broker=lambda args: not args.no_kafka,
    full_run=["--repeat", "2"],  # under run_all: best of 2
)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
