"""A tier round's offsets and the generation they go out with. A round computes its offsets
as it starts and sends them with the group's metadata as it ends; when a rebalance took the
member's partitions and gave them back in between, the offsets describe an assignment that
is over, and the member's next load may already have looked up the positions they move.
Kafka refuses them only if they carry the generation they were computed under."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from bolide.facade import Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import CONSUMER_DEFAULTS, probe_consumer
from bolide.facade.receiving.fence import Fence
from bolide.facade.receiving.tier_writer import TierWriter, Write
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group

pytestmark = [pytest.mark.kafka]


class Member:
    """A group consumer of ``topic`` whose assignments are counted (polled by one thread at a
    time: the test's, then the writer's inside a round)."""

    def __init__(self, cluster, group: str, topic: str) -> None:
        settings = {"group.id": group, "enable.auto.commit": False, "session.timeout.ms": 10_000}
        self.consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, settings))
        self.assignments = 0
        self.held: set[int] = set()
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, consumer, parts) -> None:
        self.assignments += 1
        self.held = {tp.partition for tp in parts}

    def _revoked(self, consumer, parts) -> None:
        self.held = set()

    def poll_until(self, done, *others: Consumer, timeout_s: float = 60.0) -> None:
        def step() -> bool:
            for consumer in (self.consumer, *others):
                consumer.poll(0.1)
            return done()

        eventually(step, timeout_s=timeout_s)


def rebalance_twice(cluster, member: Member, group: str, topic: str) -> None:
    """Another member joins and leaves: two rebalances, after which ``member`` holds every
    partition again, under a newer generation."""
    before = member.assignments
    other = Member(cluster, group, topic)
    try:
        member.poll_until(
            lambda: member.assignments > before and other.assignments > 0, other.consumer
        )
    finally:
        other.consumer.close()
    member.poll_until(lambda: member.assignments > before + 1 and member.held == {0, 1})


def test_offsets_computed_before_a_rebalance_go_out_with_the_generation_before_it(
    cluster, stream_factory
):
    """The first round's offsets are computed, then a second member joins and leaves; by the
    time the round confirms, the member holds its partitions again under a newer generation.
    That round is refused (its copy never committed) and the next one, computed under the
    new generation, commits: the copy is in the tier once, and only the second round's
    positions were ever confirmed."""
    source = stream_factory().name
    tier = f"{source}.tier"
    for name in (source, tier):
        with Publisher(
            cluster, PublisherConfig(stream=StreamConfig(name=name, partitions=2))
        ) as pub:
            pub.publish_async(Record(b"seed", partition=0)).result(60)
    group = fresh_group()
    member = Member(cluster, group, source)
    member.poll_until(lambda: member.held == {0, 1})
    rounds: list[int] = []
    confirmed: list[int] = []

    def offsets(partitions: set[int], proof: bool):
        rounds.append(len(rounds) + 1)
        n = rounds[-1]
        if n == 1:
            rebalance_twice(cluster, member, group, source)
        return [TopicPartition(source, 0, 100 + n)], lambda: confirmed.append(n)

    fence = Fence(hold=lambda parts: None, release=lambda parts: None, prove=lambda: None)
    writer = TierWriter(
        cluster,
        f"{group}.tiers",
        group_metadata=member.consumer.consumer_group_metadata,
        offsets=offsets,
        fence=fence,
        held=lambda: {0, 1},
        alive=lambda partition: True,
        report=lambda summary, error: None,
        halt=lambda summary, error: None,
        timeout_s=10.0,
        streams=tier,
    )
    written = threading.Event()
    copy = Record(b"copy", key=b"k", partition=0)
    writer.write(Write(0, tier, copy, lambda error: written.set()))
    writer.start()
    try:
        assert written.wait(120), f"no round committed (rounds {rounds})"
    finally:
        writer.close()
    assert confirmed == [rounds[-1]] and 1 not in confirmed, (rounds, confirmed)
    committed = member.consumer.committed([TopicPartition(source, 0)], timeout=30)[0]
    assert committed.offset == 100 + rounds[-1]
    try:
        assert committed_values(cluster, tier).count(b"copy") == 1
    finally:
        member.consumer.close()


def committed_values(cluster, topic: str) -> list[bytes]:
    """The values of ``topic`` partition 0 that a ``read_committed`` consumer sees."""
    reader = probe_consumer(cluster, **{"isolation.level": "read_committed"})
    values: list[bytes] = []

    def step() -> bool:
        for msg in reader.consume(10, 0.5):
            error = msg.error()
            if error is None:
                values.append(msg.value() or b"")
            elif error.code() == KafkaError._PARTITION_EOF:
                return True
        return False

    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        eventually(step, timeout_s=60)
    finally:
        reader.close()
    return values
