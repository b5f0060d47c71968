"""A second member joins: the first gives its partitions up in the rebalance, finishing and
confirming what it can while it still owns them; the second re-reads only what lies above."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from bolide.facade import Record, Subscriber, SubscriberConfig
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group, publish_keyed
from tests.reliability.conftest import committed

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_rebalance_confirms_finished_work_before_the_next_owner_reads(cluster, stream_factory):
    stream = stream_factory(partitions=2, global_order=False)
    published = publish_keyed(cluster, stream, 600, keys=60)
    group = fresh_group()
    lock = threading.Lock()
    handled: list[tuple[str, int, int]] = []
    at_revoke: list[dict[int, int]] = []

    def handler(name: str):
        def handle(record: Record) -> None:
            time.sleep(0.01)
            with lock:
                handled.append((name, record.partition or 0, record.offset or 0))

        return handle

    def on_revoke(partitions: list[int]) -> None:
        # After the receiver's synchronous confirm: what the group holds is what the next
        # owner starts from. A probe client reads it (the member is mid-rebalance).
        at_revoke.append(committed(cluster, group, stream.name, stream.partitions))

    def config(**extra) -> SubscriberConfig:
        return SubscriberConfig(stream=stream, group=group, lease_timeout_ms=6_000, **extra)

    first = Subscriber(cluster, config(on_revoke=on_revoke))
    second: Subscriber | None = None
    try:
        first.attach_receiver(handler("first"), concurrency=8)
        eventually(lambda: len(handled) >= 100, 120)
        second = Subscriber(cluster, config())
        second.attach_receiver(handler("second"), concurrency=8)
        # The join revokes a partition even when the first member has finished everything.
        eventually(
            lambda: at_revoke and len({(p, o) for _, p, o in handled}) >= len(published), 180
        )
    finally:
        first.close()
        if second is not None:
            second.close()
    counts = Counter((p, o) for _, p, o in handled)
    assert set(counts) == set(published)
    mine = {(p, o) for name, p, o in handled if name == "first"}
    theirs = {(p, o) for name, p, o in handled if name == "second"}
    position = at_revoke[0]
    for p, o in mine & theirs:  # read twice: only above what the first member had confirmed
        assert o >= position.get(p, 0), (p, o, position)
    assert all(n <= 2 for n in counts.values())
