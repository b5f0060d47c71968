"""The typed archive of Protobuf and JSON Schema streams, on SQLite and PostgreSQL: columns from
plain values, nested messages by their indexes, evolution widening the table, and records that
do not decode left to the raw archive."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from bolide.facade import JsonSchemaSerde, ProtobufSerde
from bolide.facade.record import Record
from bolide.facade.schemas.registry import MemorySchemaRegistry
from bolide.stores import SqlStore
from bolide.stores.typed_archive import typed_table_name, write_typed
from tests.schemas.conftest import ORDER_JSON, Line, Order, json_order, make_order


def at(offset: int, record: Record) -> Record:
    record.stream, record.partition, record.offset, record.timestamp_ms = "s", 0, offset, offset
    return record


def rows(store: SqlStore, sql: str) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def test_a_nested_message_gets_its_own_columns(sql_store: SqlStore) -> None:
    registry = MemorySchemaRegistry()
    lines = ProtobufSerde(Line, registry=registry, framing="header")
    records = [at(n, lines.encode_record(Line(sku=f"s{n}", count=n), stream="s")) for n in range(3)]
    with sql_store.engine.begin() as conn:
        assert write_typed(conn, "s", records, ProtobufSerde(registry=registry)) == 3
    table = typed_table_name("s")
    assert rows(sql_store, f"SELECT kafka_offset, sku, count FROM {table} ORDER BY 1") == [
        (n, f"s{n}", n) for n in range(3)
    ]


def test_protobuf_rows_and_what_does_not_decode(sql_store: SqlStore) -> None:
    serde = ProtobufSerde(Order, registry=MemorySchemaRegistry())
    records = [at(n, Record(serde.encode(make_order(n), stream="s"))) for n in range(2)]
    records.append(at(2, Record(b"\x00\x00\x00\x00\x63 not protobuf")))
    with sql_store.engine.begin() as conn:
        assert write_typed(conn, "s", records, serde) == 2
    got = rows(
        sql_store, f"SELECT id, ok, big, tags, status FROM {typed_table_name('s')} ORDER BY 1"
    )
    assert [(r[0], bool(r[1]), r[2], json.loads(r[3]), r[4]) for r in got] == [
        ("o0", False, 0, [], "NEW"),
        ("o1", False, -1, ["gift"], "PAID"),
    ]


def test_a_new_json_property_widens_the_table(sql_store: SqlStore) -> None:
    registry = MemorySchemaRegistry()
    registry.set_compatibility("s-value", "NONE")
    v1 = JsonSchemaSerde(ORDER_JSON, registry=registry)
    wider = {
        **ORDER_JSON,
        "properties": {**ORDER_JSON["properties"], "note": {"type": ["string", "null"]}},
    }
    v2 = JsonSchemaSerde(wider, registry=registry)
    records = [at(0, Record(v1.encode(json_order(0), stream="s")))]
    records.append(at(1, Record(v2.encode({**json_order(1), "note": "gift"}, stream="s"))))
    with sql_store.engine.begin() as conn:
        assert write_typed(conn, "s", records, v1) == 2
    got = rows(
        sql_store,
        f"SELECT kafka_offset, qty, note, address__zip FROM {typed_table_name('s')} ORDER BY 1",
    )
    assert got == [(0, 0, None, "69000"), (1, 1, "gift", "69001")]
