"""Typed archive tables on SQLite and PostgreSQL: columns, evolution, idempotence, queries."""

from __future__ import annotations

import datetime
import decimal
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade.errors import StoreError
from bolide.facade.record import Record
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import MemorySchemaRegistry
from bolide.stores import SqlStore
from bolide.stores.typed_archive import is_typed_table, typed_table_name, write_typed
from tests.avro.conftest import ORDER_V1, ORDER_V2, ORDER_V3, order
from tests.conftest import eventually, make_db_url


def published(serde: AvroSerde, stream: str, offset: int, value: Any, partition: int = 0) -> Record:
    rec = Record(serde.encode(value, stream=stream))
    rec.stream, rec.partition, rec.offset, rec.timestamp_ms = (
        stream,
        partition,
        offset,
        1_000 + offset,
    )
    return rec


def write(store: SqlStore, stream: str, records: list[Record], serde: AvroSerde) -> int:
    with store.engine.begin() as conn:
        return write_typed(conn, stream, records, serde)


def columns(store: SqlStore, table: str) -> dict[str, str]:
    found = sa.inspect(store.engine).get_columns(table)
    return {c["name"]: type(c["type"]).__name__.upper() for c in found}


def rows(store: SqlStore, sql: str) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def test_table_names() -> None:
    assert typed_table_name("orders") == "bolide_avro_orders"
    dotted = typed_table_name("shop.Orders-v2")
    assert dotted.startswith("bolide_avro_shop_orders_v2_") and len(dotted) == 35
    assert typed_table_name("shop_orders_v2") != typed_table_name("shop.orders.v2")
    assert len(typed_table_name("x" * 249)) <= 63
    assert is_typed_table(dotted) and not is_typed_table("bolide_records")


def test_columns_flatten_one_level_and_keep_json(sql_store: SqlStore) -> None:
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    recs = [published(serde, "orders", n, order(n)) for n in range(4)]
    assert write(sql_store, "orders", recs, serde) == 4
    table = typed_table_name("orders")
    cols = columns(sql_store, table)
    assert list(cols) == [
        "kafka_partition",
        "kafka_offset",
        "timestamp_ms",
        "schema_id",
        "address__city",
        "address__zip",
        "amount",
        "customer",
        "id",
        "tags",
    ]
    got = rows(sql_store, f"SELECT kafka_offset, id, address__city, tags FROM {table} ORDER BY 1")
    assert got == [
        (n, n, "Lyon" if n % 2 else "Paris", json.dumps(["gift"] * (n % 2))) for n in range(4)
    ]


def test_rewrites_are_idempotent_and_bad_payloads_skipped(sql_store: SqlStore) -> None:
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    good = [published(serde, "o", n, order(n)) for n in range(3)]
    bad = Record(b"\x00\x00\x00\x00\x2ajunk")
    bad.partition, bad.offset = 0, 3
    assert write(sql_store, "o", [*good, bad], serde) == 3
    assert write(sql_store, "o", good, serde) == 0
    assert rows(sql_store, "SELECT count(*) FROM bolide_avro_o") == [(3,)]


def test_evolution_adds_columns_and_never_drops(sql_store: SqlStore) -> None:
    registry = MemorySchemaRegistry()
    v1, v2, v3 = (AvroSerde(s, registry=registry) for s in (ORDER_V1, ORDER_V2, ORDER_V3))
    write(sql_store, "o", [published(v1, "o", 0, order(0))], v1)
    write(sql_store, "o", [published(v2, "o", 1, order(1, country="DE"))], v2)
    v3_value = {k: v for k, v in order(2, country="IT").items() if k != "tags"}
    write(sql_store, "o", [published(v3, "o", 2, v3_value)], v3)
    cols = columns(sql_store, "bolide_avro_o")
    assert {"country", "tags"} <= set(cols)
    got = rows(
        sql_store, "SELECT kafka_offset, schema_id, country, tags FROM bolide_avro_o ORDER BY 1"
    )
    ids = [registry.latest("o-value").schema_id - 2 + i for i in range(3)]  # type: ignore[union-attr]
    assert got == [(0, ids[0], None, "[]"), (1, ids[1], "DE", '["gift"]'), (2, ids[2], "IT", None)]


