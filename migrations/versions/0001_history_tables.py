"""History tables: archived records and their headers.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``bolide_records`` and ``bolide_record_headers`` with their indexes."""
    op.create_table(
        "bolide_records",
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("timestamp_ms", sa.BigInteger, nullable=True),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint(
            "stream", "kafka_partition", "kafka_offset", name="pk_bolide_records"
        ),
    )
    # By stream and time range (the common history query).
    op.create_index("ix_bolide_records_stream_time", "bolide_records", ["stream", "timestamp_ms"])
    # By key: equality only; hash on PostgreSQL, where btree entries cap at about 2.7 kB.
    op.create_index("ix_bolide_records_key", "bolide_records", ["key"], postgresql_using="hash")
    op.create_table(
        "bolide_record_headers",
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("header_index", sa.Integer, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("value", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint(
            "stream",
            "kafka_partition",
            "kafka_offset",
            "header_index",
            name="pk_bolide_record_headers",
        ),
        sa.ForeignKeyConstraint(
            ["stream", "kafka_partition", "kafka_offset"],
            [
                "bolide_records.stream",
                "bolide_records.kafka_partition",
                "bolide_records.kafka_offset",
            ],
            name="fk_bolide_record_headers_record",
            ondelete="CASCADE",
        ),
    )
    # By header value (then name): equality only, hash on PostgreSQL for the same reason.
    op.create_index(
        "ix_bolide_record_headers_value",
        "bolide_record_headers",
        ["value"],
        postgresql_using="hash",
    )


def downgrade() -> None:
    """Drop the history tables (and every archived record with them)."""
    op.drop_index("ix_bolide_record_headers_value", table_name="bolide_record_headers")
    op.drop_table("bolide_record_headers")
    op.drop_index("ix_bolide_records_key", table_name="bolide_records")
    op.drop_index("ix_bolide_records_stream_time", table_name="bolide_records")
    op.drop_table("bolide_records")
