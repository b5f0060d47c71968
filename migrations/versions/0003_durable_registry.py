"""Durable client registry: clients, their claims and last-seen times, and their markers.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_durable_clients`` and ``bolide_durable_markers``."""
    op.create_table(
        "bolide_durable_clients",
        sa.Column("durable_id", sa.String(255), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("streams", sa.Text, nullable=False),
        sa.Column("timeout_s", sa.Float, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
        sa.Column("connected", sa.Boolean, nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("lease_until_ms", sa.BigInteger, nullable=True),
        sa.Column("connections", sa.Integer, nullable=False),
        sa.Column("marker_ms", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("durable_id", name="pk_bolide_durable_clients"),
    )
    op.create_table(
        "bolide_durable_markers",
        sa.Column("durable_id", sa.String(255), nullable=False),
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "durable_id", "stream", "kafka_partition", name="pk_bolide_durable_markers"
        ),
        sa.ForeignKeyConstraint(
            ["durable_id"],
            ["bolide_durable_clients.durable_id"],
            name="fk_bolide_durable_markers_client",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    """Drop the registry: every durable client is forgotten (their Kafka offsets stay)."""
    op.drop_table("bolide_durable_markers")
    op.drop_table("bolide_durable_clients")
