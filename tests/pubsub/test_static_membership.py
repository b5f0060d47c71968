"""Static membership (``group.instance.id`` through ``consumer_config``): a member restarted
with its instance id within its lease takes its partitions back and the other members keep
theirs, with no rebalance; a second live member with the same id is a typed error."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import ConsumerGroupState

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


class Member:
    """A grouped subscriber polled in a thread, as a live member is, recording its hooks."""

    def __init__(self, config: SubscriberConfig, cluster) -> None:
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.errors: list[BaseException] = []
        self.sub = Subscriber(
            cluster,
            SubscriberConfig(
                stream=config.stream,
                group=config.group,
                lease_timeout_ms=config.lease_timeout_ms,
                consumer_config=config.consumer_config,
                on_assign=self.assigned.append,
                on_revoke=self.revoked.append,
            ),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.sub.poll(50)
            except Exception as exc:  # kept for the test to look at
                self.errors.append(exc)
                return

    def held(self) -> list[int]:
        """The partitions the last assignment gave this member."""
        return self.assigned[-1] if self.assigned else []

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


def config(stream: StreamConfig, group: str, instance: str) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=LEASE_MS,
        consumer_config={"group.instance.id": instance},
    )


def wait_stable(cluster, group: str, *live: Member) -> None:
    """Until the group is stable with ``live`` as its members, each holding a partition."""
    admin = admin_client(cluster)

    def stable() -> bool:
        described = admin.describe_consumer_groups([group])[group].result()
        return (
            described.state == ConsumerGroupState.STABLE
            and len(described.members) == len(live)
            and all(m.sub.is_assigned() and m.held() for m in live)
        )

    eventually(stable, 120)


def test_a_static_member_restarted_within_its_lease_keeps_the_others_reading(
    cluster, stream_factory
) -> None:
    stream = stream_factory(partitions=2)
    group = f"static-{stream.name}"
    a = Member(config(stream, group, "member-a"), cluster)
    b = Member(config(stream, group, "member-b"), cluster)
    with members(a, b) as live:
        wait_stable(cluster, group, a, b)
        b_held = b.held()
        a_hooks = (list(a.assigned), list(a.revoked))
        b.stop()
        again = Member(config(stream, group, "member-b"), cluster)
        live.append(again)
        # Eager rebalancing revokes every member before anyone is assigned: had the restart
        # rebalanced, ``a`` would have given its partition up before ``again`` got one.
        eventually(lambda: again.held(), 120)
        assert again.held() == b_held
        assert (a.assigned, a.revoked) == a_hooks
        wait_stable(cluster, group, a, again)
        assert (a.assigned, a.revoked) == a_hooks


def test_two_live_members_with_one_instance_id_fence_the_first(cluster, stream_factory) -> None:
    stream = stream_factory(partitions=1)
    group = f"static-twice-{stream.name}"
    first = Member(config(stream, group, "twin"), cluster)
    with members(first) as live:
        eventually(lambda: first.held(), 120)
        live.append(Member(config(stream, group, "twin"), cluster))
        eventually(lambda: first.errors, 120)
        (error,) = first.errors
        assert isinstance(error, FencedInstanceError)
        message = str(error)
        assert "twin" in message and group in message and "group.instance.id" in message
