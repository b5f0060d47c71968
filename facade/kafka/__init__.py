"""Kafka as the rest of bolide talks to it: client settings and construction, topics, offsets
and log ends (``admin``), the workarounds for brokers that deviate from Apache Kafka
(``compat``), what a cluster's brokers support (``features``) and the few requests spoken
directly (``wire``). The helpers of ``admin`` are importable from this package itself, as
``bolide.facade.kafka`` has always offered them; ``bolide.facade.compat`` and
``bolide.facade.features`` stay importable too."""

from bolide.facade.kafka.admin import (
    CONSUMER_DEFAULTS,
    PRODUCER_DEFAULTS,
    admin_client,
    admin_config,
    broker_setting,
    client_backlog,
    committed_offsets,
    ensure_topic,
    forget_topic,
    log_ends,
    log_starts,
    new_client,
    offsets_for_time,
    partition_count,
    partition_counts,
    probe_consumer,
)

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "admin_client",
    "admin_config",
    "broker_setting",
    "client_backlog",
    "committed_offsets",
    "ensure_topic",
    "forget_topic",
    "log_ends",
    "log_starts",
    "new_client",
    "offsets_for_time",
    "partition_count",
    "partition_counts",
    "probe_consumer",
]
