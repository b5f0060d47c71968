"""Records and record batches: Meteor's unit of data, carried as a plain Kafka message.

The record type and its per-record constructors live in ``_record_cy`` (compiled where a C
compiler built it, docs/performance.md#compiled-record-path); they are imported from here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from bolide.facade._record_cy import (
    MESSAGE_GROUP_HEADER,
    Headers,
    HeadersInput,
    Record,
    SharedRecord,
    group_from_headers,
    headers_or_none,
    normalize_headers,
    record_from_message,
    trusted_record,
    unshared,
)

__all__ = [
    "MESSAGE_GROUP_HEADER",
    "Headers",
    "HeadersInput",
    "Record",
    "RecordBatch",
    "SharedRecord",
    "group_from_headers",
    "headers_or_none",
    "normalize_headers",
    "record_from_message",
    "trusted_record",
    "unshared",
]


class RecordBatch(Sequence[Record]):
    """The (possibly empty) result of one ``poll``: iterable, sized, indexable."""

    __slots__ = ("_records",)

    def __init__(self, records: list[Record] | None = None) -> None:
        self._records: list[Record] = records if records is not None else []

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def is_empty(self) -> bool:
        """True when the poll returned nothing."""
        return not self._records

    def first(self) -> Record | None:
        """The first record, or ``None`` when empty."""
        return self._records[0] if self._records else None

    def last(self) -> Record | None:
        """The last record, or ``None`` when empty."""
        return self._records[-1] if self._records else None

    def __repr__(self) -> str:
        return f"RecordBatch({len(self._records)} records)"
