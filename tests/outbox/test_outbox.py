"""The outbox on a real broker, on SQLite and PostgreSQL: what commits is published with its
key, headers and partition, what rolls back never is, a key's rows keep their commit order
(with two relays on PostgreSQL too), and the relay reports its progress."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import Cluster, Record, StoreError, StreamConfig
from bolide.stores import Outbox, OutboxRelay, SqlStore
from tests.conftest import eventually
from tests.outbox.conftest import read_stream, sent_rows

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Relays = Callable[..., OutboxRelay]
Topic = Callable[..., StreamConfig]


def by_key(records: list[Record]) -> dict[bytes | None, list[int]]:
    """Each key's payloads (numbers), in the order Kafka holds them."""
    out: dict[bytes | None, list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition or 0, r.offset or 0)):
        assert r.data is not None
        out.setdefault(r.key, []).append(int(r.data))
    return out


def test_committed_rows_are_published_as_added_and_marked_sent(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic(partitions=3)
    with store.engine.begin() as conn:
        first = outbox.add(conn, stream, Record(b"keyed", key=b"k1", headers={"trace": "t-1"}))
        outbox.add(conn, stream.name, Record(b"grouped", group="order-9"))
        outbox.add(conn, stream, Record(b"placed", partition=2, headers=[("a", b"1"), ("a", b"2")]))
        outbox.add(conn, stream, Record(None, key=b"k1"))  # a tombstone
    assert outbox.pending() == 4 and outbox.pending(stream.name) == 4
    relay = relays(outbox)
    eventually(lambda: outbox.pending() == 0, 60)
    got = {r.data: r for r in read_stream(cluster, stream, 4)}
    assert len(got) == 4
    assert got[b"keyed"].key == b"k1" and got[b"keyed"].headers == [("trace", b"t-1")]
    assert got[b"grouped"].key == b"order-9" and got[b"grouped"].group == "order-9"
    assert got[b"grouped"].headers == [("bolide.group", b"order-9")]
    assert got[b"placed"].partition == 2
    assert got[b"placed"].headers == [("a", b"1"), ("a", b"2")]
    assert got[None].key == b"k1" and got[b"keyed"].partition == got[None].partition
    # Each row says where its record went.
    where = {(r.partition, r.offset) for r in got.values()}
    rows = sent_rows(store)
    assert rows[0][0] == first
    assert {(r[2], r[3]) for r in rows} == where and all(r[4] is not None for r in rows)
    stats = relay.close()
    assert stats.published == 4 and stats.batches >= 1 and stats.retries == 0


def test_a_rolled_back_transaction_publishes_nothing(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic()
    relays(outbox)
    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        outbox.add(conn, stream, Record(b"rolled back", key=b"a"))
        raise RuntimeError("the application's transaction fails")
    with store.engine.connect() as conn:  # commit or roll back by hand: the same
        outbox.add(conn, stream, Record(b"rolled back too", key=b"a"))
        conn.rollback()
        outbox.add(conn, stream, Record(b"committed", key=b"a"))
        conn.commit()
    eventually(lambda: outbox.pending() == 0 and len(sent_rows(store)) == 1, 60)
    assert [r.data for r in read_stream(cluster, stream, 1)] == [b"committed"]


def test_rows_added_while_the_relay_runs_keep_their_commit_order_per_key(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic(partitions=2)
    relay = relays(outbox, batch_size=20)
    total = 600
    rng = random.Random(7)
    added = 0
    while added < total:  # transactions of 1-15 rows over 9 keys, while the relay publishes
        size = min(rng.randint(1, 15), total - added)
        with store.engine.begin() as conn:
            for i in range(added, added + size):
                outbox.add(conn, stream, Record(b"%d" % i, key=b"k%d" % (i % 9)))
        added += size
    eventually(lambda: outbox.pending() == 0, 60)
    records = read_stream(cluster, stream, total)
    assert len(records) == total
    for key, numbers in by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r} out of order"
    assert relay.stats.published == total


@pytest.mark.postgres
def test_two_relays_share_the_rows_and_keep_each_keys_order(
    cluster: Cluster, db_url: str, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("SQLite takes one relay at a time (test_sqlite_takes_one_relay_at_a_time)")
    stream = topic(partitions=3)
    total = 3_000
    with store.engine.begin() as conn:
        for i in range(total // 2):
            outbox.add(conn, stream, Record(b"%d" % i, key=b"k%d" % (i % 40)))
    # Two processes' worth: each relay on its own store (engine) of the same database.
    with SqlStore(db_url) as other_store:
        first = relays(outbox, batch_size=25)
        second = relays(Outbox(other_store), batch_size=25)

        def write_rest() -> None:
            for start in range(total // 2, total, 10):
                with store.engine.begin() as conn:
                    for i in range(start, start + 10):
                        outbox.add(conn, stream, Record(b"%d" % i, key=b"k%d" % (i % 40)))

        writer = threading.Thread(target=write_rest)
        writer.start()
        writer.join(120)
        eventually(lambda: outbox.pending() == 0, 120)
        one, two = first.close(), second.close()
    assert one.published > 0 and two.published > 0, "both relays published"
    assert one.published + two.published == total
    records = read_stream(cluster, stream, total)
    assert sorted(int(r.data or b"") for r in records) == list(range(total)), "each row once"
    for key, numbers in by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r} out of order"


def test_concurrent_writers_of_one_key_are_published_in_commit_order(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    """A transaction that adds a key waits for one holding that key, so ids follow commits:
    the first transaction to add ``hot`` commits after a second one began adding it."""
    stream = topic()
    relays(outbox)
    first_added = threading.Event()
    with store.engine.connect() as first:
        first.begin()
        outbox.add(first, stream, Record(b"first", key=b"hot"))
        first_added.set()

        def second() -> None:
            with store.engine.begin() as conn:
                outbox.add(conn, stream, Record(b"second", key=b"hot"))

        writer = threading.Thread(target=second)
        writer.start()
        writer.join(0.5)  # on either database it waits for the first transaction
        first.commit()
    writer.join(30)
    assert not writer.is_alive()
    eventually(lambda: outbox.pending() == 0, 60)
    assert [r.data for r in read_stream(cluster, stream, 2)] == [b"first", b"second"]


def test_sqlite_takes_one_relay_at_a_time(
    cluster: Cluster, store: SqlStore, outbox: Outbox, relays: Relays
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL relays share the work (test_two_relays_share_...)")
    relay = relays(outbox)
    with pytest.raises(StoreError, match="one relay at a time"):
        outbox.relay(cluster)
    relay.close()
    relays(outbox).close()  # free again


def test_sqlite_takes_one_relay_per_file_whatever_path_leads_to_it(
    cluster: Cluster,
    store: SqlStore,
    outbox: Outbox,
    topic: Topic,
    relays: Relays,
    tmp_path: Path,
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL relays share the work (test_two_relays_share_...)")
    other = tmp_path / "elsewhere" / "alias.db"  # a hard link: tests/outbox/test_cli.py
    other.parent.mkdir()
    other.symlink_to(Path(str(store.engine.url.database)))
    stream = topic()
    with store.engine.begin() as conn:
        for i in range(20):
            outbox.add(conn, stream, Record(b"%d" % i))
    relay = relays(outbox, batch_size=1)
    with SqlStore(f"sqlite:///{other}") as alias:
        with pytest.raises(StoreError, match="one relay at a time"):
            relays(Outbox(alias))
        relay.close()
        relays(Outbox(alias))  # free again, through the other path too
        eventually(lambda: outbox.pending() == 0, 60)
    # At least once: a round the close cut short may be published again by the next relay.
    assert {int(r.data or b"") for r in read_stream(cluster, stream, 20)} == set(range(20))


def test_relay_progress_in_stats_and_in_the_log(
    cluster: Cluster,
    store: SqlStore,
    outbox: Outbox,
    topic: Topic,
    relays: Relays,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        for i in range(50):
            outbox.add(conn, stream, Record(b"%d" % i))
    with caplog.at_level(logging.INFO, logger="bolide.stores.outbox"):
        relay = relays(outbox, batch_size=10, progress_interval_s=0.2)
        eventually(lambda: relay.stats.published == 50 and relay.stats.pending == 0, 60)
        stats = relay.close()
    assert stats.batches >= 5 and stats.retries == 0 and stats.elapsed_s > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "bolide.stores.outbox"]
    assert any("outbox relay started" in line for line in lines)
    assert any("50 rows published" in line and "0 pending" in line for line in lines)


def test_purge_deletes_sent_rows_and_keeps_pending_ones(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        outbox.add(conn, stream, Record(b"sent"))
    relay = relays(outbox)
    eventually(lambda: outbox.pending() == 0, 60)
    relay.close()
    with store.engine.begin() as conn:
        outbox.add(conn, stream, Record(b"waiting"))
        sent_ms = conn.execute(sa.text("SELECT max(sent_ms) FROM bolide_outbox")).scalar_one()
    assert outbox.purge(sent_before_ms=int(sent_ms)) == 0
    assert outbox.purge(sent_before_ms=int(sent_ms) + 1) == 1
    assert outbox.pending() == 1 and len(sent_rows(store)) == 1


def test_the_asyncio_relay_starts_and_closes_off_the_loop(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        for i in range(20):
            outbox.add(conn, stream, Record(b"%d" % i, key=b"k"))

    async def serve() -> int:
        ticks = 0

        async def tick() -> None:  # the loop keeps running while the relay starts and stops
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        async with await outbox.relay_async(cluster) as relay:
            while relay.stats.published < 20:
                assert relay.running, relay.error
                await asyncio.sleep(0.05)
        ticker.cancel()
        assert not relay.running
        return ticks

    assert asyncio.run(serve()) > 0
    assert [int(r.data or b"") for r in read_stream(cluster, stream, 20)] == list(range(20))
