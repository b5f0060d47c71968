"""The topic incarnations table as a SQLAlchemy Core object (revision ``0011``).

A stream's name stands for one Kafka topic at a time; deleted and created again, it is a new
topic (a new topic id, offsets from 0). Each incarnation the store has met gets a row here,
with the key its rows carry in the other tables' ``stream`` columns (``stored_as``): the
stream's name for the first one (and every row written before this revision), the name with
``@`` and the topic id for each later one (``@`` never appears in a Kafka topic's name).
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["TOPICS"]

#: One row per incarnation of a stream's topic; the one not retired is the current one.
TOPICS = sa.Table(
    "bolide_topics",
    metadata,
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("topic_id", sa.String(32), nullable=False),
    sa.Column("cluster_id", sa.String(64), nullable=False),
    # What the incarnation's rows hold in the ``stream`` column of the history, positions
    # and durable marker tables (and what its typed table is named after).
    sa.Column("stored_as", sa.String(255), nullable=False),
    sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("retired_ms", sa.BigInteger, nullable=True),  # NULL: the current one
    sa.PrimaryKeyConstraint("stream", "topic_id", name="pk_bolide_topics"),
    sa.UniqueConstraint("stored_as", name="uq_bolide_topics_stored_as"),
)
