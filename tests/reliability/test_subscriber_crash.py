"""SIGKILL subscriber processes at random points; a takeover member finishes the stream.

Every record must be processed at least once; a record processed twice must lie in the window
its killed processor had not confirmed (at or after the group's committed position at the
kill, at or before the last record that processor logged). One member runs at a time: the next
starts once the killed one's session expired (the embedded broker
wedges a group whose leader leaves mid-rebalance, see docs/compatibility.md).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.resequencer.sequence import sequence_headers
from bolide.stores import SqlStore
from tests.conftest import eventually
from tests.reliability.conftest import (
    KILLS,
    Member,
    committed,
    make_db_url,
    publish_numbered,
    record_figures,
    scaled,
    wait_session_expiry,
)

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

_Key = Any  # (partition, offset), or (group, number) of a resequenced record


class CrashRun:
    """Runs members one after another, killing all but the last at random points."""

    def __init__(
        self,
        cluster: Cluster,
        stream: StreamConfig,
        group: str,
        mode: str,
        tmp_path: Path,
        members: list[Member],
        rng: random.Random,
        extra: list[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.stream = stream
        self.group = group
        self.kafka_group = f"bolide-durable-{group}" if mode == "durable" else group
        self.mode = mode
        self.tmp_path = tmp_path
        self.members = members
        self.rng = rng
        self.extra = extra or []
        self.windows: list[tuple[dict[int, int], dict[int, int]]] = []  # (committed, last)
        self.recovery_s: list[float] = []

    def start(self, index: int) -> Member:
        args = [
            self.mode, self.cluster.bootstrap_servers, self.stream.name,
            str(self.stream.partitions or 1), self.group, *self.extra,
        ]  # fmt: skip
        member = Member(self.tmp_path, f"m{index}", args)
        self.members.append(member)
        eventually(member.ready, timeout_s=60)
        return member

    def run(self, expected: set[_Key], kills: int, key: Callable[[Member], set[_Key]]) -> None:
        """Start ``kills + 1`` members in turn; the last one runs until ``expected`` is done."""
        done: set[_Key] = set()
        killed_at = 0.0
        for index in range(kills + 1):
            member = self.start(index)
            if index:  # from the kill to the takeover member holding the lease
                self.recovery_s.append(time.monotonic() - killed_at)
            if index == kills:
                eventually(partial(covers, member, key, done, expected), timeout_s=120)
                member.finish()
                return
            # Kill after a random share of what is left (at least one record).
            left = len(expected - done)
            target = self.rng.randint(max(1, left // 10), max(1, left // 2))
            eventually(partial(processed_at_least, member, target), timeout_s=120)
            member.kill()
            killed_at = time.monotonic()
            done |= key(member)
            last: dict[int, int] = {}
            for p, o in offsets(member):
                last[p] = max(last.get(p, -1), o)
            wait_session_expiry()
            position = committed(
                self.cluster, self.kafka_group, self.stream.name, self.stream.partitions or 1
            )
            self.windows.append((position, last))

    def in_window(self, partition: int, offset: int) -> bool:
        """True when a killed member had processed ``offset`` without confirming it."""
        return any(
            position.get(partition, 0) <= offset <= last.get(partition, -1)
            for position, last in self.windows
        )

    def check(self, expected: set[_Key], key: Callable[[Member], set[_Key]]) -> dict[str, Any]:
        """Assert nothing lost and every duplicate inside an unconfirmed window.

        ``key`` names what must be processed (offsets, or resequenced group and number);
        ``positions`` maps it back to a record's partition and offset.
        """
        counts: Counter[_Key] = Counter()
        for member in self.members:
            counts.update(key(member))
        lost = expected - set(counts)
        assert not lost, f"{len(lost)} records never processed, e.g. {sorted(lost)[:5]}"
        duplicates = {k for k, n in counts.items() if n > 1}
        where = positions(self.members)
        for k in duplicates:
            p, o = where[k]
            assert self.in_window(p, o), (
                f"{k} at {p}/{o} processed twice outside the unconfirmed windows {self.windows}"
            )
        return {
            "runs": len(self.windows),
            "lost": len(lost),
            "duplicates": len(duplicates),
            "recovery_s": round(max(self.recovery_s, default=0.0), 2),
        }


def covers(
    member: Member, key: Callable[[Member], set[_Key]], done: set[_Key], expected: set[_Key]
) -> bool:
    member.check_alive()
    return done | key(member) >= expected


def processed_at_least(member: Member, count: int) -> bool:
    member.check_alive()
    return len(member.processed()) >= count


def offsets(member: Member) -> set[_Key]:
    """``(partition, offset)`` of every record a member processed."""
    return {(int(f[0]), int(f[1])) for f in member.processed()}


def sequenced(member: Member) -> set[tuple[str, int]]:
    """``(group, number)`` of every resequenced record a member processed."""
    return {(f[2], int(f[3])) for f in member.processed()}


def positions(members: list[Member]) -> dict[Any, tuple[int, int]]:
    """Where each processed key came from: offsets map to themselves, sequence numbers to
    their record's partition and offset."""
    where: dict[Any, tuple[int, int]] = {}
    for member in members:
        for f in member.processed():
            p, o = int(f[0]), int(f[1])
            where[(p, o)] = (p, o)
            if len(f) == 4:
                where[(f[2], int(f[3]))] = (p, o)
    return where


