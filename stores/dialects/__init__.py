"""What differs between the databases the history store supports: one object per database.

The names live in ``bolide.stores.dialects.dialect``; this package names them."""

from bolide.stores.dialects.dialect import (
    DIALECTS,
    FILTER_ROLE,
    FilterGuard,
    HeaderRow,
    PostgreSQL,
    RecordRow,
    RelayGuard,
    RelayScope,
    Sent,
    SqlDialect,
    SQLite,
    describe_error,
    dialect_of,
    on_driver,
    retriable,
)

__all__ = [
    "DIALECTS",
    "FILTER_ROLE",
    "FilterGuard",
    "HeaderRow",
    "PostgreSQL",
    "RecordRow",
    "RelayGuard",
    "RelayScope",
    "SQLite",
    "Sent",
    "SqlDialect",
    "describe_error",
    "dialect_of",
    "on_driver",
    "retriable",
]
