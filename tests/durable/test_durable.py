"""Durable clients on a real broker, registry on real SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bolide.facade import (
    Cluster,
    DurableClientBusyError,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import CONSUMER_DEFAULTS
from bolide.stores import SqlStore
from bolide.stores.durable_registry import SqlDurableRegistry
from tests.aio.adapter import Api
from tests.conftest import eventually
from tests.durable.conftest import LIVE, Events, publish
from tests.pubsub.test_sparse_offsets import publish_transactions

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Factory = Callable[..., Subscriber]


def committed(cluster: Cluster, group: str, topic: str, partitions: int = 1) -> dict[int, int]:
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": group}))
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        consumer.close()


def go_live(sub: Subscriber, events: Events) -> None:
    events.drain(sub, lambda: events.live_count() == 1)


def test_reconnect_replays_exactly_what_was_missed_then_goes_live(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    registry: SqlDurableRegistry,
    api: Api,
) -> None:
    stream = stream_factory()
    before = publish(cluster, stream, 5, "before")
    first = Events()
    sub = durable(stream, "c1", registry, on_live=first.on_live)
    assert sub.durable is not None and sub.durable.state == "new"
    go_live(sub, first)
    # First-ever connect: what existed before the marker is replayed (AUTO = EARLIEST).
    assert [e[1] for e in first.records(replayed=True)] == before
    assert first.items[-1] == LIVE
    sub.close()  # keep_alive=True by default
    assert committed(cluster, "bolide-durable-c1", stream.name) == {0: before[-1] + 1}

    missed = publish(cluster, stream, 1_000, "missed")
    events = Events()
    sub = durable(stream, "c1", registry, on_live=events.on_live, max_batch=100)
    assert sub.durable is not None and sub.durable.state == "resumed"
    assert sub.marker == {0: missed[-1] + 1}
    during = publish(cluster, stream, 100, "during")  # after the marker: live, not replayed
    events.drain(sub, lambda: len(events.records()) >= 100)
    assert events.live_count() == 0
    during += publish(cluster, stream, 100, "during2")
    events.drain(sub, lambda: len(events.records()) == 1_200)

    live_at = events.items.index(LIVE)
    replayed, rest = events.items[:live_at], events.items[live_at + 1 :]
    assert [e[1] for e in replayed] == missed and all(e[2] for e in replayed)
    assert [e[1] for e in rest] == during and not any(e[2] for e in rest)
    assert all(o >= sub.marker[0] for o in during)
    assert events.live_count() == 1
    stored = registry.get("c1")
    assert stored is not None and stored.connected and stored.connections == 2
    assert stored.markers == {stream.name: sub.marker}


def test_nothing_to_replay_goes_live_on_assignment(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
    api: Api,
) -> None:
    stream = stream_factory()
    events = Events()
    sub = durable(stream, "quiet", sqlite_registry, on_live=events.on_live)
    events.drain(sub, lambda: sub.is_assigned() and events.live_count() == 1)
    assert events.items == [LIVE] and sub.marker == {0: 0}
    offsets = publish(cluster, stream, 3, "x")
    events.drain(sub, lambda: len(events.records()) == 3)
    assert events.records() == [(0, o, False, f"x-{i}".encode()) for i, o in enumerate(offsets)]


def test_multi_partition_live_records_wait_for_the_whole_replay(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
    api: Api,
) -> None:
    stream = stream_factory(partitions=3, global_order=False)

    def spread(n: int, prefix: str) -> None:
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            for i in range(n):
                pub.publish_async(Record(f"{prefix}-{i}".encode(), key=f"k{i % 7}"))
            pub.flush(timeout_s=30)

    spread(300, "old")
    events = Events()
    sub = durable(stream, "multi", sqlite_registry, on_live=events.on_live, max_batch=40)
    spread(150, "new")
    events.drain(sub, lambda: len(events.records()) == 450)
    live_at = events.items.index(LIVE)
    replayed, rest = events.items[:live_at], events.items[live_at + 1 :]
    assert len(replayed) == 300 and all(e[2] and e[3].startswith(b"old") for e in replayed)
    assert len(rest) == 150 and not any(e[2] for e in rest)
    assert all(e[1] < sub.marker[e[0]] for e in replayed)
    for p in range(3):  # per-partition order kept across the hold-back
        offsets = [e[1] for e in events.records() if e[0] == p]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))


def test_keep_alive_false_unregisters_and_drops_the_position(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
    api: Api,
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10, "a")
    events = Events()
    sub = durable(stream, "bye", sqlite_registry, on_live=events.on_live)
    go_live(sub, events)
    sub.close(keep_alive=False)
    assert sqlite_registry.get("bye") is None
    assert committed(cluster, "bolide-durable-bye", stream.name) == {}
    again = Events()
    sub = durable(stream, "bye", sqlite_registry, on_live=again.on_live)
    assert sub.durable is not None and sub.durable.state == "new"
    go_live(sub, again)
    assert [e[1] for e in again.records(replayed=True)] == list(range(10))  # from the start


def test_timeout_expires_the_queue(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 4, "a")
    events = Events()
    sub = durable(stream, "late", sqlite_registry, durable_timeout_s=1.0, on_live=events.on_live)
    go_live(sub, events)
    sub.close()
    assert committed(cluster, "bolide-durable-late", stream.name) == {0: 4}
    publish(cluster, stream, 6, "b")
    time.sleep(1.5)
    expired: list[str] = []
    again = Events()
    with caplog.at_level(logging.WARNING, logger="bolide.facade.durable"):
        sub = durable(
            stream,
            "late",
            sqlite_registry,
            durable_timeout_s=1.0,
            on_live=again.on_live,
            on_expired=expired.append,
        )
    assert expired == ["late"]
    assert sub.durable is not None and sub.durable.state == "expired"
    assert any("past its timeout" in r.getMessage() for r in caplog.records)
    go_live(sub, again)
    # Treated as new: the kept position (4) is gone; AUTO starts at the earliest record.
    assert [e[1] for e in again.records(replayed=True)] == list(range(10))


def test_two_durable_ids_are_independent(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
) -> None:
    stream = stream_factory()
    a_events, b_events = Events(), Events()
    a = durable(stream, "a", sqlite_registry, on_live=a_events.on_live)
    b = durable(stream, "b", sqlite_registry, on_live=b_events.on_live)
    go_live(a, a_events)
    go_live(b, b_events)
    a.close()
    offsets = publish(cluster, stream, 20, "x")
    b_events.drain(b, lambda: len(b_events.records()) == 20)
    assert [e[1] for e in b_events.records(replayed=False)] == offsets  # b stayed live
    a_again = Events()
    a = durable(stream, "a", sqlite_registry, on_live=a_again.on_live)
    go_live(a, a_again)
    assert [e[1] for e in a_again.records(replayed=True)] == offsets  # a replays them
    assert {c.durable_id: c.connected for c in sqlite_registry.list()} == {"a": True, "b": True}


def test_same_durable_id_twice_at_once_is_refused(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    registry: SqlDurableRegistry,
) -> None:
    stream = stream_factory()
    first = durable(stream, "dup", registry)
    with pytest.raises(DurableClientBusyError, match="'dup' is already connected elsewhere"):
        durable(stream, "dup", registry)
    first.close()
    second = durable(stream, "dup", registry)
    assert second.durable is not None and second.durable.state == "resumed"


def test_replay_reaches_into_the_sql_history(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    tmp_path: Path,
    cluster_with_starts: Callable[[dict[str, dict[int, int]]], Cluster],
    api: Api,
) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'history.db'}")
    store.upgrade()
    stream = stream_factory(store=store)
    offsets = publish(cluster, stream, 30, "h")
    archived = []
    for i, off in enumerate(offsets[:20]):
        rec = Record(f"h-{i}".encode())
        rec.partition, rec.offset = 0, off
        archived.append(rec)
    store.store_all(stream.name, archived)
    # Kafka "dropped" the first 20 records: they are only in the store now.
    trimmed = cluster_with_starts({stream.name: {0: offsets[20]}})
    events = Events()
    # registry: the stream's store
    sub = durable(stream, "hist", None, cluster=trimmed, on_live=events.on_live)
    go_live(sub, events)
    replayed = events.records(replayed=True)
    assert [e[1] for e in replayed] == offsets
    assert [e[3] for e in replayed] == [f"h-{i}".encode() for i in range(30)]
    assert SqlDurableRegistry(store).get("hist") is not None
    store.close()


def test_a_registry_is_required(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    with pytest.raises(ValueError, match="durable_registry"):
        Subscriber(cluster, SubscriberConfig(stream=stream_factory(), durable_id="x"))


@pytest.mark.slow
def test_a_killed_client_keeps_its_queue(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_url: str,
) -> None:
    stream = stream_factory()
    first = publish(cluster, stream, 50, "a")
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("durable_client.py")),
            cluster.bootstrap_servers,
            sqlite_url,
            stream.name,
            "crash",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    read: list[int] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("READ"):
                read.append(int(line.split()[1]))
            if read and read[-1] == first[-1]:
                break
        # A few more polls commit what was delivered, then the process dies without closing.
        done = {0: first[-1] + 1}
        eventually(lambda: committed(cluster, "bolide-durable-crash", stream.name) == done, 30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert read == first
    kept = committed(cluster, "bolide-durable-crash", stream.name)
    assert kept == {0: first[-1] + 1}  # the queue's position survived the kill
    later = publish(cluster, stream, 20, "b")

    with SqlDurableRegistry(sqlite_url) as registry:
        row = registry.get("crash")
        assert row is not None and row.owner is not None  # never released
        events = Events()
        deadline = time.monotonic() + 15
        while True:  # the dead process's claim lapses within one lease
            try:
                sub = durable(stream, "crash", registry, on_live=events.on_live)
                break
            except DurableClientBusyError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert sub.durable is not None and sub.durable.state == "resumed"
        go_live(sub, events)
        assert [e[1] for e in events.records(replayed=True)] == later
        sub.close()


def test_closing_a_receiver_mid_batch_loses_nothing(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
) -> None:
    stream = stream_factory()
    offsets = publish(cluster, stream, 400, "r")
    handled: list[int] = []
    live: list[str] = []

    def handle(record: Record) -> None:
        assert record.offset is not None
        handled.append(record.offset)
        time.sleep(0.002)  # slow enough to be stopped in the middle of a batch

    sub = durable(stream, "recv", sqlite_registry, max_batch=100, on_live=lambda: live.append(LIVE))
    sub.attach_receiver(handle, poll_timeout_ms=50)
    deadline = time.monotonic() + 30
    while len(handled) < 150:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sub.close()  # keep_alive: only what the receiver had polled past counts as delivered
    assert handled == offsets[: len(handled)] and len(handled) < 400 and live == []

    events = Events()
    sub = durable(stream, "recv", sqlite_registry, on_live=events.on_live)
    go_live(sub, events)
    replayed = [e[1] for e in events.records(replayed=True)]
    assert replayed and replayed[0] <= len(handled) and replayed[-1] == offsets[-1]
    assert sorted(set(handled) | set(replayed)) == offsets  # at-least-once: none lost


def test_replay_ending_on_transaction_markers_goes_live_without_a_live_record(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Factory,
    sqlite_registry: SqlDurableRegistry,
) -> None:
    stream = stream_factory()
    publish_transactions(cluster, stream, count=2, size=3)  # offsets 0-2, 4-6; markers 3, 7
    events = Events()
    sub = durable(stream, "tx", sqlite_registry, on_live=events.on_live)
    events.drain(sub, lambda: events.live_count() == 1)
    assert sub.marker == {0: 8}
    assert events.items == [
        (0, o, True, f"{o // 4}-{o % 4}".encode()) for o in (0, 1, 2, 4, 5, 6)
    ] + [LIVE]