def test_grouped_subscriber_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path, members, rng
):
    total = scaled(2_000)
    stream = stream_factory()
    expected = {(0, o) for o in publish_numbered(cluster, stream, total)}
    crash = CrashRun(cluster, stream, group_name, "group", tmp_path, members, rng)
    started = time.monotonic()
    crash.run(expected, KILLS, offsets)
    figures = crash.check(expected, offsets)
    for member in members:  # confirm after process: a member never re-reads its own records
        assert len(member.processed()) == len(offsets(member))
    record_figures(
        "subscriber-crash", records=total, elapsed_s=round(time.monotonic() - started, 1),
        **figures,
    )  # fmt: skip


@pytest.mark.postgres
def test_durable_client_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path, members, rng, request
):
    url = make_db_url("postgresql", tmp_path, request)
    with SqlStore(url) as store:
        store.upgrade()
    total = scaled(2_000)
    stream = stream_factory()
    expected = {(0, o) for o in publish_numbered(cluster, stream, total)}
    crash = CrashRun(
        cluster, stream, group_name, "durable", tmp_path, members, rng, extra=["--db", url]
    )
    started = time.monotonic()
    crash.run(expected, KILLS, offsets)
    figures = crash.check(expected, offsets)
    record_figures(
        "durable-crash", records=total, elapsed_s=round(time.monotonic() - started, 1),
        **figures,
    )  # fmt: skip


def publish_interleaved(
    cluster: Cluster, stream: StreamConfig, total: int, rng: random.Random
) -> set[tuple[str, int]]:
    """Publish about ``total`` sequenced records: up to six groups open at once, each
    group's records in shuffled order. Returns every ``(group, number)`` published."""
    pending: list[tuple[str, list[int], int]] = []
    published: set[tuple[str, int]] = set()
    made = 0
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        while made < total or pending:
            while len(pending) < 6 and made < total:
                size = rng.randint(2, 12)
                numbers = list(range(size))
                rng.shuffle(numbers)
                pending.append((f"g{len(published) + made}", numbers, size))
                made += size
            group, numbers, size = pending[rng.randrange(len(pending))]
            number = numbers.pop()
            headers = sequence_headers(group, size, number)
            pub.publish_async(Record(b"%d" % number, headers=headers, group=group))
            published.add((group, number))
            pending = [entry for entry in pending if entry[1]]
        assert pub.flush(60) == 0
    return published


def test_resequencing_subscriber_killed_at_random_points(
    cluster, stream_factory, group_name, tmp_path, members, rng
):
    stream = stream_factory()
    expected = publish_interleaved(cluster, stream, scaled(2_000), rng)
    crash = CrashRun(cluster, stream, group_name, "reseq", tmp_path, members, rng)
    started = time.monotonic()
    crash.run(expected, KILLS, sequenced)  # type: ignore[arg-type]
    figures = crash.check(expected, sequenced)  # type: ignore[arg-type]
    for member in members:  # within one member, every group comes out in sequence order
        numbers: dict[str, list[int]] = {}
        for f in member.processed():
            numbers.setdefault(f[2], []).append(int(f[3]))
        for group, seen in numbers.items():
            assert seen == sorted(set(seen)), f"{group} released out of order: {seen}"
    record_figures(
        "resequencer-crash", records=len(expected),
        elapsed_s=round(time.monotonic() - started, 1), **figures,
    )  # fmt: skip
