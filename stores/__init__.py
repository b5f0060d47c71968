"""History store: the SQL archive behind Kafka (``SqlStore``) and the archiver that fills it."""

from bolide.stores._capacity import require_delete_records
from bolide.stores.archiver import Archiver, ArchiverStats, ProgressCallback
from bolide.stores.deadletters import DeadLetter, DeadLetters
from bolide.stores.durable_registry import DurableClient, SqlDurableRegistry
from bolide.stores.outbox import Outbox
from bolide.stores.outbox_relay import AsyncOutboxRelay, OutboxRelay, RelayConfig, RelayStats
from bolide.stores.positions import SqlPositions
from bolide.stores.schema_registry import SqlSchemaRegistry
from bolide.stores.store import SqlStore

__all__ = [
    "Archiver",
    "ArchiverStats",
    "AsyncOutboxRelay",
    "DeadLetter",
    "DeadLetters",
    "DurableClient",
    "Outbox",
    "OutboxRelay",
    "ProgressCallback",
    "RelayConfig",
    "RelayStats",
    "SqlDurableRegistry",
    "SqlPositions",
    "SqlSchemaRegistry",
    "SqlStore",
    "require_delete_records",
]
