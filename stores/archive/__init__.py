"""Archiver: tails streams into the history store, at least once in, exactly once in the table.

The names live in ``bolide.stores.archive.archiver``; this package names them."""

from bolide.stores.archive.archiver import (
    Archiver,
    ArchiverStats,
    ProgressCallback,
    RejectHandler,
    write_typed,
)

__all__ = [
    "Archiver",
    "ArchiverStats",
    "ProgressCallback",
    "RejectHandler",
    "write_typed",
]
