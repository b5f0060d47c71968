"""Retry tiers across a handoff. Found by the fault campaign (``par``): a member that got a
partition rebuilt a key's lane from a tier copy of a later record of the key, written by a
member that had lost the partition, and took the key's earlier records read again from the
source for records finished before that copy's first failure: it never handled them."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from confluent_kafka import Producer

from bolide.facade import Publisher, PublisherConfig, Record, Retry, RetryTier, StreamConfig
from bolide.facade.kafka import PRODUCER_DEFAULTS, ensure_topic
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER, WRITER_HEADER
from tests.conftest import eventually
from tests.parallel.conftest import confirm_source, fresh_group, tier_copy
from tests.parallel.test_retry_tiers import committed, grouped

pytestmark = [pytest.mark.kafka]  # tiers commit in transactions: see docs/compatibility.md


class FirstCallFails:
    """Every seventh record fails its first call (in this process), the rest succeed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed: set[int] = set()
        self.order: list[tuple[bytes, int]] = []
        self.dead: list[int] = []

    def __call__(self, record: Record) -> None:
        offset = record.offset or 0
        with self.lock:
            if offset % 7 == 0 and offset not in self.failed:
                self.failed.add(offset)
                raise RuntimeError("the first call fails")
            self.order.append((record.key or b"", offset))

    def letter(self, record: Record, error: BaseException) -> None:
        with self.lock:
            self.dead.append(record.offset or 0)

    def offsets(self) -> set[int]:
        with self.lock:
            return {o for _, o in self.order} | set(self.dead)


def test_a_copy_of_a_later_record_left_in_a_tier_skips_no_earlier_record(cluster, stream_factory):
    """A member that had lost the partition wrote a copy of k's record 4 to the second tier
    while the source is not confirmed past k's earlier records, none of them handled: the
    next owner handles k's records 0 to 3 before that copy, which is due in an hour."""
    stream = stream_factory()
    slow = [RetryTier(delay_s=0.5), RetryTier(delay_s=3600)]
    tier = slow[1].stream_for(stream.name)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(8):
            pub.publish_async(Record(b"%d" % i, key=b"k"))
        assert pub.flush(60) == 0
    headers = [(ORIGIN_HEADER, f"{stream.name}/0/4".encode()), (ATTEMPTS_HEADER, b"2")]
    with Publisher(cluster, PublisherConfig(stream=StreamConfig(name=tier, partitions=1))) as pub:
        pub.publish_async(Record(b"4", key=b"k", headers=headers, partition=0)).result(60)
    handler = FirstCallFails()
    group = fresh_group()
    sub = grouped(cluster, stream, group)
    try:
        receiver = sub.attach_receiver(
            handler, concurrency=4, dead_letter=handler.letter,
            retry=Retry(attempts=1, backoff_s=0, tiers=slow),
        )  # fmt: skip
        eventually(lambda: handler.offsets() == {0, 1, 2, 3}, 30)
        # 4 waits in the second tier, 5 to 7 behind it; the source is confirmed past them.
        eventually(lambda: committed(cluster, group, stream.name) == {0: 8}, 30)
        assert receiver.metrics().parked == 4
    finally:
        sub.close()
    assert [o for _, o in handler.order] == [0, 1, 2, 3]


def test_a_new_owner_loads_the_tiers_past_a_transaction_left_open(cluster, stream_factory, caplog):
    """A writer that lost the partition left a transaction open in the tier, and a copy of
    k's record 0 was committed after it (the source confirmed past 0): the new owner's load
    waits for that transaction to end, so k is parked and its record 1 runs after 0. Found
    by a cooperative join: a load that stopped at the last stable offset missed the copy,
    and record 1 ran first."""
    stream, tier, name = _keyed_with_tier(cluster, stream_factory(), 2)
    zombie = _open_transaction(cluster, name, partition=0)
    tier_copy(cluster, stream.name, name, b"k", 0, attempts=1)
    group = fresh_group()
    confirm_source(cluster, group, stream.name, 1)
    sub = grouped(cluster, stream, group)
    try:
        order = _receiving_while_a_load_waits(sub, tier, caplog)
        assert order == []  # record 1 waits: k may be parked in the open transaction
        zombie.abort_transaction(30)
        eventually(lambda: len(order) >= 2, 60)
    finally:
        sub.close()
    assert order == [0, 1]


def test_a_load_waiting_for_a_transaction_holds_only_its_partition(cluster, stream_factory):
    """A writer that lost partition 0 left a transaction open in its tier: the new owner's
    load of partition 0 waits for it, and partition 1's records are handled meanwhile (the
    load held the whole fetch once, so a killed member stalled all its successor's
    partitions until the transaction timeout)."""
    stream = stream_factory(partitions=2)
    tier = RetryTier(delay_s=0.1)
    name = tier.stream_for(stream.name)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for partition in (0, 1):
            for i in range(3):
                pub.publish_async(Record(b"%d" % i, key=b"k%d" % partition, partition=partition))
        assert pub.flush(60) == 0
    ensure_topic(cluster, StreamConfig(name=name, partitions=2))
    zombie = _open_transaction(cluster, name, partition=0)
    handled: list[tuple[int, int]] = []
    sub = grouped(cluster, stream, fresh_group())
    try:
        sub.attach_receiver(
            lambda r: handled.append((r.partition or 0, r.offset or 0)),
            concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[tier]),
        )
        eventually(lambda: {(1, 0), (1, 1), (1, 2)} <= set(handled), 60)
        assert [h for h in handled if h[0] == 0] == []  # it waits for the transaction
        zombie.abort_transaction(30)
        eventually(lambda: {(0, 0), (0, 1), (0, 2)} <= set(handled), 60)
    finally:
        sub.close()
    assert _first_runs([o for p, o in handled if p == 0]) == [0, 1, 2]


