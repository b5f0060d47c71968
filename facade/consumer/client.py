"""A subscriber's consumer group id, consumer and its settings, error and commit reports (and
the typed errors of broker answers retrying cannot fix), and the partition arguments of its
methods."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bolide.facade.config import Cluster, SubscriberConfig, rebalance_protocol
from bolide.facade.durable import durable_group_id
from bolide.facade.errors import BolideError
from bolide.facade.kafka import CONSUMER_DEFAULTS, broker_setting, new_client
from bolide.facade.kafka.fatal import Refusals, Scope, fatal_error
from bolide.facade.support import HookLock
from bolide.facade.validate import check_int

__all__ = [
    "commit_reporter",
    "consumer_config",
    "error_reporter",
    "group_id",
    "new_consumer",
    "partition_arg",
    "partitions_arg",
    "refused_error",
]

log = logging.getLogger("bolide.facade.subscriber")

ErrorHandler = Callable[[str, BaseException | None], None]


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
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None] | None = None,
    on_error: Callable[[KafkaError], None] | None = None,
    *,
    member: Mapping[str, Any],
) -> dict[str, Any]:
    """librdkafka settings: the defaults, the membership's (``member``: a group member's
    lease, ``Membership.settings``), then the user's own (``on_commit`` for a consumer that
    commits, ``on_error`` as its ``error_cb``)."""
    own: dict[str, Any] = {
        "group.id": group,
        "client.id": f"bolide-sub-{config.single.name}",
        # Kafka's OFFSET_OUT_OF_RANGE reaches us as an error: we splice or skip ourselves.
        "auto.offset.reset": "error",
        "isolation.level": config.isolation,
        **member,
    }
    if on_commit is not None:
        own["on_commit"] = on_commit
    if on_error is not None:
        own["error_cb"] = on_error
    settings = cluster.client_config(CONSUMER_DEFAULTS, own, config.consumer_config)
    rebalance_protocol("Cluster settings", settings)
    return settings


def new_consumer(
    cluster: Cluster,
    config: SubscriberConfig,
    group: str,
    report: ErrorHandler,
    member: Mapping[str, Any],
) -> tuple[Consumer, Refusals]:
    """The subscriber's consumer (``member``: its membership's settings), its failed commits
    reported to ``report``, and what its ``error_cb`` gets that retrying cannot fix (refused
    credentials, say), for ``poll`` to raise. Settings are checked as it is built: a bad one
    fails before any topic work."""
    refusals = Refusals(f"subscriber of {config.single.name!r}")
    on_commit = commit_reporter(config.single.name, report)
    settings = consumer_config(cluster, config, group, on_commit, refusals.error_cb, member=member)
    return new_client(Consumer, settings, "consumer_config"), refusals


def refused_error(err: KafkaError, cluster: Cluster, config: SubscriberConfig) -> BolideError:
    """The typed error of a broker answer retrying cannot fix (``FATAL_CODES``), naming the
    subscriber's stream and group, and for a refused lease the broker's floor."""
    group = config.group
    if config.durable_id is not None:
        group = durable_group_id(config.durable_id)
    floor = None
    if err.code() == KafkaError.INVALID_SESSION_TIMEOUT:
        found = broker_setting(cluster, "group.min.session.timeout.ms")
        floor = int(found) if found is not None and found.isdigit() else None
    topic = config.single.name
    scope = Scope(
        "subscriber",
        topic,
        group=group,
        instance_id=config.consumer_config.get("group.instance.id"),
        lease_ms=config.lease_timeout_ms,
        session_floor_ms=floor,
    )
    return fatal_error(err, scope) or BolideError(err.str(), stream=topic)


def error_reporter(handler: ErrorHandler | None, lock: HookLock) -> ErrorHandler:
    """A subscriber's report: to ``handler`` (the error handler) once ``lock`` is let go, or
    to the log without one. A handler that raises is logged, never propagated."""

    def report(summary: str, error: BaseException | None) -> None:
        if handler is None:
            log.warning("%s: %s", summary, error if error is not None else "")
            return

        def call() -> None:
            try:
                handler(summary, error)
            except Exception:
                log.exception("error handler raised")

        lock.call(call)

    return report


def commit_reporter(
    topic: str, report: ErrorHandler
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


def partitions_arg(
    topic: str, held: AbstractSet[int], partitions: Iterable[int | tuple[str, int]] | None
) -> set[int]:
    """``partitions`` (numbers, or ``(stream, partition)`` pairs) checked against what is
    ``held``; ``None`` means every held partition.

    Raises:
        TypeError: ``partitions`` is a single partition rather than an iterable.
        ValueError: A partition is of another stream, or not held.
    """
    if partitions is None:
        return set(held)
    if isinstance(partitions, int | tuple):
        raise TypeError("partitions must be an iterable of partitions (a list), or None")
    parts: set[int] = set()
    for item in partitions:
        if isinstance(item, tuple):
            stream, part = item
            if stream != topic:
                raise ValueError(f"{stream!r} is not this subscriber's stream {topic!r}")
            item = part
        check_int("partition", item)
        if item not in held:
            raise ValueError(f"partition {item} of {topic!r} is not held")
        parts.add(item)
    return parts
