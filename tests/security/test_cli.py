"""The admin command line on the secured broker, logged in with ``-X`` as kcat is
(``security.protocol``, ``sasl.*``, ``ssl.ca.location``): a user with the ACLs of
docs/kafka-estate.md describes its topic and group, reads the lag and tails the stream; one
ACL missing is an error naming it (exit 1), never a hang."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from bolide.facade import (
    Cluster,
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    Record,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually
from tests.ops.conftest import bolide
from tests.security.conftest import LEASE_MS, UserFactory, grant, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]

PREFIXED = ResourcePatternType.PREFIXED


def login(user: Cluster) -> list[str]:
    """``--bootstrap`` and the ``-X`` settings that log in as ``user``."""
    args = ["--bootstrap", user.bootstrap_servers]
    for key, value in user.settings.items():
        args += ["-X", f"{key}={value}"]
    return args


def test_topics_groups_lag_and_tail_log_in_with_dash_x(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "cli-orders")
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.WRITE),
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, "cli-billing", AclOperation.READ),
        ]
    )
    # tail reads ungrouped, through a throwaway group named bolide-ungrouped-<uuid>.
    name, prefix = user.settings["sasl.username"], "bolide-ungrouped-"
    grant(secured.cluster(), name, [(ResourceType.GROUP, prefix, AclOperation.READ)], PREFIXED)
    with Publisher(user, PublisherConfig(stream=stream)) as pub:
        for i in range(3):
            pub.publish(Record(f"r{i}".encode()), 60)
    config = SubscriberConfig(stream=stream, group="cli-billing", lease_timeout_ms=LEASE_MS)
    with Subscriber(user, config) as sub:
        eventually(lambda: sub.poll(500), 120)
        sub.confirm(0)
        eventually(lambda: sub.committed() == {0: 1}, 60)
    scope = ["--group", "cli-billing", "--stream", stream.name]
    runs = {
        "topics": bolide("topics", stream.name, "--json", *login(user)),
        "groups": bolide("groups", "cli-billing", "--json", *login(user)),
        "lag": bolide("lag", *scope, "--json", *login(user)),
        "tail": bolide("tail", "--stream", stream.name, "--from-beginning", "-e", *login(user)),
    }
    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr)
    assert json.loads(runs["lag"].stdout)
    assert all(f"r{i}" in runs["tail"].stdout.split() for i in range(3))
    assert user.settings["sasl.password"] not in runs["lag"].stderr


def test_lag_without_the_group_acl_is_an_error_naming_it(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "cli-no-group")
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.READ)])
    run = bolide("lag", "--group", "cli-not-granted", "--stream", stream.name, *login(user))
    assert run.returncode == 1, run.stderr
    assert "cli-not-granted" in run.stderr and "DESCRIBE" in run.stderr


def test_tail_without_the_ungrouped_acl_names_the_prefix_to_grant(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    stream = new_stream(secured, "cli-no-prefix")
    with Publisher(secured.cluster(), PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"r0"), 60)
    user = user_factory([(ResourceType.TOPIC, stream.name, AclOperation.READ)])
    # Without -e: the group's refusal may come after the end of the stream, and a tail told to
    # stop there would end first. Tailing on, it fails as soon as the refusal arrives.
    run = bolide("tail", "--stream", stream.name, "--from-beginning", *login(user))
    assert run.returncode == 1, run.stderr
    assert "'bolide-ungrouped-'" in run.stderr and "PREFIXED" in run.stderr
