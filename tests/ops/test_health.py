"""``Subscriber.health()`` and ``Archiver.health()``: lease, last poll, lag, closed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from bolide.facade import Cluster, StreamConfig, Subscriber, SubscriberConfig
from bolide.facade.health import Health, partition_lag
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.ops.conftest import LEASE_MS, publish

pytestmark = pytest.mark.kafka


def test_partition_lag() -> None:
    assert partition_lag(10, 4) == 6
    assert partition_lag(10, None, log_start=3) == 7
    assert partition_lag(10, 12) == 0  # a truncated log: nothing behind


def test_grouped_subscriber_health(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS, max_batch=4)
    sub = Subscriber(cluster, config)
    try:
        before = sub.health()
        assert before.last_poll_ms is None and before.idle_s is None
        assert not before.healthy(max_idle_s=60)  # never polled
        got: list[object] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= 4, timeout_s=60)
        health = sub.health()
        assert isinstance(health, Health)
        assert (health.kind, health.group, health.streams) == ("subscriber", group, (stream.name,))
        assert health.lease_held and not health.closed
        [part] = health.partitions
        assert (part.stream, part.partition, part.position, part.log_end, part.lag) == (
            stream.name, 0, 4, 10, 6
        )  # fmt: skip
        assert health.lag == 6
        assert health.last_poll_ms is not None
        assert abs(health.last_poll_ms - time.time() * 1000) < 600_000
        assert health.healthy(max_lag=6, max_idle_s=600)
        assert not health.healthy(max_lag=5)
        assert json.loads(json.dumps(health.to_dict()))["partitions"][0]["lag"] == 6
        unmeasured = sub.health(lag=False)
        assert unmeasured.partitions[0].lag is None and unmeasured.lag is None
        sub.deactivate()
        given_up = sub.health()
        assert not given_up.lease_held and given_up.partitions == ()
        assert not given_up.healthy()
    finally:
        sub.close()
    closed = sub.health()
    assert closed.closed and not closed.lease_held and not closed.healthy()


def test_ungrouped_subscriber_health(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    publish(cluster, stream, 6)
    with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
        health = sub.health()
        # LATEST: an ungrouped subscriber starts at the end; it holds every partition.
        assert health.group is None and health.lease_held
        assert [p.partition for p in health.partitions] == [0, 1]
        assert health.lag == 0


@pytest.mark.postgres
def test_archiver_health(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = upgraded_db_url("postgresql", tmp_path, request)
    stream = stream_factory()
    publish(cluster, stream, 8)
    with SqlStore(url) as store:
        group = f"arch-{uuid.uuid4().hex[:8]}"
        config = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}
        archiver = Archiver(cluster, store, [stream], group=group, consumer_config=config)
        idle = archiver.health()
        assert idle.closed and not idle.lease_held and idle.partitions == ()
        archiver.start()
        try:
            eventually(lambda: archiver.health().lease_held, timeout_s=60)
            eventually(lambda: store.largest_offset(stream.name, 0) == 7, timeout_s=60)
            health = eventually(lambda: (h := archiver.health()).lag == 0 and h, timeout_s=30)
            assert (health.kind, health.group, health.streams) == (
                "archiver",
                group,
                (stream.name,),
            )
            [part] = health.partitions
            assert (part.position, part.log_end) == (8, 8)
            assert health.healthy(max_lag=0, max_idle_s=600)
        finally:
            archiver.stop()
    stopped = archiver.health()
    assert stopped.closed and not stopped.healthy()
