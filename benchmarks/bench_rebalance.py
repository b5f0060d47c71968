"""The rebalance when a third member joins a group of two reading 12 partitions under load:
eager against cooperative-sticky against Kafka 4's consumer group protocol (KIP-848).

Each run publishes a backlog to a fresh 12-partition stream; two members poll it (a handler
that takes ``SLEEP_S`` per record, a confirm after each poll) until both read, then a third
joins. From the join until the group has settled (every partition held by one member, each
member holding some) and a second after, it records: how long the two first members delivered
nothing at all (their longest pause), the records per second they delivered on the partitions
they kept, and the records delivered twice (re-run: read by a member that lost the partition
and again by its next owner). Each protocol runs on a group of its own.

Run from the repository root: ``python -m benchmarks.bench_rebalance [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from benchmarks._common import Context, Report, markdown_table, standalone, wait_until
from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)

NAME = "rebalance"
PARTITIONS = 12
SLEEP_S = 0.001
#: How each protocol is asked for, by ``consumer_config``.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "eager (range)": {},
    "cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky"},
    "consumer (KIP-848)": {"group.protocol": "consumer"},
}
_TIMEOUT_S = 300.0
_AFTER_S = 1.0


def publish(cluster: Cluster, count: int) -> StreamConfig:
    """A fresh 12-partition stream of ``count`` records spread over its partitions."""
    stream = StreamConfig(
        name=f"bench-rebalance-{time.time_ns()}", partitions=PARTITIONS, global_order=False
    )
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish_async(Record(b"x" * 100, partition=i % PARTITIONS))
        pub.flush(120)
    return stream


class _Member:
    """A grouped subscriber polled on its own thread, keeping when it delivered what."""

    def __init__(
        self, cluster: Cluster, stream: StreamConfig, group: str, settings: dict[str, Any]
    ) -> None:
        self.lock = threading.Lock()
        self.held: set[int] = set()
        self.delivered: list[tuple[float, int, int]] = []
        self.sub = Subscriber(
            cluster,
            SubscriberConfig(
                stream=stream,
                group=group,
                lease_timeout_ms=10_000,
                max_batch=50,
                consumer_config=settings,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
            ),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_assign(self, parts: list[int]) -> None:
        with self.lock:
            self.held |= set(parts)

    def _on_revoke(self, parts: list[int]) -> None:
        with self.lock:
            self.held -= set(parts)

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self.sub.poll(50)
            for record in batch:
                time.sleep(SLEEP_S)
                with self.lock:
                    self.delivered.append(
                        (time.perf_counter(), record.partition or 0, record.offset or 0)
                    )
            if len(batch):
                self.sub.confirm()

    def holding(self) -> set[int]:
        with self.lock:
            return set(self.held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.sub.close()


def _wait(check: Any, what: str) -> None:
    wait_until(check, f"rebalance benchmark: {what}", _TIMEOUT_S)


def _settled(members: list[_Member]) -> bool:
    held = [m.holding() for m in members]
    return all(held) and sorted(p for h in held for p in h) == list(range(PARTITIONS))


@dataclass
class Outcome:
    """One protocol's rebalance, as the two first members saw it."""

    settle_s: float
    pause_s: float
    kept_rate: float
    twice: int


def _measure(first: list[_Member], kept: list[set[int]], start: float, end: float) -> Outcome:
    times: list[float] = []
    on_kept = 0
    for member, mine in zip(first, kept, strict=True):
        with member.lock:
            window = [(t, p) for t, p, _ in member.delivered if start <= t <= end]
        times += [t for t, _ in window]
        on_kept += sum(1 for _, p in window if p in mine)
    edges = [start, *sorted(times), end]
    pause = max(b - a for a, b in itertools.pairwise(edges))
    return Outcome(0.0, pause, on_kept / (end - start), 0)


def run_protocol(cluster: Cluster, stream: StreamConfig, settings: dict[str, Any]) -> Outcome:
    """Two members read ``stream``; a third joins; what the two first saw of the rebalance."""
    group = f"bench-rebalance-{time.time_ns()}"
    members = [_Member(cluster, stream, group, settings) for _ in range(2)]
    try:
        _wait(lambda: _settled(members), "the first two members settle")
        _wait(lambda: all(len(m.delivered) > 200 for m in members), "the first two read")
        before = [m.holding() for m in members]
        joined = time.perf_counter()
        members.append(_Member(cluster, stream, group, settings))
        _wait(lambda: _settled(members), "the three members settle")
        settled = time.perf_counter()
        time.sleep(_AFTER_S)
        kept = [b & m.holding() for b, m in zip(before, members, strict=False)]
        outcome = _measure(members[:2], kept, joined, settled + _AFTER_S)
        outcome.settle_s = settled - joined
    finally:
        for member in members:
            member.close()
    counts = Counter((p, o) for m in members for _, p, o in m.delivered)
    outcome.twice = sum(1 for n in counts.values() if n > 1)
    return outcome


def bench(context: Context) -> Report:
    """``run_all``'s entry: each protocol in turn, on a backlog of its own."""
    per_partition = 500 if context.quick else 5_000
    rows: list[list[object]] = []
    data: dict[str, Any] = {"partitions": PARTITIONS, "sleep_s": SLEEP_S}
    for name, settings in PROTOCOLS.items():
        context.say(NAME, name)
        stream = publish(context.cluster, per_partition * PARTITIONS)
        outcome = run_protocol(context.cluster, stream, settings)
        data[name] = vars(outcome)
        rows.append(
            [
                name,
                f"{outcome.settle_s:.2f}",
                f"{outcome.pause_s:.2f}",
                f"{outcome.kept_rate:,.0f}",
                outcome.twice,
            ]
        )
    headers = [
        "protocol",
        "join to settled (s)",
        "longest pause of the two (s)",
        "records/s on kept partitions",
        "records delivered twice",
    ]
    title = (
        f"rebalance: a third member joins two reading {PARTITIONS} partitions "
        f"({SLEEP_S * 1000:g} ms per record; {context.broker})"
    )
    return Report(title, markdown_table(headers, rows), [], data)


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
