"""SqlPositions: subscriber positions kept in the application's own database.

The sink pattern of Kafka Connect and Spark checkpoints: the input positions are written in
the same database transaction as the results, so both commit or neither does, and a restart
reads from there (``SubscriberConfig(positions=SqlPositions(store))``, ``sub.confirm(conn=)``).

Each row names its owner: the subscriber that took the partition last claims it (on every
assignment, with a fresh token) before reading its position, and every write requires the
claim (``UPDATE ... WHERE owner = token``). A member that lost its partition finds the row
claimed by another, and its transaction fails with ``NotAssignedError`` instead of writing
twice. Writes never move a position back.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError

from bolide.facade.consumer.ledger import Ledger, decode_finished, encode_finished
from bolide.facade.errors import NotAssignedError
from bolide.facade.ports import Incarnation, TopicIdentity, now_ms
from bolide.facade.support import Closing
from bolide.facade.validate import check_int
from bolide.stores import incarnations
from bolide.stores.dialects import dialect_of
from bolide.stores.schema import POSITIONS
from bolide.stores.store import SqlStore

__all__ = ["SqlPositions"]

log = logging.getLogger("bolide.stores.positions")


class _Waiting:
    """What waits for one connection's transaction to commit."""

    __slots__ = ("doubtful", "hooks")

    def __init__(self) -> None:
        self.hooks: list[Callable[[], None]] = []
        self.doubtful = False  # a savepoint was rolled back: a write may be undone


#: What waits for each connection's transaction to end (one set of listeners per connection).
_waiting: weakref.WeakKeyDictionary[Connection, _Waiting] = weakref.WeakKeyDictionary()


