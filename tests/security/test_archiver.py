"""The archiver on the secured broker, holding only the ACLs docs/kafka-estate.md lists: it
copies every record of a stream, keys, headers and offsets, into a SQLite store in its own
group, and a second run resumes from that group's commits."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import EmbeddedBroker
from bolide.stores import Archiver, SqlStore
from tests.conftest import upgraded_db_url
from tests.history.test_archiver import archived, committed, key_of, publish
from tests.security.conftest import UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_the_archiver_with_its_acls_archives_every_record(
    secured: EmbeddedBroker,
    user_factory: UserFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    stream = new_stream(secured, "archived-secured")
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, "bolide-archiver", AclOperation.READ),
        ]
    )
    admin = secured.cluster()
    sent = publish(admin, stream, 40)
    with SqlStore(upgraded_db_url("sqlite", tmp_path, request)) as store:
        first = Archiver(user, store, [stream]).run(until_caught_up=True)
        assert (first.caught_up, first.inserted) == (True, 40)
        assert committed(admin, "bolide-archiver", stream) == {0: 40}
        sent += publish(admin, stream, 15, start=40)
        more = Archiver(user, store, [stream]).run(until_caught_up=True)
        assert (more.records, more.inserted) == (15, 15)
        got = sorted(archived(store, stream), key=key_of)
    assert [key_of(r) for r in got] == [key_of(r) for r in sorted(sent, key=key_of)]
