"""Schema-format fixtures: Protobuf message classes built from descriptors (no ``protoc``
here: the same classes ``protoc`` would generate, from the same ``FileDescriptorProto``), JSON
Schemas, and the registries every test runs against."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from bolide.facade.schemas.registry import ConfluentSchemaRegistry, MemorySchemaRegistry
from bolide.stores import SqlStore
from bolide.stores.schema_registry import SqlSchemaRegistry
from tests.conftest import DATABASES, make_db_url

F = descriptor_pb2.FieldDescriptorProto


def _field(message: Any, name: str, number: int, kind: int, **more: Any) -> None:
    message.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL, **more)


def proto_files(version: int = 1) -> list[Any]:
    """``shop/common.proto`` (Money, Status) and ``shop/orders.proto`` importing it and
    ``google/protobuf/timestamp.proto``; version 2 adds ``Order.note`` (field 9)."""
    common = descriptor_pb2.FileDescriptorProto(
        name="shop/common.proto", package="shop", syntax="proto3"
    )
    money = common.message_type.add(name="Money")
    _field(money, "cents", 1, F.TYPE_INT64)
    _field(money, "currency", 2, F.TYPE_STRING)
    status = common.enum_type.add(name="Status")
    for number, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=number)
    orders = descriptor_pb2.FileDescriptorProto(
        name="shop/orders.proto",
        package="shop",
        syntax="proto3",
        dependency=["shop/common.proto", "google/protobuf/timestamp.proto"],
    )
    order = orders.message_type.add(name="Order")
    _field(order, "id", 1, F.TYPE_STRING)
    _field(order, "qty", 2, F.TYPE_INT32)
    _field(order, "price", 3, F.TYPE_MESSAGE, type_name=".shop.Money")
    _field(order, "at", 4, F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    order.field.add(name="tags", number=5, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    _field(order, "status", 6, F.TYPE_ENUM, type_name=".shop.Status")
    _field(order, "big", 7, F.TYPE_SINT64)
    _field(order, "ok", 8, F.TYPE_BOOL)
    if version >= 2:
        _field(order, "note", 9, F.TYPE_STRING)
    line = order.nested_type.add(name="Line")
    _field(line, "sku", 1, F.TYPE_STRING)
    _field(line, "count", 2, F.TYPE_UINT32)
    return [common, orders]


def proto_classes(version: int = 1) -> dict[str, Any]:
    """The message classes of ``proto_files(version)`` by full name, in a pool of their own."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    for file in proto_files(version):
        pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        for name in ("shop.Order", "shop.Order.Line", "shop.Money")
    }


CLASSES = proto_classes(1)
Order = CLASSES["shop.Order"]
Line = CLASSES["shop.Order.Line"]


def make_order(n: int, **fields: Any) -> Any:
    """An order message."""
    message = Order(id=f"o{n}", qty=n, tags=["gift"] * (n % 2), status=n % 3, big=-(n**3))
    message.price.cents = 100 * n
    message.price.currency = "EUR"
    message.at.seconds = 1_700_000_000 + n
    for key, value in fields.items():
        setattr(message, key, value)
    return message


#: An order as a JSON Schema: an object with a nested address and a closed content model.
ORDER_JSON: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "qty": {"type": "integer", "minimum": 0},
        "amount": {"type": "number"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "paid": {"type": "boolean"},
    },
    "required": ["id", "qty"],
    "additionalProperties": False,
}


def json_order(n: int) -> dict[str, Any]:
    """A value of ``ORDER_JSON``."""
    return {
        "id": f"o{n}",
        "qty": n,
        "amount": 2.5 * n,
        "address": {"city": "Lyon" if n % 2 else "Paris", "zip": f"{69000 + n}"},
        "tags": ["gift"] * (n % 2),
        "paid": n % 2 == 0,
    }


REGISTRIES = ["memory", *DATABASES, "confluent"]


@pytest.fixture(params=REGISTRIES)
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each registry that keeps every format: in memory, on SQLite and PostgreSQL,
    Confluent's (its ``mock://`` client)."""
    if request.param == "memory":
        yield MemorySchemaRegistry()
    elif request.param == "confluent":
        yield ConfluentSchemaRegistry(f"mock://{uuid.uuid4().hex}")
    else:
        with SqlStore(make_db_url(request.param, tmp_path, request)) as store:
            store.upgrade()
            yield SqlSchemaRegistry(store)


@pytest.fixture
def confluent(confluent_url: str) -> Iterator[ConfluentSchemaRegistry]:
    """A registry confluent-kafka's serializers share with bolide's: its ``mock://`` client,
    and a real server (``tests/schemas/apicurio.py``)."""
    registry = ConfluentSchemaRegistry(confluent_url)
    yield registry
    registry.close()


def needs_guids(registry: ConfluentSchemaRegistry) -> None:
    """The header framing carries schema GUIDs, which Apicurio 3.0 does not hand out (so
    confluent-kafka's own serializer cannot write it there either)."""
    if registry.url.startswith("http"):
        pytest.skip("Apicurio 3.0 answers no schema GUID (Confluent Schema Registry 8 does)")
