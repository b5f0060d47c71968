"""The names of the typed archive's tables (``bolide.stores.typed_archive``).

Those tables are made at run time from each stream's Avro schema, never by a revision: the
migrations use ``is_typed_table`` to leave them out of what they compare.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_IDENT", "TYPED_TABLE_PREFIX", "is_typed_table", "typed_table_name"]

#: Every typed archive table's name starts with this (for Alembic filters and clean-ups).
TYPED_TABLE_PREFIX = "bolide_avro_"
#: The longest identifier PostgreSQL keeps, in bytes.
MAX_IDENT = 63
_UNSAFE = re.compile(r"[^a-z0-9_]")


def typed_table_name(stream: str) -> str:
    """The typed table of ``stream``: ``bolide_avro_<stream>``, made a safe SQL name.

    Names with characters other than lower-case letters, digits and ``_`` are folded and get a
    short hash of the stream's name, so two streams never share a table.
    """
    safe = _UNSAFE.sub("_", stream.lower())
    name = TYPED_TABLE_PREFIX + safe
    if safe != stream or len(name) > MAX_IDENT:
        digest = hashlib.sha1(stream.encode()).hexdigest()[:8]
        name = f"{TYPED_TABLE_PREFIX}{safe[: MAX_IDENT - len(TYPED_TABLE_PREFIX) - 9]}_{digest}"
    return name


def is_typed_table(name: str) -> bool:
    """True for a typed archive table's name (e.g. to keep them out of ``alembic check``)."""
    return name.startswith(TYPED_TABLE_PREFIX)
