"""A secured embedded Apache Kafka: SASL_SSL with SCRAM-SHA-512 users, Kafka's
``StandardAuthorizer`` and no ACL by default. A user with the right ACLs publishes, subscribes
in a group and confirms; bad settings of the broker or the client fail at once, by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import (
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    Record,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.security.conftest import LEASE_MS, UserFactory, grant, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_a_user_with_its_acls_publishes_subscribes_and_confirms(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "orders-granted")
    user = user_factory(
        [
            # What docs/kafka-estate.md lists: WRITE and READ include DESCRIBE.
            (ResourceType.TOPIC, stream.name, AclOperation.WRITE),
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, "billing", AclOperation.READ),
        ]
    )
    with Publisher(user, PublisherConfig(stream=stream)) as pub:
        offsets = [pub.publish(Record(f"r{i}".encode()), 60) for i in range(3)]
    assert offsets == [0, 1, 2]
    config = SubscriberConfig(stream=stream, group="billing", lease_timeout_ms=LEASE_MS)
    with Subscriber(user, config) as sub:
        got: list[bytes | None] = []
        for _ in range(240):
            got += [r.data for r in sub.poll(500)]
            if len(got) == 3:
                break
        assert got == [b"r0", b"r1", b"r2"]
        sub.confirm()
        eventually(lambda: sub.committed() == {0: 3}, 60)


def test_a_missing_ca_file_is_a_clear_error(secured: EmbeddedBroker, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-ca.pem")
    cluster = secured.cluster(**{"ssl.ca.location": missing})
    stream = new_stream(secured, "orders-no-ca")
    for build in (
        lambda: Publisher(cluster, PublisherConfig(stream=stream)),
        lambda: Subscriber(cluster, SubscriberConfig(stream=stream, group="no-ca")),
    ):
        with pytest.raises(ValueError, match="no such file") as caught:
            build()
        assert f"ssl.ca.location={missing!r}" in str(caught.value)


def test_an_unknown_security_is_a_value_error_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="plaintext, sasl_plaintext, sasl_ssl, ssl"):
        EmbeddedBroker(engine="kafka", security="bogus")  # type: ignore[arg-type]


def test_an_unknown_keyword_is_a_type_error_not_a_client_setting(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="securty"):
        EmbeddedBroker(engine="kafka", securty="sasl_ssl")
    broker = EmbeddedBroker(engine="kafka", log_path=tmp_path / "k.log", **{"client.id": "mine"})
    assert broker.cluster().settings["client.id"] == "mine"


def test_mutual_tls_users_are_client_certificates(tmp_path: Path) -> None:
    with EmbeddedBroker(engine="kafka", security="ssl", log_path=tmp_path / "k.log") as broker:
        assert broker.ca_location is not None and Path(broker.ca_location).is_file()
        stream = new_stream(broker, "orders-mtls")
        carol = broker.add_user("carol")
        assert set(carol) == {"ssl.certificate.location", "ssl.key.location"}
        grant(broker.cluster(), "carol", [(ResourceType.TOPIC, stream.name, AclOperation.WRITE)])
        with Publisher(broker.cluster(**carol), PublisherConfig(stream=stream)) as pub:
            assert pub.publish(Record(b"signed"), 60) == 0
        with pytest.raises(ValueError, match="no password"):
            broker.add_user("dave", "secret")
    assert not broker.running
