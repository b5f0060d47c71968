"""Which of a record's copies counts when a restart reads two of them back from the tiers.

A parked record's first copy goes to its key's tier, which can be the second; when that call
fails, its next copy goes to the first tier (a parked record starts there). A restart before
the older copy is confirmed reads both: the newer one is the one with more attempts, whatever
its tier. Found by the model of the receiver with retry tiers
(tests/reliability/test_tier_model.py)."""

from __future__ import annotations

import threading

import pytest

from bolide.facade import Publisher, PublisherConfig, Record, Retry, RetryTier
from tests.conftest import eventually
from tests.parallel.conftest import confirm_source, fresh_group, tier_copy
from tests.parallel.test_retry_tiers import grouped

pytestmark = [pytest.mark.kafka]


def test_the_copy_with_more_attempts_counts_whatever_its_tier(cluster, stream_factory) -> None:
    """The record failed once (its copy in the first tier has 1 attempt) after its copy as a
    parked record (in the second tier, 0 attempts). It still has the second tier to go: two
    more calls, then the dead letter. (Taking the older copy gives one call or three,
    depending on which tier is read first.)"""
    stream, group = stream_factory(), fresh_group()
    tiers = [RetryTier(delay_s=0.2), RetryTier(delay_s=0.4)]
    first, second = (t.stream_for(stream.name) for t in tiers)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_async(Record(b"x", key=b"k")).result(60)
    tier_copy(cluster, stream.name, second, b"k", 0, 0)
    tier_copy(cluster, stream.name, first, b"k", 0, 1)
    # the source is confirmed past the record: only its copies bring it back
    confirm_source(cluster, group, stream.name, 1)
    calls: list[int] = []
    letters: list[BaseException] = []
    lock = threading.Lock()

    def handler(record: Record) -> None:
        with lock:
            calls.append(record.offset or 0)
        raise RuntimeError("still failing")

    def dead_letter(record: Record, error: BaseException) -> None:
        with lock:
            letters.append(error)

    sub = grouped(cluster, stream, group)
    try:
        sub.attach_receiver(
            handler,
            concurrency=1,
            retry=Retry(attempts=1, backoff_s=0, tiers=tiers),
            dead_letter=dead_letter,
        )
        eventually(lambda: len(letters) == 1, 60)
    finally:
        sub.close()
    assert calls == [0, 0]
