"""Positions kept in the application's database (``SqlPositions``), on SQLite and PostgreSQL:
written in the application's transaction, read back at start and on assignment, fenced."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    NotAssignedError,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.consumer import positions as positions_module
from bolide.facade.errors import BrokerError
from bolide.facade.ports import PositionStore
from bolide.stores import SqlPositions, SqlStore
from tests.conftest import eventually

pytestmark = pytest.mark.kafka

EARLIEST = InitialOffsetScheme.EARLIEST
LEASE_MS = 4_000


def ledger(store: SqlStore) -> sa.Table:
    """An application table without a unique key: a duplicate would show."""
    table = sa.Table(
        f"ledger_{uuid.uuid4().hex[:8]}", sa.MetaData(), sa.Column("value", sa.LargeBinary)
    )
    table.create(store.engine)
    return table


def rows(store: SqlStore, table: sa.Table) -> list[bytes]:
    with store.engine.connect() as conn:
        return sorted(bytes(v) for v in conn.execute(sa.select(table.c.value)).scalars())


def publish(cluster: Cluster, stream: StreamConfig, count: int, start: int = 0) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(start, start + count):
            pub.publish_async(Record(b"%04d" % i))
        assert pub.flush(30) == 0


def poll_count(sub: Subscriber, count: int) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
    return got


def ungrouped(cluster: Cluster, stream: StreamConfig, positions: SqlPositions) -> Subscriber:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST, positions=positions)
    return Subscriber(cluster, config)


def reporting_member(
    stream: StreamConfig, group: str, store: SqlStore, reports: list[BaseException]
) -> SubscriberConfig:
    """A member of ``group`` keeping its positions in ``store``; its reports go to ``reports``."""
    return SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=LEASE_MS,
        positions=SqlPositions(store),
        error_handler=lambda summary, error: reports.append(error),
    )


def table_ahead_of_kafka(
    cluster: Cluster, store: SqlStore, stream: StreamConfig, group: str
) -> None:
    """Eight records; ``group``'s committed offset in Kafka is 2, its position in the table 5."""
    publish(cluster, stream, 8)
    with Subscriber(
        cluster, SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS)
    ) as sub:
        poll_count(sub, 8)
        sub.confirm(1)
        eventually(lambda: sub.committed() == {0: 2}, 30)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO bolide_positions (group_id, stream, kafka_partition, next_offset, "
                "updated_ms) VALUES (:g, :s, 0, 5, 0)"
            ),
            {"g": group, "s": stream.name},
        )


