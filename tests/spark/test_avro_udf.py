"""from_avro_udf: Confluent-framed Avro decoded in Spark's Python workers (one shared session)."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import AvroSerde, MemorySchemaRegistry
from bolide.spark.avro import avro_spark_type, from_avro_udf
from bolide.stores import SqlSchemaRegistry, SqlStore
from tests.avro.conftest import ORDER_V1, ORDER_V2, order

pytestmark = pytest.mark.spark


def test_spark_types_follow_the_schema() -> None:
    from pyspark.sql import types as T

    struct = avro_spark_type(ORDER_V2)
    assert struct.simpleString() == (
        "struct<id:bigint,customer:string,amount:double,address:struct<city:string,zip:string>,"
        "tags:array<string>,country:string>"
    )
    logical = {
        "type": "record",
        "name": "L",
        "fields": [
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {
                "name": "p",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
            {"name": "m", "type": {"type": "map", "values": ["null", "int"]}},
            {"name": "u", "type": ["null", "int", "string"]},
        ],
    }
    assert avro_spark_type(logical).simpleString() == (
        "struct<d:date,p:decimal(9,2),m:map<string,int>,u:string>"
    )
    assert avro_spark_type('"long"') == T.LongType()


def test_decodes_evolved_records_into_one_shape(spark: Any, tmp_path: Path) -> None:
    with SqlStore(f"sqlite:///{tmp_path / 'registry.db'}") as store:
        store.upgrade()
        registry = SqlSchemaRegistry(store)
        v1, v2 = AvroSerde(ORDER_V1, registry=registry), AvroSerde(ORDER_V2, registry=registry)
        payloads = [v1.encode(order(n), stream="o") for n in range(3)]
        payloads += [v2.encode(order(n, country="DE"), stream="o") for n in range(3, 5)]
        df = spark.createDataFrame([(p,) for p in payloads], "value binary")
        decode = from_avro_udf(AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2))
        rows = df.select(decode("value").alias("o")).select("o.*").orderBy("id").collect()
    assert [(r.id, r.country, r.address.city, list(r.tags)) for r in rows] == [
        (n, "DE" if n >= 3 else "FR", "Lyon" if n % 2 else "Paris", ["gift"] * (n % 2))
        for n in range(5)
    ]


def test_bad_payloads_raise_or_give_nulls(spark: Any) -> None:
    registry = MemorySchemaRegistry()
    serde = AvroSerde(
        {
            "type": "record",
            "name": "P",
            "fields": [
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                {
                    "name": "price",
                    "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
                },
            ],
        },
        registry=registry,
    )
    good = serde.encode(
        {"day": datetime.date(2026, 1, 2), "price": decimal.Decimal("3.50")}, stream="p"
    )
    df = spark.createDataFrame([(good,), (b"\x07junk",)], "value binary")
    rows = df.select(from_avro_udf(serde, on_error="null")("value").alias("p")).collect()
    assert [tuple(r.p) for r in rows] == [
        (datetime.date(2026, 1, 2), decimal.Decimal("3.50")),
        (None, None),
    ]
    with pytest.raises(Exception, match="magic byte 7"):
        df.select(from_avro_udf(serde, stream="p")("value")).collect()
    with pytest.raises(ValueError, match="on_error"):
        from_avro_udf(serde, on_error="ignore")
    with pytest.raises(ValueError, match="mock://"):
        from_avro_udf(AvroSerde(ORDER_V1, registry="mock://one-process"))


def test_protobuf_and_json_schema_columns_decode_into_structs(spark: Any) -> None:
    from bolide.facade import JsonSchemaSerde, ProtobufSerde
    from bolide.spark.avro import from_schema_udf
    from tests.schemas.conftest import ORDER_JSON, Order, json_order, make_order

    registry = MemorySchemaRegistry()
    proto = ProtobufSerde(Order, registry=registry)
    as_json = JsonSchemaSerde(ORDER_JSON, registry=registry)
    rows = [
        (proto.encode(make_order(n), stream="p"), as_json.encode(json_order(n), stream="j"))
        for n in range(3)
    ]
    df = spark.createDataFrame(rows, "p binary, j binary")
    decoded = df.select(
        from_schema_udf(proto)("p").alias("p"), from_schema_udf(as_json)("j").alias("j")
    ).collect()
    assert [(r.p.id, r.p.price.cents, r.p.status, list(r.p.tags)) for r in decoded] == [
        (f"o{n}", 100 * n, ["NEW", "PAID", "SHIPPED"][n], ["gift"] * (n % 2)) for n in range(3)
    ]
    assert all(r.p.at.year == 2023 for r in decoded)  # a Timestamp message is a timestamp
    assert [(r.j.id, r.j.qty, r.j.address.city, r.j.paid) for r in decoded] == [
        (f"o{n}", n, "Lyon" if n % 2 else "Paris", n % 2 == 0) for n in range(3)
    ]
