"""Found by the fault campaign (``par``): retry tier streams were created with one replica
whatever their source had, so killing the broker of a tier partition stopped every copy to
it; the source's confirms then stood still at the first record bound for that tier, and a
member loading the tiers waited for that partition for good. A tier stream is created with
as many replicas as its source (and the source's ``min_insync_replicas``), and the receiver
goes on through the death of any one broker."""

from __future__ import annotations

import threading

import pytest

from bolide.facade import (
    Cluster,
    EmbeddedBroker,
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
from bolide.facade.kafka import admin_client
from tests.broker.test_three_nodes import trio  # noqa: F401  (the three-node cluster)
from tests.conftest import eventually
from tests.parallel.test_retry_tiers import committed

pytestmark = [pytest.mark.reliability, pytest.mark.kafka, pytest.mark.slow]

TIERS = [RetryTier(delay_s=0.5), RetryTier(delay_s=1.0)]


def replicas(broker: EmbeddedBroker, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic``: its leader and how many replicas it has."""
    meta = admin_client(broker.cluster()).list_topics(timeout=30)
    parts = meta.topics[topic].partitions
    return {p: (info.leader, len(info.replicas)) for p, info in parts.items()}


def member(cluster: Cluster, stream: StreamConfig, group: str) -> Subscriber:
    """A member of ``group`` reading ``stream`` from its start, with a 6 s lease."""
    config = SubscriberConfig(
        stream=stream, group=group, lease_timeout_ms=6_000,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
    )  # fmt: skip
    return Subscriber(cluster, config)


def test_a_tier_stream_has_its_sources_replicas_and_outlives_a_broker(
    trio: EmbeddedBroker,  # noqa: F811
):
    cluster = trio.cluster()
    stream = StreamConfig(
        name="tiered", partitions=1, global_order=False, replication_factor=3,
        min_insync_replicas=2,
    )  # fmt: skip
    group = "tiered-readers"
    lock = threading.Lock()
    handled: set[int] = set()
    failed: set[int] = set()

    def handler(record: Record) -> None:
        offset = record.offset or 0
        with lock:
            if offset % 10 == 5 and offset not in failed:  # its first call fails
                failed.add(offset)
                raise RuntimeError("the first call fails")
            handled.add(offset)

    def publish(pub: Publisher, first: int) -> None:
        for i in range(first, first + 20):
            pub.publish_async(Record(b"%d" % i, key=b"k%d" % (i % 4)))
        assert pub.flush(60) == 0

    with (
        Publisher(cluster, PublisherConfig(stream=stream)) as pub,
        member(cluster, stream, group) as sub,
    ):
        sub.attach_receiver(
            handler, concurrency=4, retry=Retry(attempts=1, backoff_s=0, tiers=TIERS)
        )
        publish(pub, 0)
        eventually(lambda: committed(trio.cluster(), group, stream.name) == {0: 20}, 60)
        tiers = [t.stream_for(stream.name) for t in TIERS]
        for tier in tiers:
            assert replicas(trio, tier)[0][1] == 3, tier
        leader = replicas(trio, tiers[0])[0][0]
        trio.kill_node(leader)
        try:
            publish(pub, 20)  # offset 25 fails its first call: its copy goes to the first tier
            eventually(lambda: handled == set(range(40)), 90)
            eventually(lambda: committed(trio.cluster(), group, stream.name) == {0: 40}, 60)
        finally:
            trio.start_node(leader)


def test_a_load_waits_for_a_tier_whose_leader_died_since_its_last_lookup(
    trio: EmbeddedBroker,  # noqa: F811
):
    """Found by the fault campaign (``par``): a member loads its tiers (their leaders looked up
    and cached), a tier partition's leader dies and another takes over, and the member gets
    its partition again. librdkafka sends the lookup of the tier's log end to the dead leader
    it cached and answers, once that times out, with no error and no offset; the load took it
    for an empty tier and let the partition go on before the key's parked copy was read, so
    the key's next record ran before it. The load now fails and is tried again, and the
    member asks the cluster for the tiers' leaders first: the key keeps its order."""
    cluster = trio.cluster()
    stream = StreamConfig(
        name="tier-leader-died", partitions=1, global_order=False, replication_factor=3,
        min_insync_replicas=2,
    )  # fmt: skip
    tiers = [RetryTier(delay_s=40.0)]  # the copy runs after the reload below
    lock = threading.Lock()
    calls: list[int] = []

    def handler(record: Record) -> None:
        with lock:
            calls.append(record.offset or 0)
            first = calls.count(0) == 1
        if record.offset == 0 and first:
            raise RuntimeError("k@0's first call fails: k is parked in the tier")

    group = "tier-leader-died"
    with (
        Publisher(cluster, PublisherConfig(stream=stream)) as pub,
        member(cluster, stream, group) as sub,
    ):
        sub.attach_receiver(handler, concurrency=2, retry=Retry(attempts=1, tiers=tiers))
        pub.publish_async(Record(b"0", key=b"k")).result(60)
        eventually(lambda: committed(cluster, group, stream.name) == {0: 1}, 60)  # in the tier
        tier = tiers[0].stream_for(stream.name)
        leader = replicas(trio, tier)[0][0]
        trio.kill_node(leader)
        try:
            eventually(lambda: replicas(trio, tier)[0][0] not in (leader, -1), 60)
            sub.deactivate()
            pub.publish_async(Record(b"1", key=b"k")).result(60)
            sub.reactivate()  # the same member loads the tiers again
            eventually(lambda: 1 in calls, 120)
        finally:
            trio.start_node(leader)
    assert calls == [0, 0, 1], "k@1 ran before k@0's parked copy"
