"""SIGKILL a subscriber with a parallel receiver at random points; a takeover member finishes.

Every record is handled at least once, and a record handled twice lies above what the
killed member had confirmed (at or after the group's committed position at the kill, at or
before the last record that member handled): confirms never pass an unfinished record, even
with 16 records in flight out of offset order. Members run one at a time (the embedded
broker wedges a group whose leader leaves mid-rebalance, see docs/compatibility.md).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from bolide.facade import Publisher, PublisherConfig, Record, RetryTier
from bolide.facade.consumer.ledger import decode_finished
from bolide.facade.kafka import probe_consumer
from bolide.facade.retry import ORIGIN_HEADER
from tests.conftest import eventually
from tests.parallel.conftest import publish_keyed
from tests.parallel.test_retry_tiers import high_watermark
from tests.reliability.conftest import (
    KILLS,
    Member,
    committed,
    record_figures,
    scaled,
    wait_session_expiry,
)
from tests.reliability.test_subscriber_crash import CrashRun, offsets

pytestmark = [pytest.mark.kafka, pytest.mark.reliability, pytest.mark.slow]


def test_parallel_receiver_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path, members, rng
):
    total = scaled(1_500)
    stream = stream_factory()
    expected = set(publish_keyed(cluster, stream, total, keys=100))
    crash = CrashRun(
        cluster, stream, group_name, "parallel", tmp_path, members, rng,
        extra=["--delay-ms", "2", "--concurrency", "16"],
    )  # fmt: skip
    started = time.monotonic()
    crash.run(expected, KILLS, offsets)
    figures = crash.check(expected, offsets)
    for member in members:  # within one member, every record exactly once
        assert len(member.processed()) == len(offsets(member))
    assert figures["lost"] == 0
    record_figures(
        "parallel-crash", records=total, elapsed_s=round(time.monotonic() - started, 1),
        **figures,
    )  # fmt: skip


def test_retry_tiers_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path, members, rng
):
    """Every seventh record fails its first call in each member and goes through the retry
    tiers with its key parked behind it; members are killed at random points. Nothing is
    lost, and within each member's hold of its partitions every key's records succeed in
    their offset order (a record handled again comes before every later record of its key,
    never after one). A member that loses its lease and gets its partitions back starts a
    new hold: what it finished above its confirmed position is read again, as after a kill."""
    total = scaled(600)
    stream = stream_factory(partitions=2, global_order=False)
    keys = publish_keyed(cluster, stream, total, keys=20)
    expected = set(keys)
    crash = CrashRun(
        cluster, stream, group_name, "parallel", tmp_path, members, rng,
        extra=["--delay-ms", "1", "--concurrency", "8", "--fail-every", "7"],
    )  # fmt: skip
    crash.run(expected, KILLS, handled_or_dead)
    seen: set[tuple[int, int]] = set()
    for member in members:
        seen |= handled_or_dead(member)
        for hold in assignment_spans(member):
            by_key: dict[bytes, list[int]] = {}
            for partition, offset in hold:
                by_key.setdefault(keys[(partition, offset)], []).append(offset)
            for key, order in by_key.items():
                assert order == sorted(order), (member.log, key, order)
    assert expected - seen == set()


def handled_or_dead(member) -> set[tuple[int, int]]:
    """What a member finished: handled (``P``) or dead-lettered (``D``)."""
    done = {(int(f[0]), int(f[1])) for f in member.processed()}
    for line in member.lines():
        if line.startswith("D "):
            done.add((int(line.split()[1]), int(line.split()[2])))
    return done


def assignment_spans(member) -> list[list[tuple[int, int]]]:
    """``(partition, offset)`` of each record a member handled, in the order it logged them,
    one list per assignment (the worker logs ``A`` on each)."""
    spans: list[list[tuple[int, int]]] = [[]]
    for line in member.lines():
        if line.startswith("A"):
            spans.append([])
        elif line.startswith("P "):
            fields = line.split()
            spans[-1].append((int(fields[1]), int(fields[2])))
    return [span for span in spans if span]


def test_a_key_keeps_its_order_across_a_kill_after_its_source_confirm(
    cluster, stream_factory, group_name, tmp_path, members
):
    """Record k1 of key k succeeds in the first tier, behind an unfinished copy of another
    key (parked for an hour), k2 comes after it; the member is killed once the source is
    confirmed past k2 and k1's copy is confirmed as finished above that tier's offset. The
    next member does not call k1 again; what it calls again of k comes in its order,
    followed by every later one (k2 at most, then k3)."""
    stream = stream_factory()
    first = RetryTier(delay_s=0.2).stream_for(stream.name)
    second = RetryTier(delay_s=3600).stream_for(stream.name)
    args = ["tiers", cluster.bootstrap_servers, stream.name, "1", group_name]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:

        def publish(key: bytes, value: bytes) -> int:
            return pub.publish_async(Record(value, key=key)).result(60)

        publish(b"j", b"stuck")  # fails every call: an hour in the second tier
        publish(b"j", b"ok")  # parked behind it in the first tier: that tier's confirm stops
        killed = Member(tmp_path, "m0", args)
        members.append(killed)
        eventually(killed.ready, 60)
        eventually(lambda: len(copies(cluster, second)) == 1, 60)
        assert len(copies(cluster, first)) == 2  # j's copies
        k1 = publish(b"k", b"once")  # its copy goes to the first tier behind j's
        eventually(lambda: handled(killed, k1), 60)
        k2 = publish(b"k", b"ok")
        eventually(lambda: handled(killed, k2), 60)
        eventually(lambda: committed(cluster, group_name, stream.name, 1).get(0, 0) > k2, 60)
        origin = f"{stream.name}/0/{k1}".encode()
        (at,) = [o for o, found in copies(cluster, first) if found == origin]
        eventually(lambda: at in confirmed_finished(cluster, group_name, first), 60)
        killed.kill()
        wait_session_expiry()
        taker = Member(tmp_path, "m1", [*args, "--healed"])
        members.append(taker)
        eventually(taker.ready, 60)
        k3 = publish(b"k", b"ok")
        eventually(lambda: handled(taker, k3), 60)
    again = [o for o in offsets_of(taker) if o in (k1, k2, k3)]
    assert again in ([k3], [k2, k3]), again  # k2 ran again (its copy unconfirmed): k3 after


def copies(cluster, topic: str) -> list[tuple[int, bytes | None]]:
    """The committed copies in partition 0 of tier ``topic``: offset and origin header (the
    tiers write in transactions, so offsets also count their markers)."""
    reader = probe_consumer(cluster, **{"isolation.level": "read_committed"})
    try:
        high = high_watermark(cluster, topic, 0)
        reader.assign([TopicPartition(topic, 0, 0)])
        found: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + 30
        while reader.position([TopicPartition(topic, 0)])[0].offset < high:
            if time.monotonic() > deadline:
                break
            for msg in reader.consume(100, timeout=0.2):
                if msg.error() is None:
                    origin = dict(msg.headers() or []).get(ORIGIN_HEADER)
                    found.append((msg.offset() or 0, origin))
        return found
    finally:
        reader.close()


def confirmed_finished(cluster, group: str, topic: str) -> set[int]:
    """The offsets of ``topic`` partition 0 that ``group`` confirmed as finished above its
    committed offset."""
    probe = probe_consumer(cluster, **{"group.id": group})
    try:
        (tp,) = probe.committed([TopicPartition(topic, 0)], timeout=30)
        return decode_finished(tp.offset, tp.metadata, where=topic) if tp.offset >= 0 else set()
    finally:
        probe.close()


def handled(member: Member, offset: int) -> bool:
    member.check_alive()
    return offset in offsets_of(member)


def offsets_of(member: Member) -> list[int]:
    return [int(f[1]) for f in member.processed()]
