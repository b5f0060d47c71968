"""The transactional relay (``RelayConfig(transactional_id=...)``): each row once for
``read_committed`` readers, a restart that settles claimed batches from the Kafka marker, and a
newer relay with the same id fencing the older one."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition
from sqlalchemy import event

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


class UnheardClaim:
    """Lands the first claim ``relay`` makes and raises from its commit, as a database that
    goes away before it answers does; the real failure cannot be brought about on demand."""

    def __init__(self, engine: sa.Engine, relay: str) -> None:
        self.relay = relay
        self.done = False
        self._claiming: sa.Connection | None = None
        event.listen(engine, "before_cursor_execute", self._executing)
        event.listen(engine, "commit", self._committing)

    def _executing(
        self, conn: sa.Connection, _: Any, statement: str, params: Any, *__: Any
    ) -> None:
        first = params.get("relay") if isinstance(params, dict) else (params or [None])[0]
        if statement.startswith("UPDATE bolide_outbox SET relay") and first == self.relay:
            self._claiming = conn  # claim_batch: the rows get the relay's id

    def _committing(self, conn: sa.Connection) -> None:
        if conn is self._claiming and not self.done:
            self.done = True
            conn.connection.dbapi_connection.commit()  # type: ignore[union-attr]
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost)


def test_a_claim_whose_commit_landed_unheard_is_published(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    """Found by the fault campaign (``outbox``): PostgreSQL went away as a claim committed.
    The claim had landed, the relay heard a failure, and the rows waited under its claim while
    later batches of other keys committed; the next start took them for sent, and they never
    reached Kafka. The claim after a failed one hands the relay's claims back first."""
    stream = topic()
    relay_id = f"relay-{uuid.uuid4().hex[:8]}"
    unheard = UnheardClaim(store.engine, relay_id)
    add_rows(store, outbox, stream, range(1))  # key k0
    relay = relays(outbox, transactional_id=relay_id)
    eventually(lambda: unheard.done, 60)
    add_rows(store, outbox, stream, range(1, 30))
    others = [i for i in range(30) if i % 5 != 0]
    eventually(lambda: sum(sent for *_, sent in claims(store)) >= len(others), 60)
    assert relay.close().retries >= 1
    restarted = relays(outbox, transactional_id=relay_id)
    eventually(lambda: outbox.pending() == 0, 60)
    restarted.close()
    records = read_stream(cluster, stream, 30)
    assert sorted(int(r.data or b"") for r in records) == list(range(30)), "each row once"
    for key, numbers in by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r} out of order"


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
