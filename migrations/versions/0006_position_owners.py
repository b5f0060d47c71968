"""Owners of SqlPositions rows: the subscriber that claimed a partition last is the only one
whose writes land (a member that lost the partition, or a handler of an earlier assignment,
fails instead of writing). ``next_offset`` -1: claimed, no position yet.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``bolide_positions.owner`` (rows written before have none: the next claim sets it)."""
    with op.batch_alter_table("bolide_positions") as batch:
        batch.add_column(sa.Column("owner", sa.String(64), nullable=True))


def downgrade() -> None:
    """Drop the owners, and the claims that hold no position yet."""
    op.execute(sa.text("DELETE FROM bolide_positions WHERE next_offset < 0"))
    with op.batch_alter_table("bolide_positions") as batch:
        batch.drop_column("owner")
