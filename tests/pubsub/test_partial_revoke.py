"""A member that loses some partitions in a rebalance keeps confirming the ones it keeps.

Member A reads every partition and confirms each batch; B joins and takes some of them. A's
later confirms, of records of the partitions it kept, are written: with Kafka's group offsets
(``confirm()``) and with its positions in the application's database (``SqlPositions`` and
``confirm(conn=...)`` in the transaction that writes the records' effects), through the
synchronous poll loop and through ``async for``, under eager, cooperative-sticky and Kafka 4's
consumer protocol (KIP-848). With the database, each record's effect is written exactly once.

Tansu has no cooperative or KIP-848 groups; these run on Apache Kafka.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    NotAssignedError,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.aio import AsyncSubscriber
from bolide.stores import SqlPositions, SqlStore
from tests.conftest import eventually, make_db_url
from tests.pubsub.test_incremental_rebalance import PROTOCOLS

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

PARTITIONS = 4
PER_PARTITION = 5  # records of each partition in each wave


@pytest.fixture
def kafka_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine has no cooperative or KIP-848 groups")
    return bolide_backend[1]


@pytest.fixture
def pg_store(tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[SqlStore]:
    """A position store on a fresh PostgreSQL schema."""
    with SqlStore(make_db_url("postgresql", tmp_path, request)) as store:
        store.upgrade()
        yield store


class Member:
    """A grouped subscriber on its own thread, writing one row per record it handles and
    confirming (in the row's transaction with a position store, else after the batch); it
    keeps what its hooks were told, what it handled and every error it saw."""

    def __init__(
        self,
        cluster: Cluster,
        stream: StreamConfig,
        group: str,
        protocol: str,
        *,
        store: SqlStore | None,
        table: sa.Table | None,
        driver: str,
    ) -> None:
        self.lock = threading.Lock()
        self.held: set[int] = set()
        self.revoked: list[int] = []
        self.handled: list[tuple[int, int]] = []
        self.errors: list[BaseException] = []
        self._store, self._table = store, table
        self._config = SubscriberConfig(
            stream=stream,
            group=group,
            consumer_config=PROTOCOLS[protocol],
            positions=SqlPositions(store) if store is not None else None,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            error_handler=lambda summary, error: self._failed(error),
        )
        self._cluster = cluster
        self._stop = threading.Event()
        self.stopped = False
        run = {"sync": self._run_sync, "async": self._run_async, "receiver": self._run_receiver}
        self._thread = threading.Thread(target=run[driver], daemon=True)
        self._thread.start()

    def _on_assign(self, parts: list[int]) -> None:
        with self.lock:
            self.held |= set(parts)

    def _on_revoke(self, parts: list[int]) -> None:
        with self.lock:
            self.held -= set(parts)
            self.revoked.extend(parts)

    def _failed(self, error: BaseException | None) -> None:
        if error is not None:
            with self.lock:
                self.errors.append(error)

    def _write(self, conn: sa.Connection, records: list[Record]) -> None:
        assert self._table is not None
        rows = [{"part": r.partition, "off": r.offset} for r in records]
        conn.execute(self._table.insert(), rows)

    def _handled(self, records: list[Record]) -> None:
        with self.lock:
            self.handled.extend((r.partition or 0, r.offset or 0) for r in records)

    def _run_sync(self) -> None:
        with Subscriber(self._cluster, self._config) as sub:
            while not self._stop.is_set():
                batch = list(sub.poll(100))
                if not batch:
                    continue
                try:
                    if self._store is None:
                        sub.confirm()
                    else:
                        with self._store.engine.begin() as conn:
                            self._write(conn, batch)
                            sub.confirm(conn=conn)
                except Exception as exc:  # the test fails on any
                    self._failed(exc)
                    continue
                self._handled(batch)

    def _run_receiver(self) -> None:
        """A parallel receiver: each handler writes its record's row and confirms it in one
        transaction (with a store; else the receiver confirms by itself)."""
        with Subscriber(self._cluster, self._config) as sub:

            def handle(record: Record) -> None:
                if self._store is not None:
                    with self._store.engine.begin() as conn:
                        self._write(conn, [record])
                        sub.confirm(record.offset, partition=record.partition, conn=conn)
                self._handled([record])

            receiver = sub.attach_receiver(handle, concurrency=4, retry=Retry(attempts=1))
            self._stop.wait()
            receiver.close()

    def _run_async(self) -> None:
        asyncio.run(self._iterate())

    async def _iterate(self) -> None:
        sub = AsyncSubscriber(self._cluster, self._config)

        async def stop() -> None:
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
            await sub.close()

        stopping = asyncio.create_task(stop())
        async with sub:
            async for record in sub:
                try:
                    if self._store is None:
                        await sub.confirm()
                    else:
                        with self._store.engine.begin() as conn:
                            self._write(conn, [record])
                            await sub.confirm(conn=conn)
                except Exception as exc:  # the test fails on any
                    self._failed(exc)
                    continue
                self._handled([record])
        await stopping

    def refusals_of_held(self) -> list[BaseException]:
        """What went wrong other than a refused confirm of records read on a partition
        revoked since (those are read again by its next owner)."""
        with self.lock:
            revoked = set(self.revoked)
            return [
                e
                for e in self.errors
                if not (isinstance(e, NotAssignedError) and e.partition in revoked)
            ]

    def holding(self) -> set[int]:
        with self.lock:
            return set(self.held)

    def stop(self) -> None:
        self.stopped = True
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "member did not stop"


def publish_wave(cluster: Cluster, stream: StreamConfig, wave: int) -> set[tuple[int, int]]:
    """``PER_PARTITION`` records on each partition; returns their places."""
    places = set()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(PER_PARTITION):
            for p in range(PARTITIONS):
                offset = pub.publish(Record(b"%d-%d" % (wave, i), partition=p))
                places.add((p, offset))
    return places


def failures(members: list[Member]) -> list[BaseException]:
    """What the members' confirms raised or their error handlers were told."""
    return [e for m in members for e in list(m.errors)]


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("where", ["database", "kafka"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_member_keeps_confirming_the_partitions_it_keeps(
    kafka_cluster: Cluster,
    stream_factory: Any,
    request: pytest.FixtureRequest,
    protocol: str,
    where: str,
    driver: str,
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    store: SqlStore | None = request.getfixturevalue("pg_store") if where == "database" else None
    table = None
    if store is not None:
        table = sa.Table(
            f"effects_{uuid.uuid4().hex[:8]}",
            sa.MetaData(),
            sa.Column("part", sa.Integer),
            sa.Column("off", sa.BigInteger),
        )
        table.create(store.engine)
    group = f"partial-{uuid.uuid4().hex[:8]}"
    first = publish_wave(kafka_cluster, stream, 1)
    a = Member(kafka_cluster, stream, group, protocol, store=store, table=table, driver=driver)
    members = [a]
    try:
        eventually(lambda: set(a.handled) >= first, 120)
        b = Member(kafka_cluster, stream, group, protocol, store=store, table=table, driver="sync")
        members.append(b)
        # A gave some partitions up and kept the others.
        eventually(lambda: a.holding() and b.holding(), 120)
        eventually(lambda: sorted(a.holding() | b.holding()) == list(range(PARTITIONS)), 120)
        kept = a.holding()
        assert kept and kept != set(range(PARTITIONS))
        second = publish_wave(kafka_cluster, stream, 2)
        handled = lambda: {r for m in members for r in list(m.handled)}  # noqa: E731
        eventually(lambda: failures(members) or handled() >= second, 120)
        assert not failures(members), failures(members)
        mine = {(p, o) for p, o in second if p in a.holding()}
        assert mine and mine <= set(a.handled)  # A handled and confirmed its kept partitions'
    finally:
        for member in members:
            member.stop()
    assert not failures(members), failures(members)
    if store is not None and table is not None:
        with store.engine.connect() as conn:
            rows = conn.execute(sa.select(table.c.part, table.c.off)).all()
        counts = Counter((p, o) for p, o in rows)
        assert set(counts) == first | second
        assert max(counts.values()) == 1, [r for r, n in counts.items() if n > 1]
        positions = SqlPositions(store).positions(group, stream.name)
        assert positions == dict.fromkeys(range(PARTITIONS), 2 * PER_PARTITION)
