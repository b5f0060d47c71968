"""The SQL examples of docs/history.md, run as written on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import Record
from bolide.stores import SqlStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "history.md"
_EXAMPLE = re.compile(r"<!-- sql-example: ([\w-]+) -->\n```sql\n(.*?)```", re.S)


def examples() -> dict[str, str]:
    return dict(_EXAMPLE.findall(DOC.read_text(encoding="utf-8")))


def fill(store: SqlStore) -> None:
    """Two streams; ``orders`` alternates keys and carries a trace header on every record."""
    for stream, partitions in (("orders", 2), ("payments", 1)):
        for partition in range(partitions):
            records = []
            for i in range(6):
                rec = Record(
                    f"{stream} {partition}/{i}".encode(),
                    key=b"ACME" if i % 2 else b"INIT",
                    headers=[("trace", f"t-{i}".encode()), ("source", b"web")],
                )
                rec.partition, rec.offset = partition, 10 + i
                rec.timestamp_ms = 1_700_000_000_000 + 1_000 * i
                records.append(rec)
            store.store_all(stream, records)


#: name -> (parameters, expected rows)
CASES: dict[str, tuple[dict[str, Any], list[tuple[Any, ...]]]] = {
    "by-time": (
        {"stream": "orders", "from_ms": 1_700_000_002_000, "to_ms": 1_700_000_004_000},
        [
            (0, 12, 1_700_000_002_000, b"INIT", b"orders 0/2"),
            (1, 12, 1_700_000_002_000, b"INIT", b"orders 1/2"),
            (0, 13, 1_700_000_003_000, b"ACME", b"orders 0/3"),
            (1, 13, 1_700_000_003_000, b"ACME", b"orders 1/3"),
        ],
    ),
    "by-key": (
        {"stream": "payments", "key": b"ACME"},
        [(0, 11, b"payments 0/1"), (0, 13, b"payments 0/3"), (0, 15, b"payments 0/5")],
    ),
    "by-header": (
        {"stream": "orders", "header": "trace", "value": b"t-4"},
        [(0, 14, b"orders 0/4"), (1, 14, b"orders 1/4")],
    ),
    "summary": (
        {},
        [("orders", 0, 6, 10, 15), ("orders", 1, 6, 10, 15), ("payments", 0, 6, 10, 15)],
    ),
}


def test_every_documented_example_is_tested() -> None:
    assert set(examples()) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_documented_query(store: SqlStore, name: str) -> None:
    fill(store)
    params, expected = CASES[name]
    with store.engine.connect() as conn:
        rows = [tuple(row) for row in conn.execute(sa.text(examples()[name]), params)]
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows] == (
        expected
    )


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("by-key", "ix_bolide_records_key"),
        ("by-header", "ix_bolide_record_headers_value"),
        ("by-time", "ix_bolide_records_stream_time"),
    ],
)
def test_documented_queries_use_their_index(store: SqlStore, name: str, index: str) -> None:
    fill(store)
    params = CASES[name][0]
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.execute(sa.text("SET LOCAL enable_seqscan = off"))  # tiny table: force the choice
            plan = conn.execute(sa.text("EXPLAIN " + examples()[name]), params).all()
        else:
            plan = conn.execute(sa.text("EXPLAIN QUERY PLAN " + examples()[name]), params).all()
    text = "\n".join(str(r[-1]) for r in plan)
    if store.dialect == "postgresql":
        assert index in text, plan
    else:
        # Without ANALYZE statistics SQLite may prefer the primary key's (stream, ...) prefix;
        # either way the table is searched through an index, never scanned.
        assert "SEARCH" in text and "SCAN bolide_records" not in text, plan
