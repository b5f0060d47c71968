"""The registry contract, run on every registry: in-process, SQL (SQLite and PostgreSQL) and
Confluent's client on its ``mock://`` registry (the mock does not enforce compatibility; the
class checks locally there, which is what these tests exercise)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade.errors import (
    SchemaIncompatibleError,
    SchemaNotFoundError,
    SchemaOutOfDateError,
    SerializationError,
    StoreError,
)
from bolide.facade.record import Record
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    SchemaRegistry,
)
from bolide.stores import SqlStore
from bolide.stores.schema_registry import SqlSchemaRegistry
from bolide.stores.typed_archive import write_typed
from tests.avro.conftest import ORDER_V1, ORDER_V2, ORDER_V3, order
from tests.history.conftest import make_db_url

KINDS = [
    "memory",
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    "confluent-mock",
]


@pytest.fixture(params=KINDS)
def any_registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SchemaRegistry]:
    if request.param == "memory":
        yield MemorySchemaRegistry()
    elif request.param == "confluent-mock":
        yield ConfluentSchemaRegistry(f"mock://{uuid.uuid4().hex}")
    else:
        with SqlStore(make_db_url(request.param, tmp_path, request)) as store:
            store.upgrade()
            yield SqlSchemaRegistry(store)


def with_field(base: dict[str, Any], name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {**base, "fields": [*base["fields"], {"name": name, "type": type_, **extra}]}


def test_register_is_idempotent_and_versions_grow(any_registry: SchemaRegistry) -> None:
    assert isinstance(any_registry, SchemaRegistry)
    assert any_registry.latest("orders-value") is None
    first = any_registry.register("orders-value", ORDER_V1)
    assert any_registry.register("orders-value", json.dumps(ORDER_V1)) == first
    second = any_registry.register("orders-value", ORDER_V2)
    assert second != first
    latest = any_registry.latest("orders-value")
    assert latest is not None
    assert (latest.subject, latest.version, latest.schema_id) == ("orders-value", 2, second)
    assert json.loads(latest.schema) == ORDER_V2
    assert json.loads(any_registry.get_schema(first)) == ORDER_V1
    with pytest.raises(SchemaNotFoundError):
        any_registry.get_schema(10_000)


def test_add_and_remove_fields_under_backward(any_registry: SchemaRegistry) -> None:
    assert any_registry.compatibility("o-value") is Compatibility.BACKWARD
    any_registry.register("o-value", ORDER_V1)
    any_registry.register("o-value", ORDER_V2)  # added with a default
    any_registry.register("o-value", ORDER_V3)  # removed
    with pytest.raises(SchemaIncompatibleError) as info:
        any_registry.register("o-value", with_field(ORDER_V3, "vat", "double"))
    assert info.value.subject == "o-value"
    assert any("/vat: reader field 'vat' has no default" in r for r in info.value.reasons)
    assert any_registry.latest("o-value").version == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("level", "accepts_add_no_default", "accepts_remove_no_default"),
    [
        ("BACKWARD", False, True),
        ("FORWARD", True, False),
        ("FULL", False, False),
        ("NONE", True, True),
    ],
)
def test_levels(
    any_registry: SchemaRegistry,
    level: str,
    accepts_add_no_default: bool,
    accepts_remove_no_default: bool,
) -> None:
    base = with_field(ORDER_V1, "note", "string")
    add = with_field(base, "vat", "double")
    remove = {**base, "fields": [f for f in base["fields"] if f["name"] != "note"]}
    for name, new, accepted in (
        ("add", add, accepts_add_no_default),
        ("rm", remove, accepts_remove_no_default),
    ):
        subject = f"{name}-value"
        any_registry.set_compatibility(subject, level)
        assert any_registry.compatibility(subject) is Compatibility(level)
        any_registry.register(subject, base)
        if accepted:
            any_registry.register(subject, new)
        else:
            with pytest.raises(SchemaIncompatibleError, match=level):
                any_registry.register(subject, new)


def test_invalid_level_and_schema(any_registry: SchemaRegistry) -> None:
    with pytest.raises(ValueError, match="not one of"):
        any_registry.set_compatibility("x-value", "MOSTLY")
    with pytest.raises(SerializationError, match="invalid Avro schema"):
        any_registry.register("x-value", {"type": "fixed", "name": "F"})


def test_serde_round_trip_through_each_registry(any_registry: SchemaRegistry) -> None:
    writer = AvroSerde(ORDER_V1, registry=any_registry)
    data = writer.encode(order(4), stream="shop")
    reader = AvroSerde(ORDER_V2, registry=any_registry, reader_schema=ORDER_V2)
    assert reader.decode(data, stream="shop", partition=0, offset=0) == order(4, country="FR")


# -- SQL specifics --------------------------------------------------------------------------------


def test_sql_ids_are_global_and_survive_a_new_registry(sql_store: SqlStore) -> None:
    one = SqlSchemaRegistry(sql_store)
    a = one.register("a-value", ORDER_V1)
    b = one.register("b-value", ORDER_V1)
    assert a == b  # one schema, one id
    one.set_compatibility("a-value", Compatibility.NONE)
    other = SqlSchemaRegistry(sql_store.engine.url.render_as_string(hide_password=False))
    assert json.loads(other.get_schema(a)) == ORDER_V1
    assert other.compatibility("a-value") is Compatibility.NONE
    assert other.compatibility("b-value") is Compatibility.BACKWARD
    other.close()
    with sql_store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT subject, version, schema_id FROM bolide_schema_versions")
        )
        assert sorted(tuple(r) for r in rows) == [("a-value", 1, a), ("b-value", 1, a)]
        fingerprint = conn.execute(sa.text("SELECT fingerprint FROM bolide_schemas")).scalar_one()
        assert len(fingerprint) == 64


def test_sql_concurrent_registrations_agree(sql_store: SqlStore) -> None:
    url = sql_store.engine.url.render_as_string(hide_password=False)
    ids: list[int] = []
    errors: list[BaseException] = []

    def register(schema: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            registry = SqlSchemaRegistry(url)
            try:
                ids.append(registry.register("race-value", schema))
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                registry.close()

        return run

    threads = [threading.Thread(target=register(ORDER_V1)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(set(ids)) == 1
    assert SqlSchemaRegistry(sql_store).latest("race-value").version == 1  # type: ignore[union-attr]


def test_sql_registry_needs_the_migration(tmp_path: Path) -> None:
    registry = SqlSchemaRegistry(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(SchemaOutOfDateError, match="bolide db upgrade"):
        registry.register("s-value", ORDER_V1)
    registry.close()
    with pytest.raises(TypeError, match="SqlStore or a URL"):
        SqlSchemaRegistry(3)  # type: ignore[arg-type]


def test_serde_accepts_a_store_or_a_database_url(sql_store: SqlStore) -> None:
    by_store = AvroSerde(ORDER_V1, registry=sql_store)
    assert isinstance(by_store.registry, SqlSchemaRegistry)
    data = by_store.encode(order(1), stream="s")
    url = sql_store.engine.url.render_as_string(hide_password=False)
    by_url = AvroSerde(ORDER_V1, registry=url)
    assert by_url.decode(data, stream="s") == order(1)
    assert isinstance(by_url.registry, SqlSchemaRegistry)
    by_url.registry.close()


def test_an_unreachable_registry_is_a_retriable_error(sql_store: SqlStore) -> None:
    away = ConfluentSchemaRegistry("http://127.0.0.1:1", **{"max.retries": 0})
    serde = AvroSerde(ORDER_V1, registry=away)
    with pytest.raises(SerializationError, match="Connection refused") as info:
        serde.decode(b"\x00\x00\x00\x00\x01\x02", stream="s", partition=0, offset=7)
    assert info.value.retriable and info.value.offset == 7
    with pytest.raises(SerializationError) as info:
        serde.encode(order(1), stream="s")
    assert info.value.retriable and info.value.stream == "s"
    # The typed archive does not skip such records: the whole batch is to be retried.
    record = Record(b"\x00\x00\x00\x00\x01\x02")
    record.partition, record.offset = 0, 7
    with pytest.raises(StoreError) as store_info, sql_store.engine.begin() as conn:
        write_typed(conn, "s", [record], serde)
    assert store_info.value.retriable
