"""Resequencer throughput on shuffled groups against a plain pass-through of the same records.

End to end (the target): a subscriber reads the same records from the broker twice, once
handing each record straight to the handler (pass-through) and once through a ``Resequencer``
(offer, handle what it releases, read ``safe_offset`` per batch). The ratio
resequenced/pass-through says what resequencing costs a consumer; the target is >= 0.7.

In memory (for reference): the resequencer alone on the records already in memory, against
its own pass-through path (records without sequence headers) and a bare loop. These isolate
the bookkeeping and are far below the end-to-end ratio: in memory there is nothing else to do.

Run from the repository root: ``python -m benchmarks.bench_resequencer [--records N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

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
    Resequencer,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.resequencer.sequence import sequence_headers

NAME = "resequencer"
TARGET = 0.7
Mode = Literal["batch", "stream"]


def shuffled_groups(count: int, max_size: int, window: int, seed: int = 7) -> list[Record]:
    """``count`` sequenced records in groups of 1..``max_size``, shuffled ``window`` at a time.

    Kafka delivers a partition in order, so disorder is local: records of about
    ``window / (max_size / 2)`` groups interleave at any time.
    """
    rng = random.Random(seed)
    records: list[Record] = []
    group = 0
    while len(records) < count:
        size = rng.randint(1, max_size)
        name = f"g{group}"
        records += [
            Record(b"x" * 100, headers=sequence_headers(name, size, n), group=name)
            for n in range(size)
        ]
        group += 1
    records = records[:count]  # the last group may stay incomplete, as in a live stream
    out: list[Record] = []
    for start in range(0, len(records), window):
        part = records[start : start + window]
        rng.shuffle(part)
        out += part
    return out


# -- end to end --------------------------------------------------------------------------


def _read(
    cluster: Cluster, stream: StreamConfig, count: int, reseq: Resequencer | None
) -> tuple[float, float]:
    """Read ``count`` records with a fresh subscriber; return (wall, thread CPU) seconds.

    The clock starts once the client has prefetched the stream (librdkafka fetches in the
    background), so both sides measure the consumer's own work, not the broker's pace.
    """
    handled = seen = 0
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=2_000
    )
    with Subscriber(cluster, config) as sub:
        first = sub.poll(10_000)
        time.sleep(1.0)  # let the background fetcher fill the local queue
        wall, cpu = time.perf_counter(), time.thread_time()
        batch = first
        while True:
            seen += len(batch)
            if reseq is None:
                for _record in batch:
                    handled += 1
            else:
                offer = reseq.offer
                for record in batch:
                    for _released in offer(record):
                        handled += 1
                reseq.safe_offset(0)
            if seen >= count:
                break
            batch = sub.poll(1_000)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    assert handled <= count
    return wall, cpu


def end_to_end(
    cluster: Cluster, records: list[Record], repeat: int, mode: Mode
) -> dict[str, float]:
    """Publish ``records`` once, then read them ``repeat`` times each way.

    Returns the best records/s of each side (wall clock, and per CPU second of the reading
    thread, which a busy machine disturbs least) and the median ratio of the back-to-back
    pairs (wall clock), which is what the target applies to.
    """
    stream = StreamConfig(name=f"bench-reseq-{time.time_ns()}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for record in records:
            pub.publish_async(Record(record.data, headers=record.headers, group=record.group))
        pub.flush(60)
    count = len(records)
    best = {"passthrough": [math.inf, math.inf], "resequenced": [math.inf, math.inf]}
    pairs: list[float] = []
    for run in range(repeat):  # interleaved, so both sides see the same machine load
        walls = {}
        for side in sorted(best, reverse=run % 2 == 1):  # and in turn first
            reseq = None
            if side == "resequenced":
                reseq = Resequencer(mode=mode, capacity=max(count, 10_000), timeout_s=600)
            wall, cpu = _read(cluster, stream, count, reseq)
            best[side] = [min(best[side][0], wall), min(best[side][1], cpu)]
            walls[side] = wall
        pairs.append(walls["passthrough"] / walls["resequenced"])
    result = {
        f"{side}_{kind}_rps": count / best[side][index]
        for side in best
        for index, kind in enumerate(("wall", "cpu"))
    }
    # Each pair ran back to back: the median of their ratios resists a busy machine best.
    result["paired_ratio"] = statistics.median(pairs)
    return result


# -- in memory --------------------------------------------------------------------------


def _best(fn: Callable[[], object], repeat: int) -> float:
    """Best CPU seconds of the calling thread over ``repeat`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def in_memory(records: list[Record], repeat: int, mode: Mode) -> dict[str, float]:
    """The resequencer alone: shuffled groups, its pass-through path, and a bare loop."""
    for offset, record in enumerate(records):
        record.partition, record.offset = 0, offset
    plain = []
    for record in records:
        copy = Record(record.data, key=record.key)
        copy.partition, copy.offset = record.partition, record.offset
        plain.append(copy)
    count = len(records)

    def bare() -> None:
        out: list[Record] = []
        for record in records:
            out.append(record)

    def through(items: list[Record]) -> Callable[[], None]:
        def go() -> None:
            reseq = Resequencer(mode=mode, capacity=max(count, 10_000), timeout_s=600)
            offer = reseq.offer
            out: list[Record] = []
            for record in items:
                out += offer(record)
            reseq.safe_offset(0)

        return go

    return {
        "bare_rps": count / _best(bare, repeat),
        "passthrough_rps": count / _best(through(plain), repeat),
        "resequenced_rps": count / _best(through(records), repeat),
    }


# -- driver -------------------------------------------------------------------------------


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=50_000, help="records per run")
    parser.add_argument("--max-group", type=positive_int, default=50, help="largest group size")
    parser.add_argument(
        "--window", type=positive_int, default=1_000, help="records shuffled together"
    )
    parser.add_argument("--repeat", type=positive_int, default=7, help="runs per side")
    parser.add_argument("--mode", choices=["batch", "stream"], default="batch")
    parser.add_argument("--target", type=float, default=TARGET)


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Run both measures: the table, and the end-to-end ratio with its target."""
    started = time.monotonic()
    records = shuffled_groups(args.records, args.max_group, args.window)
    memory = in_memory(records, args.repeat, args.mode)
    e2e = end_to_end(context.cluster, records, args.repeat, args.mode)
    elapsed = time.monotonic() - started
    ratio = e2e["paired_ratio"]
    met = ratio >= args.target

    def row(path: str, plain: float, ours: float) -> list[Any]:
        share = ours / plain
        ratio_text = f"{share:.3f}x" if share < 0.1 else f"{share:.2f}x"
        return [path, f"{plain:,.0f}", f"{ours:,.0f}", ratio_text, "", ""]

    rows = [
        [
            "subscriber to handler (best runs; ratio: median of pairs)",
            f"{e2e['passthrough_wall_rps']:,.0f}",
            f"{e2e['resequenced_wall_rps']:,.0f}",
            f"{ratio:.2f}x",
            f">= {args.target}",
            "yes" if met else "NO",
        ],
        row(
            "subscriber to handler, per CPU second of the reading thread",
            e2e["passthrough_cpu_rps"],
            e2e["resequenced_cpu_rps"],
        ),
        row(
            "in memory (resequencer pass-through path)",
            memory["passthrough_rps"],
            memory["resequenced_rps"],
        ),
        row("in memory (bare loop)", memory["bare_rps"], memory["resequenced_rps"]),
    ]
    title = (
        f"resequencer ({args.mode} mode, {args.records:,} records, groups of "
        f"1-{args.max_group} shuffled {args.window} at a time; {context.broker}, {elapsed:.0f} s)"
    )
    headers = ["path", "pass-through rec/s", "resequenced rec/s", "ratio", "target", "met"]
    headline = Ratio(
        NAME,
        "resequenced subscriber (median of pairs)",
        "pass-through subscriber",
        "records/s",
        e2e["passthrough_wall_rps"],
        e2e["passthrough_wall_rps"] * ratio,
        args.target,
    )
    doc = {
        "end_to_end": e2e,
        "in_memory": memory,
        "ratio": ratio,
        "target": args.target,
        "met": met,
    }
    return Report(title, markdown_table(headers, rows), [headline], doc)


#: ``--quick``: 6,000 records, one run per side.
COMMAND = Command(NAME, _measure, _options, ["--records", "6000", "--repeat", "1"], __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
