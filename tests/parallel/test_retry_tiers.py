"""Retry tiers: a failing record moves to delayed retry streams, later records of its key
are parked behind it, other keys flow, nothing is reordered or lost across a restart."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition

from benchmarks import bench_retries
from bolide.facade import (
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    StreamConfigMismatchError,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import CONSUMER_DEFAULTS
from tests.conftest import eventually
from tests.parallel.conftest import LEASE_MS, fresh_group, publish_keyed

pytestmark = [pytest.mark.kafka]  # tiers commit in transactions: see docs/compatibility.md

TIERS = [RetryTier(delay_s=0.5), RetryTier(delay_s=1)]


class Handled:
    """Records handled successfully, in the order they succeeded; calls per record."""

    def __init__(self, fail: dict[tuple[int, int], int]) -> None:
        self.fail = dict(fail)  # (partition, offset) -> calls that fail before it succeeds
        self.lock = threading.Lock()
        self.order: list[tuple[bytes, int]] = []
        self.calls: Counter[int] = Counter()  # per offset (of a one-partition stream)

    def __call__(self, record: Record) -> None:
        place = (record.partition or 0, record.offset or 0)
        with self.lock:
            self.calls[place[1]] += 1
            if self.calls[place[1]] <= self.fail.get(place, 0):
                raise RuntimeError(f"fails at call {self.calls[place[1]]}")
            self.order.append((record.key or b"", place[1]))

    def of(self, key: bytes) -> list[int]:
        with self.lock:
            return [o for k, o in self.order if k == key]

    def count(self) -> int:
        with self.lock:
            return len(self.order)


def committed(cluster, group: str, topic: str, partitions: int = 1) -> dict[int, int]:
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": group}))
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
    finally:
        consumer.close()


def grouped(cluster, stream, group: str) -> Subscriber:
    return Subscriber(
        cluster, SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS)
    )


def test_a_failing_record_retries_in_tiers_and_parks_its_key_only(cluster, stream_factory):
    stream = stream_factory()
    keys = publish_keyed(cluster, stream, 40, keys=4)
    failing = 5  # key k1; its first call and its first tier's call fail
    handled = Handled({(0, failing): 2})
    others = sum(1 for k in keys.values() if k != b"k1")
    others_done = threading.Event()

    def handler(record: Record) -> None:
        if record.offset == failing and handled.calls[failing] == 2:
            # Its last call waits for the other keys: were they parked too, none would come.
            assert others_done.wait(60), "other keys waited for the failing record"
        handled(record)
        if sum(1 for k, _ in handled.order if k != b"k1") == others:
            others_done.set()

    group = fresh_group()
    sub = grouped(cluster, stream, group)
    try:
        receiver = sub.attach_receiver(
            handler, concurrency=4, retry=Retry(attempts=1, backoff_s=0, tiers=TIERS)
        )
        eventually(lambda: handled.count() == 40, 60)
        eventually(lambda: committed(cluster, group, stream.name) == {0: 40}, 30)
        tier_topics = [t.stream_for(stream.name) for t in TIERS]
        assert tier_topics == [f"{stream.name}.retry-0_5s", f"{stream.name}.retry-1s"]
        # Both tiers' copies are confirmed once done: nothing parked is left.
        eventually(lambda: all(committed(cluster, group, t)[0] >= 1 for t in tier_topics), 30)
        assert receiver.metrics().parked == 0
    finally:
        sub.close()
    assert handled.calls[failing] == 3
    for key in {k for k in keys.values()}:
        assert handled.of(key) == sorted(handled.of(key)), key  # no key reordered
    assert sorted(o for _, o in handled.order) == list(range(40))
    # Other keys flowed: all their records succeeded before the failing record did.
    done_at = handled.order.index((b"k1", failing))
    assert {k for k, _ in handled.order[done_at:]} == {b"k1"}


def test_a_record_past_its_last_tier_is_dead_lettered_and_its_key_goes_on(cluster, stream_factory):
    stream, dead = stream_factory(), stream_factory()
    publish_keyed(cluster, stream, 12, keys=3)
    handled = Handled({(0, 4): 10**6})  # key k1 never succeeds
    sub = grouped(cluster, stream, fresh_group())
    letters: list[Record] = []
    reader = Subscriber(
        cluster, SubscriberConfig(stream=dead, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    )
    try:
        with Publisher(cluster, PublisherConfig(stream=dead)) as target:
            sub.attach_receiver(
                handled,
                concurrency=2,
                retry=Retry(attempts=2, backoff_s=0, tiers=[RetryTier(delay_s=0.2)]),
                dead_letter=target,
            )
            eventually(lambda: handled.count() == 11, 60)
            eventually(lambda: letters.extend(reader.poll(200)) or len(letters) == 1, 30)
    finally:
        sub.close()
        reader.close()
    assert handled.calls[4] == 3  # two calls in the worker, one in the tier
    assert handled.of(b"k1") == [1, 7, 10]  # after 4 was given up, in order
    assert letters[0].header("bolide.reason") == b"failed"
    assert letters[0].header("bolide.source") == f"{stream.name}/0/4".encode()
    assert letters[0].header("bolide.retry.origin") is None


def test_parked_records_survive_a_restart_in_order(cluster, stream_factory):
    stream = stream_factory(partitions=2, global_order=False)
    keys = publish_keyed(cluster, stream, 60, keys=6)
    k1 = sorted(p_o for p_o, k in keys.items() if k == b"k1")
    first = k1[0]
    group = fresh_group()
    # The first k1 record fails every call: it moves to the second tier, an hour away.
    stuck = Handled({first: 10**6})
    slow = [RetryTier(delay_s=0.2), RetryTier(delay_s=3600)]
    second = slow[1].stream_for(stream.name)
    sub = grouped(cluster, stream, group)
    try:
        receiver = sub.attach_receiver(
            stuck, concurrency=4, retry=Retry(attempts=1, backoff_s=0, tiers=slow)
        )
        others = sum(1 for k in keys.values() if k != b"k1")
        eventually(lambda: stuck.count() == others, 60)
        eventually(lambda: receiver.metrics().parked == len(k1), 30)
        # In the second tier: its copy, and those of k1's records read after it moved there.
        eventually(lambda: high_watermark(cluster, second, first[0]) >= 1, 30)
        assert stuck.of(b"k1") == []
        # The source is confirmed past the parked records: they are in the tiers now.
        eventually(lambda: sum(committed(cluster, group, stream.name, 2).values()) == 60, 30)
    finally:
        sub.close()

    healed = Handled({})
    # The same tiers, the second one's delay shortened: its copy is due a second after it
    # was written (the delay is in the copy's timestamp, read again from Kafka).
    quick = [slow[0], RetryTier(delay_s=1, stream=second)]
    sub = grouped(cluster, stream, group)
    try:
        sub.attach_receiver(
            healed, concurrency=4, retry=Retry(attempts=1, backoff_s=0, tiers=quick)
        )
        eventually(lambda: len(healed.of(b"k1")) == len(k1), 60)
    finally:
        sub.close()
    assert healed.of(b"k1") == [o for _, o in k1]  # in their source order, each once
    assert healed.count() == len(k1)  # nothing else came back
    assert healed.calls[first[1]] == 1


def high_watermark(cluster, topic: str, partition: int) -> int:
    consumer = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": fresh_group()}))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1]
    finally:
        consumer.close()


def test_bad_tiers_are_refused(cluster, stream_factory):
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="delay_s"):
            RetryTier(delay_s=bad)
    with pytest.raises(TypeError):
        RetryTier(delay_s="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="topic name"):
        RetryTier(delay_s=1, stream="no spaces")
    with pytest.raises(ValueError, match="share one stream"):
        Retry(tiers=[RetryTier(delay_s=1), RetryTier(delay_s=1.0)])
    with pytest.raises(TypeError):
        Retry(tiers=[10])  # type: ignore[list-item]
    stream = stream_factory()
    ungrouped = Subscriber(cluster, SubscriberConfig(stream=stream))
    sub = grouped(cluster, stream, fresh_group())
    try:
        with pytest.raises(IllegalSubscriberStateError, match="grouped"):
            ungrouped.attach_receiver(lambda r: None, retry=Retry(tiers=TIERS))

        async def handler(record: Record) -> None:
            return None

        with pytest.raises(TypeError, match="async"):
            sub.attach_receiver(handler, retry=Retry(tiers=TIERS))
    finally:
        ungrouped.close()
        sub.close()


def test_a_tier_stream_needs_its_own_stream_with_at_least_the_sources_partitions(
    cluster, stream_factory
):
    """A tier on the source stream would read its own copies back as new records for ever;
    one with fewer partitions cannot take a copy at its record's partition number. One with
    more is used: copies go to the partition numbers of their records, the rest stay empty."""
    stream = stream_factory(partitions=2, global_order=False)
    narrow, wide = stream_factory(), stream_factory(partitions=3, global_order=False)
    for made in (narrow, wide):
        Publisher(cluster, PublisherConfig(stream=made)).close()  # the topic exists
    keys = publish_keyed(cluster, stream, 8, keys=2)
    failing = min(p_o for p_o in keys if p_o[0] == 1)
    calls: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def handler(record: Record) -> None:
        place = (record.partition or 0, record.offset or 0)
        with lock:
            calls[place] += 1
            if place == failing and calls[place] == 1:
                raise RuntimeError("first call fails")

    sub = grouped(cluster, stream, fresh_group())
    try:
        for tier, match in ((stream.name, "own stream"), (narrow.name, "fewer")):
            retry = Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2, stream=tier)])
            with pytest.raises(StreamConfigMismatchError, match=match):
                sub.attach_receiver(handler, retry=retry)
        tiers = [RetryTier(delay_s=0.2, stream=wide.name)]
        sub.attach_receiver(handler, concurrency=2, retry=Retry(attempts=1, tiers=tiers))
        eventually(lambda: len(calls) == 8 and calls[failing] == 2, 60)
    finally:
        sub.close()
    ends = [high_watermark(cluster, wide.name, p) for p in range(3)]
    assert ends[0] == ends[2] == 0 and ends[1] >= 1  # the copies (and its key's) in partition 1


def test_retry_benchmark_runs(cluster, capsys):
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    argv = ["--quick", "--json", "--bootstrap", cluster.bootstrap_servers]
    assert bench_retries.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    ratios = doc["ratios"]  # through a tier; 1% and 10% failing once against none
    assert len(ratios) == 3
    for ratio in ratios:
        assert ratio["reference_value"] > 0 and ratio["bolide_value"] > 0


def test_unordered_records_do_not_wait_for_a_failing_one(cluster, stream_factory):
    stream = stream_factory()
    publish_keyed(cluster, stream, 10, keys=1)  # one key: "key" ordering would park them all
    handled = Handled({(0, 2): 1})
    others_done = threading.Event()

    def handler(record: Record) -> None:
        if record.offset == 2 and handled.calls[2] == 1:
            # Its retry waits for the rest: were they parked behind it, none would come.
            assert others_done.wait(60), "the other records waited for the failing one"
        handled(record)
        if handled.count() == 9 and not handled.of(b"k0").count(2):
            others_done.set()

    sub = grouped(cluster, stream, fresh_group())
    try:
        sub.attach_receiver(
            handler,
            concurrency=2,
            ordering="unordered",
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2)]),
        )
        eventually(lambda: handled.count() == 10, 90)
    finally:
        sub.close()
    assert handled.order[-1] == (b"k0", 2)
    assert handled.calls[2] == 2


def test_parked_records_of_a_partition_are_bounded_and_none_is_dropped(
    cluster, stream_factory, caplog
):
    """``ordering="partition"`` with its head record stuck in a tier (its downstream hangs):
    every later record of the partition parks behind it, in memory. At ``max_in_flight``
    parked records the partition is not fetched any more (its records wait in Kafka); once
    the head goes through, every record runs, once and in order."""
    caplog.set_level(logging.INFO, logger="bolide.facade.parallel")
    stream, total, limit, batch = stream_factory(), 300, 20, 10
    publish_keyed(cluster, stream, total, keys=7)
    healed, lock = threading.Event(), threading.Lock()
    calls: Counter[int] = Counter()
    order: list[int] = []

    def handler(record: Record) -> None:
        with lock:
            calls[record.offset or 0] += 1
            first = calls[record.offset or 0] == 1
        if first and not healed.is_set():
            raise RuntimeError("the service is down")
        assert healed.wait(120)  # the head's call in its tier hangs until the outage ends
        with lock:
            order.append(record.offset or 0)

    config = SubscriberConfig(
        stream=stream, group=fresh_group(), lease_timeout_ms=LEASE_MS, max_batch=batch
    )
    sub, most = Subscriber(cluster, config), [0]
    try:
        receiver = sub.attach_receiver(
            handler,
            concurrency=2,
            ordering="partition",
            max_in_flight=limit,
            retry=Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2)]),
        )

        def parked() -> int:
            most[0] = max(most[0], receiver.metrics().parked)
            return most[0]

        def paused() -> bool:
            return any("not fetched: parked records" in m for m in caplog.messages)

        eventually(lambda: parked() >= total or (parked() >= limit and paused()), 120)
        healed.set()
        eventually(lambda: parked() >= 0 and len(order) == total, 120)
    finally:
        healed.set()
        sub.close()
    # The fetch stops at ``limit`` parked records; by then the records in flight (``limit``,
    # and one poll's ``max_batch`` past it) each park as soon as their predecessor's copy is
    # queued, and one more poll's batch may come before the pause; the head parks too.
    assert most[0] <= 2 * limit + 2 * batch + 1, most[0]
    assert order == list(range(total))
