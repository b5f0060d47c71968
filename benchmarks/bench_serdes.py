"""Serde throughput: each bolide serde against confluent-kafka's serializer of its format, and
``AvroSerde`` against bare fastavro.

* Avro, Protobuf and JSON Schema: encode and decode with bolide's serde and with
  confluent-kafka's ``AvroSerializer``/``ProtobufSerializer``/``JSONSerializer`` (and their
  deserializers) on one ``mock://`` registry, the same records; target >= 1.0x.
* Avro against bare fastavro ``schemaless_writer``/``schemaless_reader`` (the body alone, no
  framing or lookup): what the framing costs; target >= 0.85x.

Run: ``python -m benchmarks.bench_serdes [--records N] [--repeat R] [--shape small|order|all]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import random
import time
from collections.abc import Callable
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from benchmarks._common import Command, Context, Ratio, Report, markdown_table, positive_int
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import ConfluentSchemaRegistry, MemorySchemaRegistry

SMALL = {
    "type": "record",
    "name": "Tick",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "double"},
    ],
}

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "amount", "type": "double"},
        {"name": "qty", "type": "int"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "street", "type": "string"},
                    {"name": "city", "type": "string"},
                ],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "created_ms", "type": "long"},
    ],
}


def _values(shape: str, count: int) -> list[dict[str, Any]]:
    rnd = random.Random(7)
    if shape == "small":
        return [
            {"id": i, "sku": f"SKU-{i % 997}", "qty": rnd.randint(1, 9), "price": rnd.random()}
            for i in range(count)
        ]
    return [
        {
            "id": i,
            "customer": f"customer-{i % 5003}",
            "country": rnd.choice(["FR", "DE", "US", "JP"]),
            "status": rnd.choice(["NEW", "PAID"]),
            "amount": rnd.random() * 100,
            "qty": rnd.randint(1, 9),
            "note": None if i % 3 else "gift",
            "address": {"street": f"{i} Main St", "city": "Springfield"},
            "tags": ["a", "b"][: i % 3],
            "created_ms": 1_700_000_000_000 + i,
        }
        for i in range(count)
    ]


def _best(fn: Callable[[], None], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(shape: str, records: int, repeat: int) -> dict[str, float]:
    """Measure one record shape; return records/s for each side and the ratios."""
    schema = SMALL if shape == "small" else ORDER
    parsed = parse_schema(schema)
    serde = AvroSerde(schema, registry=MemorySchemaRegistry())
    values = _values(shape, records)
    stream = "bench"
    bodies: list[bytes] = []
    payloads: list[bytes] = []

    def bare_encode() -> None:
        bodies.clear()
        for value in values:
            out = BytesIO()
            schemaless_writer(out, parsed, value)
            bodies.append(out.getvalue())

    def serde_encode() -> None:
        payloads.clear()
        encode = serde.encode
        for value in values:
            payloads.append(encode(value, stream=stream))

    def bare_decode() -> None:
        for body in bodies:
            schemaless_reader(BytesIO(body), parsed)

    def serde_decode() -> None:
        decode = serde.decode
        for offset, payload in enumerate(payloads):
            decode(payload, stream=stream, partition=0, offset=offset)

    serde_encode()  # registers the schema before timing
    result = {}
    for name, bare, ours in (
        ("encode", bare_encode, serde_encode),
        ("decode", bare_decode, serde_decode),
    ):
        # Interleave so both sides see the same machine load; keep the best of each.
        t_bare = t_ours = float("inf")
        for _ in range(repeat):
            t_bare = min(t_bare, _best(bare, 1))
            t_ours = min(t_ours, _best(ours, 1))
        result[f"{name}_bare_rps"] = records / t_bare
        result[f"{name}_serde_rps"] = records / t_ours
        result[f"{name}_ratio"] = t_bare / t_ours
    assert payloads[0][5:] == bodies[0], "serde body differs from bare fastavro"
    return result


def _proto_class(shape: str) -> Any:
    """A generated-equivalent message class of ``shape`` (built from its descriptor)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name=f"bench_{shape}.proto", package="bench", syntax="proto3"
    )
    kinds = {
        "long": field.TYPE_INT64,
        "int": field.TYPE_INT32,
        "string": field.TYPE_STRING,
        "double": field.TYPE_DOUBLE,
    }
    if shape == "small":
        tick = file.message_type.add(name="Tick")
        for number, (name, kind) in enumerate(
            [("id", "long"), ("sku", "string"), ("qty", "int"), ("price", "double")], start=1
        ):
            tick.field.add(name=name, number=number, type=kinds[kind], label=1)
        name = "bench.Tick"
    else:
        status = file.enum_type.add(name="Status")
        status.value.add(name="NEW", number=0)
        status.value.add(name="PAID", number=1)
        order = file.message_type.add(name="Order")
        address = order.nested_type.add(name="Address")
        address.field.add(name="street", number=1, type=field.TYPE_STRING, label=1)
        address.field.add(name="city", number=2, type=field.TYPE_STRING, label=1)
        plain = [("id", "long"), ("customer", "string"), ("country", "string")]
        for number, (fname, kind) in enumerate(plain, start=1):
            order.field.add(name=fname, number=number, type=kinds[kind], label=1)
        order.field.add(
            name="status", number=4, type=field.TYPE_ENUM, type_name=".bench.Status", label=1
        )
        order.field.add(name="amount", number=5, type=field.TYPE_DOUBLE, label=1)
        order.field.add(name="qty", number=6, type=field.TYPE_INT32, label=1)
        order.field.add(
            name="note",
            number=7,
            type=field.TYPE_STRING,
            label=1,
            proto3_optional=True,
            oneof_index=0,
        )
        order.oneof_decl.add(name="_note")
        order.field.add(
            name="address",
            number=8,
            type=field.TYPE_MESSAGE,
            type_name=".bench.Order.Address",
            label=1,
        )
        order.field.add(name="tags", number=9, type=field.TYPE_STRING, label=3)
        order.field.add(name="created_ms", number=10, type=field.TYPE_INT64, label=1)
        name = "bench.Order"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of an Avro record schema's values (as the benchmark's records are)."""
    types = {"long": "integer", "int": "integer", "string": "string", "double": "number"}

    def of(kind: Any) -> Any:
        if isinstance(kind, str):
            return {"type": types[kind]}
        if isinstance(kind, list):
            return {"type": ["null", "string"]}
        if kind["type"] == "enum":
            return {"enum": kind["symbols"]}
        if kind["type"] == "array":
            return {"type": "array", "items": of(kind["items"])}
        return _json_schema(kind)

    return {
        "type": "object",
        "properties": {f["name"]: of(f["type"]) for f in schema["fields"]},
        "required": [f["name"] for f in schema["fields"]],
        "additionalProperties": False,
    }


def _pairs(
    shape: str, values: list[dict[str, Any]]
) -> dict[str, tuple[Any, Any, Any, Any, list[Any]]]:
    """Per format: (confluent serializer, its deserializer, bolide serde, context, inputs)."""
    import json

    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from bolide.facade import JsonSchemaSerde, ProtobufSerde

    registry = ConfluentSchemaRegistry(f"mock://bench-{shape}")
    client = registry.client
    context = SerializationContext("bench", MessageField.VALUE)
    schema = SMALL if shape == "small" else ORDER
    avro_text = json.dumps(schema)
    json_text = json.dumps(_json_schema(schema))
    cls = _proto_class(shape)
    messages = []
    for value in values:
        fields = {k: v for k, v in value.items() if v is not None}
        messages.append(cls(**fields))
    return {
        "avro": (
            AvroSerializer(client, avro_text),
            AvroDeserializer(client),
            AvroSerde(avro_text, registry=registry),
            context,
            values,
        ),
        "protobuf": (
            ProtobufSerializer(cls, client),
            ProtobufDeserializer(cls, None, client),
            ProtobufSerde(cls, registry=registry),
            context,
            messages,
        ),
        "json": (
            JSONSerializer(json_text, client),
            JSONDeserializer(json_text, schema_registry_client=client),
            JsonSchemaSerde(json_text, registry=registry),
            context,
            values,
        ),
    }


def run_peers(shape: str, records: int, repeat: int) -> list[tuple[str, str, float, float]]:
    """(format, op, confluent-kafka records/s, bolide records/s) for each format and op."""
    values = _values(shape, records)
    out = []
    for fmt, (serializer, deserializer, serde, context, inputs) in _pairs(shape, values).items():
        theirs_payloads: list[bytes] = []
        ours_payloads: list[bytes] = []

        def theirs_encode() -> None:
            theirs_payloads[:] = [serializer(v, context) for v in inputs]  # noqa: B023

        def ours_encode() -> None:
            encode = serde.encode  # noqa: B023
            ours_payloads[:] = [encode(v, stream="bench") for v in inputs]  # noqa: B023

        def theirs_decode() -> None:
            for payload in theirs_payloads:  # noqa: B023
                deserializer(payload, context)  # noqa: B023

        def ours_decode() -> None:
            decode = serde.decode  # noqa: B023
            for offset, payload in enumerate(ours_payloads):  # noqa: B023
                decode(payload, stream="bench", partition=0, offset=offset)

        theirs_encode()
        ours_encode()
        assert theirs_payloads == ours_payloads, f"{fmt}: payloads differ from confluent-kafka's"
        for op, theirs, ours in (
            ("encode", theirs_encode, ours_encode),
            ("decode", theirs_decode, ours_decode),
        ):
            t_theirs = t_ours = float("inf")
            for _ in range(repeat):  # interleaved: both sides see the same machine load
                t_theirs = min(t_theirs, _best(theirs, 1))
                t_ours = min(t_ours, _best(ours, 1))
            out.append((fmt, op, records / t_theirs, records / t_ours))
    return out


NAME = "serdes"
TARGET = 0.85
PEER_TARGET = 1.0


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=50_000)
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--shape", choices=["small", "order", "all"], default="all")
    parser.add_argument("--target", type=float, default=TARGET)


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Each format against confluent-kafka's serializer, and Avro against bare fastavro; each
    a ratio with its target; ``met`` says whether all reach it."""
    shapes = ["small", "order"] if args.shape == "all" else [args.shape]
    ratios: list[Ratio] = []
    rows: list[list[Any]] = []
    for shape in shapes:
        context.say(NAME, f"{shape}: {args.records:,} records, best of {args.repeat}")
        for fmt, op, theirs, ours in run_peers(shape, args.records, args.repeat):
            what = f"{fmt} {op} {shape}"
            ratios.append(
                Ratio(NAME, what, "confluent-kafka", "records/s", theirs, ours, PEER_TARGET)
            )
            rows.append(
                [
                    shape,
                    fmt,
                    op,
                    "confluent-kafka",
                    f"{theirs:,.0f}",
                    f"{ours:,.0f}",
                    f"{ours / theirs:.2f}x",
                ]
            )
        result = run(shape, args.records, args.repeat)
        for op in ("encode", "decode"):
            bare, ours = result[f"{op}_bare_rps"], result[f"{op}_serde_rps"]
            what = f"avro {op} {shape}"
            ratios.append(Ratio(NAME, what, "bare fastavro", "records/s", bare, ours, args.target))
            rows.append(
                [
                    shape,
                    "avro",
                    op,
                    "bare fastavro",
                    f"{bare:,.0f}",
                    f"{ours:,.0f}",
                    f"{ours / bare:.2f}x",
                ]
            )
    headers = ["shape", "format", "op", "against", "their rec/s", "bolide rec/s", "ratio"]
    table = markdown_table(headers, rows)
    title = (
        "serdes: bolide's serdes vs confluent-kafka's and bare fastavro "
        f"({args.records:,} records, best of {args.repeat})"
    )
    return Report(title, table, ratios, {"met": all(r.met is not False for r in ratios)})


#: ``--quick``: 2,000 records, one run. No broker: ``--bootstrap`` is accepted and ignored.
COMMAND = Command(
    NAME,
    _measure,
    _options,
    ["--records", "2000", "--repeat", "1"],
    __doc__,
    uses_broker=lambda _: False,
)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
