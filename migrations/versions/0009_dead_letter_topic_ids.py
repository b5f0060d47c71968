"""Dead-letter books name the topic's incarnation: replays and purges carry the dead-letter
topic's id and the dead letter's own timestamp, so a topic deleted and created again (its
offsets start over at 0) is never taken for the one a row was written about.

Rows written before this revision get ``topic_id`` ``''`` (unknown incarnation) and a NULL
``timestamp_ms``; ``bolide.stores.deadletters._books`` says what such a row still covers.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Table, primary key name, the key's columns after ``stream`` and the place.
_TABLES = (
    ("bolide_dead_letter_replays", "pk_bolide_dead_letter_replays", ["target_stream"]),
    ("bolide_dead_letter_purges", "pk_bolide_dead_letter_purges", []),
)
_PLACE = ["stream", "kafka_partition", "kafka_offset"]


def upgrade() -> None:
    """Add ``topic_id`` (in the primary key) and ``timestamp_ms`` to both tables."""
    for table, key, rest in _TABLES:
        # SQLite cannot alter a primary key: batch mode copies the table there.
        with op.batch_alter_table(table, recreate="auto") as batch:
            # Part of the key, so NOT NULL: '' stands for "unknown incarnation".
            batch.add_column(
                sa.Column("topic_id", sa.String(64), nullable=False, server_default="")
            )
            batch.add_column(sa.Column("timestamp_ms", sa.BigInteger, nullable=True))
            batch.drop_constraint(key, type_="primary")
            batch.create_primary_key(key, ["stream", "topic_id", *_PLACE[1:], *rest])


def downgrade() -> None:
    """Drop both columns; of rows that differ only by incarnation, the newest one stays."""
    for table, key, rest in _TABLES:
        columns = [*_PLACE, *rest]
        stamp = "claimed_ms" if rest else "purged_ms"
        rows = sa.table(table, *(sa.column(c) for c in [*columns, stamp, "topic_id"]))
        newer = rows.alias("newer")
        later = sa.or_(
            newer.c[stamp] > rows.c[stamp],
            sa.and_(newer.c[stamp] == rows.c[stamp], newer.c.topic_id > rows.c.topic_id),
        )
        same_place = [newer.c[c] == rows.c[c] for c in columns]
        op.execute(sa.delete(rows).where(sa.exists().where(*same_place, later)))
        with op.batch_alter_table(table, recreate="auto") as batch:
            batch.drop_constraint(key, type_="primary")
            batch.drop_column("timestamp_ms")
            batch.drop_column("topic_id")
            batch.create_primary_key(key, columns)
