"""The durable client registry: who is durable, who is connected, when each was last seen.

GemFire's servers keep a durable client's queue while it is away and forget it after its
timeout. On Kafka the queue is the client's consumer group (its committed offsets); this
registry keeps the rest in SQL: the client's streams, last-seen time, timeout, the marker
taken at its latest reconnect, and the claim that stops one durable id from being connected
twice at once.

A claim is an owner token with a lease: the connected client renews it (``touch``) and gives
it up on close (``release``). A killed client stops renewing, so its claim lapses after one
lease and the id can reconnect. Times are client wall-clock milliseconds; hosts sharing a
registry need roughly synchronised clocks (NTP), as with any lease.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import URL, Connection, RowMapping

from bolide.facade.errors import DurableClientBusyError
from bolide.facade.ports import (
    Claim,
    ClaimState,
    DurableClient,
    Incarnation,
    TopicIdentity,
    now_ms,
)
from bolide.facade.support import Closing
from bolide.stores.schema import DURABLE_CLIENTS, DURABLE_MARKERS, TOPICS
from bolide.stores.store import SqlStore

__all__ = ["Claim", "ClaimState", "DurableClient", "SqlDurableRegistry"]

_T = TypeVar("_T")


class SqlDurableRegistry(Closing):
    """Durable clients in SQL (tables from revision ``0003``; ``bolide db upgrade``).

    Args:
        store_or_url: A ``SqlStore`` (its engine is shared, and left open by ``close``) or a
            database URL (the registry then owns its store and closes it).

    Raises:
        TypeError: ``store_or_url`` is neither.
        ValueError: The URL names an unsupported database.
    """

    def __init__(self, store_or_url: SqlStore | str | URL) -> None:
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

    def __repr__(self) -> str:
        return f"SqlDurableRegistry({self.store.url!r})"

    # -- claims ----------------------------------------------------------------------------

    def register(
        self,
        durable_id: str,
        *,
        group_id: str,
        stream: str,
        timeout_s: float,
        owner: str,
        lease_ms: int,
    ) -> Claim:
        """Claim ``durable_id`` for ``owner`` for ``lease_ms``; add it if it is new.

        A client away past its stored timeout is reported ``"expired"`` and its marker is
        dropped; the caller drops its Kafka position. The stored timeout becomes ``timeout_s``.

        Raises:
            DurableClientBusyError: Another owner holds a claim whose lease has not lapsed.
            StoreError: The database failed or its schema is behind.
        """
        _check_id(durable_id)
        wanted = dict(
            group_id=group_id,
            timeout_s=float(timeout_s),
            connected=True,
            owner=owner,
        )

        def claim() -> Claim:
            now = now_ms()
            with self.store.engine.begin() as conn:
                before = _get(conn, durable_id, now)
                if before is None:
                    row = dict(wanted, durable_id=durable_id, streams=json.dumps([stream]))
                    row.update(created_ms=now, last_seen_ms=now, connections=1)
                    _insert_client(conn, dict(row, lease_until_ms=now + lease_ms))
                    state: ClaimState = "new"
                else:
                    state = _reclaim(conn, before, stream, wanted, now, lease_ms)
                after = _get(conn, durable_id, now)
                assert after is not None
                return Claim(after, state, before)

        return self._run("register durable client", claim)

    def touch(self, durable_id: str, owner: str, lease_ms: int) -> bool:
        """Renew ``owner``'s claim and last-seen time; ``False`` when the claim was lost."""
        c = DURABLE_CLIENTS.c

        def renew() -> bool:
            now = now_ms()
            with self.store.engine.begin() as conn:
                done = conn.execute(
                    DURABLE_CLIENTS.update()
                    .where(c.durable_id == durable_id, c.owner == owner)
                    .values(last_seen_ms=now, lease_until_ms=now + lease_ms, connected=True)
                )
                return bool(done.rowcount == 1)

        return self._run("touch durable client", renew)

    def identify(
        self, stream: str, identity: TopicIdentity
    ) -> tuple[Incarnation, Incarnation | None]:
        """Record which topic ``stream`` is now (``SqlStore.identify``): a marker names the
        topic incarnation it was taken on."""
        return self.store.identify(stream, identity)

    def marked_as(self, durable_id: str, stream: str) -> str | None:
        """The key of the topic incarnation of ``stream`` the client's marker was taken on
        (its name, or a later incarnation's key); ``None`` without a marker."""
        m, t = DURABLE_MARKERS.c, TOPICS.c
        keys = sa.select(t.stored_as).where(t.stream == stream)
        query = (
            sa.select(m.stream)
            .where(m.durable_id == durable_id, sa.or_(m.stream == stream, m.stream.in_(keys)))
            .limit(1)
        )

        def fetch() -> str | None:
            with self.store.engine.connect() as conn:
                found = conn.execute(query).scalar()
            return None if found is None else str(found)

        return self._run("read durable marker", fetch)

    def mark(self, durable_id: str, stream: str, marker: Mapping[int, int]) -> None:
        """Store the marker (end offset per partition) taken at this (re)connect."""
        m = DURABLE_MARKERS.c

        def write() -> None:
            now = now_ms()
            with self.store.engine.begin() as conn:
                conn.execute(
                    DURABLE_MARKERS.delete().where(m.durable_id == durable_id, m.stream == stream)
                )
                if marker:
                    conn.execute(
                        DURABLE_MARKERS.insert(),
                        [
                            {
                                "durable_id": durable_id,
                                "stream": stream,
                                "kafka_partition": int(p),
                                "end_offset": int(o),
                            }
                            for p, o in sorted(marker.items())
                        ],
                    )
                conn.execute(
                    DURABLE_CLIENTS.update()
                    .where(DURABLE_CLIENTS.c.durable_id == durable_id)
                    .values(marker_ms=now)
                )

        self._run("store durable marker", write)

    def release(self, durable_id: str, owner: str) -> bool:
        """Disconnect ``owner`` and keep the queue; ``False`` when it no longer held the claim."""
        c = DURABLE_CLIENTS.c

        def write() -> bool:
            with self.store.engine.begin() as conn:
                done = conn.execute(
                    DURABLE_CLIENTS.update()
                    .where(c.durable_id == durable_id, c.owner == owner)
                    .values(last_seen_ms=now_ms(), connected=False, owner=None, lease_until_ms=None)
                )
                return bool(done.rowcount == 1)

        return self._run("release durable client", write)

    def unregister(self, durable_id: str, owner: str | None = None) -> bool:
        """Forget ``durable_id`` (only while ``owner`` holds it, when given); ``True`` if gone."""
        c = DURABLE_CLIENTS.c

        def delete() -> bool:
            with self.store.engine.begin() as conn:
                query = DURABLE_CLIENTS.delete().where(c.durable_id == durable_id)
                if owner is not None:
                    query = query.where(c.owner == owner)
                if conn.execute(query).rowcount != 1:
                    return False
                # Explicit rather than by cascade: SQLite enforces foreign keys only when asked.
                conn.execute(
                    DURABLE_MARKERS.delete().where(DURABLE_MARKERS.c.durable_id == durable_id)
                )
                return True

        return self._run("unregister durable client", delete)

    # -- queries ---------------------------------------------------------------------------

    def get(self, durable_id: str) -> DurableClient | None:
        """One client, or ``None``."""

        def read() -> DurableClient | None:
            with self.store.engine.connect() as conn:
                return _get(conn, durable_id, now_ms())

        return self._run("read durable client", read)

    def list(self) -> builtins.list[DurableClient]:
        """Every registered client, by durable id."""

        def read() -> builtins.list[DurableClient]:
            now = now_ms()
            with self.store.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(DURABLE_CLIENTS).order_by(DURABLE_CLIENTS.c.durable_id)
                ).all()
                markers = _markers(conn, None)
            return [_client(row._mapping, markers.get(row.durable_id, {}), now) for row in rows]

        return self._run("list durable clients", read)

    def expire(self, at_ms: int | None = None) -> builtins.list[DurableClient]:
        """Forget every client away past its timeout; return the ones forgotten.

        A client is only forgotten while it is still disconnected and still past its timeout
        (checked in the delete itself), so a client reconnecting at that moment is kept.
        """
        gone: builtins.list[DurableClient] = []
        c = DURABLE_CLIENTS.c
        for client in self.list():
            now = at_ms if at_ms is not None else now_ms()
            if not client.expired(now):
                continue

            def delete(client: DurableClient = client, now: int = now) -> bool:
                with self.store.engine.begin() as conn:
                    stale = sa.or_(c.owner.is_(None), c.lease_until_ms <= now)
                    # last_seen_ms + timeout_s * 1000 < now, kept in integer arithmetic.
                    away = c.last_seen_ms < now - sa.cast(c.timeout_s * 1000, sa.BigInteger)
                    done = conn.execute(
                        DURABLE_CLIENTS.delete().where(
                            c.durable_id == client.durable_id,
                            c.connections == client.connections,
                            stale,
                            away,
                        )
                    )
                    if done.rowcount != 1:
                        return False
                    conn.execute(
                        DURABLE_MARKERS.delete().where(
                            DURABLE_MARKERS.c.durable_id == client.durable_id
                        )
                    )
                    return True

            if self._run("expire durable client", delete):
                gone.append(client)
        return gone

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Release the database connections if this registry opened them."""
        if self._owns_store:
            self.store.close()

    def _run(self, what: str, fn: Callable[[], _T]) -> _T:
        self.store.check_schema_once()
        return self.store.guarded(what, fn)


def _check_id(durable_id: object) -> None:
    if not isinstance(durable_id, str) or not durable_id:
        raise ValueError("durable_id must be a non-empty string")
    if len(durable_id) > 200:
        raise ValueError(f"durable_id is {len(durable_id)} characters long; at most 200")


def _insert_client(conn: Connection, values: dict[str, Any]) -> None:
    try:
        conn.execute(DURABLE_CLIENTS.insert().values(**values))
    except exc.IntegrityError:  # the transaction rolls back as the error leaves it
        # Another connection registered the same id between our read and our insert.
        raise DurableClientBusyError(
            f"durable client {values['durable_id']!r} was claimed by another connection at the "
            "same moment"
        ) from None


def _busy(client: DurableClient, now: int) -> DurableClientBusyError:
    lapse = ((client.lease_until_ms or now) - now) / 1000
    return DurableClientBusyError(
        f"durable client {client.durable_id!r} is already connected elsewhere (last seen "
        f"{(now - client.last_seen_ms) / 1000:.1f}s ago); a crashed connection's claim lapses "
        f"within {lapse:.1f}s"
    )


def _reclaim(
    conn: Connection,
    before: DurableClient,
    stream: str,
    wanted: dict[str, Any],
    now: int,
    lease_ms: int,
) -> ClaimState:
    """Claim a known client again: ``"expired"`` (its marker dropped) or ``"resumed"``.

    Raises:
        DurableClientBusyError: Another owner holds it, or claimed it at the same moment.
    """
    if before.connected:
        raise _busy(before, now)
    state: ClaimState = "expired" if before.expired(now) else "resumed"
    streams = list(before.streams)
    if stream not in streams:
        streams.append(stream)
    c = DURABLE_CLIENTS.c
    # The connection count is the row's version: a concurrent claim wins once.
    done = conn.execute(
        DURABLE_CLIENTS.update()
        .where(c.durable_id == before.durable_id, c.connections == before.connections)
        .values(
            **wanted,
            streams=json.dumps(streams),
            last_seen_ms=now,
            lease_until_ms=now + lease_ms,
            connections=before.connections + 1,
        )
    )
    if done.rowcount != 1:
        raise DurableClientBusyError(
            f"durable client {before.durable_id!r} was claimed by another connection "
            "at the same moment"
        )
    if state == "expired":
        conn.execute(
            DURABLE_MARKERS.delete().where(DURABLE_MARKERS.c.durable_id == before.durable_id)
        )
    return state


def _get(conn: Connection, durable_id: str, now: int) -> DurableClient | None:
    row = conn.execute(
        sa.select(DURABLE_CLIENTS).where(DURABLE_CLIENTS.c.durable_id == durable_id)
    ).first()
    if row is None:
        return None
    return _client(row._mapping, _markers(conn, durable_id).get(durable_id, {}), now)


def _markers(conn: Connection, durable_id: str | None) -> dict[str, dict[str, dict[int, int]]]:
    m = DURABLE_MARKERS.c
    query = sa.select(m.durable_id, m.stream, m.kafka_partition, m.end_offset)
    if durable_id is not None:
        query = query.where(m.durable_id == durable_id)
    out: dict[str, dict[str, dict[int, int]]] = {}
    for did, stream, partition, end in conn.execute(query):
        out.setdefault(did, {}).setdefault(stream, {})[int(partition)] = int(end)
    return out


def _client(row: RowMapping, markers: dict[str, dict[int, int]], now: int) -> DurableClient:
    lease = row["lease_until_ms"]
    connected = bool(row["connected"]) and row["owner"] is not None and (lease or 0) > now
    streams: Iterable[str] = json.loads(row["streams"])
    return DurableClient(
        durable_id=row["durable_id"],
        group_id=row["group_id"],
        streams=tuple(streams),
        timeout_s=float(row["timeout_s"]),
        created_ms=int(row["created_ms"]),
        last_seen_ms=int(row["last_seen_ms"]),
        connected=connected,
        owner=row["owner"],
        lease_until_ms=int(lease) if lease is not None else None,
        connections=int(row["connections"]),
        marker_ms=int(row["marker_ms"]) if row["marker_ms"] is not None else None,
        markers=markers,
    )
