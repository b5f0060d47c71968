"""The parallel receiver against the one-thread receiver, side by side on the same stream.

I/O-bound: a handler that sleeps 5 ms per record, on a one-partition stream whose records
carry 1,000 keys, at concurrency 1 (the one-thread receiver: the single-thread rate), 8, 32
and 128 in key order. The ratio is the rate over ``concurrency x`` the single-thread rate;
the target is >= 0.8 up to 32 (at 128, Python threads waking 25,000 times a second show).

CPU-free: a handler that does nothing, at concurrency 32 against 1, on the whole stream; the
ratio is the time at 32 over the time at 1, the target <= 1.2 (what the machinery costs when
the handler costs nothing). Runs alternate sides; the median of the back-to-back pairs is
reported.

Run from the repository root: ``python -m benchmarks.bench_parallel [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import itertools
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    markdown_table,
    positive_int,
)
from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)

NAME = "parallel"
IO_TARGET = 0.8
CPU_TARGET = 1.2
_TIMEOUT_S = 300.0


def publish(cluster: Cluster, count: int, keys: int) -> StreamConfig:
    """A fresh one-partition stream of ``count`` 100-byte records over ``keys`` random keys."""
    stream = StreamConfig(name=f"bench-parallel-{time.time_ns()}")
    rng = random.Random(5)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        records = [Record(b"x" * 100, key=b"k%d" % rng.randrange(keys)) for _ in range(count)]
        for start in range(0, count, 5_000):
            pub.publish_many(records[start : start + 5_000]).result(60)
    return stream


def _subscriber(cluster: Cluster, stream: StreamConfig) -> Subscriber:
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=1_000
    )
    return Subscriber(cluster, config)


def io_run(cluster: Cluster, stream: StreamConfig, concurrency: int, count: int, sleep_s: float):
    """Records per second of ``count`` sleeping handler calls, from the first call's start to
    the ``count``-th call's end."""
    lock, done = threading.Lock(), threading.Event()
    state = {"handled": 0, "first": 0.0, "last": 0.0}

    def handler(record: Record) -> None:
        with lock:
            if not state["first"]:
                state["first"] = time.perf_counter()
        time.sleep(sleep_s)
        with lock:
            state["handled"] += 1
            if state["handled"] == count:
                state["last"] = time.perf_counter()
                done.set()

    with _subscriber(cluster, stream) as sub:
        receiver = sub.attach_receiver(handler, concurrency=concurrency)
        if not done.wait(_TIMEOUT_S):
            raise TimeoutError(f"concurrency {concurrency}: {state['handled']} of {count}")
        receiver.close(timeout_s=0)  # what is left in flight is not measured
    return count / (state["last"] - state["first"])


def cpu_free_run(cluster: Cluster, stream: StreamConfig, concurrency: int, count: int) -> float:
    """Seconds from attaching a do-nothing handler until it has been called ``count`` times."""
    calls, done = itertools.count(1), threading.Event()

    def handler(record: Record) -> None:
        if next(calls) == count:  # itertools.count is atomic: no lock in the measured path
            done.set()

    with _subscriber(cluster, stream) as sub:
        started = time.perf_counter()
        receiver = sub.attach_receiver(handler, concurrency=concurrency)
        if not done.wait(_TIMEOUT_S):
            raise TimeoutError(f"concurrency {concurrency}: not finished")
        elapsed = time.perf_counter() - started
        receiver.close(timeout_s=0)
    return elapsed


def paired(
    repeat: int, first: Callable[[], float], second: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """Run both sides ``repeat`` times, alternating which goes first."""
    a: list[float] = []
    b: list[float] = []
    for run in range(repeat):
        if run % 2:
            b.append(second())
            a.append(first())
        else:
            a.append(first())
            b.append(second())
    return a, b


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", type=positive_int, action="append", help="I/O levels (1, 8, 32, 128)"
    )
    parser.add_argument("--sleep-ms", type=float, default=5.0, help="the I/O handler's sleep")
    parser.add_argument(
        "--io-seconds", type=float, default=1.0, help="ideal length of each I/O run"
    )
    parser.add_argument("--keys", type=positive_int, default=1_000)
    parser.add_argument(
        "--cpu-records", type=positive_int, default=200_000, help="records of the CPU-free runs"
    )
    parser.add_argument("--repeat", type=positive_int, default=3, help="I/O runs per level")
    parser.add_argument("--cpu-repeat", type=positive_int, default=7, help="CPU-free runs per side")


#: ``--quick``: short runs, one of each, concurrency 1 and 8.
QUICK = ["--io-seconds", "0.2", "--cpu-records", "5000", "--repeat", "1", "--cpu-repeat", "1",
         "--concurrency", "8"]  # fmt: skip


