"""A transactional publisher on the secured broker: with WRITE and DESCRIBE on its
transactional id (and on the stream, READ on the group whose positions it commits) it publishes
and confirms in a transaction; without the transactional-id ACL it fails at once with an
``AuthorizationError`` naming the id, not a retried or generic transaction error."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import (
    AuthorizationError,
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    Record,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.security.conftest import LEASE_MS, UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_a_transactional_publisher_with_its_acls_publishes_and_confirms(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    source, sink = new_stream(secured, "txn-in"), new_stream(secured, "txn-out")
    tid = f"pricer-{uuid.uuid4().hex[:6]}"
    user = user_factory(
        [
            (ResourceType.TOPIC, source.name, AclOperation.WRITE),
            (ResourceType.TOPIC, source.name, AclOperation.READ),
            (ResourceType.TOPIC, sink.name, AclOperation.WRITE),
            (ResourceType.GROUP, "pricer", AclOperation.READ),
            (ResourceType.TRANSACTIONAL_ID, tid, AclOperation.WRITE),
        ]
    )
    with Publisher(user, PublisherConfig(stream=source)) as pub:
        pub.publish(Record(b"in"), 60)
    config = SubscriberConfig(stream=source, group="pricer", lease_timeout_ms=LEASE_MS)
    with (
        Subscriber(user, config) as sub,
        Publisher(user, PublisherConfig(stream=sink, transactional_id=tid)) as out,
    ):
        got = eventually(lambda: sub.poll(500), 120)
        with out.transaction():
            out.publish_async(Record(got[0].data + b"-out"))
            out.confirm(sub)
        eventually(lambda: sub.committed() == {0: 1}, 60)


def test_a_missing_transactional_id_acl_is_an_authorization_error_naming_it(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    sink = new_stream(secured, "txn-no-acl")
    user = user_factory([(ResourceType.TOPIC, sink.name, AclOperation.WRITE)])
    with pytest.raises(AuthorizationError) as caught:
        Publisher(user, PublisherConfig(stream=sink, transactional_id="not-granted"))
    assert caught.value.resource_type == "transactional_id"
    assert caught.value.resource == "not-granted"
    assert "WRITE" in str(caught.value) and "not-granted" in str(caught.value)
