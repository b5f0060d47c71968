"""The outbox relay on the secured broker, holding only the ACLs docs/kafka-estate.md lists:
the default relay (idempotent) and a transactional one publish every committed row of a
SQLite outbox, keys and headers included, and mark each sent."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import EmbeddedBroker, Record, StreamConfig
from bolide.stores import Outbox, RelayConfig, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.outbox.conftest import read_stream, sent_rows
from tests.security.conftest import Grant, UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]

#: Where a transactional relay commits its markers (docs/kafka-estate.md).
MARKER_TOPIC = "bolide-outbox-markers"


def _relay_all(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    store: SqlStore,
    stream: StreamConfig,
    config: RelayConfig,
    grants: list[Grant],
) -> None:
    """Add 30 rows in three transactions, relay them as a user with only ``grants``, and
    check that Kafka holds each row once, as added."""
    outbox = Outbox(store)
    for batch in range(3):
        with store.engine.begin() as conn:
            for i in range(batch * 10, batch * 10 + 10):
                record = Record(f"{i}".encode(), key=f"k{i % 4}", headers={"n": str(i)})
                outbox.add(conn, stream, record)
    relay = outbox.relay(user_factory(grants), config)
    try:
        eventually(lambda: outbox.pending() == 0 or not relay.running, 120)
        assert relay.error is None, relay.error
        assert outbox.pending() == 0
    finally:
        stats = relay.close()
    assert stats.published == 30
    got = sorted(read_stream(secured.cluster(), stream, 30), key=lambda r: int(r.data or b""))
    assert [(r.data, r.key, r.headers) for r in got] == [
        (f"{i}".encode(), f"k{i % 4}".encode(), [("n", f"{i}".encode())]) for i in range(30)
    ]
    assert {(r[2], r[3]) for r in sent_rows(store)} == {(r.partition, r.offset) for r in got}


def test_the_default_relay_with_its_acls_publishes_every_row(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    stream = new_stream(secured, "outbox-secured")
    with SqlStore(upgraded_db_url("sqlite", tmp_path, request)) as store:
        grants = [(ResourceType.TOPIC, stream.name, AclOperation.WRITE)]
        _relay_all(secured, user_factory, store, stream, RelayConfig(), grants)


def test_a_transactional_relay_with_its_acls_publishes_every_row(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    stream = new_stream(secured, "outbox-txn-secured")
    tid = f"relay-{uuid.uuid4().hex[:6]}"
    # Each transaction also commits the batch's number to the relay's marker group.
    new_stream(secured, MARKER_TOPIC)
    grants = [
        (ResourceType.TOPIC, stream.name, AclOperation.WRITE),
        # A publisher per stream, each with a transactional id of its own.
        (ResourceType.TRANSACTIONAL_ID, f"{tid}.{stream.name}", AclOperation.WRITE),
        (ResourceType.TOPIC, MARKER_TOPIC, AclOperation.READ),
        (ResourceType.GROUP, f"bolide-outbox.{tid}", AclOperation.READ),
    ]
    with SqlStore(upgraded_db_url("sqlite", tmp_path, request)) as store:
        _relay_all(secured, user_factory, store, stream, RelayConfig(transactional_id=tid), grants)