def test_a_copy_of_another_writer_met_by_the_load_does_not_hold_the_partition_for_good(
    cluster, stream_factory, caplog
):
    """While the new owner's load waits for a transaction left open (a copy of k's record
    0), another writer commits a copy of k's record 1 behind it: the load reads both at
    once, the second past the load's end, which holds the partition until this member
    proves its generation. Once it has, both copies run; the load let go of the partition
    only when no such copy was met, so the partition stayed held until its next revoke."""
    stream, tier, name = _keyed_with_tier(cluster, stream_factory(), 3)
    group = fresh_group()
    zombie = _open_transaction(cluster, name, partition=0, copy_of=(stream.name, 0))
    sub = grouped(cluster, stream, group)
    try:
        order = _receiving_while_a_load_waits(sub, tier, caplog)
        other = _open_transaction(cluster, name, partition=0, copy_of=(stream.name, 1))
        other.commit_transaction(30)  # behind the open one: read with it, past the load's end
        zombie.commit_transaction(30)
        eventually(lambda: {0, 1, 2} <= set(order), 60)
    finally:
        sub.close()
    assert _first_runs(order) == [0, 1, 2]


def _receiving_while_a_load_waits(sub, tier: RetryTier, caplog) -> list[int]:
    """Attach to ``sub`` a receiver with ``tier`` that notes each offset it handles, and
    wait until its load says that it waits for a transaction still open (or a record ran);
    the offsets handled, as they come."""
    order: list[int] = []
    with caplog.at_level(logging.INFO, logger="bolide.facade.parallel"):
        sub.attach_receiver(
            lambda r: order.append(r.offset or 0),
            concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[tier]),
        )
        eventually(lambda: "waits for a transaction still open" in caplog.text or order, 60)
    return order


def _keyed_with_tier(
    cluster, stream: StreamConfig, count: int
) -> tuple[StreamConfig, RetryTier, str]:
    """``stream`` with records ``b"0"`` to ``count - 1`` of key ``k``, and its first tier
    (0.1 s), whose stream is made before any receiver: the tier, and the stream's name."""
    tier = RetryTier(delay_s=0.1)
    name = tier.stream_for(stream.name)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish_async(Record(b"%d" % i, key=b"k"))
        assert pub.flush(60) == 0
    ensure_topic(cluster, StreamConfig(name=name, partitions=1))
    return stream, tier, name


def _first_runs(offsets: list[int]) -> list[int]:
    """Each offset at its first run (a member that lost its lease on a slow machine runs
    some again after its rebalance: at least once)."""
    return list(dict.fromkeys(offsets))


def _open_transaction(
    cluster, tier: str, *, partition: int, copy_of: tuple[str, int] | None = None
) -> Producer:
    """A transaction left open in ``tier``'s ``partition`` by another writer: a record of
    its own, or its copy of ``copy_of`` (stream, offset; partition 0, key ``k``)."""
    writer = uuid.uuid4().hex
    producer = Producer(
        cluster.client_config(
            PRODUCER_DEFAULTS, {"transactional.id": writer, "transaction.timeout.ms": 600_000}
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    if copy_of is None:
        producer.produce(tier, value=b"open", key=b"y", partition=partition)
    else:
        source, offset = copy_of
        headers = [
            (ORIGIN_HEADER, f"{source}/0/{offset}".encode()),
            (ATTEMPTS_HEADER, b"1"),
            (WRITER_HEADER, writer.encode()),
        ]
        producer.produce(tier, value=b"%d" % offset, key=b"k", partition=0, headers=headers)
    assert producer.flush(30) == 0
    return producer


def test_a_receiver_started_again_with_its_id_ends_its_predecessors_open_round(
    cluster, stream_factory
):
    """The predecessor (same transactional id) was killed inside a round: a copy of k's
    record 0 in a transaction left open, due in an hour. The new receiver's attach ends
    that round at once (aborted, so the copy is never read) instead of its load waiting
    for the transaction timeout, and k's records run from the source."""
    stream, tier, name = _keyed_with_tier(cluster, stream_factory(), 2)
    transactional_id = f"tiers-{uuid.uuid4().hex[:8]}"
    predecessor = Producer(
        cluster.client_config(
            PRODUCER_DEFAULTS,
            {"transactional.id": transactional_id, "transaction.timeout.ms": 600_000},
        )
    )
    predecessor.init_transactions(30)
    predecessor.begin_transaction()
    headers = [(ORIGIN_HEADER, f"{stream.name}/0/0".encode()), (ATTEMPTS_HEADER, b"1")]
    predecessor.produce(name, value=b"0", key=b"k", partition=0, headers=headers)
    assert predecessor.flush(30) == 0
    order: list[int] = []
    sub = grouped(cluster, stream, fresh_group())
    try:
        sub.attach_receiver(
            lambda r: order.append(r.offset or 0), concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[tier], transactional_id=transactional_id),
        )  # fmt: skip
        eventually(lambda: len(order) >= 2, 60)  # long before the predecessor's 600 s
    finally:
        sub.close()
    assert _first_runs(order) == [0, 1]
