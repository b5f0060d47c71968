"""Incremental rebalancing: with ``partition.assignment.strategy=cooperative-sticky`` or Kafka
4's consumer group protocol (``group.protocol=consumer``, KIP-848), a third member joining a
group of two takes partitions without the others giving up the ones they keep: the hooks name
only what moves, a kept partition reads on from where it stood (polled or under a parallel
receiver), and nothing is lost or read twice past what was confirmed. Eager (the default)
revokes everything, as before.

Tansu serves neither protocol's incremental hand-over to test here; these run on Apache Kafka.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from bolide.facade import (
    Cluster,
    OffsetOutOfRangeError,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import probe_consumer
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group, publish_keyed

pytestmark = [pytest.mark.kafka]

PROTOCOLS = {
    "eager": {},
    "cooperative": {"partition.assignment.strategy": "cooperative-sticky"},
    "consumer": {"group.protocol": "consumer"},
}
PARTITIONS = 6
_STAMPS = itertools.count()  # one order over every member of a test (they share a process)
_CALLED: set[tuple[str, int, int]] = set()  # records a member's handler was called on
_CALLED_LOCK = threading.Lock()


@pytest.fixture
def kafka_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine has no cooperative or KIP-848 groups")
    return bolide_backend[1]


class Member:
    """A grouped subscriber, polled in a thread (or running a parallel receiver), keeping
    what its hooks were told and what it read."""

    def __init__(
        self,
        cluster: Cluster,
        stream: StreamConfig,
        group: str,
        protocol: str,
        *,
        receiver: bool,
        retry: Retry | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.held: set[int] = set()
        self.read: list[tuple[int, int]] = []
        self.errors: list[BaseException] = []
        self.finished: list[tuple[int, int, int]] = []  # (stamp, partition, offset)
        self.sub = Subscriber(
            cluster,
            SubscriberConfig(
                stream=stream,
                group=group,
                # The default lease: tests/pubsub/test_stock_groups.py runs these members on
                # Kafka's stock group settings too.
                consumer_config=PROTOCOLS[protocol],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
            ),
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if receiver and retry is not None:
            self.sub.attach_receiver(self._handle_once, concurrency=4, retry=retry)
        elif receiver:
            self.sub.attach_receiver(self._handle, concurrency=4)
        else:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def _on_assign(self, parts: list[int]) -> None:
        with self.lock:
            self.assigned.append(parts)
            self.held |= set(parts)

    def _on_revoke(self, parts: list[int]) -> None:
        with self.lock:
            self.revoked.append(parts)
            self.held -= set(parts)

    def _handle(self, record: Record) -> None:
        time.sleep(0.002)
        with self.lock:
            self.read.append((record.partition or 0, record.offset or 0))

    def _handle_once(self, record: Record) -> None:
        """Every seventh record's first call in the group fails (it goes through the tiers,
        its key parked behind it); a success is stamped in the group's order."""
        place = (record.stream, record.partition or 0, record.offset or 0)
        with _CALLED_LOCK:
            first = place not in _CALLED
            _CALLED.add(place)
        if first and place[2] % 7 == 3:
            raise RuntimeError("fails once")
        self._handle(record)
        with self.lock:
            self.finished.append((next(_STAMPS), place[1], place[2]))

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.sub.poll(50)
                with self.lock:
                    self.read.extend((r.partition or 0, r.offset or 0) for r in batch)
                if len(batch):
                    self.sub.confirm()
            except Exception as exc:  # kept for the test to look at
                self.errors.append(exc)
                return

    def holding(self) -> set[int]:
        with self.lock:
            return set(self.held)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        if not self.sub.closed:
            self.sub.close()


@contextmanager
def group_of(
    cluster: Cluster,
    stream: StreamConfig,
    protocol: str,
    *,
    receiver: bool,
    retry: Retry | None = None,
) -> Iterator[tuple[list[Member], Any]]:
    group = fresh_group()
    live: list[Member] = []

    def join() -> Member:
        member = Member(cluster, stream, group, protocol, receiver=receiver, retry=retry)
        live.append(member)
        return member

    try:
        yield live, join
    finally:
        for member in live:
            member.stop()


def settled(live: list[Member]) -> bool:
    """Every member holds a partition, and each partition is held by exactly one."""
    held = [m.holding() for m in live]
    return all(held) and sorted(p for h in held for p in h) == list(range(PARTITIONS))


def read_all(live: list[Member], published: dict[tuple[int, int], bytes]) -> bool:
    return set(published) <= {r for m in live for r in list(m.read)}


def snapshot(live: list[Member]) -> tuple[list[set[int]], list[tuple[list, list]]]:
    """What each member holds, and the hooks' arguments so far (closing revokes the rest)."""
    held, hooks = [], []
    for m in live:
        with m.lock:
            held.append(set(m.held))
            hooks.append((list(m.assigned), list(m.revoked)))
    return held, hooks


def join_third(live: list[Member], join: Any) -> list[tuple[set[int], int, int]]:
    """Let a third member join a settled group of two; returns what each of the two held
    before, and how many assignments and revocations its hooks had been told of by then."""
    eventually(lambda: settled(live), 120)
    held, hooks = snapshot(live)
    before = [(held[i], len(hooks[i][0]), len(hooks[i][1])) for i in range(2)]
    join()
    eventually(lambda: settled(live), 180)
    return before