def _rows(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every row of the benchmark, measured on ``cluster``."""
    levels = sorted(set(args.concurrency or [1, 8, 32, 128]) | {1})
    sleep_s = args.sleep_ms / 1000
    counts = {c: max(20, int(args.io_seconds * c / sleep_s)) for c in levels}
    rows: list[dict[str, Any]] = []
    size = max(max(counts.values()), args.cpu_records)
    stream = publish(cluster, size, args.keys)
    single = [io_run(cluster, stream, 1, counts[1], sleep_s) for _ in range(args.repeat)]
    base = statistics.median(single)
    for level in levels:
        if level == 1:
            rates = single
        else:
            rates = [
                io_run(cluster, stream, level, counts[level], sleep_s) for _ in range(args.repeat)
            ]
        rate = statistics.median(rates)
        ratio = rate / (level * base)
        target = IO_TARGET if 1 < level <= 32 else None
        rows.append(
            {
                "handler": f"sleep {args.sleep_ms:g} ms",
                "concurrency": level,
                "records": counts[level],
                "value": rate,
                "unit": "records/s",
                "ratio": ratio,
                "ratio_of": "rate / (concurrency x single-thread rate)",
                "target": f">= {IO_TARGET}" if target else "",
                "met": None if target is None else ratio >= target,
            }
        )
    one, many = paired(
        args.cpu_repeat,
        lambda: cpu_free_run(cluster, stream, 1, args.cpu_records),
        lambda: cpu_free_run(cluster, stream, 32, args.cpu_records),
    )
    ratio = statistics.median(m / o for o, m in zip(one, many, strict=True))
    for level, times in ((1, one), (32, many)):
        rows.append(
            {
                "handler": "no work",
                "concurrency": level,
                "records": args.cpu_records,
                "value": statistics.median(times),
                "unit": "s",
                "ratio": ratio if level == 32 else 1.0,
                "ratio_of": "time / time at concurrency 1",
                "target": f"<= {CPU_TARGET}" if level == 32 else "",
                "met": ratio <= CPU_TARGET if level == 32 else None,
            }
        )
    return rows


def _ratios(rows: list[dict[str, Any]]) -> list[Ratio]:
    """The headline ratios for ``bolide bench``'s summary (higher is better in each)."""
    single = next(r for r in rows if r["handler"].startswith("sleep") and r["concurrency"] == 1)
    out = [
        Ratio(
            NAME,
            f"sleep handler, concurrency {r['concurrency']}",
            f"{r['concurrency']} x single-thread rate",
            "records/s",
            r["concurrency"] * single["value"],
            r["value"],
            IO_TARGET if r["concurrency"] <= 32 else None,
        )
        for r in rows
        if r["handler"].startswith("sleep") and r["concurrency"] > 1
    ]
    times = {r["concurrency"]: r["value"] for r in rows if r["handler"] == "no work"}
    records = next(r["records"] for r in rows if r["handler"] == "no work")
    # Time at 32 <= CPU_TARGET x time at 1, as a rate against the slowest rate that allows.
    out.append(
        Ratio(
            NAME,
            "no-work handler, concurrency 32",
            f"concurrency 1 rate / {CPU_TARGET}",
            "records/s",
            records / times[1] / CPU_TARGET,
            records / times[32],
            1.0,
        )
    )
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ["handler", "concurrency", "records", "result", "ratio", "target", "met"]
    table = [
        [
            row["handler"],
            row["concurrency"],
            f"{row['records']:,}",
            f"{row['value']:,.0f} rec/s" if row["unit"] == "records/s" else
            f"{row['value']:.3f} s",
            f"{row['ratio']:.2f}x",
            row["target"],
            "" if row["met"] is None else ("yes" if row["met"] else "NO"),
        ]
        for row in rows
    ]  # fmt: skip
    return markdown_table(headers, table)


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """The rows, with the ratios for the summary; ``met`` says whether every target holds."""
    # Closing a run with records in flight abandons them on purpose: no warning per run.
    logger = logging.getLogger("bolide.facade.parallel")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        rows = _rows(context.cluster, args)
    finally:
        logger.setLevel(level)
    title = (
        f"parallel receiver (1 partition, {args.keys:,} keys, key order; medians of "
        f"{args.repeat} I/O and {args.cpu_repeat} no-work runs; {context.broker})"
    )
    text = (
        f"{_table(rows)}\n\nratio: I/O rows, rate / (concurrency x the single-thread rate); "
        "no-work rows, time / time at concurrency 1."
    )
    met = all(row["met"] is not False for row in rows)
    return Report(title, text, _ratios(rows), {"rows": rows, "met": met})


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
