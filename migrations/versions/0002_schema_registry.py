"""Schema registry tables: schemas with global ids, subject versions, compatibility levels.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_schemas``, ``bolide_schema_versions`` and ``bolide_schema_subjects``."""
    op.create_table(
        "bolide_schemas",
        sa.Column("schema_id", sa.Integer, nullable=False, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("schema", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("schema_id", name="pk_bolide_schemas"),
        sa.UniqueConstraint("fingerprint", name="uq_bolide_schemas_fingerprint"),
    )
    op.create_table(
        "bolide_schema_versions",
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("schema_id", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("subject", "version", name="pk_bolide_schema_versions"),
        sa.UniqueConstraint("subject", "schema_id", name="uq_bolide_schema_versions_schema"),
        sa.ForeignKeyConstraint(
            ["schema_id"], ["bolide_schemas.schema_id"], name="fk_bolide_schema_versions_schema"
        ),
    )
    op.create_table(
        "bolide_schema_subjects",
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("compatibility", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("subject", name="pk_bolide_schema_subjects"),
    )


def downgrade() -> None:
    """Drop the schema registry (records already written keep their ids, now unresolvable)."""
    op.drop_table("bolide_schema_subjects")
    op.drop_table("bolide_schema_versions")
    op.drop_table("bolide_schemas")
