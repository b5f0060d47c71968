"""bolide's documented group defaults on a broker that runs Kafka's stock group settings, as a
production cluster does (a 3 s delay before a new group's first rebalance, no lease under
6 s): grouped subscribers with the default lease join, read, confirm and take over from a
member that leaves, under the classic and the consumer group protocol; a share group reads
with its defaults; and a lease under the broker's floor is a typed error naming the floor.

Marked ``stock``: ``./dev test`` runs this file again on an embedded Apache Kafka with
``group_settings="stock"`` (``BOLIDE_TEST_GROUP_SETTINGS=stock``). The tests pass on the
suite's fast broker too, and run there with the rest.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import pytest

from bolide.facade import (
    Cluster,
    EmbeddedBroker,
    IncompatibleBrokerError,
    Publisher,
    PublisherConfig,
    Record,
    ShareSubscriber,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.broker import FAST_GROUP_SETTINGS
from bolide.facade.kafka import broker_setting
from tests.conftest import eventually
from tests.parallel.conftest import publish_keyed
from tests.pubsub.test_incremental_rebalance import (
    PARTITIONS,
    group_of,
    read_all,
    settled,
)

pytestmark = [pytest.mark.kafka, pytest.mark.stock]

#: Kafka's own values of the group settings the embedded broker's fast ones replace.
KAFKA_STOCK_GROUP_SETTINGS = {
    "group.initial.rebalance.delay.ms": "3000",
    "group.min.session.timeout.ms": "6000",
    "group.share.min.record.lock.duration.ms": "15000",
}


@pytest.fixture
def kafka_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("Kafka's stock group settings are Apache Kafka's (Tansu has its own)")
    return bolide_backend[1]


def test_the_embedded_broker_runs_the_group_settings_asked_for(
    bolide_broker: EmbeddedBroker | None, kafka_cluster: Cluster
) -> None:
    """``BOLIDE_TEST_GROUP_SETTINGS`` reaches the broker, so the stock run is what it says."""
    if bolide_broker is None:
        pytest.skip("the tests run on a broker the suite did not start")
    asked = os.environ.get("BOLIDE_TEST_GROUP_SETTINGS") or "fast"
    assert bolide_broker.group_settings == asked
    expected = KAFKA_STOCK_GROUP_SETTINGS if asked == "stock" else FAST_GROUP_SETTINGS
    for name, value in expected.items():
        assert broker_setting(kafka_cluster, name) == value, name


# The two sets of settings a grouped subscriber sends: the classic protocol's lease
# (session.timeout.ms, heartbeat.interval.ms, max.poll.interval.ms), which cooperative-sticky
# shares with eager, and the consumer protocol's (max.poll.interval.ms only).
@pytest.mark.parametrize("protocol", ["eager", "consumer"])
def test_default_leased_members_join_read_confirm_and_take_over_when_one_leaves(
    kafka_cluster: Cluster, stream_factory: Callable[..., StreamConfig], protocol: str
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    first = publish_keyed(kafka_cluster, stream, 60, keys=12)
    with group_of(kafka_cluster, stream, protocol, receiver=False) as (live, join):
        join(), join()
        eventually(lambda: settled(live) and read_all(live, first), 120)
        leaving, staying = live
        leaving.stop()  # closes: the member leaves the group, its confirms committed
        eventually(lambda: staying.holding() == set(range(PARTITIONS)), 120)
        second = publish_keyed(kafka_cluster, stream, 60, keys=12)
        eventually(lambda: read_all([staying], second), 120)
        assert not [e for m in live for e in m.errors]
    counts = Counter(r for m in live for r in m.read)
    assert set(counts) == set(first) | set(second)
    assert max(counts.values()) == 1  # the survivor went on from the leaver's confirms


def test_a_share_group_reads_with_its_default_settings(
    kafka_cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    with Publisher(kafka_cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(5):
            pub.publish(Record(b"r%d" % i))
    config = SubscriberConfig(stream=stream, share_group=f"g-{stream.name}")
    with Subscriber(kafka_cluster, config) as sub:
        assert isinstance(sub, ShareSubscriber)
        got: list[Record] = []

        def all_five() -> bool:
            got.extend(sub.poll(100))
            return len(got) >= 5

        eventually(all_five, 60)
        for record in got:
            sub.ack(record)
        sub.confirm()
    assert sorted(r.data for r in got) == [b"r%d" % i for i in range(5)]


def test_a_lease_under_the_brokers_floor_is_a_typed_error_naming_the_floor(
    kafka_cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    floor = int(broker_setting(kafka_cluster, "group.min.session.timeout.ms") or 0)
    if floor <= 1_000:
        pytest.skip(f"this broker allows every lease (group.min.session.timeout.ms={floor})")
    lease = floor - 1_000
    stream = stream_factory()
    config = SubscriberConfig(stream=stream, group=f"g-{stream.name}", lease_timeout_ms=lease)
    with Subscriber(kafka_cluster, config) as sub, pytest.raises(IncompatibleBrokerError) as caught:
        eventually(lambda: sub.poll(100) and False, 60)
    message = str(caught.value)
    assert f"lease_timeout_ms={lease}" in message and f"{floor} ms" in message
