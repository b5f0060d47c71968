"""A dead-letter topic deleted and created again: its offsets start over at 0, and the replays
and purges of the previous topic must neither hide, skip nor delete the new dead letters.

On a real broker (DeleteRecords for real on Apache Kafka) and both real databases.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import NewTopic

from bolide.facade import Cluster, Publisher, PublisherConfig, Reason, Record, StreamConfig
from bolide.facade.deadletter import letter
from bolide.facade.kafka import admin_client, partition_count
from bolide.stores import Archiver, DeadLetters, SqlStore
from tests.conftest import DATABASES, eventually, upgraded_db_url
from tests.deadletters.conftest import log_start, read_all

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


@pytest.fixture(params=DATABASES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    with SqlStore(upgraded_db_url(request.param, tmp_path, request)) as opened:
        yield opened


def _publish_letters(cluster: Cluster, dead: StreamConfig, source: str, tag: bytes) -> None:
    """Six dead letters, each naming ``source``/0/i as where it came from."""
    with Publisher(cluster, PublisherConfig(stream=dead)) as pub:
        for i in range(6):
            failed = Record(b"%s %d" % (tag, i), key=b"k%d" % i)
            pub.publish(letter(failed, Reason.FAILED, "boom", f"{source}/0/{i}"))


def _topic_id(cluster: Cluster, name: str) -> str | None:
    admin = admin_client(cluster)
    future = admin.describe_topics(TopicCollection([name]))[name]
    try:
        return str(future.result(timeout=30).topic_id)
    except KafkaException:  # gone
        return None


def _recreate(cluster: Cluster, name: str) -> None:
    """Delete topic ``name``, wait until it is gone, and create it again (one partition)."""
    admin = admin_client(cluster)
    before = _topic_id(cluster, name)
    admin.delete_topics([name], operation_timeout=30)[name].result(timeout=60)
    eventually(lambda: partition_count(admin_client(cluster), name) is None, 60)

    def created() -> bool:
        future = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=30)[name]
        try:
            future.result(timeout=60)
        except KafkaException:  # still being deleted
            return False
        return True

    eventually(created, 60, 0.5)
    eventually(lambda: _topic_id(cluster, name) not in (None, before), 60)


def test_books_of_a_deleted_topic_leave_the_new_one_alone(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    source, dead = stream_factory("orders"), stream_factory("orders-dlq")
    workbench = DeadLetters(store, cluster)
    _publish_letters(cluster, dead, source.name, b"old")
    assert workbench.purge(stream=dead.name, where="kafka_offset <= 2") == 3
    assert workbench.replay(stream=dead.name, where="kafka_offset >= 3") == 3
    _recreate(cluster, dead.name)
    _publish_letters(cluster, dead, source.name, b"new")

    listed = workbench.list(stream=dead.name)
    assert [(d.offset, d.value) for d in listed] == [(i, b"new %d" % i) for i in range(6)]
    assert all(d.replayed_to == () and not d.archived for d in listed)
    assert workbench.show(f"{dead.name}/0/1").value == b"new 1"
    # A purge that chooses nothing deletes nothing from Kafka.
    assert workbench.purge(stream=dead.name, reason=Reason.TIMEOUT) == 0
    assert log_start(cluster, dead.name) == 0
    assert [r.data for r in read_all(cluster, dead)] == [b"new %d" % i for i in range(6)]
    # Replayed once, to the source: the previous topic's replays were other dead letters.
    assert workbench.replay(stream=dead.name) == 6
    assert workbench.replay(stream=dead.name) == 0
    again = [r.data for r in read_all(cluster, source)]
    assert again == [b"old 3", b"old 4", b"old 5"] + [b"new %d" % i for i in range(6)]
    # A purge of the new ones trims Kafka up to the first one it did not choose.
    assert workbench.purge(stream=dead.name, where="kafka_offset <= 1") == 2
    assert [d.offset for d in workbench.list(stream=dead.name)] == [2, 3, 4, 5]


def test_archived_dead_letters_of_either_topic_keep_their_own_books(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    store: SqlStore,
    cluster_with_starts: Callable[[Any], Cluster],
) -> None:
    source, dead = stream_factory("orders"), stream_factory("orders-dlq")
    _publish_letters(cluster, dead, source.name, b"old")
    with Archiver(cluster, store, [dead], group=f"arch-{dead.name}") as archiver:
        archiver.run(until_caught_up=True)
    workbench = DeadLetters(store, cluster)
    assert workbench.purge(stream=dead.name, where="kafka_offset <= 2") == 3
    assert workbench.replay(stream=dead.name, where="kafka_offset >= 3") == 3
    _recreate(cluster, dead.name)
    _publish_letters(cluster, dead, source.name, b"new")
    # The archive still holds the previous topic's 3-5: not the new dead letters there.
    assert [d.archived for d in workbench.list(stream=dead.name)] == [False] * 6
    with Archiver(cluster, store, [dead], group=f"arch-new-{dead.name}") as archiver:
        archiver.run(until_caught_up=True)  # the new topic's own history: 0-5
    assert [d.archived for d in workbench.list(stream=dead.name)] == [True] * 6
    # 0-2 leave Kafka: the archive alone holds them, and the old purge marks there are not
    # theirs; the old topic's rows stay under their own key.
    trimmed = cluster_with_starts({dead.name: {0: 3}})
    workbench = DeadLetters(store, trimmed)
    listed = workbench.list(stream=dead.name)
    assert [(d.offset, d.value, d.archived) for d in listed] == [
        (i, b"new %d" % i, True) for i in range(6)
    ]
    assert workbench.replay(stream=dead.name, where="kafka_offset < 3") == 3
    assert [d.replayed_to for d in workbench.list(stream=dead.name)] == [(source.name,)] * 3 + [
        ()
    ] * 3
    # Purging a new dead letter deletes its archived row, never the previous topic's there.
    assert workbench.purge(stream=dead.name, where="kafka_offset = 4") == 1
    assert store.load(dead.name, 0, 4) is None
    kept = store.read(dead.name, 0, 4, 1, stored_as=dead.name)
    assert [r.data for r in kept] == [b"old 4"]
    assert [d.offset for d in workbench.list(stream=dead.name)] == [0, 1, 2, 3, 5]


def test_books_written_before_topic_ids_cover_only_older_letters(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """Rows of revision 0008 (no topic id): after the upgrade they still hide and skip the
    letters they were written about, never trim Kafka, and leave a new topic's letters alone."""
    source, dead = stream_factory("orders"), stream_factory("orders-dlq")
    store.downgrade("0008")
    _publish_letters(cluster, dead, source.name, b"old")
    now = int(time.time() * 1000)
    place = {"stream": dead.name, "kafka_partition": 0}
    with store.engine.begin() as conn:
        for offset in (0, 1):
            conn.execute(
                _table("bolide_dead_letter_purges", conn).insert(),
                [{**place, "kafka_offset": offset, "purged_ms": now}],
            )
        conn.execute(
            _table("bolide_dead_letter_replays", conn).insert(),
            [
                {
                    **place,
                    "kafka_offset": 2,
                    "target_stream": source.name,
                    "owner": "before",
                    "claimed_ms": now,
                    "target_partition": 0,
                    "target_offset": 0,
                    "replayed_ms": now,
                }
            ],
        )
    store.upgrade()
    workbench = DeadLetters(store, cluster)
    listed = workbench.list(stream=dead.name)
    assert [d.offset for d in listed] == [2, 3, 4, 5]
    assert [d.replayed_to for d in listed] == [(source.name,), (), (), ()]
    assert workbench.purge(stream=dead.name, reason=Reason.TIMEOUT) == 0
    assert log_start(cluster, dead.name) == 0  # an old mark is not proof enough to trim
    _recreate(cluster, dead.name)
    _publish_letters(cluster, dead, source.name, b"new")
    listed = workbench.list(stream=dead.name)
    assert [(d.offset, d.replayed_to) for d in listed] == [(i, ()) for i in range(6)]
    assert workbench.purge(stream=dead.name, reason=Reason.TIMEOUT) == 0
    assert log_start(cluster, dead.name) == 0


def _table(name: str, conn: sa.Connection) -> sa.Table:
    """Table ``name`` as the database has it now (an older revision's shape)."""
    return sa.Table(name, sa.MetaData(), autoload_with=conn)
