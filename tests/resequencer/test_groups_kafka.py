"""Message groups, ordering modes and the resequencer on a real broker.

The failover test runs two subscriber-group members as processes (``tests.resequencer.member``),
publishes 100 shuffled groups through three publishers, SIGKILLs one member mid-way and checks
every group was processed in sequence, and none again once confirmed.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Resequencer,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
    publish_sequence,
)
from bolide.facade.deadletter import DETAIL_HEADER, REASON_HEADER
from bolide.facade.kafka import probe_consumer
from bolide.facade.resequencer.sequence import (
    NUMBER_HEADER,
    SEQUENCE_GROUP_HEADER,
    SIZE_HEADER,
    sequence_headers,
)
from tests.conftest import eventually
from tests.resequencer.conftest import seq_of

pytestmark = pytest.mark.kafka

LEASE_MS = 6000  # the embedded broker's group joins take about half of this
ROOT = Path(__file__).resolve().parents[2]


def _read_all(sub: Subscriber, count: int, timeout_s: float = 20) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(100)) or len(got) >= count, timeout_s)
    return got


def _ungrouped(cluster, stream: StreamConfig) -> Subscriber:
    return Subscriber(
        cluster,
        SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST),
    )


# -- publishing groups ----------------------------------------------------------------------


def test_publish_sequence_stamps_headers_and_keeps_a_group_on_one_partition(
    cluster, stream_factory
):
    stream = stream_factory(partitions=4, global_order=False)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = publish_sequence(
            pub, [b"part1", b"part2", b"part3"], group="order-9", headers={"trace": "t-1"}
        )
        with pytest.raises(ValueError, match="payloads"):
            publish_sequence(pub, [], group="order-9")
        with pytest.raises(ValueError, match="group"):
            publish_sequence(pub, [b"x"], group="")
        with pytest.raises(TypeError, match="payloads"):
            publish_sequence(pub, ["text"], group="g")
    assert offsets == sorted(offsets) and len(set(offsets)) == 3
    with _ungrouped(cluster, stream) as sub:
        records = _read_all(sub, 3)
    assert [r.data for r in records] == [b"part1", b"part2", b"part3"]
    assert len({r.partition for r in records}) == 1
    assert [r.offset for r in records] == offsets
    assert all(r.key == b"order-9" for r in records)
    assert [seq_of(r) for r in records] == [("order-9", 0), ("order-9", 1), ("order-9", 2)]
    assert {r.header(SIZE_HEADER) for r in records} == {b"3"}
    assert records[0].headers[0] == ("trace", b"t-1")


def test_a_message_group_is_read_by_one_member_of_a_subscriber_group(cluster, stream_factory):
    stream = stream_factory(partitions=4, global_order=False)
    members = [
        Subscriber(cluster, SubscriberConfig(stream=stream, group="g", lease_timeout_ms=LEASE_MS))
        for _ in range(2)
    ]

    def held() -> list[set[int]]:
        return [{p.partition for p in m.health(lag=False).partitions} for m in members]

    def settled() -> bool:
        # is_assigned() stays true for a member whose revocation is not served yet: wait for
        # the final split, or records read before a later rebalance come again to the other.
        for member in members:
            member.poll(0)  # serves the group's callbacks; nothing is published yet
        first, second = held()
        return bool(first and second) and not first & second and first | second == set(range(4))

    try:
        eventually(settled, 30)
        split = held()
        names = [f"stock-{i}" for i in range(12)]
        fixed = Publisher(cluster, PublisherConfig(stream=stream, group="ACME"))
        auto = Publisher(cluster, PublisherConfig(stream=stream, auto_group=True))
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub, fixed, auto:
            for i in range(60):
                pub.publish_async(Record(f"{i}".encode(), group=names[i % len(names)]))
                fixed.publish_async(Record(f"acme-{i}".encode()))
                auto.publish_async(Record(f"auto-{i}".encode()))
        readers: dict[bytes, set[int]] = defaultdict(set)
        got: list[tuple[int, Record]] = []

        def read() -> bool:
            for index, member in enumerate(members):
                got.extend((index, r) for r in member.poll(50))
            return len(got) >= 180

        eventually(read, 30)
        assert held() == split, "no rebalance while reading (a lease lost: see the broker log)"
    finally:
        for member in members:
            member.close()
    for index, record in got:
        assert record.key is not None
        readers[record.key].add(index)
    assert set(readers) == {n.encode() for n in names} | {b"ACME", auto.group.encode()}
    assert all(len(who) == 1 for who in readers.values()), "a group has one reader"
    assert {index for index, _ in got} == {0, 1}, "partitions spread over both members"
    acme = [r.data for _, r in got if r.key == b"ACME"]
    assert acme == [f"acme-{i}".encode() for i in range(60)]


# -- ordering modes (Hazelcast's globalOrderEnabled) ------------------------------------------


def _publish_concurrently(cluster, stream: StreamConfig, publishers: int, count: int) -> None:
    futures: list[Future[int]] = []

    def work(index: int) -> None:
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            for i in range(count):
                futures.append(pub.publish_async(Record(f"p{index}-{i}".encode())))
                if i % 10 == 0:
                    time.sleep(0.001)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(f.result(30) >= 0 for f in futures)  # every publish acknowledged
    assert len(futures) == publishers * count


def _per_publisher(order: list[bytes]) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = defaultdict(list)
    for data in order:
        publisher, number = data.decode().split("-")
        seen[publisher].append(int(number))
    return seen


@pytest.mark.parametrize("global_order", [True, False])
def test_ordering_modes_on_recorded_orders(cluster, stream_factory, global_order: bool):
    partitions = 1 if global_order else 4
    stream = stream_factory(partitions=partitions, global_order=global_order)
    _publish_concurrently(cluster, stream, publishers=3, count=100)
    orders = []
    for _ in range(2):
        with _ungrouped(cluster, stream) as sub:
            records = _read_all(sub, 300)
        orders.append([r.data for r in records])
        by_publisher: dict[str, set[int | None]] = defaultdict(set)
        for record in records:
            by_publisher[record.data.split(b"-")[0].decode()].add(record.partition)
        assert all(len(parts) == 1 for parts in by_publisher.values())
    for order in orders:
        assert len(order) == len(set(order)) == 300
        for numbers in _per_publisher(order).values():
            assert numbers == list(range(100)), "each publisher's order holds"
    if global_order:
        assert orders[0] == orders[1], "one total order for every subscriber"


def test_contradictory_ordering_config_is_refused():
    with pytest.raises(ValueError, match="global_order"):
        StreamConfig(name="s", partitions=4, global_order=True)


# -- dead letters ---------------------------------------------------------------------------


def test_rejected_and_timed_out_records_reach_the_dead_letter_stream(cluster, stream_factory):
    stream = stream_factory()
    dlq = stream_factory(name_prefix="dlq")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for number in (2, 0):  # group "t" never completes: 1 is missing
            pub.publish(Record(b"t", headers=sequence_headers("t", 3, number), group="t"))
        bad = {SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "2", NUMBER_HEADER: "7"}
        pub.publish(Record(b"bad", headers=bad))
        last = publish_sequence(pub, [b"a", b"b"], group="ok")[-1]
    dead_pub = Publisher(cluster, PublisherConfig(stream=dlq))
    reseq = Resequencer(
        mode="stream", timeout_s=1.0, on_timeout="dead_letter", dead_letter=dead_pub
    )
    released: list[Record] = []
    with dead_pub, _ungrouped(cluster, stream) as sub:
        for record in _read_all(sub, 5):
            released += reseq.offer(record)
        assert [seq_of(r) for r in released] == [("t", 0), ("ok", 0), ("ok", 1)]
        assert reseq.safe_offset(0) is None  # "t" is open and holds offset 0
        eventually(lambda: released.extend(reseq.tick()) or reseq.metrics().timed_out == 1, 5)
        eventually(lambda: reseq.safe_offset(0) == last, 10)  # once the dead letters are in
    assert released[3:] == []
    with _ungrouped(cluster, dlq) as sub:
        letters = _read_all(sub, 2)
    reasons = {r.data: (r.header(REASON_HEADER), r.header(DETAIL_HEADER)) for r in letters}
    assert reasons[b"bad"][0] == b"out_of_range" and b"7" in (reasons[b"bad"][1] or b"")
    assert reasons[b"t"][0] == b"timeout"
    assert [seq_of(r) for r in letters if r.data == b"t"] == [("t", 2)]
    metrics = reseq.metrics()
    assert (metrics.rejected, metrics.timed_out, metrics.dead_letter_failures) == (2, 1, 0)


def test_a_dead_letter_stream_that_refuses_holds_confirmation(cluster, stream_factory):
    dead_pub = Publisher(cluster, PublisherConfig(stream=stream_factory(name_prefix="dlq")))
    dead_pub.close()  # publishing to it now fails
    reseq = Resequencer(dead_letter=dead_pub)
    bad = Record(b"bad", headers={SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "1", NUMBER_HEADER: "1"})
    bad.partition, bad.offset = 0, 0
    assert reseq.offer(bad) == []
    plain = Record(b"plain")
    plain.partition, plain.offset = 0, 1
    assert reseq.offer(plain) == [plain]
    assert reseq.safe_offset(0) is None, "never confirm past a record not dealt with"
    assert reseq.metrics().dead_letter_failures == 1


# -- failover with resequencers ---------------------------------------------------------------


class _Member:
    """A member process and its log."""

    def __init__(self, cluster, stream: StreamConfig, group: str, tmp: Path, name: str) -> None:
        self.log = tmp / f"{name}.log"
        self.stop = tmp / f"{name}.stop"
        self.log.touch()
        args = [cluster.bootstrap_servers, stream.name, str(stream.partitions), group]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.resequencer.member",
                *args,
                str(self.log),
                str(self.stop),
                "batch",
            ],
            cwd=ROOT,
        )

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines() if line.strip()]

    def ready(self) -> bool:
        return any(f[0] == "READY" for f in self.lines())

    def close(self) -> None:
        self.stop.touch()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _runs_by_group(member: _Member) -> dict[str, list[tuple[float, list[int]]]]:
    """Split a member's processing of each group into runs (each starts at number 0)."""
    runs: dict[str, list[tuple[float, list[int]]]] = defaultdict(list)
    for f in member.lines():
        if f[0] != "R":
            continue
        when, group, number = float(f[1]), f[4], int(f[5])
        if number == 0 or not runs[group]:
            runs[group].append((when, []))
        runs[group][-1][1].append(number)
    return runs


