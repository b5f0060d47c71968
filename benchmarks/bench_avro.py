"""AvroSerde throughput against bare fastavro schemaless encode/decode.

Bare fastavro writes and reads the Avro body alone; ``AvroSerde`` adds the Confluent framing
(magic byte, schema id), the schema-id lookup and the error wrapping. The ratio
serde/bare says what that costs; the target is >= 0.85.

Run: ``python -m benchmarks.bench_avro [--records N] [--repeat R] [--shape small|order|all]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from benchmarks._common import Command, Context, Ratio, Report, markdown_table, positive_int
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import MemorySchemaRegistry

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


NAME = "avro"
TARGET = 0.85


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=50_000)
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--shape", choices=["small", "order", "all"], default="all")
    parser.add_argument("--target", type=float, default=TARGET)


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Encode and decode of each shape, each a ratio with its target; ``met`` says whether
    all reach it."""
    shapes = ["small", "order"] if args.shape == "all" else [args.shape]
    ratios: list[Ratio] = []
    rows: list[list[Any]] = []
    for shape in shapes:
        context.say(NAME, f"{shape}: {args.records:,} records, best of {args.repeat}")
        result = run(shape, args.records, args.repeat)
        for op in ("encode", "decode"):
            bare, ours = result[f"{op}_bare_rps"], result[f"{op}_serde_rps"]
            ratios.append(
                Ratio(NAME, f"{op} {shape}", "bare fastavro", "records/s", bare, ours, args.target)
            )
            rows.append([shape, op, f"{bare:,.0f}", f"{ours:,.0f}", f"{ours / bare:.2f}x"])
    table = markdown_table(["shape", "op", "bare rec/s", "serde rec/s", "ratio"], rows)
    title = f"avro: AvroSerde vs bare fastavro ({args.records:,} records, best of {args.repeat})"
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
