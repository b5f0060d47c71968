"""The dead-letter workbench's tables as SQLAlchemy Core objects (revision ``0008``).

They live on the history tables' ``metadata`` so that ``alembic check`` compares them too.
A dead letter is named by its place in its dead-letter stream: ``(stream, kafka_partition,
kafka_offset)``.
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores._schema import metadata

__all__ = ["PURGES", "REPLAYS"]

#: One row per dead letter and target stream a replay claimed: ``target_offset`` is NULL from
#: the claim (written before the publish) until the broker acknowledged the record (written
#: after), so a row left NULL by a replay that died is a publish in doubt (``DeadLetters``).
REPLAYS = sa.Table(
    "bolide_dead_letter_replays",
    metadata,
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    sa.Column("target_stream", sa.String(255), nullable=False),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("claimed_ms", sa.BigInteger, nullable=False),
    sa.Column("target_partition", sa.Integer, nullable=True),
    sa.Column("target_offset", sa.BigInteger, nullable=True),
    sa.Column("replayed_ms", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint(
        "stream",
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
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    sa.Column("purged_ms", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint(
        "stream", "kafka_partition", "kafka_offset", name="pk_bolide_dead_letter_purges"
    ),
)
