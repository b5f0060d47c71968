"""History store: the SQL archive behind Kafka (``SqlStore``) and the archiver that fills it."""

from bolide.stores._capacity import require_delete_records
from bolide.stores.archiver import Archiver, ArchiverStats, ProgressCallback
from bolide.stores.durable_registry import DurableClient, SqlDurableRegistry
from bolide.stores.positions import SqlPositions
from bolide.stores.schema_registry import SqlSchemaRegistry
from bolide.stores.store import SqlStore

__all__ = [
    "Archiver",
    "ArchiverStats",
    "DurableClient",
    "ProgressCallback",
    "SqlDurableRegistry",
    "SqlPositions",
    "SqlSchemaRegistry",
    "SqlStore",
    "require_delete_records",
]
