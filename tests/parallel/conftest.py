"""Parallel receiver fixtures: keyed streams and a log of what handlers did, with checks."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import CONSUMER_DEFAULTS
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER
from tests.reliability.conftest import group_name, members, rng

# The kill test's fixtures (worker processes, seeded kill points) come from the reliability
# suite, whose worker has a ``parallel`` mode.
__all__ = [
    "LEASE_MS",
    "Log",
    "confirm_source",
    "fresh_group",
    "group_name",
    "members",
    "publish_keyed",
    "rng",
    "tier_copy",
]

#: Grouped subscribers in these tests: the embedded broker's join takes half of it.
LEASE_MS = 4_000


def tier_copy(
    cluster: Cluster, stream: str, tier: str, key: bytes, origin: int, attempts: int
) -> None:
    """A copy of ``stream``'s record ``origin`` (partition 0) in ``tier``, as a receiver
    writes it: for tests that set the tiers' state up themselves."""
    headers = [
        (ORIGIN_HEADER, f"{stream}/0/{origin}".encode()),
        (ATTEMPTS_HEADER, b"%d" % attempts),
    ]
    with Publisher(cluster, PublisherConfig(stream=StreamConfig(name=tier, partitions=1))) as pub:
        pub.publish_async(Record(b"%d" % origin, key=key, headers=headers, partition=0)).result(60)


def confirm_source(
    cluster: Cluster, group: str, topic: str, offset: int, metadata: str = ""
) -> None:
    """Commit ``group``'s offset of ``topic`` partition 0, as a member that moved its
    records to the tiers would have (or a tier's, its finished copies in ``metadata``)."""
    owner = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": group}))
    try:
        where = TopicPartition(topic, 0, offset, metadata=metadata)
        owner.commit(offsets=[where], asynchronous=False)
    finally:
        owner.close()


def fresh_group() -> str:
    return f"par-{uuid.uuid4().hex[:10]}"


def publish_keyed(
    cluster: Cluster, stream: StreamConfig, count: int, keys: int
) -> dict[tuple[int, int], bytes]:
    """Publish ``count`` records ``b"<i>"`` with keys ``k<i % keys>``; return the key of
    every ``(partition, offset)``."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        records = [Record(b"%d" % i, key=b"k%d" % (i % keys)) for i in range(count)]
        futures = [pub.publish_async(r) for r in records]
        assert pub.flush(60) == 0
        offsets = [f.result(60) for f in futures]
    return {(r.partition or 0, o): r.key or b"" for r, o in zip(records, offsets, strict=True)}


@dataclass
class Log:
    """What handlers did, from any thread: starts and ends per record, overlaps per key."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: list[tuple[int, int, bytes | None]] = field(default_factory=list)
    running: Counter[object] = field(default_factory=Counter)
    running_now: int = 0
    most_at_once: int = 0
    overlaps: list[tuple[object, int]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def start(self, record: Record, lane: object) -> None:
        with self.lock:
            if self.running[lane]:
                self.overlaps.append((lane, record.offset or 0))
            self.running[lane] += 1
            self.running_now += 1
            self.most_at_once = max(self.most_at_once, self.running_now)
            self.threads.add(threading.current_thread().name)

    def end(self, record: Record, lane: object) -> None:
        with self.lock:
            self.running[lane] -= 1
            self.running_now -= 1
            self.done.append((record.partition or 0, record.offset or 0, record.key))

    def count(self) -> int:
        with self.lock:
            return len(self.done)

    def by_lane(self, lane_of: Callable[[tuple[int, int, bytes | None]], object]) -> dict:
        """Offsets handled per lane, in the order their handlers ended."""
        out: dict[object, list[int]] = {}
        with self.lock:
            for entry in self.done:
                out.setdefault(lane_of(entry), []).append(entry[1])
        return out
