"""The demo's ending: SQL queries over the archive, the summary, and the checks behind it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import sqlalchemy as sa

__all__ = ["DemoSummary", "QueryResult", "archive_queries", "print_summary"]


@dataclass(frozen=True)
class QueryResult:
    """One SQL query over the archive and its rows."""

    title: str
    sql: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class DemoSummary:
    """What the demo did, in figures, and which of its claims held.

    Attributes:
        ok: Every check passed.
        checks: Check name -> passed.
        records: Records published (plain orders plus block parts).
        orders: Plain orders; ``blocks``/``block_parts``: multi-part orders and their parts.
        processed: Records the subscriber group processed, redeliveries not counted.
        redelivered: Records delivered again after a lease moved (at-least-once).
        archived: Rows in the history store for the stream.
        typed_rows: Rows in the stream's typed Avro table (decoded fields as columns).
        workdir: Where the demo's files were kept (``None``: a removed temporary directory).
        publish_rate_per_s: Orders per second published flat out (bursts 1 and 3).
        elapsed_s: Wall time of the whole demo.
        failover_s: From a member's leaving to the first record its partitions gave another.
        missed / replayed: Records the durable client missed while away, and replayed.
        live_after_reconnect: Records the durable client read live after its replay.
        blocks_out_of_order: Multi-part orders whose parts reached the stream out of order.
        spark_archived: Rows the Spark archive job wrote (``None`` with ``--quick``).
    """

    ok: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    bootstrap: str = ""
    embedded: bool = False  # the demo started its own broker (gone when it ends)
    db: str = ""
    stream: str = ""
    partitions: int = 0
    symbols: int = 0
    publishers: int = 0
    members: int = 0
    records: int = 0
    orders: int = 0
    blocks: int = 0
    block_parts: int = 0
    processed: int = 0
    redelivered: int = 0
    processed_by_member: dict[str, int] = field(default_factory=dict)
    archived: int = 0
    typed_rows: int = 0
    workdir: str | None = None
    publish_rate_per_s: float = 0.0
    elapsed_s: float = 0.0
    failover_s: float | None = None
    left_member: str = ""
    moved_partitions: list[int] = field(default_factory=list)
    durable_state: str = ""
    missed: int = 0
    replayed: int = 0
    live_after_reconnect: int = 0
    marker: dict[str, int] = field(default_factory=dict)
    blocks_out_of_order: int = 0
    order_violations: list[str] = field(default_factory=list)
    spark_archived: int | None = None
    spark_rows: list[list[Any]] | None = None
    queries: list[QueryResult] = field(default_factory=list)

    def check(self, name: str, passed: bool) -> None:
        """Record one claim and whether it held."""
        self.checks[name] = bool(passed)

    def finish(self) -> DemoSummary:
        """Set ``ok`` from the checks."""
        self.ok = bool(self.checks) and all(self.checks.values())
        return self

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        return asdict(self)


def _queries(stream: str, typed_table: str | None) -> list[tuple[str, str]]:
    out = [
        (
            "records per partition",
            "SELECT kafka_partition AS partition, COUNT(*) AS records, "
            "MIN(kafka_offset) AS first_offset, MAX(kafka_offset) AS last_offset "
            "FROM bolide_records WHERE stream = :stream "
            "GROUP BY kafka_partition ORDER BY kafka_partition",
        ),
        (
            "busiest message groups (the Kafka key)",
            'SELECT key AS "group", COUNT(*) AS records FROM bolide_records '
            "WHERE stream = :stream GROUP BY key ORDER BY records DESC, key LIMIT 5",
        ),
        (
            "multi-part orders, from their sequence headers",
            "SELECT h.value AS block, COUNT(*) AS parts, MIN(h.kafka_offset) AS first_offset "
            "FROM bolide_record_headers h WHERE h.stream = :stream "
            "AND h.name = 'bolide.seq.group' GROUP BY h.value ORDER BY block LIMIT 5",
        ),
    ]
    if typed_table is not None:
        out.append(
            (
                "volume and average price per symbol and side (decoded Avro columns)",
                # The table name comes from typed_table_name(): a safe SQL identifier.
                "SELECT symbol, side, COUNT(*) AS orders, SUM(quantity) AS volume, "  # noqa: S608
                "ROUND(CAST(AVG(price) AS NUMERIC), 2) AS avg_price "
                f'FROM "{typed_table}" WHERE block_id IS NULL '
                "GROUP BY symbol, side ORDER BY volume DESC LIMIT 6",
            )
        )
    return out


def archive_queries(
    engine: sa.Engine, stream: str, typed_table: str | None = None
) -> list[QueryResult]:
    """Run the demo's SQL queries over the archive (portable: SQLite and PostgreSQL)."""
    results = []
    with engine.connect() as conn:
        for title, sql in _queries(stream, typed_table):
            result = conn.execute(sa.text(sql), {"stream": stream})
            columns = list(result.keys())
            rows = [[_plain(v) for v in row] for row in result]
            results.append(QueryResult(title, sql, columns, rows))
    return results


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return "\\x" + raw.hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return float(value) if hasattr(value, "__float__") else str(value)


