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

from tests.parallel.conftest import publish_keyed
from tests.reliability.conftest import KILLS, record_figures, scaled
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
