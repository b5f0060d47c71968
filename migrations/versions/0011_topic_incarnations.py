"""Topic incarnations: which Kafka topic (topic id, cluster id) each stream's stored rows
belong to, so that a topic deleted and created again under the same name starts a history of
its own instead of mixing with, skipping or trimming against the old one's.

Rows written before this revision belong to the incarnation the store sees first: the first
time an archiver, a subscriber or a durable client meets the stream's topic, its topic id and
cluster id are recorded with ``stored_as`` equal to the stream's name, the key those rows
already carry. Nothing else changes in the existing tables.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_topics``."""
    op.create_table(
        "bolide_topics",
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("topic_id", sa.String(32), nullable=False),
        sa.Column("cluster_id", sa.String(64), nullable=False),
        sa.Column("stored_as", sa.String(255), nullable=False),
        sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
        sa.Column("retired_ms", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("stream", "topic_id", name="pk_bolide_topics"),
        sa.UniqueConstraint("stored_as", name="uq_bolide_topics_stored_as"),
    )


def downgrade() -> None:
    """Drop ``bolide_topics``; the rows of later incarnations stay under their keys."""
    op.drop_table("bolide_topics")
