"""Durable clients as operators see them: the records waiting for one (``bolide lag``, the
backlog gauge) and enforcing expiry (``bolide durable expire``)."""

from __future__ import annotations

import logging

from confluent_kafka import TopicPartition

from bolide.facade.config import Cluster
from bolide.facade.durable import drop_position
from bolide.facade.kafka import (
    admin_client,
    committed_offsets,
    log_ends,
    log_starts,
    partition_count,
    probe_consumer,
)
from bolide.facade.ports import DurableClient, DurableRegistry

__all__ = ["client_backlog", "expire_clients"]

log = logging.getLogger("bolide.facade.durable")


def client_backlog(cluster: Cluster, client: DurableClient) -> dict[str, dict[int, int]]:
    """Records waiting for a durable client: end offset minus position, per stream and partition.

    A partition without a committed position counts from the first record Kafka holds. A
    stream whose topic no longer exists is left out.
    """
    admin = admin_client(cluster)
    consumer = probe_consumer(cluster, **{"group.id": client.group_id})
    try:
        out: dict[str, dict[int, int]] = {}
        for stream in client.streams:
            count = partition_count(admin, stream)
            if not count:
                continue
            parts = range(count)
            ends = log_ends(cluster, stream, parts)
            starts = log_starts(consumer, stream, parts, cluster=cluster)
            committed = committed_offsets(consumer, [TopicPartition(stream, p) for p in parts])
            out[stream] = {}
            for tp in committed:
                position = tp.offset if tp.offset >= 0 else starts[tp.partition]
                out[stream][tp.partition] = max(0, ends[tp.partition] - position)
        return out
    finally:
        consumer.close()


def expire_clients(cluster: Cluster, registry: DurableRegistry) -> list[DurableClient]:
    """Enforce expiry: forget every client away past its timeout and drop its position."""
    gone = registry.expire()
    for client in gone:
        log.warning(
            "durable client %r was away %.1fs, past its timeout of %.1fs: queue dropped",
            client.durable_id,
            client.away_s(),
            client.timeout_s,
        )
        drop_position(cluster, client.group_id)
    return gone
