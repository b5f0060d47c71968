"""The completion ledger: when the lowest unfinished record of a partition finishes, its
position jumps past every record finished above it (in SQL and in Kafka's group offsets), and
a restart hands none of the finished records out again."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from benchmarks import bench_ledger, run_all
from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import SqlPositions, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.parallel.conftest import LEASE_MS, fresh_group, publish_keyed

pytestmark = pytest.mark.kafka

COUNT = 10


@pytest.fixture
def store(tmp_path: Path, request: pytest.FixtureRequest) -> SqlStore:
    with SqlStore(upgraded_db_url("postgresql", tmp_path, request)) as s:
        yield s


def _config(stream: StreamConfig, group: str, positions: SqlPositions | None) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream,
        group=group,
        lease_timeout_ms=LEASE_MS,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        positions=positions,
    )


class HeldHead:
    """Confirms each record in its own transaction (or by itself); record 0 waits for
    ``release`` until every other record is finished."""

    def __init__(self, confirm: Callable[[Record], None]) -> None:
        self.confirm = confirm
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.handled: list[int] = []

    def __call__(self, record: Record) -> None:
        assert record.offset is not None
        if record.offset == 0:
            self.release.wait(120)
        self.confirm(record)
        with self.lock:
            self.handled.append(record.offset)

    def count(self) -> int:
        with self.lock:
            return len(self.handled)


def _hold_then_release(sub: Subscriber, handler: HeldHead) -> None:
    receiver = sub.attach_receiver(handler, concurrency=4, ordering="unordered")
    eventually(lambda: handler.count() == COUNT - 1, 120)
    handler.release.set()
    eventually(lambda: handler.count() == COUNT, 120)
    receiver.close()


def _handled_after_restart(cluster: Cluster, config: SubscriberConfig) -> list[int]:
    """What a new member of the group hands its handler (waiting for a record past the end)."""
    handled: list[int] = []
    publish_keyed(cluster, config.single, 1, keys=1)  # offset COUNT: the end marker
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(
            lambda r: handled.append(r.offset or 0), concurrency=4, ordering="unordered"
        )
        eventually(lambda: COUNT in handled, 120)
        receiver.close()
    return sorted(handled)


def test_sql_position_jumps_past_records_finished_above_the_head(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, group = stream_factory(), fresh_group()
    publish_keyed(cluster, stream, COUNT, keys=COUNT)
    table = sa.Table(f"out_{uuid.uuid4().hex[:8]}", sa.MetaData(), sa.Column("off", sa.BigInteger))
    table.create(store.engine)
    positions = SqlPositions(store)
    config = _config(stream, group, positions)
    with Subscriber(cluster, config) as sub:

        def confirm(record: Record) -> None:
            with store.engine.begin() as conn:
                conn.execute(table.insert().values(off=record.offset))
                sub.confirm(record.offset, partition=record.partition, conn=conn)

        handler = HeldHead(confirm)
        _hold_then_release(sub, handler)
        assert positions.positions(group, stream.name) == {0: COUNT}
    assert _handled_after_restart(cluster, config) == [COUNT], "nothing finished runs again"


def test_kafka_position_jumps_past_records_finished_above_the_head(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    def run(sub: Subscriber, handler: HeldHead) -> None:
        _hold_then_release(sub, handler)
        eventually(lambda: sub.committed() == {0: COUNT}, 60)

    assert _in_kafka(cluster, stream_factory(), run) == [COUNT], "nothing finished runs again"


def _in_kafka(
    cluster: Cluster, stream: StreamConfig, run: Callable[[Subscriber, HeldHead], None]
) -> list[int]:
    """``run`` a grouped subscriber whose handlers confirm their own records to Kafka; then
    what a restart hands out."""
    publish_keyed(cluster, stream, COUNT, keys=COUNT)
    config = _config(stream, fresh_group(), None)
    with Subscriber(cluster, config) as sub:
        run(sub, HeldHead(lambda r: sub.confirm(r.offset, partition=r.partition)))
    return _handled_after_restart(cluster, config)


def _abandon_the_head(sub: Subscriber, handler: HeldHead) -> None:
    """Records 1.. finish and confirm; record 0 is still running when the receiver closes."""
    receiver = sub.attach_receiver(handler, concurrency=4, ordering="unordered")
    eventually(lambda: handler.count() == COUNT - 1, 120)
    receiver.close(timeout_s=0)
    handler.release.set()


def test_a_restart_skips_the_records_finished_above_an_abandoned_head_in_sql(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], store: SqlStore
) -> None:
    stream, group = stream_factory(), fresh_group()
    publish_keyed(cluster, stream, COUNT, keys=COUNT)
    positions = SqlPositions(store)
    config = _config(stream, group, positions)
    with Subscriber(cluster, config) as sub:

        def confirm(record: Record) -> None:
            with store.engine.begin() as conn:
                sub.confirm(record.offset, partition=record.partition, conn=conn)

        _abandon_the_head(sub, HeldHead(confirm))
    assert positions.positions(group, stream.name) == {0: 0}
    assert _handled_after_restart(cluster, config) == [0, COUNT]


def test_a_restart_skips_the_records_finished_above_an_abandoned_head_in_kafka(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    assert _in_kafka(cluster, stream_factory(), _abandon_the_head) == [0, COUNT]


def test_a_receiver_keeps_what_finished_above_a_held_head_for_the_next_owner(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    """Handlers that confirm nothing themselves: the receiver's own confirms carry the
    records finished above the head, so the member taking over runs only the head."""
    stream = stream_factory()
    publish_keyed(cluster, stream, COUNT, keys=COUNT)
    config = _config(stream, fresh_group(), None)
    with Subscriber(cluster, config) as sub:
        _abandon_the_head(sub, HeldHead(lambda r: None))
    assert _handled_after_restart(cluster, config) == [0, COUNT]


def test_commit_metadata_of_another_client_is_ignored_with_a_warning(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another client committed offset 3 with metadata of its own: the group resumes at 3 and
    skips nothing above it."""
    stream, group = stream_factory(), fresh_group()
    publish_keyed(cluster, stream, COUNT, keys=COUNT)
    other = Consumer(cluster.client_config({"group.id": group}))
    try:
        foreign = TopicPartition(stream.name, 0, 3, metadata="checkpoint=4,5,6")
        other.commit(offsets=[foreign], asynchronous=False)
    finally:
        other.close()
    config = _config(stream, group, None)
    with caplog.at_level(logging.WARNING, logger="bolide.subscriber"):
        handled = _handled_after_restart(cluster, config)
    assert handled == list(range(3, COUNT + 1))
    assert "not written by bolide is ignored" in caplog.text


@pytest.mark.slow
def test_the_ledger_benchmark_runs(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    argv = ["--bootstrap", cluster.bootstrap_servers, "--quick", "--json"]
    assert bench_ledger.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "ledger"
    for store in ("Kafka group offsets", "SqlPositions (sqlite)", "SqlPositions (postgresql)"):
        found = doc[store]
        assert found["frontier_only"] == 50, found  # every record above the head finished
        assert found["ledger"] == 0 and found["metadata_bytes"] > 0, found
    assert "ledger" in run_all.KNOWN and "ledger" in run_all.available()
