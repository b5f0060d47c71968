"""The archiver reads ahead while it writes: batches queued behind a write on a revoke, a stop
and a database error keep every promise of the serial loop."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from bolide.facade import Cluster, Record, StoreError, StreamConfig
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually
from tests.history.test_archiver import FAST_GROUP, archived, committed, publish

pytestmark = pytest.mark.kafka


class GatedStore(SqlStore):
    """Holds the first batch's transaction open until ``release`` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def store_batches(
        self, batches: Mapping[str, Sequence[Record]], *, also: Any = None, **keys: Any
    ) -> int:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(60)
        return super().store_batches(batches, also=also, **keys)


@pytest.fixture
def gated(tmp_path: Path) -> Any:
    store = GatedStore(f"sqlite:///{tmp_path}/gated.db")
    store.upgrade()
    yield store
    store.release.set()
    store.close()


def queue_behind_a_write(
    cluster: Cluster, store: GatedStore, stream_factory: Callable[..., StreamConfig]
) -> tuple[Archiver, StreamConfig, str]:
    """A started archiver holding 10 records in a transaction and 10 more queued behind it;
    its stream and group."""
    stream = stream_factory()
    group = f"g-{uuid.uuid4().hex[:8]}"
    publish(cluster, stream, 10)
    archiver = Archiver(
        cluster,
        store,
        [stream],
        group=group,
        batch_size=1_000,
        consumer_config=FAST_GROUP,
        progress_interval_s=0.0,
    )
    archiver.start()
    assert store.entered.wait(60)
    publish(cluster, stream, 10, start=10)
    eventually(lambda: archiver.stats.queued == 20, timeout_s=30)
    assert store.largest_offset(stream.name, 0) is None
    return archiver, stream, group


def test_a_revoke_completes_once_the_queued_batches_are_written_and_committed(
    cluster: Cluster, gated: GatedStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    archiver, stream, group = queue_behind_a_write(cluster, gated, stream_factory)
    # Another member joins: the archiver's partition is revoked while a batch is queued.
    seen: list[tuple[list[int], dict[int, int]]] = []
    assigned, leave = threading.Event(), threading.Event()

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The rebalance completes only after the archiver's revoke: what does it leave?
        seen.append(([r.offset or 0 for r in archived(gated, stream)], committed_now()))
        assigned.set()

    def committed_now() -> dict[int, int]:
        return committed(cluster, group, stream)

    def member() -> None:
        other = Consumer(cluster.client_config({"group.id": group, **FAST_GROUP}))
        other.subscribe([stream.name], on_assign=on_assign)
        while not leave.is_set():
            other.poll(0.1)
        other.close()

    joiner = threading.Thread(target=member)
    joiner.start()
    try:
        eventually(lambda: not archiver.health(lag=False).lease_held, timeout_s=30)
        assert not assigned.is_set()  # the revoke waits for the write in progress
        gated.release.set()
        assert assigned.wait(60)
    finally:
        leave.set()
        joiner.join(30)
    offsets, offsets_committed = seen[0]
    assert offsets == list(range(20))  # both batches, whole, before the next owner starts
    assert offsets_committed == {0: 20}
    publish(cluster, stream, 5, start=20)
    eventually(lambda: gated.largest_offset(stream.name, 0) == 24, timeout_s=60)
    stats = archiver.stop()
    assert (stats.records, stats.inserted, stats.queued) == (25, 25, 0)
    assert [r.offset for r in archived(gated, stream)] == list(range(25))
    eventually(lambda: committed(cluster, group, stream) == {0: 25}, timeout_s=20)


def test_stop_writes_the_queued_batches_before_it_returns(
    cluster: Cluster, gated: GatedStore, stream_factory: Callable[..., StreamConfig]
) -> None:
    archiver, stream, group = queue_behind_a_write(cluster, gated, stream_factory)
    stopped: list[int] = []
    stopper = threading.Thread(target=lambda: stopped.append(archiver.stop(60).records))
    stopper.start()
    gated.release.set()
    stopper.join(60)
    assert stopped == [20]
    assert [r.offset for r in archived(gated, stream)] == list(range(20))
    assert committed(cluster, group, stream) == {0: 20}


class RefusingStore(SqlStore):
    """Refuses the second batch for good, as a database refuses a statement."""

    calls = 0

    def store_batches(
        self, batches: Mapping[str, Sequence[Record]], *, also: Any = None, **keys: Any
    ) -> int:
        self.calls += 1
        if self.calls == 2:
            raise StoreError("the database refused the batch", retriable=False)
        return super().store_batches(batches, also=also, **keys)


def test_a_write_error_on_the_writer_thread_stops_the_run_with_it(
    cluster: Cluster, tmp_path: Path, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    group = f"g-{uuid.uuid4().hex[:8]}"
    publish(cluster, stream, 30)
    with RefusingStore(f"sqlite:///{tmp_path}/refusing.db") as store:
        store.upgrade()
        archiver = Archiver(
            cluster, store, [stream], group=group, batch_size=5, consumer_config=FAST_GROUP
        )
        with pytest.raises(StoreError, match="refused the batch"):
            archiver.run()
        first = store.largest_offset(stream.name, 0)
        assert first is not None
        assert [r.offset for r in archived(store, stream)] == list(range(first + 1))
        assert committed(cluster, group, stream) == {0: first + 1}  # the batch before, only
        assert archiver.stats.records == first + 1
        # Started in a thread: the error reaches the handler and stop() raises it.
        reports: list[tuple[str, BaseException | None]] = []
        store.calls = 1
        again = Archiver(
            cluster,
            store,
            [stream],
            group=group,
            batch_size=5,
            consumer_config=FAST_GROUP,
            error_handler=lambda summary, error: reports.append((summary, error)),
        )
        again.start()
        eventually(lambda: reports, timeout_s=60)
        with pytest.raises(StoreError, match="refused the batch"):
            again.stop()
        assert reports[0][0] == "the archiver stopped"
        assert committed(cluster, group, stream) == {0: first + 1}
