"""A subscriber's consumer group id, consumer settings, commit reports and partition argument."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from bolide.facade.config import Cluster, SubscriberConfig, check_eager
from bolide.facade.durable import durable_group_id
from bolide.facade.kafka import CONSUMER_DEFAULTS
from bolide.facade.validate import check_int

__all__ = ["commit_reporter", "consumer_config", "group_id", "partition_arg"]


def group_id(config: SubscriberConfig) -> str:
    """The consumer group: the durable client's, the subscriber group, or a throwaway one."""
    if config.durable_id is not None:
        return durable_group_id(config.durable_id)
    if config.group is not None:
        return config.group
    return f"bolide-ungrouped-{uuid.uuid4().hex}"  # never commits


def consumer_config(
    cluster: Cluster,
    config: SubscriberConfig,
    group: str,
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None],
) -> dict[str, Any]:
    """librdkafka settings: the defaults, the lease (grouped), then the user's own."""
    lease = config.lease_timeout_ms
    own: dict[str, Any] = {
        "group.id": group,
        "client.id": f"bolide-sub-{config.single.name}",
        # Kafka's OFFSET_OUT_OF_RANGE reaches us as an error: we splice or skip ourselves.
        "auto.offset.reset": "error",
        "on_commit": on_commit,
        "isolation.level": config.isolation,
    }
    if config.grouped:
        own.update(
            {
                "session.timeout.ms": lease,
                "max.poll.interval.ms": lease,
                "heartbeat.interval.ms": max(100, lease // 10),
            }
        )
    settings = cluster.client_config(CONSUMER_DEFAULTS, own, config.consumer_config)
    check_eager("Cluster settings", settings)
    return settings


def commit_reporter(
    topic: str, report: Callable[[str, BaseException | None], None]
) -> Callable[[KafkaError | None, list[TopicPartition]], None]:
    """The consumer's ``on_commit``: a failed confirm goes to ``report`` (the error handler)."""

    def on_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:
            report(f"confirm failed on {topic}: {err.str()}", None)
            return
        failed = [tp for tp in partitions if tp.error is not None]
        if failed:
            report(f"confirm failed on {topic}: {failed}", None)

    return on_commit


def partition_arg(topic: str, partitions: int, partition: int | None) -> int:
    """``partition`` checked against the stream; ``None`` means 0 on a one-partition stream.

    Raises:
        ValueError: ``partition`` is missing on a multi-partition stream, or does not exist.
    """
    if partition is None:
        if partitions != 1:
            raise ValueError(f"partition is required: {topic!r} has {partitions} partitions")
        return 0
    check_int("partition", partition)
    if partition >= partitions:
        raise ValueError(f"partition {partition} does not exist in {topic!r}")
    return partition
