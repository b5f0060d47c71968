"""Subscriber positions kept in the application's database (``SqlPositions``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_positions``."""
    op.create_table(
        "bolide_positions",
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "group_id", "stream", "kafka_partition", name="pk_bolide_positions"
        ),
    )


def downgrade() -> None:
    """Drop the positions: subscribers using ``SqlPositions`` start from their offset scheme."""
    op.drop_table("bolide_positions")