def test_a_changed_sql_type_gets_its_own_column(sql_store: SqlStore) -> None:
    registry = MemorySchemaRegistry()
    ints = {"type": "record", "name": "M", "fields": [{"name": "qty", "type": "int"}]}
    doubles = {"type": "record", "name": "M", "fields": [{"name": "qty", "type": "double"}]}
    old, new = AvroSerde(ints, registry=registry), AvroSerde(doubles, registry=registry)
    write(sql_store, "m", [published(old, "m", 0, {"qty": 3})], old)
    write(sql_store, "m", [published(new, "m", 1, {"qty": 2.5})], new)
    assert rows(sql_store, "SELECT kafka_offset, qty, qty__real FROM bolide_avro_m ORDER BY 1") == [
        (0, 3, None),
        (1, None, 2.5),
    ]


def test_reader_schema_shapes_the_table(sql_store: SqlStore) -> None:
    registry = MemorySchemaRegistry()
    v1 = AvroSerde(ORDER_V1, registry=registry)
    as_v2 = AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2)
    write(sql_store, "o", [published(v1, "o", 0, order(0))], as_v2)
    assert rows(sql_store, "SELECT country FROM bolide_avro_o") == [("FR",)]


LOGICAL = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "ok", "type": "boolean"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "raw", "type": "bytes"},
        {"name": "maybe", "type": ["null", "long"], "default": None},
        {"name": "either", "type": ["null", "long", "string"], "default": None},
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
    ],
}


def test_logical_and_union_types(sql_store: SqlStore) -> None:
    serde = AvroSerde(LOGICAL, registry=MemorySchemaRegistry())
    ref = uuid.uuid4()
    value = {
        "ok": True,
        "day": datetime.date(2026, 11, 21),
        "at": datetime.datetime(2026, 11, 21, 12, 30, tzinfo=datetime.UTC),
        "price": decimal.Decimal("12.34"),
        "ref": str(ref),
        "kind": "B",
        "raw": b"\x00\xff",
        "maybe": 7,
        "either": "x",
        "attrs": {"k": "v"},
    }
    write(sql_store, "e", [published(serde, "e", 0, value)], serde)
    [row] = rows(
        sql_store, "SELECT ok, day, price, ref, kind, raw, maybe, either, attrs FROM bolide_avro_e"
    )
    assert row[0] in (True, 1)
    assert str(row[1]) == "2026-11-21"  # SQLite answers raw SQL with text
    assert decimal.Decimal(str(row[2])) == decimal.Decimal("12.34")
    assert row[3:] == (str(ref), "B", b"\x00\xff", 7, '"x"', '{"k": "v"}')
    with sql_store.engine.connect() as conn:
        at = conn.execute(sa.text("SELECT at FROM bolide_avro_e")).scalar_one()
    assert str(at).startswith("2026-11-21 12:30:00")


def documented_query() -> str:
    """The first SQL block of docs/schemas.md."""
    text = (Path(__file__).parents[2] / "docs" / "schemas.md").read_text()
    return text.split("```sql\n", 1)[1].split("```", 1)[0]


def test_the_documented_query(sql_store: SqlStore) -> None:
    """The query shown in docs/schemas.md, on the table it describes."""
    serde = AvroSerde(ORDER_V2, registry=MemorySchemaRegistry())
    values = [order(n, country="FR" if n % 3 else "DE") for n in range(12)]
    recs = [published(serde, "orders", n, v) for n, v in enumerate(values)]
    write(sql_store, "orders", recs, serde)
    expected: dict[str, list[float]] = {}
    for v in values:
        if v["country"] == "FR" and v["address"]["city"] == "Lyon":
            expected.setdefault(v["customer"], []).append(v["amount"])
    assert expected  # the data has rows for the query to find
    got = rows(sql_store, documented_query())
    assert got == [(c, len(a), sum(a)) for c, a in sorted(expected.items())]


def test_records_need_positions(sql_store: SqlStore) -> None:
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with pytest.raises(ValueError, match="partition/offset"):
        write(sql_store, "o", [Record(serde.encode(order(1), stream="o"))], serde)


def test_typed_tables_stay_out_of_alembic_check(sql_store: SqlStore) -> None:
    from alembic import command

    from bolide.stores._migrate import alembic_config

    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    write(sql_store, "o", [published(serde, "o", 0, order(0))], serde)
    with sql_store.engine.begin() as conn:
        command.check(alembic_config(conn))  # raises when models and database differ


