"""The history tables (the archive of Kafka records) as SQLAlchemy Core objects.

Keys and header values are bytes, so equality on them takes a bytes parameter. PostgreSQL
indexes them with hash indexes: a btree entry is limited to about 2.7 kB, a Kafka key is not.
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["HEADERS", "RECORDS"]

#: One row per archived Kafka record.
RECORDS = sa.Table(
    "bolide_records",
    metadata,
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    sa.Column("timestamp_ms", sa.BigInteger, nullable=True),
    sa.Column("key", sa.LargeBinary, nullable=True),
    sa.Column("payload", sa.LargeBinary, nullable=True),  # NULL: a tombstone (0005)
    sa.PrimaryKeyConstraint("stream", "kafka_partition", "kafka_offset", name="pk_bolide_records"),
    sa.Index("ix_bolide_records_stream_time", "stream", "timestamp_ms"),
    sa.Index("ix_bolide_records_key", "key", postgresql_using="hash"),
)

#: One row per header of an archived record; ``header_index`` keeps their order and repeats.
HEADERS = sa.Table(
    "bolide_record_headers",
    metadata,
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    sa.Column("header_index", sa.Integer, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("value", sa.LargeBinary, nullable=False),
    sa.PrimaryKeyConstraint(
        "stream", "kafka_partition", "kafka_offset", "header_index", name="pk_bolide_record_headers"
    ),
    sa.ForeignKeyConstraint(
        ["stream", "kafka_partition", "kafka_offset"],
        ["bolide_records.stream", "bolide_records.kafka_partition", "bolide_records.kafka_offset"],
        name="fk_bolide_record_headers_record",
        ondelete="CASCADE",
    ),
    sa.Index("ix_bolide_record_headers_value", "value", postgresql_using="hash"),
)
