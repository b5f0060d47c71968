"""Static membership (``group.instance.id`` through ``consumer_config``): a member restarted
with its instance id within its lease takes its partitions back and the other members keep
theirs, with no rebalance, under the classic protocol and under Kafka 4's consumer protocol
(KIP-848, whose lease is the broker's ``group.consumer.session.timeout.ms``); a second live
member with the same id is a typed error."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupType

from bolide.facade import (
    FencedInstanceError,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import admin_client
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka]

#: Long enough that a restart, however slow the machine, comes back within the lease.
LEASE_MS = 60_000


#: Each protocol's ``consumer_config`` besides the instance id.
PROTOCOLS = {"classic": {}, "consumer": {"group.protocol": "consumer"}}


class Member:
    """A grouped subscriber polled in a thread, as a live member is, recording its hooks."""

    def __init__(self, config: SubscriberConfig, cluster) -> None:
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.errors: list[BaseException] = []
        self._held: set[int] = set()
        self.sub = Subscriber(
            cluster,
            SubscriberConfig(
                stream=config.stream,
                group=config.group,
                lease_timeout_ms=config.lease_timeout_ms,
                consumer_config=config.consumer_config,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
            ),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _on_assign(self, partitions: list[int]) -> None:
        self.assigned.append(partitions)
        self._held |= set(partitions)  # the whole assignment (eager) or what moved in

    def _on_revoke(self, partitions: list[int]) -> None:
        self.revoked.append(partitions)
        self._held -= set(partitions)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.sub.poll(50)
            except Exception as exc:  # kept for the test to look at
                self.errors.append(exc)
                return

    def held(self) -> list[int]:
        """The partitions the member holds, as its hooks said."""
        return sorted(self._held)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if not self.sub.closed:
            self.sub.close()


@contextmanager
def members(*started: Member) -> Iterator[list[Member]]:
    live = list(started)
    try:
        yield live
    finally:
        for member in live:
            member.stop()


def config(
    stream: StreamConfig, group: str, instance: str, protocol: str = "classic"
) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=LEASE_MS,
        consumer_config={**PROTOCOLS[protocol], "group.instance.id": instance},
    )


#: The group type each protocol makes on the broker.
GROUP_TYPES = {"classic": ConsumerGroupType.CLASSIC, "consumer": ConsumerGroupType.CONSUMER}


def wait_stable(cluster, group: str, *live: Member, protocol: str = "classic") -> None:
    """Until the group is stable with ``live`` as its members, each holding a partition."""
    admin = admin_client(cluster)

    def stable() -> bool:
        described = admin.describe_consumer_groups([group])[group].result()
        return (
            described.type == GROUP_TYPES[protocol]  # a group not made yet reads as classic
            and described.state == ConsumerGroupState.STABLE
            and len(described.members) == len(live)
            and all(m.sub.is_assigned() and m.held() for m in live)
        )

    eventually(stable, 120)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_static_member_restarted_within_its_lease_keeps_the_others_reading(
    cluster, stream_factory, protocol: str, embedded_broker: bool
) -> None:
    if protocol == "consumer" and embedded_broker:
        pytest.skip("the embedded Tansu engine has no consumer group protocol (KIP-848)")
    stream = stream_factory(partitions=2)
    group = f"static-{protocol}-{stream.name}"
    a = Member(config(stream, group, "member-a", protocol), cluster)
    b = Member(config(stream, group, "member-b", protocol), cluster)
    with members(a, b) as live:
        wait_stable(cluster, group, a, b, protocol=protocol)
        b_held = b.held()
        a_hooks = (list(a.assigned), list(a.revoked))
        b.stop()
        again = Member(config(stream, group, "member-b", protocol), cluster)
        live.append(again)
        # A rebalance would move ``a``'s partitions too: eager revokes every member before
        # anyone is assigned, and the incremental protocols hand ``b``'s partition to ``a``
        # once ``b`` is taken for gone. Either shows in ``a``'s hooks.
        eventually(lambda: again.held(), 120)
        assert again.held() == b_held
        assert (a.assigned, a.revoked) == a_hooks
        wait_stable(cluster, group, a, again, protocol=protocol)
        assert (a.assigned, a.revoked) == a_hooks


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_two_live_members_with_one_instance_id_is_a_typed_error(
    cluster, stream_factory, protocol: str, embedded_broker: bool
) -> None:
    """Classic: the newcomer takes the partitions and the first is fenced. Consumer protocol:
    the broker refuses the newcomer (UNRELEASED_INSTANCE_ID) and the first reads on."""
    if protocol == "consumer" and embedded_broker:
        pytest.skip("the embedded Tansu engine has no consumer group protocol (KIP-848)")
    stream = stream_factory(partitions=1)
    group = f"static-twice-{protocol}-{stream.name}"
    first = Member(config(stream, group, "twin", protocol), cluster)
    with members(first) as live:
        eventually(lambda: first.held(), 120)
        second = Member(config(stream, group, "twin", protocol), cluster)
        live.append(second)
        refused, kept = (first, second) if protocol == "classic" else (second, first)
        eventually(lambda: refused.errors, 120)
        (error,) = refused.errors
        assert isinstance(error, FencedInstanceError)
        assert (error.group, error.instance_id) == (group, "twin")
        message = str(error)
        assert "twin" in message and group in message and "group.instance.id" in message
        assert not kept.errors
        if kept is first:
            assert first.held() == [0] and first.revoked == []
