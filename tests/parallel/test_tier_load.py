"""Retry tiers whose load keeps failing. Found by the fault campaign (``par``): a tiers'
reader took its metadata from a node that had restarted and not caught up, every load of a
new partition failed for five minutes, and each failure, once per poll, went to the error
handler (40,197 reports). A failed load waits before the next one, and only failures that
bring their run to a power of two are reported."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, ClassVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException

from bolide.facade import (
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.receiving import tier_reader as reader_module
from tests.conftest import eventually
from tests.parallel.conftest import LEASE_MS, fresh_group

pytestmark = [pytest.mark.kafka]


class _FailingReader(Consumer):
    """A real tiers' reader whose metadata requests fail while ``failing`` is set: the stale
    metadata itself cannot be brought about on demand."""

    failing: ClassVar[threading.Event] = threading.Event()
    asked: ClassVar[list[float]] = []  # monotonic times of the requests that failed

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing.is_set():
            self.asked.append(time.monotonic())
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Unknown partition"))
        return super().list_topics(*args, **kwargs)


def test_a_failing_load_backs_off_is_reported_sparingly_and_recovers(
    cluster, stream_factory, monkeypatch
):
    stream = stream_factory()
    monkeypatch.setattr(reader_module, "Consumer", _FailingReader)
    monkeypatch.setattr(_FailingReader, "asked", [])
    _FailingReader.failing.set()
    reports: list[str] = []
    config = SubscriberConfig(
        stream=stream, group=fresh_group(), lease_timeout_ms=LEASE_MS,
        error_handler=lambda summary, _: reports.append(summary),
    )  # fmt: skip
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_async(Record(b"0", key=b"k")).result(60)
    handled: list[int] = []
    member = Subscriber(cluster, config)
    try:
        member.attach_receiver(
            lambda r: handled.append(r.offset or 0), concurrency=2,
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2)]),
        )  # fmt: skip
        eventually(lambda: len(_FailingReader.asked) >= 6, 120)
        _FailingReader.failing.clear()
        eventually(lambda: handled == [0], 60)  # loaded at last: the partition's record runs
    finally:
        _FailingReader.failing.clear()
        member.close()
    asked = _FailingReader.asked
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    for n, gap in enumerate(gaps, start=1):  # a slow machine only makes the gaps longer
        assert gap >= min(1.0, 0.1 * 2 ** (n - 1)) * 0.99, f"load {n + 1} came {gap:.3f}s after"
    failed = [s for s in reports if "reading the tiers of new partitions failed" in s]
    expected = ["" if n == 1 else f" ({n} times in a row)" for n in (1, 2, 4, 8, 16, 32, 64)]
    assert failed == [
        f"retry tiers: reading the tiers of new partitions failed{times}"
        for times in expected[: len(failed)]
    ]
    assert len(failed) == len(asked).bit_length()  # one per power of two up to the last
