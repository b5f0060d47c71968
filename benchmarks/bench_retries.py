"""Retry tiers: records/s through a tier against plain publishing, in one run.

The reference is ``Publisher.publish_async`` of the same records (100 B, 100 keys) to a fresh
stream, flushed. bolide's side: a parallel receiver whose handler fails every record's first
call, so each record is copied to a retry tier (delay 1 ms), read back, called again and
confirmed on both streams; the rate is the records handled per second from the first call to
the last success. It is bounded by a publish and a read of each record, so the ratio tells how
much the tier adds on top of the publish it needs.

Then the cost of failures in a receiver's steady work: the same stream read by a receiver with
tiers whose handler (which does nothing else) fails 0%, 1% and 10% of the records once; each
failure is a move to the tier (a Kafka transaction carrying it, batched with the other moves of
its moment) and a call back. The ratios are the rates with failures over the rate without,
in one run; "per move" is the time each failure adds, ``(1/rate - 1/rate at 0%) / share``.

Run from the repository root: ``python -m benchmarks.bench_retries [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import threading
import time

from benchmarks._common import Context, Ratio, Report, markdown_table, standalone
from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)

NAME = "retries"
_TIMEOUT_S = 300.0


def publish_rate(cluster: Cluster, count: int) -> tuple[float, StreamConfig]:
    """Records/s of plain ``publish_async`` to a fresh stream, and the stream."""
    stream = StreamConfig(name=f"bench-retries-{time.time_ns()}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        started = time.perf_counter()
        for i in range(count):
            pub.publish_async(Record(b"x" * 100, key=b"k%d" % (i % 100)))
        pub.flush(_TIMEOUT_S)
        return count / (time.perf_counter() - started), stream


def failing_rate(cluster: Cluster, stream: StreamConfig, count: int, every: int) -> float:
    """Records/s of a receiver with a retry tier whose handler fails the first call of one
    record in ``every`` (none when 0), from the first call to the last record finished."""
    lock, done = threading.Lock(), threading.Event()
    failed: set[int] = set()
    clock = {"first": 0.0, "last": 0.0, "handled": 0}

    def handler(record: Record) -> None:
        offset = record.offset or 0
        with lock:
            if not clock["first"]:
                clock["first"] = time.perf_counter()
            if every and offset % every == 0 and offset not in failed:
                failed.add(offset)
                raise RuntimeError("first call fails")
            clock["handled"] += 1
            if clock["handled"] == count:
                clock["last"] = time.perf_counter()
                done.set()

    config = SubscriberConfig(
        stream=stream,
        group=f"bench-retries-{time.time_ns()}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
    )
    # A tier of its own: a tier stream is read from its start by a group new to it.
    tier = RetryTier(delay_s=0.001, stream=f"{stream.name}.tier-{time.time_ns()}")
    retry = Retry(attempts=1, backoff_s=0, tiers=[tier])
    with Subscriber(cluster, config) as sub:
        sub.attach_receiver(handler, concurrency=8, retry=retry)
        if not done.wait(_TIMEOUT_S):
            raise TimeoutError(f"{clock['handled']} of {count} handled")
    return count / (clock["last"] - clock["first"])


def failure_rows(
    context: Context, stream: StreamConfig, count: int
) -> tuple[list[list[str]], list[Ratio]]:
    """Rates at 0%, 1% and 10% failing once, alternated twice; the median of each."""
    rates: dict[int, list[float]] = {0: [], 100: [], 10: []}
    for _ in range(2):
        for every in rates:
            context.say(NAME, f"receiver, one record in {every or 'none'} failing once")
            rates[every].append(failing_rate(context.cluster, stream, count, every))
    best = {every: sorted(found)[len(found) // 2] for every, found in rates.items()}
    rows, ratios = [], []
    for every, label in ((0, "none"), (100, "1%"), (10, "10%")):
        rate = best[every]
        ratio = Ratio(NAME, f"receiver, {label} failing once", "no failure", "records/s",
                      best[0], rate, None)  # fmt: skip
        per_move = "" if not every else f"{(1 / rate - 1 / best[0]) * every * 1000:.2f} ms"
        rows.append([f"receiver with a tier, {label} failing once", f"{rate:,.0f}",
                     f"{ratio.ratio:.2f}x", per_move])  # fmt: skip
        if every:
            ratios.append(ratio)
    return rows, ratios


def bench(context: Context) -> Report:
    """``run_all``'s entry: plain publishing, then the same records through a tier."""
    count = 300 if context.quick else 5_000
    context.say(NAME, f"publish {count} records")
    reference, stream = publish_rate(context.cluster, count)
    context.say(NAME, "the same records through a retry tier")
    rate = failing_rate(context.cluster, stream, count, 1)  # every record's first call fails
    ratio = Ratio(NAME, "through a retry tier", "plain publish_async", "records/s",
                  reference, rate, None)  # fmt: skip
    rows = [
        ["plain publish_async", f"{reference:,.0f}", "1.00x"],
        ["through a retry tier (fail, copy, read back, call)", f"{rate:,.0f}",
         f"{ratio.ratio:.2f}x"],
    ]  # fmt: skip
    table = markdown_table(["path", "records/s", "ratio"], rows)
    failing, more = failure_rows(context, stream, count)
    table += "\n\n" + markdown_table(["receiver", "records/s", "ratio", "per move"], failing)
    title = f"retries: records through a retry tier vs plain publishing ({context.broker})"
    return Report(title, table, [ratio, *more], {"records": count})


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
