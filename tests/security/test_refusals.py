"""Broker answers that retrying cannot fix are typed errors from the call that meets them,
within seconds, never a loop in the log: a missing ACL (``AuthorizationError`` naming the
resource and the ACL to grant), wrong credentials (``AuthenticationError``), a lease below the
broker's floor (``IncompatibleBrokerError`` naming both)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka.admin import AclOperation, NewTopic, ResourceType

from bolide.facade import (
    AuthenticationError,
    AuthorizationError,
    BolideError,
    EmbeddedBroker,
    IncompatibleBrokerError,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import admin_client
from tests.conftest import eventually
from tests.security.conftest import (
    LEASE_MS,
    STOCK_SESSION_FLOOR_MS,
    UserFactory,
    needs_kafka,
    new_stream,
)

pytestmark = [pytest.mark.kafka, needs_kafka]


def poll_until_raises(sub: Subscriber) -> None:
    """Poll until the subscriber raises (each poll waits half a second for records)."""
    for _ in range(240):
        assert not sub.poll(500)


def test_a_user_without_the_group_acl_gets_an_authorization_error_from_poll(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "orders-no-group")
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.TOPIC, stream.name, AclOperation.DESCRIBE),
        ]
    )
    config = SubscriberConfig(stream=stream, group="no-acl-group", lease_timeout_ms=LEASE_MS)
    with Subscriber(user, config) as sub, pytest.raises(AuthorizationError) as caught:
        poll_until_raises(sub)
    assert caught.value.resource_type == "group"
    assert caught.value.resource == "no-acl-group"
    assert "no-acl-group" in str(caught.value) and "READ" in str(caught.value)


def test_a_user_with_only_describe_gets_an_authorization_error_from_publish(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "orders-describe-only")
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.DESCRIBE)])
    record = Record(b"refused")
    with (
        Publisher(user, PublisherConfig(stream=stream)) as pub,
        pytest.raises(AuthorizationError) as caught,
    ):
        pub.publish(record, 120)
    assert caught.value.record is record and record.offset is None
    assert stream.name in str(caught.value) and "WRITE" in str(caught.value)


def test_records_published_after_the_producer_failed_for_good_get_the_cause(
    secured: EmbeddedBroker, user_factory: UserFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the idempotent producer's id was refused (no WRITE), the producer has failed for
    good: every later record, alone or in a batch, is refused with the cause, not "Fatal
    error"."""
    stream = new_stream(secured, "orders-describe-only-later")
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.DESCRIBE)])
    with (
        caplog.at_level(logging.ERROR, logger="bolide"),
        Publisher(user, PublisherConfig(stream=stream)) as pub,
    ):
        eventually(
            lambda: any(f"publisher for {stream.name!r}" in r.getMessage() for r in caplog.records),
            120,
        )
        record = Record(b"one")
        with pytest.raises(AuthorizationError, match="WRITE") as one:
            pub.publish(record, 120)
        assert one.value.record is record and record.offset is None
        batch = pub.publish_many([Record(b"a"), Record(b"b")])
        with pytest.raises(AuthorizationError, match="WRITE"):
            batch.result(120)


def test_a_wrong_password_is_an_authentication_error(secured: EmbeddedBroker) -> None:
    stream = new_stream(secured, "orders-wrong-password")
    secured.add_user("mallory", "right-password")
    wrong = secured.cluster(**{"sasl.username": "mallory", "sasl.password": "wrong"})
    with (
        pytest.raises(AuthenticationError) as caught,
        Publisher(wrong, PublisherConfig(stream=stream)) as pub,
    ):
        pub.publish(Record(b"x"), 120)
    assert "sasl.password" in str(caught.value)


def test_a_wrong_password_is_an_authentication_error_for_a_subscriber(
    secured: EmbeddedBroker,
) -> None:
    stream = new_stream(secured, "orders-wrong-password-poll")
    secured.add_user("mallory-sub", "right-password")
    wrong = secured.cluster(**{"sasl.username": "mallory-sub", "sasl.password": "wrong"})
    config = SubscriberConfig(stream=stream, group="g", lease_timeout_ms=LEASE_MS)
    with pytest.raises(AuthenticationError), Subscriber(wrong, config) as sub:
        poll_until_raises(sub)


def test_a_lease_below_the_brokers_floor_is_a_typed_error_naming_both(
    secured: EmbeddedBroker,
) -> None:
    stream = new_stream(secured, "orders-short-lease")
    config = SubscriberConfig(stream=stream, group="short-lease", lease_timeout_ms=4_000)
    with (
        Subscriber(secured.cluster(), config) as sub,
        pytest.raises(IncompatibleBrokerError) as caught,
    ):
        poll_until_raises(sub)
    message = str(caught.value)
    assert "lease_timeout_ms=4000" in message and f"{STOCK_SESSION_FLOOR_MS} ms" in message


def test_the_new_errors_are_bolide_errors() -> None:
    assert issubclass(AuthorizationError, BolideError)
    assert issubclass(AuthenticationError, BolideError)


def test_a_receiver_reports_a_refusal_once_and_stops(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "orders-receiver-no-group")
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.READ)])
    reports: list[tuple[str, BaseException | None]] = []
    config = SubscriberConfig(
        stream=stream,
        group="receiver-no-acl",
        lease_timeout_ms=LEASE_MS,
        error_handler=lambda summary, error: reports.append((summary, error)),
    )
    with Subscriber(user, config) as sub:
        receiver = sub.attach_receiver(lambda record: None)
        eventually(lambda: not receiver.running, 120)
        refusals = [e for _, e in reports if isinstance(e, AuthorizationError)]
        assert len(refusals) == 1 and refusals[0].resource == "receiver-no-acl"


def test_a_user_without_any_acl_on_the_topic_is_refused_when_the_publisher_starts(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = StreamConfig(name="orders-no-acl", partitions=1)
    # Made behind bolide's back, so that the publisher describes it as the user.
    new = NewTopic(stream.name, num_partitions=1, replication_factor=1)
    admin = admin_client(secured.cluster())
    admin.create_topics([new])[stream.name].result(60)
    user = user_factory([])
    with pytest.raises(AuthorizationError) as caught:
        Publisher(user, PublisherConfig(stream=stream))
    assert caught.value.resource_type == "topic" and caught.value.resource == stream.name
    assert "DESCRIBE" in str(caught.value)


def test_a_topic_another_user_made_in_this_process_is_described_again_as_this_one(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    """What one user learnt of a topic is not taken as known by another: a user without
    any ACL on it is refused when the publisher starts, not later, on every record."""
    stream = StreamConfig(name="orders-made-by-admin", partitions=1)
    with Publisher(secured.cluster(), PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"x"), 120)
    user = user_factory([])
    with pytest.raises(AuthorizationError) as caught:
        Publisher(user, PublisherConfig(stream=stream))
    assert caught.value.resource_type == "topic" and caught.value.resource == stream.name


def test_a_wrong_password_on_a_stream_not_yet_known_is_an_authentication_error(
    secured: EmbeddedBroker,
) -> None:
    secured.add_user("mallory-new", "right-password")
    wrong = secured.cluster(**{"sasl.username": "mallory-new", "sasl.password": "wrong"})
    stream = StreamConfig(name="orders-never-described", partitions=1)
    with (
        pytest.raises(AuthenticationError),
        Publisher(wrong, PublisherConfig(stream=stream)) as pub,
    ):
        pub.publish(Record(b"x"), 120)
