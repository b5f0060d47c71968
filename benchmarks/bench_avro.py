"""AvroSerde throughput against bare fastavro schemaless encode/decode.

Bare fastavro writes and reads the Avro body alone; ``AvroSerde`` adds the Confluent framing
(magic byte, schema id), the schema-id lookup and the error wrapping. The ratio
serde/bare says what that costs; the target is >= 0.85.

Run: ``python benchmarks/bench_avro.py [--records N] [--repeat R] [--shape small|order|all]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from benchmarks._common import Context, Ratio, Report, markdown_table
from bolide.facade.avro.registry import MemorySchemaRegistry
from bolide.facade.avro.serde import AvroSerde

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


def bench(context: Context) -> Report:
    """``run_all``'s entry: encode and decode of both shapes, each a ratio with its target."""
    records, repeat = (2_000, 1) if context.quick else (50_000, 5)
    ratios: list[Ratio] = []
    rows: list[list[Any]] = []
    for shape in ("small", "order"):
        result = run(shape, records, repeat)
        for op in ("encode", "decode"):
            bare, ours = result[f"{op}_bare_rps"], result[f"{op}_serde_rps"]
            ratios.append(
                Ratio(NAME, f"{op} {shape}", "bare fastavro", "records/s", bare, ours, TARGET)
            )
            rows.append([shape, op, f"{bare:,.0f}", f"{ours:,.0f}", f"{ours / bare:.2f}x"])
    table = markdown_table(["shape", "op", "bare rec/s", "serde rec/s", "ratio"], rows)
    return Report(
        f"avro: AvroSerde vs bare fastavro ({records:,} records, best of {repeat})", table, ratios
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table; return 0, or 1 when a ratio misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shape", choices=["small", "order", "all"], default="all")
    parser.add_argument("--target", type=float, default=0.85)
    args = parser.parse_args(argv)
    shapes = ["small", "order"] if args.shape == "all" else [args.shape]
    ok = True
    print(f"{'shape':<6} {'op':<7} {'bare rec/s':>12} {'serde rec/s':>12} {'ratio':>6}")
    for shape in shapes:
        result = run(shape, args.records, args.repeat)
        for op in ("encode", "decode"):
            ratio = result[f"{op}_ratio"]
            ok = ok and ratio >= args.target
            print(
                f"{shape:<6} {op:<7} {result[f'{op}_bare_rps']:>12,.0f} "
                f"{result[f'{op}_serde_rps']:>12,.0f} {ratio:>6.2f}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
