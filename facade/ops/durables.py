"""Durable clients as operators see them: the records waiting for one (``bolide lag``, the
backlog gauge) and enforcing expiry (``bolide durable expire``)."""

from __future__ import annotations

import logging

from bolide.facade.config import Cluster
from bolide.facade.durable import drop_position
from bolide.facade.kafka import client_backlog
from bolide.facade.ports import DurableClient, DurableRegistry

__all__ = ["client_backlog", "expire_clients"]

log = logging.getLogger("bolide.facade.durable")


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
