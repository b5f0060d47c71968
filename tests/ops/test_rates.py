"""``bolide.facade.ops.rates`` and ``LagReport.over``: the arithmetic behind ``top`` and
``lag --fail-over``, on reports built by hand."""

from __future__ import annotations

import pytest

from bolide.facade.ops import ArchiveLag, DurableBacklog, LagReport, PartitionLag, rates


def _report(at: float, end: int, committed: int | None, archived: int) -> LagReport:
    lag = end - (committed or 0)
    return LagReport(
        partitions=(PartitionLag("g", "orders", 0, committed, 0, end, lag),),
        archive=(ArchiveLag("orders", 0, archived - 1, archived, end, end - archived),),
        durable=(
            DurableBacklog("c7", "bolide-durable-c7", "away", 12.0, 300.0, {"orders": {0: 9}}),
        ),
        ends={("orders", 0): end},
        taken_at=at,
    )


def test_rates_between_two_reports() -> None:
    speed = rates(_report(10.0, 100, 40, 50), _report(12.0, 300, 100, 90))
    assert speed.published == {"orders": pytest.approx(100.0)}
    assert speed.consumed == {("g", "orders", 0): pytest.approx(30.0)}
    assert speed.archived == {("orders", 0): pytest.approx(20.0)}
    # A group that starts committing has no rate yet; offsets never count backwards.
    fresh = rates(_report(0.0, 100, None, 50), _report(1.0, 90, 10, 40))
    assert fresh.consumed == {("g", "orders", 0): 0.0}
    assert fresh.published == {"orders": 0.0} and fresh.archived == {("orders", 0): 0.0}


def test_over_names_every_lag_past_the_limit() -> None:
    report = _report(0.0, 100, 40, 95)
    assert report.max_lag == 60
    assert report.over(8) == [
        "group g on orders[0]: lag 60",
        "durable client c7 (away): backlog 9",
    ]
    assert report.over(60) == []
    assert report.to_dict()["durable"][0]["backlog_by_partition"] == {"orders": {"0": 9}}
