"""Tombstones in the archive: ``bolide_records.payload`` may be NULL (a record whose Kafka value
is null: on a compacted topic, the deletion marker of its key).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Allow a NULL payload (batch mode: SQLite rebuilds the table)."""
    with op.batch_alter_table("bolide_records") as batch:
        batch.alter_column("payload", existing_type=sa.LargeBinary, nullable=True)


def downgrade() -> None:
    """Tombstones keep their row with an empty payload: NOT NULL again."""
    op.execute(
        sa.text("UPDATE bolide_records SET payload = :empty WHERE payload IS NULL").bindparams(
            empty=b""
        )
    )
    with op.batch_alter_table("bolide_records") as batch:
        batch.alter_column("payload", existing_type=sa.LargeBinary, nullable=False)
