"""Retry tiers across a handoff. Found by the fault campaign (``par``): a member that got a
partition rebuilt a key's lane from a tier copy of a later record of the key, written by a
member that had lost the partition, and took the key's earlier records read again from the
source for records finished before that copy's first failure: it never handled them."""

from __future__ import annotations

import threading

import pytest

from bolide.facade import Publisher, PublisherConfig, Record, Retry, RetryTier, StreamConfig
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group
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
