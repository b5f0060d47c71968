"""The positions table as a SQLAlchemy Core object (revisions ``0004``, ``0006``, ``0010``).

It lives on the schema's one ``metadata`` so that ``alembic check`` compares it too.
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["POSITIONS"]

#: One row per (group, stream, partition): the next offset to read, written in the same
#: transaction as the application's results (``SqlPositions``).
POSITIONS = sa.Table(
    "bolide_positions",
    metadata,
    sa.Column("group_id", sa.String(255), nullable=False),
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("next_offset", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
    # The subscriber (and assignment) that may write the row: the last to claim it (0006).
    sa.Column("owner", sa.String(64), nullable=True),
    # The records finished above ``next_offset``, in bolide's encoding: skipped on resuming
    # (0010; ``bolide.facade.consumer.ledger``).
    sa.Column("finished", sa.Text, nullable=True),
    sa.PrimaryKeyConstraint("group_id", "stream", "kafka_partition", name="pk_bolide_positions"),
)
