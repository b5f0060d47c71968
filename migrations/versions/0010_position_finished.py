"""Finished records above a SqlPositions row's position: a parallel receiver's handlers
confirm their own records in any order, and the records finished above the first unfinished
one are written with the position (bolide's encoding, ``bolide.facade.consumer.ledger``), so
that the next owner of the partition skips them instead of running them again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``bolide_positions.finished`` (rows written before have none: nothing skipped)."""
    with op.batch_alter_table("bolide_positions") as batch:
        batch.add_column(sa.Column("finished", sa.Text, nullable=True))


def downgrade() -> None:
    """Drop the finished sets: their records run again after a restart."""
    with op.batch_alter_table("bolide_positions") as batch:
        batch.drop_column("finished")
