"""History store: the SQL archive behind Kafka (``SqlStore``) and the archiver that fills it.

One folder per concept (docs/architecture.md draws the layers): ``archive`` (the archiver, the
typed archive), ``outbox``, ``deadletters`` (the workbench), ``dialects`` (what differs per
database) and ``schema`` (every table, the one module ``bolide.migrations`` imports); beside
them ``store`` (``SqlStore``), ``positions``, ``durable_registry`` and ``schema_registry``.
"""

from bolide.facade.kafka.deletion import require_delete_records
from bolide.stores.archive import Archiver, ArchiverStats, ProgressCallback
from bolide.stores.deadletters import DeadLetter, DeadLetters
from bolide.stores.durable_registry import DurableClient, SqlDurableRegistry
from bolide.stores.incarnations import Incarnation
from bolide.stores.outbox import AsyncOutboxRelay, Outbox, OutboxRelay, RelayConfig, RelayStats
from bolide.stores.positions import SqlPositions
from bolide.stores.queries import QueryResult, run_query
from bolide.stores.schema_registry import SqlSchemaRegistry
from bolide.stores.store import Search, SqlStore

__all__ = [
    "Archiver",
    "ArchiverStats",
    "AsyncOutboxRelay",
    "DeadLetter",
    "DeadLetters",
    "DurableClient",
    "Incarnation",
    "Outbox",
    "OutboxRelay",
    "ProgressCallback",
    "QueryResult",
    "RelayConfig",
    "RelayStats",
    "Search",
    "SqlDurableRegistry",
    "SqlPositions",
    "SqlSchemaRegistry",
    "SqlStore",
    "require_delete_records",
    "run_query",
]