def print_summary(summary: DemoSummary, out: TextIO) -> None:
    """Print the query results and the summary for people."""
    from bolide.facade.ops.text import table  # the same table layout as `bolide sql`

    for query in summary.queries:
        print(f"\n-- {query.title}\n{query.sql}", file=out)
        print(table(query.columns, [tuple(r) for r in query.rows]), file=out)
    s = summary
    failover = f"{s.failover_s:.2f}s" if s.failover_s is not None else "did not happen"
    lines = [
        ("records", f"{s.records} published by {s.publishers} venues for {s.symbols} symbols "
         f"({s.orders} orders, {s.blocks} multi-part orders in {s.block_parts} parts)"),
        ("group", f"{s.processed} processed by {s.members} members "
         f"({', '.join(f'{k} {v}' for k, v in s.processed_by_member.items())}), "
         f"{s.redelivered} redelivered, {len(s.order_violations)} out of order"),
        ("throughput", f"{s.publish_rate_per_s:,.0f} records/s published (Avro, acks=all)"),
        ("failover", f"{failover}: {s.left_member} left, partitions {s.moved_partitions} moved"),
        ("durable", f"{s.missed} missed while away, {s.replayed} replayed up to the marker, "
         f"then live ({s.live_after_reconnect} live records)"),
        ("resequencer", f"{s.blocks} multi-part orders released whole and in sequence, "
         f"{s.blocks_out_of_order} of them arrived out of order"),
        ("archive", f"{s.archived} records, {s.typed_rows} typed rows in {s.db}"),
    ]  # fmt: skip
    if s.spark_archived is not None:
        lines.append(("spark", f"{s.spark_archived} records archived by Structured Streaming"))
    passed = sum(s.checks.values())
    lines.append(("checks", f"{passed}/{len(s.checks)} passed in {s.elapsed_s:.1f}s"))
    print("\nsummary", file=out)
    for name, text in lines:
        print(f"  {name:<12} {text}", file=out)
    for name, ok in s.checks.items():
        if not ok:
            print(f"  FAILED       {name}", file=out)
    for violation in s.order_violations[:5]:
        print(f"  violation    {violation}", file=out)
    if s.workdir is not None:
        print(f'\nexplore the archive: bolide sql --db {s.db} "SELECT ..."', file=out)
    else:
        print("\n(the demo's files were removed; pass --workdir DIR to keep them)", file=out)
    print(console_hint(s), file=out)


def console_hint(s: DemoSummary) -> str:
    """How to open the web console on the demo's data (the demo's own broker, if it started
    one, is gone: the console needs a cluster that stays)."""
    if s.workdir is not None and not s.embedded:
        return f"open it in the web console: bolide console -b {s.bootstrap} --db {s.db}"
    return (
        "to open the demo in the web console (pip install 'bolide[console]'), run it on a "
        "broker that stays: bolide broker --port 9092 & bolide demo -b 127.0.0.1:9092 "
        "--workdir demo; then bolide console -b 127.0.0.1:9092 --db sqlite:///demo/bolide-demo.db"
    )