class SqlPositions(Closing):
    """Subscriber positions in SQL (``bolide_positions``, revisions ``0004``, ``0006``, ``0010``).

    Args:
        store_or_url: A ``SqlStore`` (its engine is shared, and left open by ``close``) or a
            database URL (then owned, and closed by ``close``). The application's
            transactions must run on this database.
        group: The key positions are kept under; ``None`` takes the subscriber's group. An
            ungrouped subscriber must name one.

    Raises:
        TypeError: ``store_or_url`` is neither a store nor a URL.
        ValueError: The URL names an unsupported database, or ``group`` is empty.
    """

    def __init__(self, store_or_url: SqlStore | str | URL, *, group: str | None = None) -> None:
        if isinstance(store_or_url, SqlStore):
            self.store = store_or_url
            self._owns_store = False
        elif isinstance(store_or_url, str | URL):
            self.store = SqlStore(store_or_url)
            self._owns_store = True
        else:
            raise TypeError(
                "store_or_url must be a SqlStore or a database URL, not "
                f"{type(store_or_url).__name__}"
            )
        if group is not None and (not isinstance(group, str) or not group or len(group) > 255):
            raise ValueError("group must be a non-empty string of at most 255 characters")
        self.group = group

    def __repr__(self) -> str:
        return f"SqlPositions({self.store.url!r}, group={self.group!r})"

    # -- PositionStore ---------------------------------------------------------------------

    def load(self, group: str, stream: str, partitions: Sequence[int]) -> dict[int, int]:
        """The stored positions of ``partitions``, claiming nothing; a partition without one
        is left out.

        Raises:
            StoreError: The database failed, or its schema is behind (``bolide db upgrade``).
        """
        wanted = [check_int("partition", p) for p in partitions]

        def fetch() -> dict[int, int]:
            with self.store.engine.connect() as conn:
                return _stored(conn, group, stream, wanted)

        self.store.check_schema_once()
        return self.store.guarded("load positions", fetch, stream=stream)

    def claim(
        self, group: str, stream: str, partitions: Sequence[int], owner: str
    ) -> dict[int, int]:
        """Make ``owner`` the only writer of ``partitions``' positions, then read them (one
        transaction: a write of the previous owner lands before the read or fails).

        Raises:
            StoreError: The database failed, or its schema is behind (``bolide db upgrade``).
        """
        wanted = [check_int("partition", p) for p in partitions]

        def claim() -> dict[int, int]:
            with self.store.engine.begin() as conn:
                for partition in sorted(wanted):
                    _claim(conn, group, stream, partition, owner)
                return _stored(conn, group, stream, wanted)

        self.store.check_schema_once()
        return self.store.guarded("claim positions", claim, stream=stream)

    def save(
        self,
        conn: Connection,
        group: str,
        stream: str,
        positions: Mapping[int, int],
        *,
        owners: Mapping[int, str],
        on_commit: Callable[[], None],
        finished: Mapping[int, Collection[int]] | None = None,
    ) -> None:
        """Write ``positions`` through ``conn`` in its open transaction; none moves back.
        The records ``finished`` above each join those the row holds (encoded, bolide's
        ``bolide.facade.consumer.ledger``; left out when too large: they run again).

        ``on_commit`` runs once the transaction has committed (not when a savepoint holding
        the write was rolled back meanwhile).

        Raises:
            TypeError: ``conn`` is not a SQLAlchemy ``Connection``.
            NotAssignedError: A partition is claimed by another owner (or never was by the one
                in ``owners``): the transaction must roll back.
            StoreError: The database failed.
        """
        if not isinstance(conn, Connection):
            raise TypeError(
                "conn must be a SQLAlchemy Connection in the application's transaction "
                f"(store.engine.begin()), not {type(conn).__name__}"
            )
        self.store.check_schema_once()
        self.store.guarded(
            "save positions", lambda: _write(conn, group, stream, positions, owners, finished or {})
        )
        _when_committed(conn, on_commit)

    def finished(self, group: str, stream: str, partitions: Sequence[int]) -> dict[int, str]:
        """The finished sets (encoded) stored above the positions of ``partitions``; a
        partition without one is left out.

        Raises:
            StoreError: The database failed, or its schema is behind (``bolide db upgrade``).
        """
        wanted = [check_int("partition", p) for p in partitions]
        c = POSITIONS.c
        query = sa.select(c.kafka_partition, c.finished).where(
            c.group_id == group, c.stream == stream, c.kafka_partition.in_(wanted)
        )

        def fetch() -> dict[int, str]:
            with self.store.engine.connect() as conn:
                return {int(p): str(f) for p, f in conn.execute(query) if f}

        self.store.check_schema_once()
        return self.store.guarded("load finished records", fetch, stream=stream)

    def identify(
        self, stream: str, identity: TopicIdentity
    ) -> tuple[Incarnation, Incarnation | None]:
        """Record which topic ``stream`` is now (``SqlStore.identify``): the positions of a
        topic deleted since are kept under its own incarnation, never resumed from.

        Raises:
            ClusterMismatchError: The store holds the stream of another cluster.
            StoreError: The database failed.
        """
        return self.store.identify(stream, identity)

    # -- inspection and lifetime -----------------------------------------------------------

    def positions(self, group: str, stream: str, *, stored_as: str | None = None) -> dict[int, int]:
        """Every stored position of ``group`` on ``stream`` (its current topic incarnation, or
        the one ``stored_as`` names): partition -> next offset."""
        c = POSITIONS.c

        def fetch() -> dict[int, int]:
            with self.store.engine.connect() as conn:
                key = stored_as or incarnations.stored_as(conn, stream)
                query = sa.select(c.kafka_partition, c.next_offset).where(
                    c.group_id == group, c.stream == key
                )
                return {int(p): int(o) for p, o in conn.execute(query) if o >= 0}

        self.store.check_schema_once()
        return self.store.guarded("read positions", fetch, stream=stream)

    def close(self) -> None:
        """Close the store if this object opened it."""
        if self._owns_store:
            self.store.close()


def _stored(conn: Connection, group: str, stream: str, partitions: list[int]) -> dict[int, int]:
    c = POSITIONS.c
    query = sa.select(c.kafka_partition, c.next_offset).where(
        c.group_id == group, c.stream == stream, c.kafka_partition.in_(partitions)
    )
    # A claimed partition without a position yet holds -1.
    return {int(p): int(o) for p, o in conn.execute(query) if o >= 0}


