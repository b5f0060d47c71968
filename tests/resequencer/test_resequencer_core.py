"""The resequencer core without a broker: ordering, duplicates, safe offsets, timeouts, capacity.

Property tests drive it with arbitrary arrival orders (with duplicates, plain records, several
partitions and sparse offsets) and compare it step by step with a small model of its rules.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolide.facade import Record, Resequencer, ResequencerFullError
from bolide.facade.deadletter import Reason
from bolide.facade.resequencer.sequence import NUMBER_HEADER, SEQUENCE_GROUP_HEADER, SIZE_HEADER
from tests.resequencer.conftest import FakeClock, plain_record, seq_of, seq_record

MODES = ("batch", "stream")

# -- a model of the rules -----------------------------------------------------------------


@dataclass
class _ModelGroup:
    size: int
    born: float
    seen: set[int] = field(default_factory=set)
    closed: bool = False
    timed_out: bool = False


@dataclass
class Model:
    """What ``safe_offset`` must say: the longest finished prefix of each partition."""

    timeout_s: float
    groups: dict[tuple[int, str], _ModelGroup] = field(default_factory=dict)
    # per partition: (offset, group key or None when finished on arrival)
    seen: dict[int, list[tuple[int, tuple[int, str] | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    duplicates: int = 0
    late: int = 0

    def arrive(self, partition: int, offset: int, item: tuple[str, int, int] | None, now: float):
        for group in self.groups.values():
            if not group.closed and now - group.born >= self.timeout_s:
                group.closed = group.timed_out = True
        if item is None:
            self.seen[partition].append((offset, None))
            return
        name, size, number = item
        key = (partition, name)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _ModelGroup(size, now)
        if group.closed:
            self.late += group.timed_out
            self.duplicates += not group.timed_out
            self.seen[partition].append((offset, None))
        elif number in group.seen:
            self.duplicates += 1
            self.seen[partition].append((offset, None))
        else:
            group.seen.add(number)
            group.closed = len(group.seen) == group.size
            self.seen[partition].append((offset, key))

    def safe(self, partition: int) -> int | None:
        safe = None
        for offset, key in self.seen[partition]:
            if key is not None and not self.groups[key].closed:
                break
            safe = offset
        return safe


@st.composite
def arrivals(draw: st.DrawFn, max_groups: int = 6, max_size: int = 6) -> list:
    """Shuffled sequenced records (with duplicates and plain records) over 1-3 partitions."""
    partitions = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_groups))
    items: list[tuple[int, tuple[str, int, int] | None]] = [
        (g % partitions, (f"g{g}", size, n)) for g, size in enumerate(sizes) for n in range(size)
    ]
    items += draw(st.lists(st.sampled_from(items), max_size=6))  # duplicates
    items += [(p, None) for p in draw(st.lists(st.integers(0, partitions - 1), max_size=4))]
    order = draw(st.permutations(items))
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(order), max_size=len(order)))
    next_offset = [draw(st.integers(0, 5)) for _ in range(partitions)]
    out = []
    for (partition, item), gap in zip(order, gaps, strict=True):
        out.append((partition, next_offset[partition], item))
        next_offset[partition] += gap  # offsets are sparse, as Kafka's may be
    return out


def _make(partition: int, offset: int, item: tuple[str, int, int] | None) -> Record:
    if item is None:
        return plain_record(offset=offset, partition=partition)
    name, size, number = item
    return seq_record(name, size, number, offset=offset, partition=partition)


# -- properties ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(mode=st.sampled_from(MODES), items=arrivals())
def test_releases_each_group_once_in_sequence_and_safe_offset_follows_the_model(
    mode: str, items: list
) -> None:
    reseq = Resequencer(mode=mode, timeout_s=60, clock=FakeClock())  # type: ignore[arg-type]
    model = Model(timeout_s=60)
    released: dict[tuple[int, str], list[int]] = defaultdict(list)
    plain_seen = plain_out = 0
    for partition, offset, item in items:
        record = _make(partition, offset, item)
        out = reseq.offer(record)
        model.arrive(partition, offset, item, 0.0)
        plain_seen += item is None
        for rec in out:
            if rec.header(SEQUENCE_GROUP_HEADER) is None:
                assert rec is record, "a plain record is released by its own offer"
                plain_out += 1
                continue
            name, number = seq_of(rec)
            released[(rec.partition or 0, name)].append(number)
        for key, group in model.groups.items():
            got = released[key]
            if mode == "batch":
                want = list(range(group.size)) if group.closed else []
            else:
                prefix = 0
                while prefix in group.seen:
                    prefix += 1
                want = list(range(prefix))
            assert got == want, f"{key}: released {got}, expected {want}"
        for p in model.seen:
            assert reseq.safe_offset(p) == model.safe(p)
    assert plain_out == plain_seen
    metrics = reseq.metrics()
    assert metrics.duplicates == model.duplicates
    assert metrics.open_groups == 0 and metrics.buffered == 0
    assert metrics.released == sum(g.size for g in model.groups.values())
    for p, seen in model.seen.items():
        assert reseq.safe_offset(p) == seen[-1][0]  # every group complete: all confirmable


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    policy=st.sampled_from(("release", "dead_letter")),
    items=arrivals(),
    steps=st.lists(st.sampled_from((0.0, 0.5, 2.0, 6.0)), min_size=60, max_size=60),
)
def test_timeouts_keep_order_lose_nothing_and_hold_confirmation(
    mode: str, policy: str, items: list, steps: list[float]
) -> None:
    clock = FakeClock(start=0.0)
    dead: list[tuple[Record, Reason]] = []
    reseq = Resequencer(
        mode=mode,  # type: ignore[arg-type]
        timeout_s=5.0,
        on_timeout=policy,  # type: ignore[arg-type]
        dead_letter=lambda rec, reason: dead.append((rec, reason)),
        clock=clock,
    )
    model = Model(timeout_s=5.0)
    released: dict[tuple[int, str], list[int]] = defaultdict(list)
    for (partition, offset, item), step in zip(items, steps * 2, strict=False):
        clock.advance(step)
        for rec in reseq.offer(_make(partition, offset, item)):
            if rec.header(SEQUENCE_GROUP_HEADER) is not None:
                released[(rec.partition or 0, seq_of(rec)[0])].append(seq_of(rec)[1])
        model.arrive(partition, offset, item, clock.now)
        for p in model.seen:
            assert reseq.safe_offset(p) == model.safe(p)
    clock.advance(10.0)
    for rec in reseq.tick():
        released[(rec.partition or 0, seq_of(rec)[0])].append(seq_of(rec)[1])
    for numbers in released.values():
        assert numbers == sorted(set(numbers)), "released in sequence order, each at most once"
    timed_out_letters = [(r, why) for r, why in dead if why is Reason.TIMEOUT]
    assert all(why in (Reason.TIMEOUT, Reason.LATE) for _, why in dead)
    if policy == "release":
        assert not timed_out_letters
    sequenced = sum(item is not None for _, _, item in items)
    metrics = reseq.metrics()
    assert sum(map(len, released.values())) + len(dead) + metrics.duplicates == sequenced
    assert metrics.buffered == 0 and metrics.open_groups == 0
    assert metrics.duplicates == model.duplicates
    assert sum(why is Reason.LATE for _, why in dead) == model.late
    for p, seen in model.seen.items():
        assert reseq.safe_offset(p) == seen[-1][0]


_NAMES = st.sampled_from(
    (SEQUENCE_GROUP_HEADER, SIZE_HEADER, NUMBER_HEADER, "other", "bolide.reason")
)
_VALUES = st.one_of(
    st.binary(max_size=24),
    st.integers(-5, 10**20).map(lambda n: str(n).encode()),
    st.sampled_from((b"", b" 1", b"1 ", b"+1", b"0x1", b"1.0", b"\xff\xfe", "٣".encode())),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(MODES),
    headers=st.lists(st.lists(st.tuples(_NAMES, _VALUES), max_size=6), min_size=1, max_size=8),
)
def test_fuzzed_headers_never_crash_and_bad_ones_are_rejected(
    mode: str, headers: list[list[tuple[str, bytes]]]
) -> None:
    dead: list[tuple[Record, Reason]] = []
    reseq = Resequencer(
        mode=mode,  # type: ignore[arg-type]
        capacity=10**6,
        dead_letter=lambda rec, reason: dead.append((rec, reason)),
        clock=FakeClock(),
    )
    records = []
    for offset, pairs in enumerate(headers):
        record = Record(b"x", headers=pairs)
        record.partition, record.offset = 0, offset
        records.append(record)
        out = reseq.offer(record)
        names = {name for name, _ in pairs}
        if not names & {SEQUENCE_GROUP_HEADER, SIZE_HEADER, NUMBER_HEADER}:
            assert out == [record]
        for rec in out:
            assert any(rec is r for r in records)
    metrics = reseq.metrics()
    accounted = metrics.released + metrics.passed_through + metrics.duplicates + len(dead)
    assert accounted + metrics.buffered == len(records)
    for _rec, reason in dead:
        assert isinstance(reason, Reason)
        assert reason is not Reason.TIMEOUT


# -- examples -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_plain_records_pass_straight_through_and_never_hold_confirmation(mode: str) -> None:
    reseq = Resequencer(mode=mode)  # type: ignore[arg-type]
    held = seq_record("g", 2, 1, offset=0)
    assert reseq.offer(held) == []
    plain = plain_record(offset=1)
    assert reseq.offer(plain) == [plain]
    assert reseq.safe_offset(0) is None  # offset 0 belongs to an unfinished group
    other = plain_record(offset=0, partition=1)
    assert reseq.offer(other) == [other]
    assert reseq.safe_offset(1) == 0
    first = seq_record("g", 2, 0, offset=2)
    assert [seq_of(r) for r in reseq.offer(first)] == [("g", 0), ("g", 1)]
    assert reseq.safe_offset(0) == 2
    unpositioned = Record(b"no offset")
    assert reseq.offer(unpositioned) == [unpositioned]
    assert reseq.metrics().passed_through == 3


def test_stream_mode_holds_the_released_prefix_until_the_group_finishes() -> None:
    reseq = Resequencer(mode="stream")
    assert [seq_of(r) for r in reseq.offer(seq_record("g", 3, 0, offset=10))] == [("g", 0)]
    assert reseq.safe_offset(0) is None, "a new owner must re-read the whole group"
    assert reseq.offer(seq_record("g", 3, 2, offset=11)) == []
    assert [seq_of(r) for r in reseq.offer(seq_record("g", 3, 1, offset=12))] == [
        ("g", 1),
        ("g", 2),
    ]
    assert reseq.safe_offset(0) == 12


@pytest.mark.parametrize("mode", MODES)
def test_duplicates_are_dropped_and_counted(mode: str) -> None:
    reseq = Resequencer(mode=mode)  # type: ignore[arg-type]
    reseq.offer(seq_record("g", 2, 0, offset=0))
    assert reseq.offer(seq_record("g", 2, 0, offset=1)) == []
    out = reseq.offer(seq_record("g", 2, 1, offset=2))
    assert [seq_of(r) for r in out] == ([("g", 0), ("g", 1)] if mode == "batch" else [("g", 1)])
    assert reseq.offer(seq_record("g", 2, 1, offset=3)) == []  # after the group completed
    assert reseq.metrics().duplicates == 2
    assert reseq.safe_offset(0) == 3


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "3", NUMBER_HEADER: "3"}, Reason.OUT_OF_RANGE),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "3", NUMBER_HEADER: "-1"}, Reason.OUT_OF_RANGE),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "3", NUMBER_HEADER: "one"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "0", NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: " 3", NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: "g", NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SIZE_HEADER: "3", NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: b"\xff", SIZE_HEADER: "3", NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "9" * 40, NUMBER_HEADER: "0"}, Reason.MALFORMED),
        ({SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "4", NUMBER_HEADER: "0"}, Reason.SIZE_MISMATCH),
    ],
)
def test_bad_sequence_headers_go_to_the_dead_letter_target_with_a_reason(
    headers: dict[str, str | bytes], reason: Reason
) -> None:
    dead: list[tuple[Record, Reason]] = []
    reseq = Resequencer(dead_letter=lambda rec, why: dead.append((rec, why)))
    assert reseq.offer(seq_record("g", 3, 1, offset=0)) == []  # opens group g, size 3
    bad = Record(b"bad", headers=headers)
    bad.partition, bad.offset = 0, 1
    assert reseq.offer(bad) == []
    assert dead == [(bad, reason)]
    assert reseq.metrics().rejected == 1
    assert reseq.safe_offset(0) is None  # group g still holds offset 0
    out = reseq.offer(seq_record("g", 3, 0, offset=2)) + reseq.offer(
        seq_record("g", 3, 2, offset=3)
    )
    assert [seq_of(r) for r in out] == [("g", 0), ("g", 1), ("g", 2)]
    assert reseq.safe_offset(0) == 3


def test_a_failing_dead_letter_target_holds_confirmation_before_the_record() -> None:
    def refuse(record: Record, reason: Reason) -> None:
        raise RuntimeError("dead-letter stream unavailable")

    reseq = Resequencer(dead_letter=refuse)
    bad = Record(b"bad", headers={SEQUENCE_GROUP_HEADER: "g", SIZE_HEADER: "x", NUMBER_HEADER: "0"})
    bad.partition, bad.offset = 0, 0
    assert reseq.offer(bad) == []
    assert reseq.offer(plain_record(offset=1))
    assert reseq.safe_offset(0) is None
    assert reseq.metrics().dead_letter_failures == 1


def test_rejects_without_a_target_are_dropped_and_confirmable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reseq = Resequencer()
    bad = seq_record("g", 2, 0, offset=0)
    bad.headers = [(n, b"5" if n == NUMBER_HEADER else v) for n, v in bad.headers]
    assert reseq.offer(bad) == []
    assert reseq.safe_offset(0) == 0
    assert "out_of_range" in caplog.text


# -- timeouts -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_timeout_releases_a_partial_group_in_order(mode: str) -> None:
    clock = FakeClock()
    reseq = Resequencer(mode=mode, timeout_s=30, clock=clock)  # type: ignore[arg-type]
    for offset, number in enumerate((4, 2, 1)):
        assert reseq.offer(seq_record("g", 5, number, offset=offset)) == []
    clock.advance(20)
    metrics = reseq.metrics()
    assert metrics.open_groups == 1 and metrics.oldest_open_age_s == 20
    assert reseq.tick() == []
    clock.advance(10)
    assert [seq_of(r)[1] for r in reseq.tick()] == [1, 2, 4]
    assert reseq.safe_offset(0) == 2
    metrics = reseq.metrics()
    assert (metrics.timed_out, metrics.open_groups, metrics.oldest_open_age_s) == (1, 0, None)


def test_timeouts_are_also_checked_on_offer() -> None:
    clock = FakeClock()
    reseq = Resequencer(timeout_s=1, clock=clock)
    reseq.offer(seq_record("old", 2, 1, offset=0))
    clock.advance(1.5)
    plain = plain_record(offset=1)
    out = reseq.offer(plain)
    assert [seq_of(r) for r in out[:1]] == [("old", 1)] and out[1] is plain
    assert reseq.expire(now=clock.now + 100) == []


def test_timeout_to_dead_letter_and_late_records_follow() -> None:
    clock = FakeClock()
    dead: list[tuple[Record, Reason]] = []
    reseq = Resequencer(
        mode="stream",
        timeout_s=5,
        on_timeout="dead_letter",
        dead_letter=lambda rec, why: dead.append((rec, why)),
        clock=clock,
    )
    assert len(reseq.offer(seq_record("g", 4, 0, offset=0))) == 1
    assert reseq.offer(seq_record("g", 4, 2, offset=1)) == []
    assert reseq.offer(seq_record("g", 4, 3, offset=2)) == []
    assert reseq.expire(now=clock.now + 5) == []
    assert [(seq_of(r), why) for r, why in dead] == [
        (("g", 2), Reason.TIMEOUT),
        (("g", 3), Reason.TIMEOUT),
    ]
    assert reseq.safe_offset(0) == 2
    assert reseq.offer(seq_record("g", 4, 1, offset=3)) == []
    assert dead[-1][1] is Reason.LATE
    assert reseq.metrics().rejected == 3


def test_dead_letter_policy_needs_a_target() -> None:
    with pytest.raises(ValueError, match="dead_letter"):
        Resequencer(on_timeout="dead_letter")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"mode": "fifo"}, ValueError),
        ({"timeout_s": 0}, ValueError),
        ({"timeout_s": "30"}, TypeError),
        ({"capacity": 0}, ValueError),
        ({"capacity": 1.5}, TypeError),
        ({"on_timeout": "drop"}, ValueError),
        ({"dead_letter": "dlq"}, TypeError),
        ({"clock": 5}, TypeError),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs: dict[str, object], error: type) -> None:
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        Resequencer(**kwargs)  # type: ignore[arg-type]


def test_offer_takes_only_records() -> None:
    with pytest.raises(TypeError, match="Record"):
        Resequencer().offer(b"bytes")  # type: ignore[arg-type]


# -- capacity and back-pressure -----------------------------------------------------------


def test_a_full_resequencer_refuses_records_that_would_wait_but_takes_the_rest() -> None:
    reseq = Resequencer(capacity=2)
    reseq.offer(seq_record("a", 2, 1, offset=0, partition=0))
    reseq.offer(seq_record("b", 2, 1, offset=0, partition=1))
    assert reseq.is_full
    waiting = seq_record("c", 2, 1, offset=1, partition=0)
    with pytest.raises(ResequencerFullError) as caught:
        reseq.offer(waiting)
    assert caught.value.retriable and caught.value.offset == 1
    assert reseq.metrics().buffered == 2, "a refused record is not taken"
    # Records that need no room are taken while full (here from another partition's feed).
    plain = plain_record(offset=1, partition=1)
    assert reseq.offer(plain) == [plain]
    done = reseq.offer(seq_record("b", 2, 0, offset=2, partition=1))  # completes b
    assert [seq_of(r) for r in done] == [("b", 0), ("b", 1)]
    assert not reseq.is_full
    assert reseq.offer(waiting) == []  # offered again: taken
    assert reseq.metrics().buffered == 2
    assert reseq.safe_offset(1) == 2 and reseq.safe_offset(0) is None


def test_a_refused_record_holds_confirmation_until_it_is_taken() -> None:
    reseq = Resequencer(mode="stream", capacity=1)
    reseq.offer(seq_record("a", 2, 1, offset=0, partition=1))  # full
    refused = seq_record("b", 2, 1, offset=5)
    with pytest.raises(ResequencerFullError):
        reseq.offer(refused)
    # A caller that drops the error and reads on must not confirm past the refused record.
    assert reseq.offer(plain_record(offset=6))
    assert reseq.safe_offset(0) is None
    with pytest.raises(TypeError, match="timeout_s"):
        reseq.offer(refused, timeout_s="1")  # type: ignore[arg-type]
    reseq.offer(seq_record("a", 2, 0, offset=1, partition=1))  # room again
    reseq.forget(0)  # the partition is read again from the last confirm
    assert reseq.offer(refused) == []
    assert reseq.safe_offset(0) is None  # now held by group b itself
    assert [seq_of(r) for r in reseq.offer(seq_record("b", 2, 0, offset=7))] == [
        ("b", 0),
        ("b", 1),
    ]
    assert reseq.safe_offset(0) == 7


def test_a_refused_record_offered_again_lifts_its_hold() -> None:
    reseq = Resequencer(mode="stream", capacity=1)
    reseq.offer(plain_record(offset=3))
    reseq.offer(seq_record("a", 2, 1, offset=0, partition=1))
    waiting = seq_record("c", 2, 1, offset=4)
    with pytest.raises(ResequencerFullError):
        reseq.offer(waiting)
    assert reseq.safe_offset(0) == 3
    reseq.offer(seq_record("a", 2, 0, offset=1, partition=1))
    assert reseq.offer(waiting) == []
    assert reseq.safe_offset(0) == 3  # now held by group c, not by the refusal
    assert reseq.offer(seq_record("c", 2, 0, offset=5))
    assert reseq.safe_offset(0) == 5


def test_a_group_larger_than_capacity_is_rejected_in_batch_mode() -> None:
    dead: list[tuple[Record, Reason]] = []
    reseq = Resequencer(capacity=3, dead_letter=lambda rec, why: dead.append((rec, why)))
    assert reseq.offer(seq_record("big", 4, 0, offset=0)) == []
    assert dead[0][1] is Reason.TOO_LARGE and reseq.metrics().buffered == 0


def test_a_blocking_offer_waits_for_room_made_by_another_thread() -> None:
    reseq = Resequencer(mode="stream", capacity=1)
    reseq.offer(seq_record("a", 2, 1, offset=0, partition=1))
    waiting = seq_record("b", 2, 1, offset=0, partition=0)
    complete_a = seq_record("a", 2, 0, offset=1, partition=1)
    started = time.monotonic()
    threading.Timer(0.2, lambda: reseq.offer(complete_a)).start()
    assert reseq.offer(waiting, timeout_s=5) == []
    assert time.monotonic() - started > 0.1  # it waited for the room (no upper bound: speed)
    assert reseq.metrics().buffered == 1


def test_a_blocking_offer_lets_timeouts_make_room_and_gives_up_after_its_timeout() -> None:
    reseq = Resequencer(mode="stream", capacity=1, timeout_s=2.0)  # b outlives c's wait
    reseq.offer(seq_record("a", 2, 1, offset=0))
    out = reseq.offer(seq_record("b", 2, 1, offset=1), timeout_s=5)
    assert [seq_of(r) for r in out] == [("a", 1)]  # a timed out while the offer waited
    started = time.monotonic()
    with pytest.raises(ResequencerFullError):
        reseq.offer(seq_record("c", 2, 1, offset=2), timeout_s=0.1)
    assert time.monotonic() - started >= 0.09  # it waited its timeout before giving up


# -- partitions, rebalances, threads --------------------------------------------------------


def test_forget_drops_a_revoked_partition_only() -> None:
    reseq = Resequencer()
    reseq.offer(seq_record("g", 2, 1, offset=5, partition=0))
    reseq.offer(seq_record("h", 2, 1, offset=7, partition=1))
    reseq.offer(plain_record(offset=8, partition=1))
    assert reseq.forget(0) == 1
    assert reseq.safe_offset(0) is None
    assert reseq.metrics().open_groups == 1 and reseq.metrics().buffered == 1
    # The partition comes back: the group is read again from the confirmed offset.
    out = reseq.offer(seq_record("g", 2, 0, offset=4, partition=0))
    assert out == []
    out = reseq.offer(seq_record("g", 2, 1, offset=5, partition=0))
    assert [seq_of(r) for r in out] == [("g", 0), ("g", 1)]


def test_reading_a_partition_again_forgets_its_state_by_itself() -> None:
    reseq = Resequencer()
    reseq.offer(seq_record("g", 2, 1, offset=10))
    reseq.offer(seq_record("g", 2, 0, offset=11))  # complete, released, not yet confirmed
    reseq.offer(seq_record("h", 2, 1, offset=12))
    # A new lease re-reads from the last confirm (10): g is released again, h not doubled.
    assert reseq.offer(seq_record("g", 2, 1, offset=10)) == []
    assert reseq.metrics().buffered == 1 and reseq.metrics().duplicates == 0
    assert len(reseq.offer(seq_record("g", 2, 0, offset=11))) == 2
    assert reseq.offer(seq_record("h", 2, 1, offset=12)) == []
    assert reseq.metrics().buffered == 1


def test_offer_and_tick_from_several_threads() -> None:
    reseq = Resequencer(mode="stream", timeout_s=60)
    released: list[list[Record]] = [[], []]
    stop = threading.Event()

    def feed(partition: int) -> None:
        offset = 0
        for g in range(200):
            for number in (2, 0, 1):
                rec = seq_record(f"g{g}", 3, number, offset=offset, partition=partition)
                released[partition] += reseq.offer(rec)
                offset += 1

    def tick() -> None:
        while not stop.is_set():
            assert reseq.tick() == []
            reseq.metrics()

    ticker = threading.Thread(target=tick)
    ticker.start()
    feeders = [threading.Thread(target=feed, args=(p,)) for p in (0, 1)]
    for thread in feeders:
        thread.start()
    for thread in feeders:
        thread.join()
    stop.set()
    ticker.join()
    for partition in (0, 1):
        got = [seq_of(r) for r in released[partition]]
        assert got == [(f"g{g}", n) for g in range(200) for n in range(3)]
        assert reseq.safe_offset(partition) == 599
