"""Sequence headers: what marks a record as part of a sequence group, and how to stamp it.

A resequenced record carries three headers (all UTF-8 / ASCII text, so raw consumers and Spark
can read them):

``bolide.seq.group``
    The group id (non-empty UTF-8).
``bolide.seq.size``
    How many records the group holds, as ASCII decimal (``1`` or more).
``bolide.seq.number``
    The record's place in the group, 0-based ASCII decimal: ``0`` to ``size - 1``.

Rejected records are sent to a dead-letter target with the headers of
``bolide.facade.deadletter``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bolide.facade.deadletter import Reason
from bolide.facade.record import HeadersInput, Record, normalize_headers

if TYPE_CHECKING:
    from bolide.facade.publisher import Publisher

__all__ = [
    "NUMBER_HEADER",
    "SEQUENCE_GROUP_HEADER",
    "SIZE_HEADER",
    "Invalid",
    "Sequence",
    "parse_sequence",
    "publish_sequence",
    "scan_sequence",
    "sequence_headers",
]

SEQUENCE_GROUP_HEADER = "bolide.seq.group"
SIZE_HEADER = "bolide.seq.size"
NUMBER_HEADER = "bolide.seq.number"

_SEQ_NAMES = frozenset((SEQUENCE_GROUP_HEADER, SIZE_HEADER, NUMBER_HEADER))
#: More digits than this is not a number anyone means (and keeps int() cheap on hostile input).
_MAX_DIGITS = 18


@dataclass(frozen=True, slots=True)
class Sequence:
    """The parsed sequence headers of one record."""

    group: str
    size: int
    number: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """Sequence headers that are present but unusable."""

    reason: Reason
    detail: str
    group: str | None = None


def _number(name: str, raw: object) -> int | str:
    """Parse optional ``-`` and ASCII digits; return the int or an error sentence."""
    if not isinstance(raw, bytes):
        return f"{name} must be ASCII decimal, got {raw!r}"
    digits = raw[1:] if raw[:1] == b"-" else raw
    if not digits or len(digits) > _MAX_DIGITS or not digits.isdigit():
        return f"{name} must be ASCII decimal, got {raw[:40]!r}"
    return int(raw)


def parse_sequence(record: Record) -> Sequence | Invalid | None:
    """Read a record's sequence headers.

    Returns:
        ``None`` when the record has none of the three headers (it is not sequenced);
        a ``Sequence``; or an ``Invalid`` naming what is wrong. Repeated headers: the last
        value counts, as with ``Record.header``. Never raises on header content.
    """
    group_raw = size_raw = number_raw = None
    for name, value in record.headers:
        if name in _SEQ_NAMES:
            if name == SEQUENCE_GROUP_HEADER:
                group_raw = value
            elif name == SIZE_HEADER:
                size_raw = value
            else:
                number_raw = value
    if group_raw is None and size_raw is None and number_raw is None:
        return None
    group: str | None = None
    if group_raw is not None:
        try:
            group = group_raw.decode("utf-8") or None
        except (UnicodeDecodeError, AttributeError):
            group = None
    if group is None:
        return Invalid(Reason.MALFORMED, f"{SEQUENCE_GROUP_HEADER} is missing, empty or not UTF-8")
    if size_raw is None or number_raw is None:
        missing = SIZE_HEADER if size_raw is None else NUMBER_HEADER
        return Invalid(Reason.MALFORMED, f"{missing} is missing", group)
    size = _number(SIZE_HEADER, size_raw)
    if isinstance(size, str):
        return Invalid(Reason.MALFORMED, size, group)
    if size < 1:
        return Invalid(Reason.MALFORMED, f"{SIZE_HEADER} must be >= 1, got {size}", group)
    number = _number(NUMBER_HEADER, number_raw)
    if isinstance(number, str):
        return Invalid(Reason.MALFORMED, number, group)
    if not 0 <= number < size:
        return Invalid(
            Reason.OUT_OF_RANGE, f"{NUMBER_HEADER}={number} is outside 0..{size - 1}", group
        )
    return Sequence(group, size, number)


def scan_sequence(record: Record) -> tuple[bytes, int, int] | Invalid | None:
    """``parse_sequence`` for hot paths: ``(raw group, size, number)`` in the valid case.

    The group stays bytes and its UTF-8 is not checked here: callers check it once per group
    (with ``parse_sequence``). Anything unusual is left to ``parse_sequence``.
    """
    headers = record.headers
    group: object
    size: object
    number: object
    if (
        len(headers) >= 3
        and headers[-3][0] == SEQUENCE_GROUP_HEADER
        and headers[-2][0] == SIZE_HEADER
        and headers[-1][0] == NUMBER_HEADER
    ):
        # Where ``sequence_headers`` puts them: being last, they are the values that count.
        group, size, number = headers[-3][1], headers[-2][1], headers[-1][1]
    else:
        found = dict(headers)  # the last value of a repeated header counts
        group = found.get(SEQUENCE_GROUP_HEADER)
        size = found.get(SIZE_HEADER)
        number = found.get(NUMBER_HEADER)
    if group is None and size is None and number is None:
        return None
    if (
        isinstance(group, bytes)
        and isinstance(size, bytes)
        and isinstance(number, bytes)
        and group
        and size.isdigit()
        and number.isdigit()
        and len(size) <= _MAX_DIGITS
        and len(number) <= _MAX_DIGITS
    ):
        size_int = int(size)
        number_int = int(number)
        if number_int < size_int:
            return group, size_int, number_int
    parsed = parse_sequence(record)
    if isinstance(parsed, Sequence):  # pragma: no cover - the fast path takes every valid case
        return parsed.group.encode(), parsed.size, parsed.number
    return parsed


def sequence_headers(group: str, size: int, number: int) -> list[tuple[str, bytes]]:
    """The three headers that place a record at ``number`` (0-based) in a group of ``size``."""
    return [
        (SEQUENCE_GROUP_HEADER, group.encode()),
        (SIZE_HEADER, str(size).encode("ascii")),
        (NUMBER_HEADER, str(number).encode("ascii")),
    ]


def publish_sequence(
    publisher: Publisher,
    payloads: Iterable[Any],
    group: str,
    *,
    headers: HeadersInput = None,
    timeout_s: float | None = 30.0,
) -> list[int]:
    """Publish payloads as one resequenced group and wait for their offsets.

    Each record gets the three sequence headers (numbers 0-based, in ``payloads`` order) and
    ``group`` as its message group, hence its Kafka key: the whole group lands on one
    partition and so is read by one member of a subscriber group.

    Args:
        publisher: The publisher to use.
        payloads: Bytes, or objects the publisher's serde encodes.
        group: The group id (non-empty).
        headers: Extra headers for every record (the sequence headers are added after them).
        timeout_s: How long to wait for the broker's acknowledgements; ``None`` waits forever.

    Returns:
        The offsets, in sequence order.

    Raises:
        ValueError: ``group`` is empty or ``payloads`` is empty.
        TypeError: A payload is neither bytes nor something the serde encodes.
        PublishError: The broker refused a record.
        TimeoutError: No acknowledgement within ``timeout_s``.
    """
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty string")
    items = list(payloads)
    if not items:
        raise ValueError("payloads must hold at least one payload: a group cannot be empty")
    extra = normalize_headers(headers)
    serde = publisher.config.serde
    records = []
    for number, item in enumerate(items):
        if isinstance(item, bytes | bytearray | memoryview):
            data = bytes(item)
        elif serde is not None:
            data = serde.encode(item, stream=publisher.stream.name)
        else:
            raise TypeError(
                f"payloads[{number}] must be bytes, not {type(item).__name__}; "
                "configure PublisherConfig(serde=...) to publish objects"
            )
        records.append(
            Record(data, headers=extra + sequence_headers(group, len(items), number), group=group)
        )
    futures = [publisher.publish_async(record) for record in records]
    publisher.flush(0 if timeout_s is None else timeout_s)
    return [future.result(timeout_s) for future in futures]
