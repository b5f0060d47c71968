"""A share group (``ShareSubscriber``) on the secured broker, holding only the ACLs
docs/kafka-estate.md lists: two members acquire and acknowledge every record of a stream,
each record once, whole."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import (
    AuthorizationError,
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    Record,
    ShareSubscriber,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.security.conftest import UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_a_share_group_with_its_acls_shares_every_record_once(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "queue-secured")
    sent = [Record(f"job-{i}".encode(), key=f"k{i % 3}") for i in range(30)]
    with Publisher(secured.cluster(), PublisherConfig(stream=stream)) as pub:
        for record in sent:  # one record per batch: a share fetch acquires whole batches
            pub.publish(record, 60)
    group = "workers"
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, group, AclOperation.READ),
            # A member sets the group's share.auto.offset.reset and isolation when it starts.
            (ResourceType.GROUP, group, AclOperation.ALTER_CONFIGS),
        ]
    )
    config = SubscriberConfig(stream=stream, share_group=group, max_batch=4)
    members = [Subscriber(user, config) for _ in range(2)]
    got: list[tuple[bytes | None, bytes | None, int | None]] = []
    try:
        assert all(isinstance(m, ShareSubscriber) for m in members)

        def take() -> bool:
            for member in members:
                for record in member.poll(200):
                    got.append((record.data, record.key, record.offset))
                    member.ack(record)  # type: ignore[attr-defined]
            return len(got) >= len(sent)

        eventually(take, 120)
    finally:
        for member in members:
            member.close()
    assert Counter(offset for _, _, offset in got) == Counter(r.offset for r in sent)
    assert sorted((data, key) for data, key, _ in got) == sorted((r.data, r.key) for r in sent)


def test_a_share_member_that_may_not_set_its_group_is_an_authorization_error(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "queue-no-configs")
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, "no-configs", AclOperation.READ),
        ]
    )
    with pytest.raises(AuthorizationError) as caught:
        Subscriber(user, SubscriberConfig(stream=stream, share_group="no-configs"))
    assert (caught.value.resource_type, caught.value.resource) == ("group", "no-configs")
    assert "ALTER_CONFIGS" in str(caught.value)
