"""Helpers for message-group and resequencer tests: sequenced records and a settable clock."""

from __future__ import annotations

from bolide.facade import Record
from bolide.facade.resequencer.sequence import (
    NUMBER_HEADER,
    SEQUENCE_GROUP_HEADER,
    sequence_headers,
)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def seq_record(
    group: str,
    size: int,
    number: int,
    *,
    offset: int | None = None,
    partition: int | None = 0,
    data: bytes | None = None,
) -> Record:
    """A record as a subscriber would deliver it: sequence headers, partition and offset."""
    record = Record(
        data if data is not None else f"{group}:{number}".encode(),
        headers=sequence_headers(group, size, number),
        group=group,
    )
    record.partition = partition if offset is not None else None
    record.offset = offset
    return record


def plain_record(*, offset: int | None = None, partition: int | None = 0) -> Record:
    """A record without sequence headers."""
    record = Record(b"plain")
    record.partition = partition if offset is not None else None
    record.offset = offset
    return record


def seq_of(record: Record) -> tuple[str, int]:
    """``(group, number)`` of a sequenced record."""
    group = record.header(SEQUENCE_GROUP_HEADER)
    number = record.header(NUMBER_HEADER)
    assert group is not None and number is not None
    return group.decode(), int(number)
