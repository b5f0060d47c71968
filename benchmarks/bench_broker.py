"""Start-up time and memory of the embedded broker's engines: Tansu, and Apache Kafka with one
and three nodes.

Each start is timed from the constructor until every node answers metadata requests; memory is
the resident set (VmRSS) of the broker processes once they answer. No ratio: the figures say
what a laptop or CI pays for each engine (goal: one Apache Kafka node answering within ~20 s
with a heap of at most 1 GiB).

    python -m benchmarks.bench_broker [--quick] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import Context, Report, markdown_table, standalone
from bolide.facade import EmbeddedBroker
from bolide.facade.broker.apache import DEFAULT_HEAP, kafka_unavailable

NAME = "broker"


def _rss_mib(pids: Sequence[int]) -> float:
    total_kib = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def measure(engine: str, brokers: int) -> dict[str, Any]:
    """Start one broker of ``engine`` with ``brokers`` nodes; its start-up seconds and RSS."""
    started = time.monotonic()
    broker = EmbeddedBroker(engine=engine, brokers=brokers)  # type: ignore[arg-type]
    with broker:
        startup_s = time.monotonic() - started
        rss = _rss_mib(broker.pids)
    return {"engine": engine, "nodes": brokers, "startup_s": startup_s, "rss_mib": rss}


def bench(context: Context) -> Report:
    """``run_all``'s entry: one start of each engine and size (three with ``--quick`` off)."""
    shapes = [("tansu", 1)]
    if kafka_unavailable() is None:
        shapes += [("kafka", 1)] if context.quick else [("kafka", 1), ("kafka", 3)]
    repeat = 1 if context.quick else 3
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"heap_per_kafka_node": DEFAULT_HEAP, "runs": []}
    for engine, nodes in shapes:
        runs = []
        for _ in range(repeat):
            context.say(NAME, f"starting {engine} with {nodes} node(s)")
            runs.append(measure(engine, nodes))
        data["runs"] += runs
        best = min(r["startup_s"] for r in runs)
        worst = max(r["startup_s"] for r in runs)
        rss = max(r["rss_mib"] for r in runs)
        rows.append([engine, nodes, f"{best:.1f}", f"{worst:.1f}", f"{rss:,.0f}"])
    table = markdown_table(
        ["engine", "nodes", "start-up s (best)", "start-up s (worst)", "RSS MiB (all nodes)"],
        rows,
    )
    title = f"broker: start-up and memory of the embedded engines (best/worst of {repeat})"
    return Report(title, table, [], data)


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
