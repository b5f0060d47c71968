"""Retry tiers' confirms when two keys' finished copies cross two tiers.

Found by the model of the receiver with retry tiers (tests/reliability/test_tier_model.py): a
finished copy counts for its tier's confirm only once the key's earlier finished copies in
other tiers are confirmed, and a tier is confirmed only up to its first copy not counted. Key
a with its records in the first tier then the second, and key b the other way round, each
behind the other's copy in one tier, wait for each other for ever: neither tier is ever
confirmed past them, both keys stay parked (their later records all go through the tier) and
every restart builds the same state from the tiers again."""

from __future__ import annotations

import threading

import pytest

from bolide.facade import Publisher, PublisherConfig, Record, Retry, RetryTier
from tests.conftest import eventually
from tests.parallel.conftest import confirm_source, fresh_group, tier_copy
from tests.parallel.test_retry_tiers import committed, grouped

pytestmark = [pytest.mark.kafka]


@pytest.mark.xfail(
    strict=True,
    reason="defect: two keys whose finished copies cross two tiers hold each other's tier "
    "confirms for ever (Shelf._settle waits for the key's earlier copy in another tier)",
)
def test_two_keys_whose_copies_cross_two_tiers_both_get_confirmed(cluster, stream_factory):
    """Source: b's records 0 and 1, a's records 2 and 3, all confirmed (in the tiers). The
    first tier holds b's 1 (parked), then a's 2; the second holds a's 3, then b's 0. Every
    call succeeds: each key runs in its order, and both tiers are then confirmed to their
    ends (nothing is unfinished)."""
    stream, group = stream_factory(), fresh_group()
    tiers = [RetryTier(delay_s=0.2), RetryTier(delay_s=0.4)]
    first, second = (t.stream_for(stream.name) for t in tiers)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for key in (b"b", b"b", b"a", b"a"):
            pub.publish_async(Record(key, key=key))
        assert pub.flush(60) == 0
    for tier, key, origin, attempts in (
        (first, b"b", 1, 0),
        (first, b"a", 2, 1),
        (second, b"a", 3, 2),
        (second, b"b", 0, 2),
    ):
        tier_copy(cluster, stream.name, tier, key, origin, attempts)
    # the source is confirmed past the records whose copies are in the tiers
    confirm_source(cluster, group, stream.name, 4)
    order, lock = [], threading.Lock()

    def handler(record: Record) -> None:
        with lock:
            order.append((record.key, record.offset))

    sub = grouped(cluster, stream, group)
    try:
        sub.attach_receiver(
            handler, concurrency=2, retry=Retry(attempts=1, backoff_s=0, tiers=tiers)
        )
        eventually(lambda: len(order) == 4, 60)
        assert [o for k, o in order if k == b"a"] == [2, 3]
        assert [o for k, o in order if k == b"b"] == [0, 1]
        eventually(
            lambda: committed(cluster, group, first) == committed(cluster, group, second) == {0: 2},
            30,
        )
    finally:
        sub.close()
