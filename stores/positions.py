"""SqlPositions: subscriber positions kept in the application's own database.

The sink pattern of Kafka Connect and Spark checkpoints: the input positions are written in
the same database transaction as the results, so both commit or neither does, and a restart
reads from there (``SubscriberConfig(positions=SqlPositions(store))``, ``sub.confirm(conn=)``).

Each write names the position it replaces (``UPDATE ... WHERE next_offset = expected``): a
subscriber that lost its partition to another member, which has written since, finds the
row changed, and its transaction fails with ``NotAssignedError`` instead of writing twice.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection

from bolide.facade.errors import NotAssignedError
from bolide.facade.ports import Closing, now_ms
from bolide.facade.validate import check_int
from bolide.stores._positions_schema import POSITIONS
from bolide.stores.store import SqlStore

__all__ = ["SqlPositions"]

_Hooks = tuple[Callable[[], None], Callable[[], None]]  # (on_commit, on_rollback)

#: What waits for each connection's transaction to end (one pair of listeners per connection).
_waiting: weakref.WeakKeyDictionary[Connection, list[_Hooks]] = weakref.WeakKeyDictionary()


class SqlPositions(Closing):
    """Subscriber positions in SQL (table ``bolide_positions``, revision ``0004``).

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
        """The stored positions of ``partitions``; a partition without one is left out.

        Raises:
            StoreError: The database failed, or its schema is behind (``bolide db upgrade``).
        """
        wanted = [check_int("partition", p) for p in partitions]
        c = POSITIONS.c
        query = sa.select(c.kafka_partition, c.next_offset).where(
            c.group_id == group, c.stream == stream, c.kafka_partition.in_(wanted)
        )

        def fetch() -> dict[int, int]:
            with self.store.engine.connect() as conn:
                return {int(p): int(o) for p, o in conn.execute(query)}

        self.store._ready()
        return self.store._guard("load positions", fetch, stream=stream)

    def save(
        self,
        conn: Connection,
        group: str,
        stream: str,
        positions: Mapping[int, int],
        *,
        expected: Mapping[int, int | None],
        on_commit: Callable[[], None],
        on_rollback: Callable[[], None],
    ) -> None:
        """Write ``positions`` through ``conn`` in its open transaction.

        Raises:
            TypeError: ``conn`` is not a SQLAlchemy ``Connection``.
            NotAssignedError: A stored position is not the ``expected`` one: another
                subscriber moved it; the transaction must roll back.
            StoreError: The database failed.
        """
        if not isinstance(conn, Connection):
            raise TypeError(
                "conn must be a SQLAlchemy Connection in the application's transaction "
                f"(store.engine.begin()), not {type(conn).__name__}"
            )
        self.store._ready()
        self.store._guard(
            "save positions", lambda: _write(conn, group, stream, positions, expected)
        )
        _when_done(conn, (on_commit, on_rollback))

    # -- inspection and lifetime -----------------------------------------------------------

    def positions(self, group: str, stream: str) -> dict[int, int]:
        """Every stored position of ``group`` on ``stream``: partition -> next offset."""
        c = POSITIONS.c
        query = sa.select(c.kafka_partition, c.next_offset).where(
            c.group_id == group, c.stream == stream
        )

        def fetch() -> dict[int, int]:
            with self.store.engine.connect() as conn:
                return {int(p): int(o) for p, o in conn.execute(query)}

        self.store._ready()
        return self.store._guard("read positions", fetch, stream=stream)

    def close(self) -> None:
        """Close the store if this object opened it."""
        if self._owns_store:
            self.store.close()


def _write(
    conn: Connection,
    group: str,
    stream: str,
    positions: Mapping[int, int],
    expected: Mapping[int, int | None],
) -> None:
    c = POSITIONS.c
    now = now_ms()
    for partition, offset in sorted(positions.items()):
        before = expected.get(partition)
        moved = NotAssignedError(
            f"the stored position of {stream}[{partition}] for {group!r} is no longer "
            f"{before}: another subscriber took the partition over and moved it; roll back",
            stream=stream,
            partition=partition,
        )
        if before is None:
            try:  # another subscriber inserting first fails it: the transaction rolls back
                conn.execute(
                    POSITIONS.insert().values(
                        group_id=group,
                        stream=stream,
                        kafka_partition=partition,
                        next_offset=offset,
                        updated_ms=now,
                    )
                )
            except exc.IntegrityError:
                raise moved from None
            continue
        result = conn.execute(
            POSITIONS.update()
            .where(
                c.group_id == group,
                c.stream == stream,
                c.kafka_partition == partition,
                c.next_offset == before,
            )
            .values(next_offset=offset, updated_ms=now)
        )
        if result.rowcount != 1:
            raise moved


def _when_done(conn: Connection, hooks: _Hooks) -> None:
    """Call ``hooks``' commit or rollback half once ``conn``'s transaction ends."""
    waiting = _waiting.get(conn)
    if waiting is None:
        waiting = _waiting[conn] = []
        event.listen(conn, "commit", _committed)
        event.listen(conn, "rollback", _rolled_back)
    waiting.append(hooks)


def _taken(conn: Connection) -> list[_Hooks]:
    waiting = _waiting.get(conn, [])
    taken = list(waiting)
    waiting.clear()  # the listeners stay for the connection's next transaction
    return taken


def _committed(conn: Connection) -> None:
    for on_commit, _ in _taken(conn):
        on_commit()


def _rolled_back(conn: Connection) -> None:
    for _, on_rollback in _taken(conn):
        on_rollback()
