"""The transactional outbox: records added in the application's own database transaction,
published to Kafka by a relay once that transaction has committed (docs/outbox.md).

A service that writes its rows and publishes an event has two systems to keep in step: publish
first and a rollback leaves an event for a change that never happened; commit first and a crash
loses the event. ``Outbox.add`` writes the record to ``bolide_outbox`` through the
application's connection, so it commits or rolls back with the application's rows; a relay
(``Outbox.relay``, ``bolide outbox relay``) publishes what committed, in commit order per key.

The relay's parts beside it: the relay thread (``_relay``), one round of claim, publish and
mark (``_rounds``), the SQL of claiming (``_claims``) and the Kafka side (``_kafka``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.engine import Connection

from bolide.facade.config import Cluster, StreamConfig
from bolide.facade.ports import now_ms
from bolide.facade.record import MESSAGE_GROUP_HEADER, Record
from bolide.facade.validate import check_int
from bolide.stores.dialects import dialect_of
from bolide.stores.outbox._claims import pending_count
from bolide.stores.outbox._relay import (
    AsyncOutboxRelay,
    OutboxRelay,
    RelayConfig,
    RelayStats,
    check_store,
)
from bolide.stores.schema import OUTBOX, lane_of, pack_headers
from bolide.stores.store import SqlStore

__all__ = ["AsyncOutboxRelay", "Outbox", "OutboxRelay", "RelayConfig", "RelayStats"]

#: Where a pooled connection keeps the identity of its database (asked once per connection).
_IDENTITY = "bolide.outbox.database"


class Outbox:
    """The outbox of a store's database (table ``bolide_outbox``, revision ``0007``).

    Args:
        store: The ``SqlStore`` on the application's database: the application's
            transactions and the outbox share it (``bolide db upgrade`` adds the table).

    Raises:
        TypeError: ``store`` is not a ``SqlStore``.
        ValueError: ``store`` is an in-memory SQLite database (``sqlite://``).
    """

    def __init__(self, store: SqlStore) -> None:
        self.store = check_store(store)
        self._identity: str | None = None

    def __repr__(self) -> str:
        return f"Outbox({self.store.url!r})"

    def add(self, conn: Connection, stream: StreamConfig | str, record: Record) -> int:
        """Add ``record`` for ``stream`` in ``conn``'s transaction; it is published once that
        transaction commits, and never if it rolls back.

        Key, headers, message group and an asked partition (``Record(partition=...)``) are
        kept. Rows of one key (of one stream) are published in commit order: on PostgreSQL a
        second transaction adding the same key waits here until the first one ends.

        Args:
            conn: A SQLAlchemy connection on the store's database, in the application's
                transaction (``store.engine.begin()``, or the application's own engine).
            stream: The stream (or its name). It must exist by the time the relay reaches
                the row: the relay never creates streams.
            record: What to publish.

        Returns:
            The row's id in ``bolide_outbox``.

        Raises:
            TypeError: ``conn`` is not a Connection, ``stream`` neither a StreamConfig nor a
                name, or ``record`` not a ``Record``.
            ValueError: ``stream`` is not a valid stream name, or ``conn`` is on another
                database than the store's.
            StoreError: The database failed, or its schema is behind (``bolide db upgrade``).
        """
        name = _stream_name(stream)
        if not isinstance(record, Record):
            raise TypeError(
                f"record must be a bolide.facade.Record, not {type(record).__name__} "
                "(wrap a payload as Record(data, key=...))"
            )
        if not isinstance(conn, Connection):
            raise TypeError(
                "conn must be a SQLAlchemy Connection in the application's transaction "
                f"(engine.begin()), not {type(conn).__name__}"
            )
        self.store.check_schema_once()
        row = _row(name, record)

        def write() -> int:
            self._check_database(conn)
            dialect_of(conn).lock_lane(conn, row["lane"])
            inserted = conn.execute(OUTBOX.insert().values(**row)).inserted_primary_key
            assert inserted is not None  # an insert of one row always has its key
            return int(inserted[0])

        return self.store.guarded("outbox add", write, stream=name)

    def _check_database(self, conn: Connection) -> None:
        """Refuse a connection on another database (or schema) than the store's."""
        info = conn.connection.info
        theirs = info.get(_IDENTITY)
        if theirs is None:
            theirs = info[_IDENTITY] = dialect_of(conn).database_identity(conn)
        if theirs != self._identity:
            # Asked again: the store's server may have restarted since it was asked (a
            # PostgreSQL identity holds the server's start time).
            with self.store.engine.connect() as own:
                self._identity = self.store.sql_dialect.database_identity(own)
        if theirs != self._identity:
            raise ValueError(
                f"conn is on another database than the outbox's store ({self.store.url}): "
                "add rows in a transaction on the store's database, so that they commit with "
                "the application's"
            )

    def pending(self, stream: str | None = None) -> int:
        """Rows not yet sent (of ``stream``, or of all streams)."""
        self.store.check_schema_once()

        def count() -> int:
            with self.store.engine.connect() as conn:
                return pending_count(conn, stream)

        return self.store.guarded("outbox pending", count, stream=stream)

    def purge(self, *, sent_before_ms: int) -> int:
        """Delete rows sent before ``sent_before_ms`` (epoch milliseconds); unsent rows stay.
        Sent rows are kept until purged: they say where each record went.

        Returns:
            How many rows were deleted.
        """
        check_int("sent_before_ms", sent_before_ms)
        self.store.check_schema_once()
        c = OUTBOX.c
        query = OUTBOX.delete().where(c.sent_ms.is_not(None), c.sent_ms < sent_before_ms)

        def delete() -> int:
            with self.store.engine.begin() as conn:
                return int(conn.execute(query).rowcount)

        return self.store.guarded("outbox purge", delete)

    def relay(self, cluster: Cluster, config: RelayConfig | None = None) -> OutboxRelay:
        """Start a relay: a thread that publishes committed rows and marks them sent.

        Args:
            cluster: Where the streams live.
            config: ``RelayConfig(transactional_id=...)`` for exactly-once; defaults to at
                least once.

        Raises:
            PublishError: A stream with pending rows does not exist.
            StoreError: The database failed, or (SQLite) another relay runs on the same
                file, whatever path it was given.
        """
        return OutboxRelay(self.store, cluster, config)

    async def relay_async(
        self, cluster: Cluster, config: RelayConfig | None = None
    ) -> AsyncOutboxRelay:
        """``relay`` for asyncio services: started on a worker thread; ``await close()``."""
        relay = await asyncio.to_thread(OutboxRelay, self.store, cluster, config)
        return AsyncOutboxRelay(relay)


def _row(stream: str, record: Record) -> dict[str, Any]:
    """The outbox row of ``record``."""
    headers = list(record.headers)
    if record.group is not None:  # as a Publisher sends it: one group header, last
        headers = [h for h in headers if h[0] != MESSAGE_GROUP_HEADER]
        headers.append((MESSAGE_GROUP_HEADER, record.group.encode()))
    return {
        "stream": stream,
        "lane": lane_of(stream, record.key),
        # A record read from Kafka goes where its key sends it, as with a Publisher.
        "kafka_partition": record.partition if record.offset is None else None,
        "key": record.key,
        "payload": record.data,
        "headers": pack_headers(headers),
        "created_ms": now_ms(),
    }


def _stream_name(stream: object) -> str:
    if isinstance(stream, StreamConfig):
        return stream.name
    if not isinstance(stream, str):
        raise TypeError(f"stream must be a StreamConfig or a name, not {type(stream).__name__}")
    return StreamConfig(name=stream).name  # Kafka's naming rules, checked
