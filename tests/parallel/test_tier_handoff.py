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
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER
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
    stream = stream_factory()
    tier = RetryTier(delay_s=0.1)
    name = tier.stream_for(stream.name)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(2):
            pub.publish_async(Record(b"%d" % i, key=b"k"))
        assert pub.flush(60) == 0
    ensure_topic(cluster, StreamConfig(name=name, partitions=1))
    zombie = Producer(
        cluster.client_config(PRODUCER_DEFAULTS, {"transactional.id": uuid.uuid4().hex})
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(name, value=b"open", key=b"y", partition=0)
    assert zombie.flush(30) == 0
    tier_copy(cluster, stream.name, name, b"k", 0, attempts=1)
    group = fresh_group()
    confirm_source(cluster, group, stream.name, 1)
    order: list[int] = []
    sub = grouped(cluster, stream, group)
    try:
        with caplog.at_level(logging.INFO, logger="bolide.facade.parallel"):
            sub.attach_receiver(
                lambda r: order.append(r.offset or 0),
                concurrency=2,
                retry=Retry(attempts=1, backoff_s=0, tiers=[tier]),
            )
            waits = "waits for a transaction still open"
            eventually(lambda: waits in caplog.text or order, 60)
            assert order == []  # record 1 waits: k may be parked in the open transaction
            zombie.abort_transaction(30)
            eventually(lambda: len(order) >= 2, 60)
    finally:
        sub.close()
    assert order == [0, 1]
