"""The transactional relay (``RelayConfig(transactional_id=...)``): each row once for
``read_committed`` readers, a restart that settles claimed batches from the Kafka marker, and a
newer relay with the same id fencing the older one."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition

from bolide.facade import Cluster, ProducerFencedError, Record, StreamConfig
from bolide.facade.kafka import committed_offsets, probe_consumer
from bolide.stores import Outbox, OutboxRelay, SqlStore
from tests.conftest import eventually
from tests.outbox.conftest import read_stream
from tests.outbox.test_outbox import by_key

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Relays = Callable[..., OutboxRelay]
Topic = Callable[..., StreamConfig]


def add_rows(store: SqlStore, outbox: Outbox, stream: StreamConfig, numbers: range) -> None:
    with store.engine.begin() as conn:
        for i in numbers:
            outbox.add(conn, stream, Record(b"%d" % i, key=b"k%d" % (i % 5)))


def marker(cluster: Cluster, relay_id: str) -> int:
    """The batch number the relay's last Kafka transaction committed."""
    consumer = probe_consumer(cluster, **{"group.id": f"bolide-outbox.{relay_id}"})
    try:
        found = committed_offsets(consumer, [TopicPartition("bolide-outbox-markers", 0)])
        return int(found[0].offset)
    finally:
        consumer.close()


def claims(store: SqlStore) -> list[tuple[str | None, int | None, bool]]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT relay, batch, sent_ms FROM bolide_outbox ORDER BY id"))
        return [(r[0], r[1], r[2] is not None) for r in rows]


def test_each_row_is_published_once_in_commit_order_per_key(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic(partitions=2)
    relay_id = f"relay-{uuid.uuid4().hex[:8]}"
    add_rows(store, outbox, stream, range(300))
    relay = relays(outbox, transactional_id=relay_id, batch_size=40)
    add_rows(store, outbox, stream, range(300, 400))
    eventually(lambda: outbox.pending() == 0, 60)
    stats = relay.close()
    records = read_stream(cluster, stream, 400)
    assert sorted(int(r.data or b"") for r in records) == list(range(400)), "each row once"
    for key, numbers in by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r} out of order"
    assert stats.published == 400 and stats.batches >= 10
    batches = {batch for relay, batch, sent in claims(store) if relay == relay_id and sent}
    assert len(batches) == stats.batches and marker(cluster, relay_id) == max(batches)


def test_a_restart_settles_claimed_batches_from_the_marker(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    """The two states a killed relay leaves: a batch committed in Kafka but not marked sent,
    and a batch claimed whose transaction never committed."""
    stream = topic()
    relay_id = f"relay-{uuid.uuid4().hex[:8]}"
    add_rows(store, outbox, stream, range(30))
    with relays(outbox, transactional_id=relay_id, batch_size=30):
        eventually(lambda: outbox.pending() == 0, 60)
    last = marker(cluster, relay_id)
    add_rows(store, outbox, stream, range(30, 45))
    with store.engine.begin() as conn:
        # Killed after the Kafka commit of the last batch, before its rows were marked sent.
        unmarked = conn.execute(
            sa.text("UPDATE bolide_outbox SET sent_ms = NULL WHERE batch = :b"), {"b": last}
        ).rowcount
        # Killed inside the transaction of a later batch: claimed, never committed.
        conn.execute(
            sa.text("UPDATE bolide_outbox SET relay = :r, batch = :b WHERE sent_ms IS NULL "
                    "AND relay IS NULL"),
            {"r": relay_id, "b": last + 1},
        )  # fmt: skip
    assert unmarked == 30 and outbox.pending() == 45
    relay = relays(outbox, transactional_id=relay_id)
    assert relay.stats.recovered == 30 and relay.stats.released == 15
    eventually(lambda: outbox.pending() == 0, 60)
    assert relay.close().published == 15
    records = read_stream(cluster, stream, 45)
    assert sorted(int(r.data or b"") for r in records) == list(range(45)), "each row once"


@pytest.mark.postgres
def test_a_newer_relay_with_the_same_id_fences_the_older(
    cluster: Cluster,
    db_url: str,
    store: SqlStore,
    outbox: Outbox,
    topic: Topic,
    relays: Relays,
    embedded_broker: bool,
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("SQLite lets one relay in at a time: an older relay cannot run on")
    if embedded_broker:
        pytest.skip(
            "Tansu delivers aborted transactions to read_committed readers "
            "(docs/compatibility.md): a fenced relay's aborted batch would show"
        )
    stream = topic(partitions=2)
    relay_id = f"relay-{uuid.uuid4().hex[:8]}"
    add_rows(store, outbox, stream, range(2_000))
    older = relays(outbox, transactional_id=relay_id, batch_size=20)
    eventually(lambda: older.stats.published > 0, 60)
    with SqlStore(db_url) as other:
        newer = relays(Outbox(other), transactional_id=relay_id, batch_size=20)
        add_rows(store, outbox, stream, range(2_000, 2_500))
        eventually(lambda: not older.running, 60)
        assert isinstance(older.error, ProducerFencedError)
        with pytest.raises(ProducerFencedError):
            older.close()
        eventually(lambda: outbox.pending() == 0, 120)
        newer.close()
    records = read_stream(cluster, stream, 2_500)
    copies = Counter(int(r.data or b"") for r in records)
    assert set(copies) == set(range(2_500)) and max(copies.values()) == 1, "each row once"
    for key, numbers in by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r} out of order"
