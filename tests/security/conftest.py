"""One secured embedded Apache Kafka (SASL_SSL, SCRAM-SHA-512, ``StandardAuthorizer``) for
the package, and the users, ACLs and topics its tests need."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bolide.facade import Cluster, EmbeddedBroker, StreamConfig
from bolide.facade.broker.apache import kafka_unavailable
from bolide.facade.kafka import admin_client, ensure_topic
from tests.conftest import eventually

needs_kafka = pytest.mark.skipif(
    kafka_unavailable() is not None, reason=f"Apache Kafka cannot run here: {kafka_unavailable()}"
)

#: The stock broker's floor for a session (a lease): the embedded default allows 500 ms.
STOCK_SESSION_FLOOR_MS = 6_000

#: A lease the stock broker allows.
LEASE_MS = STOCK_SESSION_FLOOR_MS

#: ``(resource type, name, operation)``: an ACL to grant.
Grant = tuple[ResourceType, str, AclOperation]
UserFactory = Callable[[list[Grant]], Cluster]


@pytest.fixture(scope="package")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A SASL_SSL broker with a stock ``group.min.session.timeout.ms``, stopped at the end."""
    broker = EmbeddedBroker(
        engine="kafka",
        security="sasl_ssl",
        log_path=tmp_path_factory.mktemp("secured") / "kafka.log",
        broker_settings={"group.min.session.timeout.ms": str(STOCK_SESSION_FLOOR_MS)},
    )
    with broker:
        yield broker
    assert not broker.running


def grant(
    admin_cluster: Cluster,
    user: str,
    grants: list[Grant],
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
) -> None:
    """Allow ``user`` each operation, as the super user (``AdminClient.create_acls``), on the
    resources named (``PREFIXED``: on every resource whose name starts so)."""
    bindings = [
        AclBinding(
            kind,
            name,
            pattern,
            f"User:{user}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for kind, name, operation in grants
    ]
    if not grants:
        return
    admin = admin_client(admin_cluster)
    for future in admin.create_acls(bindings).values():
        future.result(30)
    # The ACLs reach the broker's authorizer through the metadata log: wait until it has them.
    mine = AclBindingFilter(
        ResourceType.ANY,
        None,
        pattern,
        f"User:{user}",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    eventually(lambda: len(admin.describe_acls(mine).result(30)) >= len(bindings), 30)


def new_stream(secured: EmbeddedBroker, name: str) -> StreamConfig:
    """A stream whose topic the super user made (users get no CREATE)."""
    stream = StreamConfig(name=name, partitions=1)
    ensure_topic(secured.cluster(), stream)
    return stream


@pytest.fixture
def user_factory(secured: EmbeddedBroker) -> UserFactory:
    """A fresh SCRAM user with only ``grants``, as a ``Cluster``."""

    def make(grants: list[Grant]) -> Cluster:
        name = f"user-{uuid.uuid4().hex[:8]}"
        password = uuid.uuid4().hex
        credentials = secured.add_user(name, password)
        grant(secured.cluster(), name, grants)
        return secured.cluster(**credentials)

    return make