def test_an_ungrouped_subscriber_resumes_from_the_table(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, table = stream_factory(), ledger(store)
    publish(cluster, stream, 10)
    positions = SqlPositions(store, group="ledger")
    assert isinstance(positions, PositionStore)
    with ungrouped(cluster, stream, positions) as sub:
        batch = poll_count(sub, 10)[:6]
        with store.engine.begin() as conn:
            for r in batch:
                conn.execute(table.insert().values(value=r.data))
            sub.confirm(batch[-1].offset, conn=conn)
    assert positions.positions("ledger", stream.name) == {0: 6}
    with ungrouped(cluster, stream, positions) as sub:
        rest = poll_count(sub, 4)
        assert [r.offset for r in rest] == [6, 7, 8, 9], "from the table, not EARLIEST"
        with store.engine.begin() as conn:
            for r in rest:
                conn.execute(table.insert().values(value=r.data))
            sub.confirm(conn=conn)
    assert rows(store, table) == [b"%04d" % i for i in range(10)]


def test_a_rolled_back_transaction_moves_nothing(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, table = stream_factory(), ledger(store)
    publish(cluster, stream, 3)
    positions = SqlPositions(store, group="ledger")
    with ungrouped(cluster, stream, positions) as sub:
        batch = poll_count(sub, 3)
        with pytest.raises(RuntimeError), store.engine.begin() as conn:
            conn.execute(table.insert().values(value=batch[0].data))
            sub.confirm(conn=conn)
            raise RuntimeError("the application failed")
        assert positions.positions("ledger", stream.name) == {}
        assert rows(store, table) == []
        # The subscriber still knows what is stored: a later confirm is not refused.
        with store.engine.begin() as conn:
            sub.confirm(conn=conn)
    assert positions.positions("ledger", stream.name) == {0: 3}


def test_a_grouped_subscriber_takes_the_table_over_kafkas_offsets(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, group = stream_factory(), f"g-{uuid.uuid4().hex[:8]}"
    table_ahead_of_kafka(cluster, store, stream, group)
    config = SubscriberConfig(
        stream=stream, group=group, lease_timeout_ms=LEASE_MS, positions=SqlPositions(store)
    )
    with Subscriber(cluster, config) as sub:
        got = poll_count(sub, 3)
        assert [r.offset for r in got] == [5, 6, 7]
        with store.engine.begin() as conn:
            sub.confirm(conn=conn)
        # Once the database commits, Kafka's offsets follow (for lag tools).
        eventually(lambda: sub.committed() == {0: 8}, 30)
        with pytest.raises(IllegalSubscriberStateError, match="conn="):
            sub.confirm()
        tid = f"t-{uuid.uuid4().hex}"
        with (
            Publisher(cluster, PublisherConfig(stream=stream, transactional_id=tid)) as pub,
            pytest.raises(IllegalSubscriberStateError, match="conn"),
            pub.transaction(),
        ):
            pub.confirm(sub)
    assert SqlPositions(store).positions(group, stream.name) == {0: 8}


def test_a_member_whose_positioning_fails_resumes_from_the_table_not_from_kafka(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    store: SqlStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim read the table's position, then asking the broker where the partition starts
    failed (its leader was down): the member, which holds the claim and so may write, goes on
    from the table's position, not from Kafka's committed offset below it (which would write
    the effects of records 2-4 a second time)."""
    stream, group = stream_factory(), f"g-{uuid.uuid4().hex[:8]}"
    table_ahead_of_kafka(cluster, store, stream, group)
    real, failures = positions_module.log_starts, [1]

    def leader_down(*args: Any, **kwargs: Any) -> dict[int, int]:
        if failures:
            failures.pop()
            raise BrokerError("the partition's leader did not answer")
        return real(*args, **kwargs)

    monkeypatch.setattr(positions_module, "log_starts", leader_down)
    reports: list[BaseException] = []
    config = reporting_member(stream, group, store, reports)
    with Subscriber(cluster, config) as sub:
        got = poll_count(sub, 3)
        assert [r.offset for r in got] == [5, 6, 7]
        with store.engine.begin() as conn:
            sub.confirm(conn=conn)
    assert not failures, "positioning failed once"
    assert any(isinstance(e, BrokerError) for e in reports)
    assert SqlPositions(store).positions(group, stream.name) == {0: 8}


def test_a_member_whose_position_was_moved_by_another_is_refused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, table = stream_factory(), ledger(store)
    publish(cluster, stream, 4)
    positions = SqlPositions(store, group="ledger")
    with ungrouped(cluster, stream, positions) as sub:
        batch = poll_count(sub, 4)
        # Another subscriber took the partition over (claimed it) and wrote its position.
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE bolide_positions SET owner = 'other', next_offset = 2 "
                    "WHERE group_id = 'ledger' AND stream = :s"
                ),
                {"s": stream.name},
            )
        with (
            pytest.raises(NotAssignedError, match="another subscriber"),
            store.engine.begin() as conn,
        ):
            for r in batch:
                conn.execute(table.insert().values(value=r.data))
            sub.confirm(conn=conn)
    assert rows(store, table) == [], "the application's writes rolled back with it"
    assert positions.positions("ledger", stream.name) == {0: 2}


def test_a_durable_client_resumes_from_the_table(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 6)
    durable_id = f"d-{uuid.uuid4().hex[:8]}"
    config = SubscriberConfig(
        stream=stream,
        durable_id=durable_id,
        durable_registry=store,
        lease_timeout_ms=LEASE_MS,
        initial_offset_scheme=EARLIEST,
        positions=SqlPositions(store),
    )
    with Subscriber(cluster, config) as sub:
        got = poll_count(sub, 6)
        assert all(r.replayed for r in got)
        with store.engine.begin() as conn:
            sub.confirm(2, conn=conn)  # the application finished three of them
    with Subscriber(cluster, config) as sub:
        again = poll_count(sub, 3)
        assert [r.offset for r in again] == [3, 4, 5]


def test_positions_are_checked(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore, db_url: str
) -> None:
    stream = stream_factory()
    with pytest.raises(ValueError, match="group="):
        SubscriberConfig(stream=stream, positions=SqlPositions(store))
    with pytest.raises(TypeError, match="SqlStore or a database URL"):
        SqlPositions(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group"):
        SqlPositions(store, group="")
    publish(cluster, stream, 1)
    with ungrouped(cluster, stream, SqlPositions(store, group="x")) as sub:
        poll_count(sub, 1)
        with pytest.raises(TypeError, match="Connection"):
            sub.confirm(conn=store.engine)
    with Subscriber(
        cluster, SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST)
    ) as sub:
        poll_count(sub, 1)
        with (
            pytest.raises(IllegalSubscriberStateError, match="positions="),
            store.engine.begin() as conn,
        ):
            sub.confirm(conn=conn)
    with SqlPositions(db_url, group="x") as owned:
        assert owned.positions("x", stream.name) == {}


def test_a_member_whose_claim_fails_reads_nothing_until_it_claims(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], tmp_path: Path
) -> None:
    """The claim on assignment failed (another writer held the database): the member cannot
    write the partition's position, so it reads none of its records (Kafka's committed
    offset, below the table's, would hand it records 2-4 a second time). Once the database
    answers, a later poll claims the partition and reads on from the table's position."""
    path = tmp_path / "positions.db"
    stream, group = stream_factory(), f"g-{uuid.uuid4().hex[:8]}"
    with SqlStore(f"sqlite:///{path}", busy_timeout_ms=100) as store:
        store.upgrade()
        table_ahead_of_kafka(cluster, store, stream, group)
        table = ledger(store)
        reports: list[BaseException] = []
        config = reporting_member(stream, group, store, reports)
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            with Subscriber(cluster, config) as sub:
                early: list[Record] = []
                eventually(lambda: early.extend(sub.poll(200)) or (sub.is_assigned() and reports))
                early.extend(sub.poll(1_000))
                assert not early, "read without the claim"
                locker.execute("COMMIT")
                got = poll_count(sub, 3)
                assert [r.offset for r in got] == [5, 6, 7]
                with store.engine.begin() as conn:
                    conn.execute(table.insert(), [{"value": r.data} for r in got])
                    sub.confirm(conn=conn)
        finally:
            locker.close()
        assert SqlPositions(store).positions(group, stream.name) == {0: 8}
        assert rows(store, table) == [b"0005", b"0006", b"0007"]
