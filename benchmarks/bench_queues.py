"""Share groups against a consumer group on one partition: the queue scales with its members.

A one-partition stream, a handler that sleeps 5 ms per record. The reference is one member of a
consumer group (more members would not help: the partition feeds one of them); bolide's side is
1, 2 and 4 members of a share group (``SubscriberConfig(share_group=...)``), each polling,
handling and acking on its own thread. The ratio is the share group's deliveries per second
over the consumer group's; the targets ask for near-linear scaling (0.8 per member from 2 on).
Records are published one per producer batch: a share fetch acquires whole batches.

Run from the repository root: ``python -m benchmarks.bench_queues [--quick] [--json]``.
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
    ShareSubscriber,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.features import broker_features

NAME = "queues"
SLEEP_S = 0.005
MEMBERS = (1, 2, 4)
_TIMEOUT_S = 300.0


def publish(cluster: Cluster, count: int) -> StreamConfig:
    """A fresh one-partition stream of ``count`` records, one per producer batch."""
    stream = StreamConfig(name=f"bench-queues-{time.time_ns()}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish(Record(b"x" * 100, key=b"k%d" % (i % 100)))
    return stream


class _Clock:
    """Deliveries handled, from the first call's start to the ``count``-th call's end."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.first = self.last = 0.0
        self.handled = 0

    def handle(self, record: Record) -> None:
        with self.lock:
            if not self.first:
                self.first = time.perf_counter()
        time.sleep(SLEEP_S)
        with self.lock:
            self.handled += 1
            if self.handled == self.count:
                self.last = time.perf_counter()
                self.done.set()

    def rate(self) -> float:
        if not self.done.wait(_TIMEOUT_S):
            raise TimeoutError(f"{self.handled} of {self.count} handled")
        return self.count / (self.last - self.first)


def consumer_group_rate(cluster: Cluster, stream: StreamConfig, count: int) -> float:
    """Deliveries/s of one consumer-group member handling records one after another."""
    clock = _Clock(count)
    config = SubscriberConfig(
        stream=stream,
        group=f"bench-queues-cg-{time.time_ns()}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
    )
    with Subscriber(cluster, config) as sub:
        while not clock.done.is_set():
            for record in sub.poll(100):
                if not clock.done.is_set():
                    clock.handle(record)
            sub.confirm()
    return clock.rate()


def share_group_rate(cluster: Cluster, stream: StreamConfig, members: int, count: int) -> float:
    """Deliveries/s of ``members`` share-group members, each on its own thread."""
    clock = _Clock(count)
    config = SubscriberConfig(stream=stream, share_group=f"bench-queues-{time.time_ns()}",
                              max_batch=10)  # fmt: skip
    subs = [ShareSubscriber(cluster, config) for _ in range(members)]

    def work(sub: ShareSubscriber) -> None:
        while not clock.done.is_set():
            for record in sub.poll(100):
                if clock.done.is_set():
                    sub.release(record)
                    continue
                clock.handle(record)
                sub.ack(record)  # sent with the next poll

    threads = [threading.Thread(target=work, args=(sub,)) for sub in subs]
    try:
        for thread in threads:
            thread.start()
        return clock.rate()
    finally:
        clock.done.set()
        for thread in threads:
            thread.join(30)
        for sub in subs:
            sub.close()


def bench(context: Context) -> Report:
    """``run_all``'s entry: the consumer group, then 1, 2 and 4 share members."""
    features = broker_features(context.cluster)
    if features is not None and features.share_groups() is not None:
        raise ImportError(f"share groups are not available: {features.share_groups()}")
    per_member = 40 if context.quick else 400  # about 2 s of work per member
    stream = publish(context.cluster, per_member * max(MEMBERS))
    context.say(NAME, "one consumer-group member")
    reference = consumer_group_rate(context.cluster, stream, per_member)
    rows: list[list[object]] = [["consumer group, 1 member", f"{reference:,.0f}", "1.00x", ""]]
    ratios = []
    for members in MEMBERS:
        context.say(NAME, f"{members} share-group members")
        rate = share_group_rate(context.cluster, stream, members, per_member * members)
        target = 0.8 * members if members > 1 else None
        reader = f"share group, {members} member{'s' if members > 1 else ''}"
        ratio = Ratio(NAME, reader, "1 consumer-group member",
                      "deliveries/s", reference, rate, target)  # fmt: skip
        ratios.append(ratio)
        rows.append([reader, f"{rate:,.0f}", f"{ratio.ratio:.2f}x",
                     "" if target is None else f">= {target:.1f}x"])  # fmt: skip
    table = markdown_table(["reader", "deliveries/s", "ratio", "target"], rows)
    title = f"queues: share group vs consumer group (1 partition, 5 ms handler; {context.broker})"
    return Report(title, table, ratios, {"per_member": per_member, "sleep_s": SLEEP_S})


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
