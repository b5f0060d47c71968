"""Retry tiers of a member that lost its partition without hearing it yet. Found by the fault
campaign (``par``): a member paused past its lease woke up and, before its rebalance told it
that it had lost the partition, its tiers' thread ran copies that the partition's new owner
had written meanwhile; the key's records in between were handled later by other owners, out
of order. The same happens to a member whose application stops polling past its lease. Its
writes are fenced by Kafka (their transactions carry its ended generation); a copy another
writer made holds the partition until this member proves its own generation."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from bolide.facade import Publisher, PublisherConfig, Record, Retry, RetryTier, StreamConfig
from bolide.facade.kafka import probe_consumer
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER, WRITER_HEADER
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group
from tests.parallel.test_retry_tiers import grouped, high_watermark

pytestmark = [pytest.mark.kafka]


class Calls:
    """Offsets a member's handler was called on; ``failing`` always fails."""

    def __init__(self, failing: int = -1) -> None:
        self.failing = failing
        self.lock = threading.Lock()
        self.offsets: list[int] = []

    def __call__(self, record: Record) -> None:
        with self.lock:
            self.offsets.append(record.offset or 0)
        if record.offset == self.failing:
            raise RuntimeError("fails")

    def seen(self) -> list[int]:
        with self.lock:
            return list(self.offsets)


def test_a_member_past_its_lease_runs_no_copy_the_new_owner_wrote(
    cluster, stream_factory, monkeypatch, caplog
):
    """Member A owns the partition, then stops polling past its lease; B takes the partition
    over, and k's first record fails there: B writes its copy and those of k's later records
    to the tier, which A's tiers' thread still reads. B's tier waits an hour, A's (the same
    stream) a fifth of a second: were A to handle those copies, it would run them now."""
    caplog.set_level(logging.INFO, logger="bolide.facade.parallel")
    stream = stream_factory()
    tier = f"{stream.name}.tier"
    group = fresh_group()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_async(Record(b"0", key=b"other")).result(60)
    a_calls, b_calls = Calls(), Calls(failing=1)
    a, b = grouped(cluster, stream, group), None
    release = threading.Event()
    try:
        a_receiver = a.attach_receiver(
            a_calls, concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2, stream=tier)]),
        )  # fmt: skip
        eventually(lambda: a_calls.seen() == [0], 60)  # A owns the partition, its tier loaded
        stop_polling(monkeypatch, a, release)
        b = grouped(cluster, stream, group)
        b.attach_receiver(
            b_calls, concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=3600, stream=tier)]),
        )  # fmt: skip
        eventually(b.is_assigned, 120)  # A's lease ran out: B owns the partition
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            for i in range(1, 5):
                pub.publish_async(Record(b"%d" % i, key=b"k"))
            assert pub.flush(60) == 0
        # 1 failed at B, 2 to 4 parked behind it: their copies are in the tier, B's.
        eventually(lambda: high_watermark(cluster, tier, 0) >= 4, 60)
        assert b_calls.seen() == [1]

        def fenced() -> bool:  # B's copies put the partition behind A's fence
            return a_receiver._tiers.fence.holds(0)

        eventually(lambda: len(a_calls.seen()) > 1 or fenced(), 60)
        assert a_calls.seen() == [0], "A ran copies the partition's new owner wrote"
        monkeypatch.undo()
        release.set()  # A polls again: its rebalance gives the partition up
        eventually(lambda: not a.is_assigned() and a_receiver.metrics().parked == 0, 60)
        assert a_calls.seen() == [0]
    finally:
        release.set()
        if b is not None:
            b.close()
        a.close()


