"""Every table bolide owns, as SQLAlchemy Core objects on one ``metadata``: what the stores'
queries use and what the Alembic revisions in ``bolide.migrations`` must match.

The tables themselves are only ever created by those revisions (``bolide db upgrade``), never
by ``create_all`` in production code. Importing this package defines all of them, so that
``alembic check`` compares every table; the typed archive's per-stream tables are made at run
time instead, and ``is_typed_table`` tells the migrations to leave them out.

This is the one module of ``bolide.stores`` that ``bolide.migrations`` imports.
"""

from bolide.stores.schema._dead_letters import PURGES, REPLAYS, UNKNOWN_TOPIC
from bolide.stores.schema._durable import DURABLE_CLIENTS, DURABLE_MARKERS
from bolide.stores.schema._history import HEADERS, RECORDS
from bolide.stores.schema._metadata import VERSION_TABLE, metadata
from bolide.stores.schema._outbox import (
    OUTBOX,
    OUTBOX_RELAYS,
    lane_of,
    pack_headers,
    unpack_headers,
)
from bolide.stores.schema._positions import POSITIONS
from bolide.stores.schema._registry import SCHEMA_SUBJECTS, SCHEMA_VERSIONS, SCHEMAS
from bolide.stores.schema._topics import TOPICS
from bolide.stores.schema._typed import (
    MAX_IDENT,
    TYPED_TABLE_PREFIX,
    is_typed_table,
    typed_table_name,
)

__all__ = [
    "DURABLE_CLIENTS",
    "DURABLE_MARKERS",
    "HEADERS",
    "MAX_IDENT",
    "OUTBOX",
    "OUTBOX_RELAYS",
    "POSITIONS",
    "PURGES",
    "RECORDS",
    "REPLAYS",
    "SCHEMAS",
    "SCHEMA_SUBJECTS",
    "SCHEMA_VERSIONS",
    "TOPICS",
    "TYPED_TABLE_PREFIX",
    "UNKNOWN_TOPIC",
    "VERSION_TABLE",
    "is_typed_table",
    "lane_of",
    "metadata",
    "pack_headers",
    "typed_table_name",
    "unpack_headers",
]