def _complete(members: list[_Member], sizes: dict[str, int]) -> set[str]:
    """Groups some member processed completely."""
    return {
        g
        for member in members
        for g, runs in _runs_by_group(member).items()
        if any(numbers == list(range(sizes[g])) for _, numbers in runs)
    }


@pytest.fixture
def members(tmp_path) -> Iterator[list[_Member]]:
    started: list[_Member] = []
    yield started
    for member in started:
        member.close()


@pytest.mark.slow
def test_groups_survive_a_killed_member(cluster, stream_factory, tmp_path, members):
    stream = stream_factory(partitions=4, global_order=False)
    rng = random.Random(5)
    sizes = {f"grp-{g}": rng.randint(1, 50) for g in range(100)}
    # Groups 0-49 whole, then half of the records of groups 50-99 (the victim dies here, with
    # confirmed groups behind it and open ones ahead), then the rest; each phase shuffled.
    whole = [(g, n) for g in list(sizes)[:50] for n in range(sizes[g])]
    rest = [(g, n) for g in list(sizes)[50:] for n in range(sizes[g])]
    rng.shuffle(rest)
    phases = [whole, rest[: len(rest) // 2], rest[len(rest) // 2 :]]
    for phase in phases:
        rng.shuffle(phase)
    group = f"reseq-{stream.name}"
    publishers = [Publisher(cluster, PublisherConfig(stream=stream)) for _ in range(3)]
    members.append(_Member(cluster, stream, group, tmp_path, "a"))
    eventually(members[0].ready, 30)
    members.append(_Member(cluster, stream, group, tmp_path, "b"))
    eventually(members[1].ready, 30)
    victim, survivor = members
    offsets: dict[str, tuple[int, list[int]]] = {}

    def publish(part: list[tuple[str, int]]) -> None:
        futures = []
        for i, (g, n) in enumerate(part):
            rec = Record(f"{g}:{n}".encode(), headers=sequence_headers(g, sizes[g], n), group=g)
            futures.append((g, rec, publishers[i % 3].publish_async(rec)))
        for pub in publishers:
            pub.flush()
        for g, rec, fut in futures:
            fut.result(10)
            partition, seen = offsets.setdefault(g, (rec.partition or 0, []))
            assert rec.partition == partition, "a group stays on one partition"
            seen.append(fut.result())

    publish(phases[0])
    publish(phases[1])
    eventually(lambda: len(_complete(members, sizes)) >= 50, 30)
    eventually(lambda: any(f[0] == "K" for f in victim.lines()), 30)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    killed_at = time.time()
    probe = probe_consumer(cluster, **{"group.id": group})
    try:
        committed = {
            tp.partition: tp.offset
            for tp in probe.committed(
                [TopicPartition(stream.name, p) for p in range(4)], timeout=10
            )
        }
    finally:
        probe.close()
    publish(phases[2])
    for pub in publishers:
        pub.close()

    eventually(lambda: len(_complete(members, sizes)) == len(sizes), 90)
    survivor.close()

    victim_runs, survivor_runs = _runs_by_group(victim), _runs_by_group(survivor)
    victim_parts = {offsets[g][0] for g in victim_runs}
    assert victim_runs, "the victim processed groups before it died"
    # Every run is in sequence; all complete, but the victim's last may have been cut short.
    for member_runs in (victim_runs, survivor_runs):
        for g, runs in member_runs.items():
            for index, (_, numbers) in enumerate(runs):
                cut_short = member_runs is victim_runs and index == len(runs) - 1
                want = list(range(len(numbers) if cut_short else sizes[g]))
                assert numbers == want, f"{g} processed out of sequence: {numbers}"
    # Affinity: a group both processed belongs to a partition that moved at the kill.
    for g, runs in survivor_runs.items():
        if g in victim_runs:
            assert offsets[g][0] in victim_parts, f"{g} read by both members of a group"
            assert all(when > killed_at for when, _ in runs), f"{g} read by both before the kill"
    moved = [g for g in survivor_runs if offsets[g][0] in victim_parts]
    assert moved, "the victim's partitions moved to the survivor"
    confirmed_whole = [
        g for g in victim_runs if max(offsets[g][1]) < (committed.get(offsets[g][0]) or 0)
    ]
    assert confirmed_whole, "the victim confirmed some groups before it died"
    # A group the victim confirmed completely was never processed again.
    for g, runs in victim_runs.items():
        partition, group_offsets = offsets[g]
        if max(group_offsets) < (committed.get(partition) or 0):
            assert runs[-1][1] == list(range(sizes[g]))
            assert g not in survivor_runs, f"{g} processed again after its last confirm"
    # The same from the broker truth the members logged: no run starts after a covering confirm.
    confirms = [
        (float(f[1]), int(f[2]), int(f[3]))
        for member in members
        for f in member.lines()
        if f[0] == "K"
    ]
    for member_runs in (victim_runs, survivor_runs):
        for g, runs in member_runs.items():
            partition, group_offsets = offsets[g]
            for started, _ in runs:
                assert not any(
                    when < started and p == partition and position > max(group_offsets)
                    for when, p, position in confirms
                ), f"{g} processed again after a confirm covered it"