def test_a_copy_of_another_writer_runs_once_the_member_proves_its_generation(
    cluster, stream_factory
):
    """A copy another writer made after this member loaded the tier (a member that held the
    partition before, its transaction committed late) holds the partition until a
    transaction of this member commits with the group's metadata: then it still owns the
    partition, and the copy runs. Found by the fault campaign (``par``) when the owner was
    asked of the group instead: a group that could not answer stopped the receiver."""
    stream = stream_factory()
    tier = f"{stream.name}.tier"
    group = fresh_group()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_async(Record(b"0", key=b"k")).result(60)
    calls = Calls()
    member = grouped(cluster, stream, group)
    try:
        receiver = member.attach_receiver(
            calls, concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2, stream=tier)]),
        )  # fmt: skip
        eventually(lambda: calls.seen() == [0], 60)  # the partition and its tier are loaded
        rounds = receiver._tiers.writer.rounds
        copy = Record(b"7", key=b"k", partition=0, headers=[
            (ORIGIN_HEADER, f"{stream.name}/0/7".encode()), (ATTEMPTS_HEADER, b"1"),
            (WRITER_HEADER, b"another-receiver"),
        ])  # fmt: skip
        with Publisher(cluster, PublisherConfig(stream=StreamConfig(name=tier))) as pub:
            pub.publish_async(copy).result(60)
        eventually(lambda: calls.seen() == [0, 7], 60)
        assert receiver._tiers.writer.rounds > rounds, "ran before a transaction proved it"
        assert not receiver._tiers.fence.holds(0)
    finally:
        member.close()


def test_a_member_past_its_lease_writes_no_copy(cluster, stream_factory, monkeypatch):
    """Member A stops polling past its lease while its handler runs record 0; B takes the
    partition over and handles record 0. Then A's call of record 0 fails: A moves it to the
    tier, in a transaction whose offsets carry A's ended generation. Kafka refuses them, the
    transaction aborts (librdkafka drops the copy before sending it, or it stays aborted),
    and no ``read_committed`` reader (B's tiers) ever sees it."""
    stream = stream_factory()
    tier = f"{stream.name}.tier"
    group = fresh_group()
    started, fail = threading.Event(), threading.Event()
    b_calls = Calls()

    def a_handler(record: Record) -> None:
        started.set()
        fail.wait(120)
        raise RuntimeError("fails after its partition moved")

    a, b = grouped(cluster, stream, group), None
    release = threading.Event()
    retry = Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2, stream=tier)])
    try:
        a_receiver = a.attach_receiver(a_handler, concurrency=2, retry=retry)
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            pub.publish_async(Record(b"0", key=b"k")).result(60)
        assert started.wait(60)  # A runs record 0
        stop_polling(monkeypatch, a, release)
        b = grouped(cluster, stream, group)
        b.attach_receiver(b_calls, concurrency=2, retry=retry)
        eventually(lambda: b_calls.seen() == [0], 120)  # A's lease ran out: B has record 0
        writer = a_receiver._tiers.writer
        fail.set()  # A's call fails now: it moves the record to the tier, a zombie
        eventually(lambda: writer._failures >= 2, 60)  # its transactions are refused
        assert writer.rounds_with_writes == 0
        assert tier_records(cluster, tier, "read_committed") == []
        assert [w.copy.data for w in writer._pending] == [b"0"]  # A tried, and tries again
        assert a_receiver._tiers.fence.holds(0)
    finally:
        release.set()
        fail.set()
        if b is not None:
            b.close()
        a.close()


def stop_polling(monkeypatch, sub, release: threading.Event) -> None:
    """``sub``'s application stops polling (its receiver too) until ``release`` is set."""
    real_poll, real_serve = sub.poll, sub.is_assigned

    def held_poll(timeout_ms: int):
        release.wait()
        return real_poll(timeout_ms)

    def held_serve() -> bool:
        release.wait()
        return real_serve()

    monkeypatch.setattr(sub, "poll", held_poll)
    monkeypatch.setattr(sub, "is_assigned", held_serve)


def tier_records(cluster, topic: str, isolation: str) -> list[bytes | None]:
    """The values in partition 0 of ``topic``, read to its end at ``isolation``."""
    reader = probe_consumer(cluster, **{"isolation.level": isolation})
    try:
        high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            at = reader.position([TopicPartition(topic, 0)])[0].offset
            if at >= high:
                break
            for msg in reader.consume(100, timeout=0.2):
                if msg.error() is None:
                    values.append(msg.value())
        return values
    finally:
        reader.close()
