"""``SchemaReader``: any format decoded by its registered schema; Avro schemas that reference
other subjects' types."""

from __future__ import annotations

import json
from typing import Any

from bolide.facade import AvroSerde, SchemaReference
from bolide.facade.schemas.reader import SchemaReader
from bolide.facade.schemas.registry import Schema


def test_an_avro_schema_with_references_decodes(registry: Any) -> None:
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "shop",
        "fields": [{"name": "city", "type": "string"}],
    }
    registry.register("address-value", json.dumps(address))
    order = {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "ship_to", "type": "shop.Address"}],
    }
    refs = (SchemaReference("shop.Address", "address-value", 1),)
    schema_id = registry.register("orders-value", Schema(json.dumps(order), "AVRO", refs))
    body = b"\x08Lyon"  # the Avro body of {"ship_to": {"city": "Lyon"}}
    payload = b"\x00" + schema_id.to_bytes(4, "big") + body
    assert AvroSerde('"null"', registry=registry).decode(payload, stream="orders") == {
        "ship_to": {"city": "Lyon"}
    }
    assert SchemaReader(registry).decode(payload, stream="orders") == {"ship_to": {"city": "Lyon"}}
