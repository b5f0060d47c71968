"""Retry tiers' confirms carry the copies finished above a tier's first unfinished one.

A finished copy is confirmed at once, whatever tier its key's other copies are in: a tier
partition's confirm carries the finished copies above its first unfinished one, and a source
partition's tiers are confirmed together. Key a with its records in the first tier then the
second, and key b the other way round, each behind the other's copy in one tier, run in their
keys' order, and both tiers are then confirmed to their ends (nothing parked is left). A
member that reads a tier skips the copies confirmed as finished."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    StreamConfig,
)
from bolide.facade.consumer.ledger import encode_finished
from tests.conftest import eventually
from tests.parallel.conftest import confirm_source, fresh_group, tier_copy
from tests.parallel.test_retry_tiers import committed, grouped

pytestmark = [pytest.mark.kafka]


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
    with _receiving(cluster, stream, group, tiers) as order:
        eventually(lambda: len(order) == 4, 60)
        assert [o for k, o in order if k == b"a"] == [2, 3]
        assert [o for k, o in order if k == b"b"] == [0, 1]
        eventually(
            lambda: committed(cluster, group, first) == committed(cluster, group, second) == {0: 2},
            30,
        )


def test_a_copy_confirmed_as_finished_is_not_run_again(cluster, stream_factory):
    """Source: j's record 0 and k's record 1, confirmed (in the tier). The tier holds j's
    copy, then k's, and is confirmed at j's with k's finished above it: only j runs, and the
    tier is then confirmed to its end."""
    stream, group = stream_factory(), fresh_group()
    tiers = [RetryTier(delay_s=0.2)]
    tier = tiers[0].stream_for(stream.name)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for key in (b"j", b"k"):
            pub.publish_async(Record(key, key=key))
        assert pub.flush(60) == 0
    for key, origin in ((b"j", 0), (b"k", 1)):
        tier_copy(cluster, stream.name, tier, key, origin, 1)
    confirm_source(cluster, group, stream.name, 2)
    confirm_source(cluster, group, tier, 0, encode_finished(0, [1]) or "")
    with _receiving(cluster, stream, group, tiers) as order:
        eventually(lambda: committed(cluster, group, tier) == {0: 2}, 60)
        assert order == [(b"j", 0)]


@contextmanager
def _receiving(
    cluster: Cluster, stream: StreamConfig, group: str, tiers: list[RetryTier]
) -> Iterator[list[tuple[bytes | None, int | None]]]:
    """A grouped subscriber whose receiver (retry ``tiers``, one call a tier) notes the key
    and source offset of every call, in call order."""
    order: list[tuple[bytes | None, int | None]] = []
    lock = threading.Lock()

    def handler(record: Record) -> None:
        with lock:
            order.append((record.key, record.offset))

    sub = grouped(cluster, stream, group)
    try:
        sub.attach_receiver(
            handler, concurrency=2, retry=Retry(attempts=1, backoff_s=0, tiers=tiers)
        )
        yield order
    finally:
        sub.close()