def _claim(conn: Connection, group: str, stream: str, partition: int, owner: str) -> None:
    c = POSITIONS.c
    row = {"group_id": group, "stream": stream, "kafka_partition": partition}
    keys = [c.group_id, c.stream, c.kafka_partition]
    insert = dialect_of(conn).insert_ignoring(POSITIONS, keys)
    conn.execute(insert.values(**row, next_offset=-1, updated_ms=now_ms(), owner=owner))
    where = (c.group_id == group, c.stream == stream, c.kafka_partition == partition)
    conn.execute(POSITIONS.update().where(*where).values(owner=owner))


def _write(
    conn: Connection,
    group: str,
    stream: str,
    positions: Mapping[int, int],
    owners: Mapping[int, str],
    finished: Mapping[int, Collection[int]],
) -> None:
    c = POSITIONS.c
    now = now_ms()
    for partition, offset in sorted(positions.items()):
        where = (
            c.group_id == group,
            c.stream == stream,
            c.kafka_partition == partition,
            c.owner == owners.get(partition),
        )
        # Locks the row first: the finished set read next is the last one committed, and
        # concurrent handlers' sets add up instead of replacing each other.
        if conn.execute(POSITIONS.update().where(*where).values(updated_ms=now)).rowcount != 1:
            raise NotAssignedError(
                f"{stream}[{partition}] of {group!r} is claimed by another subscriber (it took "
                "the partition over): this one may no longer write its position; roll back",
                stream=stream,
                partition=partition,
            )
        stored, text = conn.execute(sa.select(c.next_offset, c.finished).where(*where)).one()
        where_ = f"{stream}[{partition}] positions of {group!r}"
        done = decode_finished(stored, text, where=where_) if stored >= 0 else set()
        done.update(finished.get(partition, ()))
        # Concurrent handlers' sets add up here: the position jumps past what they finished.
        ledger = Ledger(int(stored), done)
        ledger.advance(offset)
        position = ledger.frontier
        encoded = encode_finished(position, ledger.finished)
        if encoded is None:
            log.warning("%s: finished set too large, left out (its records run again)", where_)
        conn.execute(
            POSITIONS.update().where(*where).values(next_offset=position, finished=encoded or None)
        )


def _when_committed(conn: Connection, hook: Callable[[], None]) -> None:
    """Call ``hook`` once ``conn``'s transaction has committed; forget it on a rollback."""
    waiting = _waiting.get(conn)
    if waiting is None:
        waiting = _waiting[conn] = _Waiting()
        event.listen(conn, "commit", _commit)
        event.listen(conn, "rollback", _rolled_back)
        event.listen(conn, "rollback_savepoint", _savepoint_rolled_back)
    waiting.hooks.append(hook)


def _taken(conn: Connection) -> _Waiting:
    waiting = _waiting.get(conn)
    taken = _Waiting()
    if waiting is not None:  # the listeners stay for the connection's next transaction
        taken.hooks, taken.doubtful = waiting.hooks, waiting.doubtful
        waiting.hooks, waiting.doubtful = [], False
    return taken


def _commit(conn: Connection) -> None:
    """SQLAlchemy calls this just before the database's COMMIT: commit here, then run the
    hooks, so that they follow a COMMIT that succeeded (SQLAlchemy's own COMMIT then finds
    nothing left to commit)."""
    taken = _taken(conn)
    if not taken.hooks:
        return
    dialect = conn.dialect
    try:
        dialect.do_commit(conn.connection)
    except dialect.loaded_dbapi.Error as error:
        raise DBAPIError.instance(None, None, error, dialect.loaded_dbapi.Error) from error
    if taken.doubtful:
        return  # a write may have been undone by its savepoint: its position stays unsaid
    for hook in taken.hooks:
        hook()


def _rolled_back(conn: Connection) -> None:
    _taken(conn)


def _savepoint_rolled_back(conn: Connection, name: object, context: object) -> None:
    waiting = _waiting.get(conn)
    if waiting is not None and waiting.hooks:
        waiting.doubtful = True