def since_join(
    before: list[tuple[set[int], int, int]], after: list[set[int]], hooks: list[tuple[list, list]]
) -> Iterator[tuple[set[int], set[int], set[int]]]:
    """Per member of the first two: the partitions it kept through the join, and those its
    hooks assigned and revoked after it."""
    for i, (held, assigns, revokes) in enumerate(before):
        assigned, revoked = hooks[i]
        yield (
            held & after[i],
            {p for parts in assigned[assigns:] for p in parts},
            {p for parts in revoked[revokes:] for p in parts},
        )


@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_a_joining_member_takes_partitions_without_revoking_the_kept_ones(
    kafka_cluster, stream_factory, protocol
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    first = publish_keyed(kafka_cluster, stream, 300, keys=60)
    with group_of(kafka_cluster, stream, protocol, receiver=False) as (live, join):
        join(), join()
        eventually(lambda: read_all(live, first), 120)
        before = join_third(live, join)
        second = publish_keyed(kafka_cluster, stream, 300, keys=60)
        eventually(lambda: read_all(live, second), 120)
        after, hooks = snapshot(live)
        assert not [e for m in live for e in m.errors]
    moved = since_join(before, after, hooks)
    for member, (kept, assigned, revoked) in zip(live, moved, strict=False):
        assert kept, (protocol, before, after)
        assert not revoked & kept  # never revoked of what it keeps...
        assert not assigned & kept  # ...nor assigned it again
        for p in kept:  # ...and read on where it stood: each later record of it, in a run
            mine = sorted(o for q, o in member.read if q == p)
            assert {o for q, o in second if q == p} <= set(mine)
            assert mine == list(range(mine[0], mine[0] + len(mine)))
    counts = Counter(r for m in live for r in m.read)
    assert set(counts) == set(first) | set(second)
    assert max(counts.values()) == 1  # each member confirmed what it read before a revoke


def test_eager_rebalancing_revokes_every_partition_when_a_member_joins(
    kafka_cluster, stream_factory
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    with group_of(kafka_cluster, stream, "eager", receiver=False) as (live, join):
        join(), join()
        before = join_third(live, join)
        after, hooks = snapshot(live)
    moved = since_join(before, after, hooks)
    for (held, _, _), (_, assigned, revoked) in zip(before, moved, strict=True):
        assert revoked >= held  # every partition, the kept ones too, then assigned anew
        assert assigned


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_a_parallel_receiver_keeps_running_the_partitions_it_keeps(
    kafka_cluster, stream_factory, protocol
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    published = publish_keyed(kafka_cluster, stream, 1200, keys=60)
    with group_of(kafka_cluster, stream, protocol, receiver=True) as (live, join):
        join(), join()
        eventually(lambda: settled(live) and len(live[0].read) + len(live[1].read) >= 100, 120)
        before = join_third(live, join)
        eventually(lambda: read_all(live, published), 180)
        after, hooks = snapshot(live)
    counts = Counter(r for m in live for r in m.read)
    assert set(counts) == set(published)
    for kept, _, revoked in since_join(before, after, hooks):
        assert kept
        assert not revoked & kept
        for p in kept:  # its in-flight work there went on: each record handled once
            assert all(counts[(q, o)] == 1 for q, o in published if q == p)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_retry_tiers_keep_each_keys_order_through_an_incremental_join(
    kafka_cluster, stream_factory, protocol
) -> None:
    """A member keeps the partitions it keeps without a revoke: the tiers' fence and the
    shelf let go of only what moves, and a key's records first finish in their order."""
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    published = publish_keyed(kafka_cluster, stream, 1200, keys=60)
    retry = Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2)])
    with group_of(kafka_cluster, stream, protocol, receiver=True, retry=retry) as (live, join):
        join(), join()
        eventually(lambda: settled(live) and len(live[0].read) + len(live[1].read) >= 100, 120)
        join_third(live, join)
        done = lambda: {(p, o) for m in live for _, p, o in list(m.finished)}  # noqa: E731
        eventually(lambda: set(published) <= done(), 180)
    first: dict[tuple[int, int], int] = {}
    for stamp, p, o in sorted(f for m in live for f in m.finished):
        first.setdefault((p, o), stamp)
    for key in set(published.values()):
        places = sorted(place for place, k in published.items() if k == key)
        stamps = [first[place] for place in places]
        assert stamps == sorted(stamps), f"key {key!r} first finished out of order"


@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_a_position_past_the_end_moves_that_partition_alone(
    kafka_cluster, stream_factory, protocol
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    group = fresh_group()
    with Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub:
        for p in (0, 1):
            pub.publish(Record(b"old", partition=p))
    probe = probe_consumer(kafka_cluster, **{"group.id": group})
    try:  # partition 0's confirmed position lies past its end
        probe.commit(offsets=[TopicPartition(stream.name, 0, 100)], asynchronous=False)
    finally:
        probe.close()
    errors: list[BaseException | None] = []
    config = SubscriberConfig(
        stream=stream,
        group=group,
        consumer_config=PROTOCOLS[protocol],
        error_handler=lambda summary, error: errors.append(error),
    )
    got: list[Record] = []

    def polled(check: Any) -> Any:
        return lambda: got.extend(sub.poll(50)) or check()

    with (
        Subscriber(kafka_cluster, config) as sub,
        Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub,
    ):
        # Moved to the end of partition 0 by assigning it again, partition 1 left as it is.
        eventually(polled(lambda: any(isinstance(e, OffsetOutOfRangeError) for e in errors)), 120)
        for p in (0, 1):
            pub.publish(Record(b"new", partition=p))
        eventually(polled(lambda: len(got) >= 3), 120)
        assert len(sub.poll(500)) == 0
    assert sorted((r.partition, r.offset, r.data) for r in got) == [
        (0, 1, b"new"),
        (1, 0, b"old"),
        (1, 1, b"new"),
    ]
