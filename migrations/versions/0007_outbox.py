"""The transactional outbox: rows an application adds inside its own transaction, published
to Kafka by a relay after they commit (``bolide.stores.Outbox``), and the transactional
relays' epochs and batch numbers (``bolide_outbox_relays``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_outbox`` and ``bolide_outbox_relays``."""
    op.create_table(
        "bolide_outbox",
        # SQLite: INTEGER PRIMARY KEY is the rowid, numbered in insert (= commit) order.
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True),
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("lane", sa.BigInteger, nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=True),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("payload", sa.LargeBinary, nullable=True),
        sa.Column("headers", sa.LargeBinary, nullable=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("sent_ms", sa.BigInteger, nullable=True),
        sa.Column("kafka_offset", sa.BigInteger, nullable=True),
        sa.Column("relay", sa.String(255), nullable=True),
        sa.Column("batch", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_bolide_outbox"),
    )
    # Partial indexes: the relay's queries touch pending rows only, however many were sent.
    pending = sa.text("sent_ms IS NULL")
    for name, columns in (
        ("ix_bolide_outbox_pending", ["id"]),
        ("ix_bolide_outbox_lane", ["lane", "id"]),
    ):
        op.create_index(
            name, "bolide_outbox", columns, postgresql_where=pending, sqlite_where=pending
        )
    op.create_table(
        "bolide_outbox_relays",
        sa.Column("relay", sa.String(255), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("batch", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("relay", name="pk_bolide_outbox_relays"),
    )


def downgrade() -> None:
    """Drop both tables: rows not yet published are lost with them."""
    op.drop_table("bolide_outbox_relays")
    op.drop_index("ix_bolide_outbox_lane", table_name="bolide_outbox")
    op.drop_index("ix_bolide_outbox_pending", table_name="bolide_outbox")
    op.drop_table("bolide_outbox")
