"""The transactional outbox: records added in the application's own database transaction,
published to Kafka by a relay once that transaction has committed (docs/outbox.md).

The names live in ``bolide.stores.outbox.writer``; this package names them."""

from bolide.stores.outbox.writer import (
    AsyncOutboxRelay,
    Outbox,
    OutboxRelay,
    RelayConfig,
    RelayStats,
)

__all__ = [
    "AsyncOutboxRelay",
    "Outbox",
    "OutboxRelay",
    "RelayConfig",
    "RelayStats",
]
