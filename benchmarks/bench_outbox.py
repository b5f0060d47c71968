"""The transactional outbox against a plain publisher: records/s from rows in the outbox to
records acknowledged by Kafka and marked sent, next to ``Publisher.publish_async`` of the same
records in the same run.

The reference publishes N records of 100 bytes over 100 keys and waits for every
acknowledgement. The outbox side adds the same N records to ``bolide_outbox`` in one
application transaction (timed apart, as the application's cost), then times a running relay
(started and idle beforehand, so its start is not counted) from the commit until no row is
pending: claim, publish, wait for the acknowledgements, mark sent. At least once and
transactional (``transactional_id``), on SQLite (a temporary file) and PostgreSQL (a fresh
schema). The ratio is relay records/s over ``publish_async`` records/s.

Run from the repository root: ``python -m benchmarks.bench_outbox [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import time
import uuid

from benchmarks._common import Context, Ratio, Report, bench_databases, markdown_table, standalone
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import ensure_topic
from bolide.stores import Outbox, OutboxRelay, RelayConfig, SqlStore

NAME = "outbox"
PAYLOAD = b"x" * 100
KEYS = 100
PARTITIONS = 3
_TIMEOUT_S = 300.0

#: What each relay must reach against publish_async: the relay's round trips to the
#: database (claim, then mark) cost per batch, not per record.
TARGETS = {"at least once": 0.3, "transactional": 0.15}


def _stream(cluster: Cluster) -> StreamConfig:
    stream = StreamConfig(
        name=f"bench-outbox-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS, global_order=False
    )
    ensure_topic(cluster, stream)
    return stream


def _records(count: int) -> list[Record]:
    return [Record(PAYLOAD, key=b"k%d" % (i % KEYS)) for i in range(count)]


def publish_async_rate(cluster: Cluster, count: int) -> float:
    """records/s of ``publish_async`` until the last acknowledgement."""
    with Publisher(cluster, PublisherConfig(stream=_stream(cluster))) as pub:
        pub.publish(Record(PAYLOAD))  # connected and warm, like the running relay
        records = _records(count)
        started = time.perf_counter()
        futures = [pub.publish_async(r) for r in records]
        for future in futures:
            future.result(_TIMEOUT_S)
        return count / (time.perf_counter() - started)


def relay_rate(cluster: Cluster, url: str, count: int, transactional: bool) -> tuple[float, float]:
    """(relay records/s, add records/s) on the database at ``url``."""
    stream = _stream(cluster)
    tid = f"bench-{uuid.uuid4().hex[:8]}" if transactional else None
    with SqlStore(url) as store:
        outbox = Outbox(store)
        with store.engine.begin() as conn:
            outbox.add(conn, stream, Record(PAYLOAD))
        with outbox.relay(cluster, RelayConfig(transactional_id=tid)) as relay:
            _drain(relay, 1)
            records = _records(count)
            started = time.perf_counter()
            with store.engine.begin() as conn:
                for record in records:
                    outbox.add(conn, stream, record)
            committed = time.perf_counter()
            _drain(relay, 1 + count)
            done = time.perf_counter()
        if outbox.pending():
            raise RuntimeError(f"the relay left {outbox.pending()} rows pending")
    return count / (done - committed), count / (committed - started)


def _drain(relay: OutboxRelay, published: int) -> None:
    """Wait until the relay has published (and marked) ``published`` rows; it is watched in
    memory, so that the wait puts no load on the database."""
    deadline = time.monotonic() + _TIMEOUT_S
    while relay.stats.published < published:
        if not relay.running or time.monotonic() > deadline:
            raise RuntimeError(f"the relay stopped at {relay.stats.published} rows: {relay.error}")
        time.sleep(0.002)


def bench(context: Context) -> Report:
    """``run_all``'s entry: publish_async, then each relay on each database."""
    count = 500 if context.quick else 20_000
    context.say(NAME, f"publish_async, {count} records")
    reference = publish_async_rate(context.cluster, count)
    rows: list[list[object]] = [["publish_async", "-", f"{reference:,.0f}", "", "1.00x"]]
    ratios: list[Ratio] = []
    with bench_databases(context.pg_url, NAME) as dbs:
        for database, url in dbs:
            for mode, target in TARGETS.items():
                context.say(NAME, f"{mode} relay on {database}")
                rate, added = relay_rate(context.cluster, url, count, mode == "transactional")
                metric = f"{mode} relay, {database}"
                ratio = Ratio(NAME, metric, "publish_async", "records/s", reference, rate, target)
                ratios.append(ratio)
                rows.append([f"{mode} relay", database, f"{rate:,.0f}", f"{added:,.0f}",
                             f"{ratio.ratio:.2f}x"])  # fmt: skip
    table = markdown_table(
        ["path", "database", "records/s", "outbox add records/s", "vs publish_async"], rows
    )
    title = (
        f"outbox: relay vs publish_async ({count} records of 100 B, {KEYS} keys, "
        f"{PARTITIONS} partitions; {context.broker})"
    )
    return Report(title, table, ratios, {"records": count, "reference_rec_s": reference})


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
