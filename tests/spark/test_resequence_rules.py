"""The resequence job's per-group rules, without Spark: the same rules as the facade's."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bolide.facade.resequencer.sequence import sequence_headers
from bolide.spark._resequence import _Group, _Step

NOW = 1_000_000
TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def row(group: str, size: int, number: int, offset: int, **extra: Any) -> dict[str, Any]:
    headers = [{"key": k, "value": v} for k, v in sequence_headers(group, size, number)]
    return {
        "key": group.encode(),
        "value": f"{group}:{number}".encode(),
        "topic": "t",
        "partition": 0,
        "offset": offset,
        "timestamp": TS,
        "timestampType": 0,
        "headers": extra.get("headers", headers),
    }


def numbers(out: list[dict[str, Any]]) -> list[int]:
    return [r["seq_number"] for r in out]


def test_batch_mode_releases_a_complete_group_in_order_and_drops_duplicates() -> None:
    step = _Step("batch", 5_000, "release")
    group, out = step.offer(None, [row("g", 3, 2, 0), row("g", 3, 0, 1)], NOW)
    assert out == [] and group is not None and sorted(group.held) == [0, 2]
    group = _Group.load(group.dump())  # the state store round trip
    group, out = step.offer(group, [row("g", 3, 0, 2), row("g", 3, 1, 3)], NOW)
    assert numbers(out) == [0, 1, 2]
    assert [r["offset"] for r in out] == [1, 3, 0]
    assert all(r["reason"] is None and not r["timed_out"] for r in out)
    assert out[0]["headers"] == row("g", 3, 0, 1)["headers"]
    assert group is not None and group.status == "done"
    _, again = step.offer(group, [row("g", 3, 1, 4)], NOW)
    assert again == []  # a late copy of a finished group is a duplicate


def test_stream_mode_releases_each_record_after_its_predecessor() -> None:
    step = _Step("stream", 5_000, "release")
    group, out = step.offer(None, [row("g", 4, 1, 0)], NOW)
    assert out == []
    group, out = step.offer(group, [row("g", 4, 0, 1)], NOW)
    assert numbers(out) == [0, 1]
    group, out = step.offer(group, [row("g", 4, 3, 2), row("g", 4, 2, 3)], NOW)
    assert numbers(out) == [2, 3]


def test_bad_headers_and_size_mismatch_are_dead_letters() -> None:
    step = _Step("batch", 5_000, "release")
    malformed = row("g", 2, 0, 0, headers=[{"key": "bolide.seq.group", "value": b"g"}])
    group, out = step.offer(None, [malformed], NOW)
    assert group is None and out[0]["reason"] == "malformed"
    group, out = step.offer(None, [row("g", 2, 0, 1), row("g", 3, 1, 2)], NOW)
    assert [r["reason"] for r in out] == ["size_mismatch"]
    assert "differs" in out[0]["detail"]


def test_timeout_releases_or_marks_what_a_group_holds_then_marks_late_records() -> None:
    for policy, reason in (("release", None), ("dead_letter", "timeout")):
        step = _Step("batch", 5_000, policy)
        group, _ = step.offer(None, [row("g", 4, 3, 0), row("g", 4, 1, 1)], NOW)
        assert group is not None and group.deadline_ms == NOW + 5_000
        out = step.expire(group, "g", NOW + 5_000)
        assert numbers(out) == [1, 3]
        assert all(r["timed_out"] and r["reason"] == reason for r in out)
        assert group.status == "expired" and not group.held
        _, late = step.offer(group, [row("g", 4, 0, 2)], NOW + 6_000)
        assert late[0]["reason"] == "late"
