"""Publish-to-read latency under load: publishers and one group of subscribers at a fixed rate.

The shape of the reliability soak (``tests/reliability/test_load.py``): ``--publishers``
publishers send ``--rate`` records per second in total, sixteen message groups each, to a
4-partition stream read by ``--subscribers`` members of one group that confirm after each
batch. Every record carries its publish time; the latency is the time from ``publish_async``
to the member's ``poll`` returning it. Percentiles are given for the whole run and after
``--warmup-s`` (the first records wait for the members' first fetches).

Latency depends on the machine and its load, so it is measured here, not asserted by a test.
Run ``python -m benchmarks.bench_load --help`` from the repository root, or ``bolide bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import struct
import threading
import time
import uuid
from typing import Any

from benchmarks._common import (
    Command,
    Context,
    Report,
    markdown_table,
    positive_int,
    settings_of,
    summarize,
    wait_until,
)
from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)

__all__ = ["bench", "main", "run"]

NAME = "load"
PARTITIONS = 4
KEYS = 16  # message groups per publisher
LEASE_MS = 6_000
_PAYLOAD = struct.Struct("!IIq")  # publisher, sequence number, perf_counter_ns at publish
_PHASE_TIMEOUT_S = 120.0


class _Member(threading.Thread):
    """A group member that reads, confirms after each batch and notes each record's latency."""

    def __init__(self, sub: Subscriber) -> None:
        super().__init__(daemon=True)
        self.sub = sub
        self.seen: list[tuple[int, float]] = []  # (sequence number, latency in ms)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            batch = self.sub.poll(100)
            now = time.perf_counter_ns()
            for record in batch:
                _, seq, sent = _PAYLOAD.unpack(record.data)
                self.seen.append((seq, (now - sent) / 1e6))
            if len(batch):
                self.sub.confirm()


def _wait(check: Any, what: str) -> None:
    wait_until(check, what, _PHASE_TIMEOUT_S)


def run(
    cluster: Cluster,
    *,
    seconds: float = 15.0,
    rate: float = 2_000.0,
    publishers: int = 8,
    subscribers: int = 8,
    warmup_s: float = 3.0,
) -> dict[str, Any]:
    """Run one load; return the record counts and the latency percentiles (ms)."""
    stream = StreamConfig(
        name=f"bench-load-{uuid.uuid4().hex[:10]}", partitions=PARTITIONS, global_order=False
    )
    sub_config = SubscriberConfig(
        stream=stream, group=f"bench-{uuid.uuid4().hex[:8]}", lease_timeout_ms=LEASE_MS
    )
    members = [_Member(Subscriber(cluster, sub_config)) for _ in range(subscribers)]
    pubs = [Publisher(cluster, PublisherConfig(stream=stream)) for _ in range(publishers)]
    sent = [0] * publishers
    stop = threading.Event()

    def publish(index: int) -> None:
        interval = publishers / rate
        next_at = time.perf_counter()
        seq = 0
        while not stop.is_set():
            payload = _PAYLOAD.pack(index, seq, time.perf_counter_ns())
            pubs[index].publish_async(Record(payload, group=f"{index}-{seq % KEYS}"))
            seq += 1
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        sent[index] = seq

    try:
        for member in members:
            member.start()
        # The group settled before the clock starts: the run measures steady state.
        owners = min(subscribers, PARTITIONS)
        _wait(lambda: sum(m.sub.is_assigned() for m in members) == owners, "group join")
        threads = [threading.Thread(target=publish, args=(i,)) for i in range(publishers)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        for pub in pubs:
            pub.flush(_PHASE_TIMEOUT_S)
        total = sum(sent)
        _wait(lambda: sum(len(m.seen) for m in members) >= total, "reading every record")
    finally:
        stop.set()
        for member in members:
            member.stop.set()
        for member in members:
            member.join(30)
            member.sub.close()
        for pub in pubs:
            pub.close()
    steady_from = warmup_s * rate / publishers  # sequence numbers sent after the warm-up
    whole = [lat for m in members for _, lat in m.seen]
    steady = [lat for m in members for seq, lat in m.seen if seq >= steady_from] or whole
    return {
        "records": total,
        "throughput_per_s": round(total / elapsed),
        "whole_ms": summarize(whole),
        "after_warmup_ms": summarize(steady),
    }


def table(result: dict[str, Any]) -> str:
    """The Markdown table of one run's latency percentiles."""
    rows = [
        [span, *(f"{result[key][q]:.2f}" for q in ("min", "p50", "p95", "p99", "max"))]
        for span, key in (("whole run", "whole_ms"), ("after warm-up", "after_warmup_ms"))
    ]
    return markdown_table(["latency (ms)", "min", "p50", "p95", "p99", "max"], rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=positive_int, default=15, help="length of the run")
    parser.add_argument("--rate", type=positive_int, default=2_000, help="records/s in total")
    parser.add_argument("--publishers", type=positive_int, default=8)
    parser.add_argument("--subscribers", type=positive_int, default=8)
    parser.add_argument(
        "--warmup-s", type=float, default=3.0, help="seconds left out of 'after warm-up'"
    )


#: ``--quick``: a one-second run of one publisher and one subscriber.
QUICK = ["--seconds", "1", "--rate", "100", "--publishers", "1", "--subscribers", "1"]
QUICK += ["--warmup-s", "0"]


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """The latency table (latency has no ratio to a raw path here)."""
    context.say(NAME, str(settings_of(args)))
    result = run(
        context.cluster,
        seconds=args.seconds,
        rate=args.rate,
        publishers=args.publishers,
        subscribers=args.subscribers,
        warmup_s=args.warmup_s,
    )
    title = (
        f"load: publish-to-read latency, {args.publishers} publishers, "
        f"{args.subscribers} subscribers, {args.rate} records/s "
        f"({result['records']} records, {result['throughput_per_s']} records/s; {context.broker})"
    )
    return Report(title, table(result), [], result)


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
