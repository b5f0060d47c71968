"""The dead-letter workbench's tables as SQLAlchemy Core objects (revisions ``0008``, ``0009``).

They live on the schema's one ``metadata`` so that ``alembic check`` compares them too.
A row names its dead letter by its place in the dead-letter stream, ``(stream,
kafka_partition, kafka_offset)``, and by which letter held that place: ``topic_id``, the
dead-letter topic's id when the letter was read from Kafka (a topic deleted and created again
gets a new one and starts its offsets over), and ``timestamp_ms``, the letter's own timestamp,
which also names it once only the archive holds it. ``topic_id`` ``''`` is an unknown
incarnation: rows written before ``0009``, letters read from the archive alone, brokers that
report no topic ids. ``bolide.stores.deadletters._books`` decides which row covers which letter.
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["PURGES", "REPLAYS", "UNKNOWN_TOPIC"]

#: ``topic_id`` of a row whose dead letter's topic incarnation is not known.
UNKNOWN_TOPIC = ""


def _identity() -> list[sa.Column[object]]:
    return [
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        # Part of the primary key, so NOT NULL: '' is the unknown incarnation.
        sa.Column("topic_id", sa.String(64), nullable=False, server_default=UNKNOWN_TOPIC),
        sa.Column("timestamp_ms", sa.BigInteger, nullable=True),
    ]


#: One row per dead letter and target stream a replay claimed: ``target_offset`` is NULL from
#: the claim (written before the publish) until the broker acknowledged the record (written
#: after), so a row left NULL by a replay that died is a publish in doubt (``DeadLetters``).
REPLAYS = sa.Table(
    "bolide_dead_letter_replays",
    metadata,
    *_identity(),
    sa.Column("target_stream", sa.String(255), nullable=False),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("claimed_ms", sa.BigInteger, nullable=False),
    sa.Column("target_partition", sa.Integer, nullable=True),
    sa.Column("target_offset", sa.BigInteger, nullable=True),
    sa.Column("replayed_ms", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint(
        "stream",
        "topic_id",
        "kafka_partition",
        "kafka_offset",
        "target_stream",
        name="pk_bolide_dead_letter_replays",
    ),
)

#: One row per purged dead letter: Kafka can only delete a partition's oldest records, so a
#: purged dead letter it still holds stays hidden by its row.
PURGES = sa.Table(
    "bolide_dead_letter_purges",
    metadata,
    *_identity(),
    sa.Column("purged_ms", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint(
        "stream",
        "topic_id",
        "kafka_partition",
        "kafka_offset",
        name="pk_bolide_dead_letter_purges",
    ),
)