@pytest.mark.postgres
@pytest.mark.parametrize("table_exists", [True, False], ids=["widen", "create"])
def test_two_writers_changing_one_table_at_once(
    tmp_path: Path, request: pytest.FixtureRequest, pg_admin: sa.Engine, table_exists: bool
) -> None:
    registry = MemorySchemaRegistry()
    v1, v2 = AvroSerde(ORDER_V1, registry=registry), AvroSerde(ORDER_V2, registry=registry)
    with SqlStore(make_db_url("postgresql", tmp_path, request)) as store:
        store.upgrade()
        if table_exists:
            write(store, "w", [published(v1, "w", 0, order(0))], v1)
        errors: list[BaseException] = []

        def second() -> None:
            try:
                write(store, "w", [published(v2, "w", 2, order(2, country="IT"))], v2)
            except BaseException as exc:
                errors.append(exc)

        with store.engine.connect() as first:
            with first.begin():  # widens (or creates) the table and holds it, uncommitted
                write_typed(first, "w", [published(v2, "w", 1, order(1, country="DE"))], v2)
                thread = threading.Thread(target=second)
                thread.start()
                eventually(lambda: _lock_waits(pg_admin) > 0)  # the second writer waits
            thread.join(30)
        assert not errors, errors
        got = rows(store, "SELECT kafka_offset, country FROM bolide_avro_w ORDER BY 1")
        assert got == ([(0, None)] if table_exists else []) + [(1, "DE"), (2, "IT")]


def _lock_waits(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar_one()
        )


def _schema(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}


def test_names_the_database_confuses_keep_their_columns_across_writes(
    sql_store: SqlStore,
) -> None:
    """Whichever field comes first keeps the plain column; later writes find theirs again."""
    lower = AvroSerde(_schema(("name", "string")), registry=MemorySchemaRegistry())
    both = AvroSerde(
        _schema(("name", "string"), ("Name", "string")), registry=MemorySchemaRegistry()
    )
    write(sql_store, "c", [published(lower, "c", 0, {"name": "low0"})], lower)
    write(sql_store, "c", [published(both, "c", 1, {"name": "low1", "Name": "UP1"})], both)
    write(sql_store, "c", [published(lower, "c", 2, {"name": "low2"})], lower)
    write(sql_store, "c", [published(both, "c", 3, {"name": "low3", "Name": "UP3"})], both)
    cols = [
        c for c in columns(sql_store, "bolide_avro_c") if c not in ("timestamp_ms", "schema_id")
    ]
    assert len(cols) == 4  # the keys, name, and one more for Name
    [upper] = [c for c in cols if c.startswith("Name")]
    got = rows(sql_store, f'SELECT kafka_offset, name, "{upper}" FROM bolide_avro_c ORDER BY 1')
    assert got == [(0, "low0", None), (1, "low1", "UP1"), (2, "low2", None), (3, "low3", "UP3")]


@pytest.mark.postgres
def test_rows_the_database_refuses_are_left_out_and_reported(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    serde = AvroSerde(_schema(("s", "string")), registry=MemorySchemaRegistry())
    bad = {2, 5, 6}
    recs = [published(serde, "n", i, {"s": "x\x00" if i in bad else f"s{i}"}) for i in range(9)]
    refused: list[tuple[list[Record], BaseException]] = []
    with SqlStore(make_db_url("postgresql", tmp_path, request)) as store:
        store.upgrade()
        with store.engine.begin() as conn:
            inserted = write_typed(
                conn, "n", recs, serde, on_reject=lambda r, e: refused.append((r, e))
            )
            conn.execute(sa.text("SELECT 1"))  # the transaction is still usable
        assert inserted == 6
        assert rows(store, "SELECT kafka_offset FROM bolide_avro_n ORDER BY 1") == [
            (i,) for i in range(9) if i not in bad
        ]
    assert sorted(r.offset for batch, _ in refused for r in batch) == sorted(bad)
    assert all(isinstance(e, StoreError) and not e.retriable for _, e in refused)


def test_a_rolled_back_transaction_leaves_no_typed_table(sql_store: SqlStore) -> None:
    """Table changes and rows belong to the caller's transaction, on SQLite too."""
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    with sql_store.engine.connect() as conn, conn.begin() as transaction:
        assert write_typed(conn, "rb", [published(serde, "rb", 0, order(0))], serde) == 1
        transaction.rollback()
    assert not sa.inspect(sql_store.engine).has_table("bolide_avro_rb")
