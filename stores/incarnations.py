"""Topic incarnations: which Kafka topic each stream's stored rows belong to.

Kafka names a topic, but knows it by its topic id (KIP-516): deleted and created again, the
same name is a new topic whose offsets start over at 0, and Kafka forgets every group's
offsets of the old one. The store does the same. ``bolide_topics`` (revision ``0011``) keeps
one row per incarnation it has met (topic id, cluster id, first seen, retired), and the key
the incarnation's rows carry in the ``stream`` column of the history, positions and durable
marker tables (``stored_as``): the stream's name for the first, ``name@topic-id`` for each
later one. So an old incarnation's history stays queryable beside the new one's, and is never
read, trimmed against or resumed from as the new one's.

Whoever meets a stream's topic (the archiver, a subscriber with a history store or
``SqlPositions``) calls ``identify`` with the id Kafka gives it now: the first call records the
incarnation (it claims the rows stored before under the bare name); an id that changed retires
the current incarnation and starts a new, empty one; another cluster's id is refused
(``ClusterMismatchError``) until the stream adopts it (``adopt``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.facade.errors import ClusterMismatchError
from bolide.facade.ports import Incarnation, TopicIdentity, now_ms
from bolide.stores.schema import (
    DURABLE_MARKERS,
    HEADERS,
    POSITIONS,
    RECORDS,
    TOPICS,
    typed_table_name,
)

__all__ = [
    "Conflict",
    "Incarnation",
    "adopt",
    "drop",
    "identify",
    "incarnations",
    "stored_as",
]

#: The longest ``stream`` value the tables hold.
_MAX_KEY = 255


class Conflict(Exception):
    """Another process changed a stream's incarnations while this one did."""


def incarnations(conn: Connection, stream: str | None = None) -> list[Incarnation]:
    """Every incarnation the store has met (of ``stream``), oldest first per stream."""
    c = TOPICS.c
    query = sa.select(TOPICS).order_by(c.stream, c.first_seen_ms, c.topic_id)
    if stream is not None:
        query = query.where(c.stream == stream)
    return [Incarnation(**row._mapping) for row in conn.execute(query)]


def stored_as(conn: Connection, stream: str) -> str:
    """The key of ``stream``'s current incarnation; its name while the store has met none."""
    c = TOPICS.c
    found = conn.execute(
        sa.select(c.stored_as).where(c.stream == stream, c.retired_ms.is_(None))
    ).scalar()
    return stream if found is None else str(found)


def identify(
    conn: Connection, stream: str, identity: TopicIdentity
) -> tuple[Incarnation, Incarnation | None]:
    """Record that ``stream`` is the topic ``identity`` now (in ``conn``'s transaction).

    Returns:
        The current incarnation, and the one this call retired (``None`` unless the topic id
        changed since the store last met the stream).

    Raises:
        ClusterMismatchError: The store met the stream on another cluster, and the stream
            has not adopted this one.
        sqlalchemy.exc.IntegrityError, Conflict: Another process recorded a change at the
            same moment: roll back and call again (it then finds it recorded).
    """
    known = incarnations(conn, stream)
    current = next((i for i in known if i.current), None)
    if current is not None and current.cluster_id != identity.cluster_id:
        raise ClusterMismatchError(
            f"the store holds {stream!r} of Kafka cluster {current.cluster_id!r}, and this is "
            f"cluster {identity.cluster_id!r}: offsets of one cluster mean nothing on another, "
            f"so nothing is read or written. If the stream now lives on {identity.cluster_id!r} "
            f"(a failover to a mirror, say), run `bolide db adopt {stream} --cluster-id "
            f"{identity.cluster_id}`; else point this client at the right database",
            stream=stream,
            stored_cluster_id=current.cluster_id,
            cluster_id=identity.cluster_id,
        )
    met = next((i for i in known if i.topic_id == identity.topic_id), None)
    if met is not None:
        return met, None  # Kafka never gives a topic id to a second topic
    now = now_ms()
    if current is not None:
        c = TOPICS.c
        retire = (
            TOPICS.update()
            .where(c.stream == stream, c.topic_id == current.topic_id, c.retired_ms.is_(None))
            .values(retired_ms=now)
        )
        if conn.execute(retire).rowcount != 1:  # another process retired it first
            raise Conflict(f"the incarnations of {stream!r} changed meanwhile")
    key = stream if not known else _later_key(stream, identity.topic_id)
    new = Incarnation(stream, identity.topic_id, identity.cluster_id, key, now, None)
    conn.execute(TOPICS.insert().values(**new.__dict__))
    retired = None if current is None else Incarnation(**{**current.__dict__, "retired_ms": now})
    return new, retired


def _later_key(stream: str, topic_id: str) -> str:
    """The key of a later incarnation: its name (cut to fit), ``@`` and its topic id."""
    suffix = f"@{topic_id}"
    return stream[: _MAX_KEY - len(suffix)] + suffix


def adopt(conn: Connection, stream: str, cluster_id: str) -> Incarnation:
    """Let ``stream``'s history continue on cluster ``cluster_id`` (a failover to a mirror):
    its current incarnation is said to live there. The topic there has its own topic id, so
    the next client that meets it starts a new incarnation: offsets of the old cluster are
    never used on the new one.

    Raises:
        LookupError: The store has never met ``stream``.
    """
    current = next((i for i in incarnations(conn, stream) if i.current), None)
    if current is None:
        raise LookupError(f"the store has met no topic named {stream!r}: nothing to adopt")
    c = TOPICS.c
    conn.execute(
        TOPICS.update()
        .where(c.stream == stream, c.topic_id == current.topic_id)
        .values(cluster_id=cluster_id)
    )
    return Incarnation(**{**current.__dict__, "cluster_id": cluster_id})


def drop(conn: Connection, stream: str, topic_id: str) -> int:
    """Delete a retired incarnation: its records, headers, typed table, positions and durable
    markers, and its row. Returns how many records went.

    Raises:
        LookupError: The store has no such incarnation.
        ValueError: It is the current one (the topic Kafka has under that name now).
    """
    found = next((i for i in incarnations(conn, stream) if i.topic_id == topic_id), None)
    if found is None:
        raise LookupError(f"the store has no incarnation {topic_id!r} of {stream!r}")
    if found.current:
        raise ValueError(
            f"{topic_id!r} is the current incarnation of {stream!r}: only a retired one "
            "(a topic deleted since) can be dropped"
        )
    key = found.stored_as
    sa.Table(typed_table_name(key), sa.MetaData()).drop(conn, checkfirst=True)
    conn.execute(HEADERS.delete().where(HEADERS.c.stream == key))
    records = conn.execute(RECORDS.delete().where(RECORDS.c.stream == key)).rowcount
    conn.execute(POSITIONS.delete().where(POSITIONS.c.stream == key))
    conn.execute(DURABLE_MARKERS.delete().where(DURABLE_MARKERS.c.stream == key))
    c = TOPICS.c
    conn.execute(TOPICS.delete().where(c.stream == stream, c.topic_id == topic_id))
    return int(records)
