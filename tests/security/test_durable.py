"""A durable client on the secured broker, holding only the ACLs docs/kafka-estate.md lists:
it replays what it missed, goes live, and on reconnecting replays exactly what came while it
was away; unregistering drops its position."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import EmbeddedBroker, Subscriber, SubscriberConfig
from bolide.stores.durable_registry import SqlDurableRegistry
from tests.conftest import upgraded_db_url
from tests.durable.conftest import LIVE, Events, publish
from tests.durable.test_durable import committed
from tests.security.conftest import LEASE_MS, UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_a_durable_client_with_its_acls_replays_then_goes_live(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = new_stream(secured, "durable-secured")
    group = "bolide-durable-ledger"
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, group, AclOperation.READ),
            # A new client and an unregistered one drop the group's position.
            (ResourceType.GROUP, group, AclOperation.DELETE),
        ]
    )
    admin = secured.cluster()
    before = publish(admin, stream, 5, "before")
    caplog.set_level(logging.WARNING, logger="bolide")
    with SqlDurableRegistry(upgraded_db_url("sqlite", tmp_path, request)) as registry:
        config = SubscriberConfig(
            stream=stream, durable_id="ledger", durable_registry=registry, lease_timeout_ms=LEASE_MS
        )
        first = Events()
        sub = Subscriber(user, replace(config, on_live=first.on_live))
        first.drain(sub, lambda: first.live_count() == 1, 120)
        live = publish(admin, stream, 3, "live")
        first.drain(sub, lambda: len(first.records()) == 8, 60)
        assert first.records(replayed=True) == [
            (0, o, True, f"before-{i}".encode()) for i, o in enumerate(before)
        ]
        assert first.records(replayed=False) == [
            (0, o, False, f"live-{i}".encode()) for i, o in enumerate(live)
        ]
        sub.confirm()
        sub.close()  # keep_alive: the position stays
        assert committed(admin, group, stream.name) == {0: 8}

        missed = publish(admin, stream, 4, "missed")
        again = Events()
        sub = Subscriber(user, replace(config, on_live=again.on_live))
        assert sub.durable is not None and sub.durable.state == "resumed"
        again.drain(sub, lambda: again.live_count() == 1, 120)
        after = publish(admin, stream, 2, "after")
        again.drain(sub, lambda: len(again.records()) == 6, 60)
        assert again.items == [
            *[(0, o, True, f"missed-{i}".encode()) for i, o in enumerate(missed)],
            LIVE,
            *[(0, o, False, f"after-{i}".encode()) for i, o in enumerate(after)],
        ]
        sub.close(keep_alive=False)  # unregistered: the group's position is deleted
        assert committed(admin, group, stream.name) == {}
    refused = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
    assert not refused, refused
