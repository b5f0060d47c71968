"""The durable client registry tables as SQLAlchemy Core objects (revision ``0003``).

They live on the schema's one ``metadata`` so that ``alembic check`` compares them too.
Times are Unix epoch milliseconds (``BIGINT``), like Kafka's record timestamps: one type on
SQLite and PostgreSQL, and directly comparable with ``Record.timestamp_ms``.
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["DURABLE_CLIENTS", "DURABLE_MARKERS"]

#: One row per durable client: its claim (owner token and lease), last-seen time and timeout.
DURABLE_CLIENTS = sa.Table(
    "bolide_durable_clients",
    metadata,
    sa.Column("durable_id", sa.String(255), nullable=False),
    sa.Column("group_id", sa.String(255), nullable=False),
    sa.Column("streams", sa.Text, nullable=False),  # JSON list of stream names
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

#: The marker taken at a client's latest (re)connect: the end offset of every partition.
DURABLE_MARKERS = sa.Table(
    "bolide_durable_markers",
    metadata,
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
