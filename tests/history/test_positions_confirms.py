"""What a confirm through ``SqlPositions`` may write: never past a record still unfinished (a
parallel receiver's handlers confirm their own records), never backwards, and its
consequences (Kafka's offsets, what the subscriber takes as stored) only once the database
has committed: not for a COMMIT that fails, nor for a write a savepoint rolled back."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    NotAssignedError,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import SqlPositions, SqlStore
from tests.conftest import eventually
from tests.history.test_positions import EARLIEST, LEASE_MS, ledger, poll_count, publish, ungrouped

pytestmark = pytest.mark.kafka


def grouped(
    stream: StreamConfig, group: str, positions: SqlPositions, **extra: Any
) -> SubscriberConfig:
    """A grouped subscriber from the start of the stream, its positions in ``positions``."""
    return SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=LEASE_MS,
        initial_offset_scheme=EARLIEST,
        positions=positions,
        **extra,
    )


def test_parallel_handlers_confirm_their_own_records_without_passing_unfinished_ones(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """Each handler of a ``concurrency=4`` receiver writes its row and confirms its record in
    one transaction: none is refused by a sibling's write, and the position written never
    passes a record whose row is not committed."""
    stream, count = stream_factory(), 120
    table = sa.Table(
        f"out_{uuid.uuid4().hex[:8]}",
        sa.MetaData(),
        sa.Column("off", sa.BigInteger),
    )
    table.create(store.engine)
    publish(cluster, stream, count)
    positions = SqlPositions(store)
    group = f"g-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException | None] = []
    violations: list[tuple[int, int]] = []
    c = table.c
    position_of = sa.text(
        "SELECT next_offset FROM bolide_positions WHERE group_id = :g AND stream = :s"
    )

    def handle(record: Record) -> None:
        assert record.offset is not None
        with store.engine.begin() as conn:
            conn.execute(table.insert().values(off=record.offset))
            sub.confirm(record.offset, partition=record.partition, conn=conn)
            position = conn.execute(position_of, {"g": group, "s": stream.name}).scalar()
            if position is not None and position > 0:
                below = conn.execute(
                    sa.select(sa.func.count()).select_from(table).where(c.off < position)
                ).scalar()
                if below != position:  # a record below the position has no row
                    violations.append((position, int(below or 0)))

    config = grouped(stream, group, positions, error_handler=lambda s, e: errors.append(e))
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handle, concurrency=4, ordering="unordered")
        eventually(lambda: receiver.metrics().finished >= count, 120)
        receiver.close()
        assert errors == [] and violations == []
        stored = positions.positions(group, stream.name)[0]
        assert 0 < stored <= count
        with store.engine.begin() as conn:  # the tail: everything is finished now
            sub.confirm(conn=conn)
        assert positions.positions(group, stream.name) == {0: count}
    with store.engine.connect() as conn:
        offsets = sorted(conn.execute(sa.select(c.off)).scalars())
    assert offsets == list(range(count)), "each record's row once"


def test_a_position_never_moves_back(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 6)
    positions = SqlPositions(store, group="mono")
    with ungrouped(cluster, stream, positions) as sub:
        poll_count(sub, 6)
        with store.engine.begin() as conn:
            sub.confirm(conn=conn)
        with store.engine.begin() as conn:
            sub.confirm(1, partition=0, conn=conn)  # an older confirm arriving late
        assert positions.positions("mono", stream.name) == {0: 6}


def _deferred_tables(store: SqlStore) -> tuple[sa.Table, sa.Table]:
    """A child table whose foreign key is checked at COMMIT: an orphan fails the COMMIT."""
    suffix = uuid.uuid4().hex[:8]
    meta = sa.MetaData()
    parent = sa.Table(f"parent_{suffix}", meta, sa.Column("id", sa.Integer, primary_key=True))
    child = sa.Table(
        f"child_{suffix}",
        meta,
        sa.Column(
            "parent_id",
            sa.Integer,
            sa.ForeignKey(parent.c.id, deferrable=True, initially="DEFERRED"),
        ),
    )
    meta.create_all(store.engine)
    return parent, child


def test_nothing_follows_a_commit_that_fails(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """The database refuses the COMMIT: Kafka's offset does not move, and a retry of the
    same work in a new transaction writes the position."""
    stream, table = stream_factory(), ledger(store)
    _, child = _deferred_tables(store)
    publish(cluster, stream, 4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    positions = SqlPositions(store)
    config = grouped(stream, group, positions)
    with Subscriber(cluster, config) as sub:
        batch = poll_count(sub, 4)
        with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:
            conn.execute(child.insert().values(parent_id=99))  # refused at COMMIT
            sub.confirm(conn=conn)
        assert positions.positions(group, stream.name) == {}
        assert sub.committed() == {0: None}, "Kafka's offset moved for a failed COMMIT"
        with store.engine.begin() as conn:  # the application retries
            for r in batch:
                conn.execute(table.insert().values(value=r.data))
            sub.confirm(conn=conn)
        assert positions.positions(group, stream.name) == {0: 4}
        eventually(lambda: sub.committed() == {0: 4}, 30)


def _sqlite_savepoints(store: SqlStore) -> None:
    """SQLAlchemy's recipe for SAVEPOINT on pysqlite: the driver leaves transactions alone
    and SQLAlchemy emits BEGIN itself (pysqlite's own handling does not nest them)."""

    @sa.event.listens_for(store.engine, "connect")
    def _no_driver_transactions(dbapi_connection: object, _record: object) -> None:
        dbapi_connection.isolation_level = None  # type: ignore[attr-defined]

    @sa.event.listens_for(store.engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    store.engine.dispose()  # connections made from now on follow the recipe


def test_a_confirm_in_a_rolled_back_savepoint_is_not_written(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    if store.dialect == "sqlite":
        _sqlite_savepoints(store)
    stream = stream_factory()
    publish(cluster, stream, 3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    positions = SqlPositions(store)
    config = grouped(stream, group, positions)
    with Subscriber(cluster, config) as sub:
        poll_count(sub, 3)
        with store.engine.begin() as conn:  # noqa: SIM117 (the savepoint inside the transaction)
            with contextlib.suppress(RuntimeError), conn.begin_nested():
                sub.confirm(conn=conn)
                raise RuntimeError("this part of the work failed")
        assert positions.positions(group, stream.name) == {}
        assert sub.committed() == {0: None}, "Kafka's offset moved for an undone write"
        with store.engine.begin() as conn:
            sub.confirm(conn=conn)
        assert positions.positions(group, stream.name) == {0: 3}


def test_a_member_of_an_earlier_claim_is_refused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """Two subscribers under one key: the one that claimed last is the only writer."""
    stream = stream_factory()
    publish(cluster, stream, 4)
    positions = SqlPositions(store, group="shared")
    config = SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST, positions=positions)
    with Subscriber(cluster, config) as first:
        poll_count(first, 4)
        with Subscriber(cluster, config) as second:
            poll_count(second, 4)
            with pytest.raises(Exception, match="claimed by another"), store.engine.begin() as c:
                first.confirm(conn=c)
            with store.engine.begin() as conn:
                second.confirm(conn=conn)
    assert positions.positions("shared", stream.name) == {0: 4}


def test_a_confirm_on_a_partition_not_held_rolls_its_effects_back(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """A record read, then its partition given up (a handler still running across a
    revocation): its confirm through ``conn`` raises, so the effects written beside it roll
    back instead of committing without their position; once the partition is held again and
    the record read again, its effects and its confirm commit together."""
    stream = stream_factory()
    publish(cluster, stream, 4)
    positions = SqlPositions(store)
    group = f"g-{uuid.uuid4().hex[:8]}"
    table = ledger(store)
    with Subscriber(cluster, grouped(stream, group, positions)) as sub:
        records = poll_count(sub, 4)
        sub.deactivate()
        with pytest.raises(NotAssignedError, match="not held"), store.engine.begin() as conn:
            conn.execute(table.insert().values(value=records[2].value))
            sub.confirm(records[2].offset, partition=0, conn=conn)
        with store.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
        assert positions.positions(group, stream.name) in ({}, {0: 0})
        sub.reactivate()
        again = poll_count(sub, 4)
        assert [r.offset for r in again] == [0, 1, 2, 3]
        with store.engine.begin() as conn:
            conn.execute(table.insert().values(value=again[2].value))
            sub.confirm(again[2].offset, partition=0, conn=conn)
    assert positions.positions(group, stream.name) == {0: 3}


def test_a_confirm_below_the_stored_position_still_needs_the_claim(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    """A confirm that moves no position (its records are below the one stored: read again
    after a seek, or from the group's offsets when a claim failed) still commits effects: it
    is refused once another subscriber claimed the partition, and the effects roll back."""
    stream = stream_factory()
    publish(cluster, stream, 4)
    positions = SqlPositions(store, group="below")
    table = ledger(store)
    config = SubscriberConfig(stream=stream, initial_offset_scheme=EARLIEST, positions=positions)
    with Subscriber(cluster, config) as first:
        records = poll_count(first, 4)
        with store.engine.begin() as conn:
            first.confirm(conn=conn)
        with Subscriber(cluster, config) as second:
            assert not len(second.poll(200))  # claimed, and resumes after the records
            refused = pytest.raises(NotAssignedError, match="claimed by another")
            with refused, store.engine.begin() as conn:
                conn.execute(table.insert().values(value=records[1].value))
                first.confirm(records[1].offset, partition=0, conn=conn)
            with store.engine.connect() as conn:
                assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
    assert positions.positions("below", stream.name) == {0: 4}
