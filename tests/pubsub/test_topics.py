"""A stream's topic: created on first use, checked against every later config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from bolide.facade import Cluster, StreamConfig, StreamConfigMismatchError
from bolide.facade.kafka import ensure_topic, forget_topic

pytestmark = pytest.mark.kafka


def test_other_partition_counts_are_refused(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    assert ensure_topic(cluster, stream) == 2
    other = replace(stream, partitions=4)
    with pytest.raises(StreamConfigMismatchError, match="has 2 partitions"):
        ensure_topic(cluster, other)
    forget_topic(cluster, stream.name)  # as a new process would: described, not cached
    with pytest.raises(StreamConfigMismatchError, match="has 2 partitions"):
        ensure_topic(cluster, other)
    assert ensure_topic(cluster, stream) == 2


def test_a_second_config_of_a_known_topic_has_its_settings_checked(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], embedded_broker: bool
) -> None:
    if embedded_broker:
        pytest.skip("the embedded broker describes no topic configs (docs/compatibility.md)")
    stream = stream_factory(retention_ms=3_600_000)
    ensure_topic(cluster, stream)
    with pytest.raises(StreamConfigMismatchError, match=r"retention\.ms"):
        ensure_topic(cluster, replace(stream, retention_ms=60_000))
