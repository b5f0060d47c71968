"""The schema registry tables as SQLAlchemy Core objects (revisions ``0002`` and ``0012``).

They live on the schema's one ``metadata`` so that ``alembic check`` compares them too.
One row per distinct schema (its global id, format, text, references, fingerprint and GUID),
one per subject version, and one per subject whose compatibility level was set (BACKWARD when
absent).
"""

from __future__ import annotations

import sqlalchemy as sa

from bolide.stores.schema._metadata import metadata

__all__ = ["SCHEMAS", "SCHEMA_SUBJECTS", "SCHEMA_VERSIONS"]

#: One row per distinct schema: ids are global, as in Confluent Schema Registry.
SCHEMAS = sa.Table(
    "bolide_schemas",
    metadata,
    sa.Column("schema_id", sa.Integer, nullable=False, autoincrement=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("schema", sa.Text, nullable=False),
    # AVRO, PROTOBUF or JSON (Confluent's schemaType)
    sa.Column("schema_type", sa.String(16), nullable=False, server_default="AVRO"),
    # The schemas this one references: a JSON list of [name, subject, version]; NULL for none.
    sa.Column("schema_references", sa.Text, nullable=True),
    # What the header framing carries; unique, one per schema.
    sa.Column("guid", sa.String(36), nullable=True),
    sa.PrimaryKeyConstraint("schema_id", name="pk_bolide_schemas"),
    sa.UniqueConstraint("fingerprint", name="uq_bolide_schemas_fingerprint"),
    sa.Index("ix_bolide_schemas_guid", "guid", unique=True),
)

#: One row per version of a subject, numbered from 1.
SCHEMA_VERSIONS = sa.Table(
    "bolide_schema_versions",
    metadata,
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("schema_id", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("subject", "version", name="pk_bolide_schema_versions"),
    sa.UniqueConstraint("subject", "schema_id", name="uq_bolide_schema_versions_schema"),
    sa.ForeignKeyConstraint(
        ["schema_id"], ["bolide_schemas.schema_id"], name="fk_bolide_schema_versions_schema"
    ),
)

#: Compatibility level per subject; a subject without a row uses BACKWARD.
SCHEMA_SUBJECTS = sa.Table(
    "bolide_schema_subjects",
    metadata,
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Column("compatibility", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("subject", name="pk_bolide_schema_subjects"),
)
