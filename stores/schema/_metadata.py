"""The ``MetaData`` every bolide table is defined on, and the Alembic version table's name."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["VERSION_TABLE", "metadata"]

#: Alembic's version table for bolide's revisions (kept apart from an application's own).
VERSION_TABLE = "bolide_alembic_version"

#: One metadata for every table, so that ``alembic check`` compares them all with the revisions.
metadata = sa.MetaData()
