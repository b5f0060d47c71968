"""Avro fixtures: schemas of one evolving subject, and SQL registries on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from bolide.stores import SqlStore
from bolide.stores.schema_registry import SqlSchemaRegistry

__all__ = ["ORDER_V1", "ORDER_V2", "ORDER_V3"]

#: Version 1 of an order.
ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": "string"},
                ],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}

#: Version 2: adds ``country`` with a default (BACKWARD and FORWARD compatible).
ORDER_V2: dict[str, Any] = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "country", "type": "string", "default": "FR"}],
}

#: Version 3: drops ``tags`` (compatible: the readers ignore it or never had it).
ORDER_V3: dict[str, Any] = {
    **ORDER_V2,
    "fields": [f for f in ORDER_V2["fields"] if f["name"] != "tags"],
}


def order(n: int, **extra: Any) -> dict[str, Any]:
    """A version 1 order value (plus ``extra`` fields)."""
    return {
        "id": n,
        "customer": f"c{n % 3}",
        "amount": 10.0 * n,
        "address": {"city": "Lyon" if n % 2 else "Paris", "zip": f"{69000 + n}"},
        "tags": ["gift"] * (n % 2),
        **extra,
    }


@pytest.fixture
def sql_registry(sql_store: SqlStore) -> SqlSchemaRegistry:
    """A ``SqlSchemaRegistry`` on ``sql_store``."""
    return SqlSchemaRegistry(sql_store)
