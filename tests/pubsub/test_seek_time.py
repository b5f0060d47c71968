"""``seek_to_time``: an ungrouped subscriber replays from the first record at or after a time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from bolide.facade import (
    Cluster,
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from tests.aio.adapter import Api
from tests.conftest import eventually

# On Tansu too: its time lookup goes through bolide.facade.compat.
pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _publish(cluster: Cluster, stream: StreamConfig, prefix: bytes, count: int) -> list[Record]:
    records = [Record(prefix + b"%d" % i, key=b"k%d" % i) for i in range(count)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for record in records:
            pub.publish_async(record)
        assert pub.flush(30) == 0
    return records


def _read(sub: Subscriber, count: int) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
    got.extend(sub.poll(300))
    return got


def test_seek_to_time_replays_from_the_first_record_at_or_after_it(
    api: Api, cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2)
    before = _publish(cluster, stream, b"old-", 10)
    when = max(r.timestamp_ms or 0 for r in before) + 1
    eventually(lambda: time.time() * 1000 > when + 1, 5)  # later records are stamped after it
    after = _publish(cluster, stream, b"new-", 10)
    assert min(r.timestamp_ms or 0 for r in after) >= when
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with api.Subscriber(cluster, config) as sub:
        assert len(_read(sub, 20)) == 20
        sub.seek_to_time(when)
        assert sorted(r.data for r in _read(sub, 10)) == sorted(r.data for r in after)
        sub.seek_to_time(0, partition=1)  # one partition, from its first record
        again = _read(sub, sum(1 for r in before + after if r.partition == 1))
        assert sorted(r.data for r in again) == sorted(
            r.data for r in before + after if r.partition == 1
        )
        sub.seek_to_time(int(time.time() * 1000) + 3_600_000)  # later than every record
        assert len(sub.poll(500)) == 0
        _publish(cluster, stream, b"live-", 4)
        assert sorted(r.data for r in _read(sub, 4)) == [b"live-%d" % i for i in range(4)]


def test_seek_to_time_is_for_ungrouped_subscribers_and_checks_its_arguments(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2)
    grouped = SubscriberConfig(stream=stream, group="g-seek-time")
    with (
        Subscriber(cluster, grouped) as sub,
        pytest.raises(IllegalSubscriberStateError, match="ungrouped"),
    ):
        sub.seek_to_time(0)
    with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
        with pytest.raises(ValueError, match="timestamp_ms"):
            sub.seek_to_time(-1)
        with pytest.raises(ValueError, match="partition 5"):
            sub.seek_to_time(0, partition=5)
