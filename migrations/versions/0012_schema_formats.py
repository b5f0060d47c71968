"""Schema formats: each registered schema keeps its format (AVRO, PROTOBUF or JSON), the
schemas it references, and a GUID (what Confluent's header framing of a payload carries).

Rows written before this revision are Avro schemas without references; their GUID is filled
in from their fingerprint, as the registry computes it for new rows (in offline mode, where no
row can be read, by the registry the first time it hands that GUID out).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The namespace of bolide's schema GUIDs (``bolide.facade.schemas.registry.guid_of``).
_GUIDS = uuid.UUID("6f1c5f4e-52b1-4d3e-9a7c-2d0b8f3c1a10")


def upgrade() -> None:
    """Add ``schema_type``, ``schema_references`` and ``guid`` to ``bolide_schemas``."""
    with op.batch_alter_table("bolide_schemas") as batch:
        batch.add_column(
            sa.Column("schema_type", sa.String(16), nullable=False, server_default="AVRO")
        )
        batch.add_column(sa.Column("schema_references", sa.Text, nullable=True))
        batch.add_column(sa.Column("guid", sa.String(36), nullable=True))
    schemas = sa.table(
        "bolide_schemas",
        sa.column("schema_id", sa.Integer),
        sa.column("fingerprint", sa.String),
        sa.column("guid", sa.String),
    )
    if op.get_context().as_sql:
        op.create_index("ix_bolide_schemas_guid", "bolide_schemas", ["guid"], unique=True)
        return
    conn = op.get_bind()
    for row in conn.execute(sa.select(schemas.c.schema_id, schemas.c.fingerprint)).all():
        guid = str(uuid.uuid5(_GUIDS, row.fingerprint))
        conn.execute(
            sa.update(schemas).where(schemas.c.schema_id == row.schema_id).values(guid=guid)
        )
    op.create_index("ix_bolide_schemas_guid", "bolide_schemas", ["guid"], unique=True)


def downgrade() -> None:
    """Drop the three columns (schemas of other formats stay, as text)."""
    op.drop_index("ix_bolide_schemas_guid", table_name="bolide_schemas")
    with op.batch_alter_table("bolide_schemas") as batch:
        batch.drop_column("guid")
        batch.drop_column("schema_references")
        batch.drop_column("schema_type")
