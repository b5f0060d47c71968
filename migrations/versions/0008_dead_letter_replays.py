"""The dead-letter workbench (``bolide.stores.DeadLetters``): which dead letters were replayed
where (claimed before the publish, completed once acknowledged), and which were purged.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_dead_letter_replays`` and ``bolide_dead_letter_purges``."""
    op.create_table(
        "bolide_dead_letter_replays",
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
    op.create_table(
        "bolide_dead_letter_purges",
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("purged_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "stream", "kafka_partition", "kafka_offset", name="pk_bolide_dead_letter_purges"
        ),
    )


def downgrade() -> None:
    """Drop both tables (replays and purges are forgotten; the dead letters stay)."""
    op.drop_table("bolide_dead_letter_purges")
    op.drop_table("bolide_dead_letter_replays")
