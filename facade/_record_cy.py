"""The record type and its construction from a consumed message: the per-record path.

Written in Cython's pure-Python mode: setup.py compiles it into an extension module where a C
compiler is at hand, and it runs as it is otherwise (``bolide.facade._cext``). Either way it
behaves the same; ``bolide.facade.record`` is where the names are imported from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from confluent_kafka import Message

    from bolide.facade import _cython as cython
else:
    try:
        import cython  # the compiler needs this import by name
    except ModuleNotFoundError:  # Cython is a build requirement only
        from bolide.facade import _cython as cython

__all__ = [
    "MESSAGE_GROUP_HEADER",
    "Headers",
    "HeadersInput",
    "Record",
    "SharedRecord",
    "group_from_headers",
    "headers_or_none",
    "is_compiled",
    "normalize_headers",
    "record_from_message",
    "trusted_record",
    "unshared",
]

#: Carries a record's message group (``Record.group``, the Kafka key), so that readers can tell
#: a group id from any other key. Not the subscriber group (a Kafka consumer group) nor the
#: resequencing group (``SEQUENCE_GROUP_HEADER``); see docs/concepts.md.
MESSAGE_GROUP_HEADER = "bolide.group"

Headers: TypeAlias = list[tuple[str, bytes]]
HeadersInput: TypeAlias = Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None


def is_compiled() -> bool:
    """True when this module runs as an extension module built by Cython."""
    return bool(cython.compiled)


def _header_value(name: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b""
    raise TypeError(f"headers: value of {name!r} must be bytes or str, not {type(value).__name__}")


def normalize_headers(headers: HeadersInput) -> Headers:
    """Return headers as a list of ``(str, bytes)`` pairs, as confluent-kafka exposes them.

    Args:
        headers: A mapping or an iterable of pairs; ``str`` values are UTF-8 encoded.

    Raises:
        TypeError: A name is not a string or a value is neither bytes nor str.
    """
    if headers is None:
        return []
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out: Headers = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("headers: expected (name, value) pairs")
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"headers: name must be str, not {type(name).__name__}")
        out.append((name, _header_value(name, value)))
    return out


@cython.cclass
class Record:
    """One record of a stream.

    Args:
        data: The payload bytes; ``None`` is a tombstone (a null value: on a compacted
            topic, the key's deletion marker).
        key: The Kafka key; defaults to the group id when ``group`` is set.
        headers: A dict or a list of ``(str, bytes)`` pairs (repeated names allowed).
        group: Message group id (HornetQ's JMSXGroupID): becomes the Kafka key, so one member
            of a subscriber group reads the group in order (docs/concepts.md, glossary).
        partition: Publish to this partition (Kafka's ``ProducerRecord`` partition); by
            default the key, or the publisher, picks it. A record read or already published
            (its ``offset`` set) goes where the key or the publisher sends it.

    After publishing or polling, ``offset``, ``partition`` and ``timestamp_ms`` are set.
    Durable replays set ``replayed``; a serde sets ``value`` to the decoded object; a share
    group sets ``delivery_count`` (1 on the first delivery; ``None`` elsewhere).
    """

    __slots__ = (
        "_headers",
        "data",
        "delivery_count",
        "group",
        "key",
        "offset",
        "partition",
        "replayed",
        "stream",
        "timestamp_ms",
        "value",
    )

    def __init__(
        self,
        data: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput = None,
        group: str | None = None,
        *,
        partition: int | None = None,
    ) -> None:
        if type(data) is not bytes and data is not None:  # the common case skips the checks
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(
                    f"data must be bytes or None (a tombstone), not {type(data).__name__}"
                )
            data = bytes(data)
        if group is not None:
            if not isinstance(group, str):
                raise TypeError(f"group must be a str, not {type(group).__name__}")
            if not group:
                raise ValueError("group must be a non-empty string")
        if isinstance(key, str):
            key = key.encode()
        elif key is not None and not isinstance(key, bytes):
            raise TypeError(f"key must be bytes or str, not {type(key).__name__}")
        if partition is not None:
            if type(partition) is not int or partition < 0:
                raise ValueError(f"partition must be an int >= 0, not {partition!r}")
            if group is not None:
                raise ValueError(
                    "partition and group contradict each other: a group's partition is its key's"
                )
        if group is not None and key is not None and key != group.encode():
            raise ValueError(
                f"key {key!r} and group {group!r} disagree: a group's records are keyed by "
                "the group id, so that one subscriber reads them all"
            )
        self.data: bytes | None = data
        self.group = group
        self.key: bytes | None = key if key is not None else (group.encode() if group else None)
        self._headers: Headers | None = None if headers is None else normalize_headers(headers)
        self.offset: int | None = None
        self.partition: int | None = partition
        self.timestamp_ms: int | None = None
        self.replayed: bool = False
        self.delivery_count: int | None = None
        self.stream: str | None = None
        self.value: Any = None

    @property
    def headers(self) -> Headers:
        """The headers, a list of ``(str, bytes)`` pairs the record owns (repeated names
        allowed); empty when there are none."""
        # Made on first use: most records have no headers, and every list the collector must
        # track costs reads and publishes more than the list itself (docs/performance.md).
        headers = self._headers
        if headers is None:
            headers = self._headers = []
        return headers

    @headers.setter
    def headers(self, headers: Headers) -> None:
        self._headers = headers

    def header(self, name: str) -> bytes | None:
        """Return the last value of header ``name``, or ``None``."""
        found = None
        for key, value in self._headers or ():
            if key == name:
                found = value
        return found

    def __repr__(self) -> str:
        data = self.data
        if data is not None and len(data) > 32:
            data = data[:32] + b"..."
        return (
            f"Record(stream={self.stream!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, data={data!r}{', replayed=True' if self.replayed else ''})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (
            self.data == other.data
            and self.key == other.key
            and (self._headers or []) == (other._headers or [])
            and self.offset == other.offset
            and self.partition == other.partition
            and self.stream == other.stream
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: offset is set after publish


class SharedRecord(Record):
    """A record read through the shared fetch: one object for every subscriber of the process
    that reads it (docs/performance.md#shared-fetch). Publishing it publishes a copy
    (``unshared``), so the new offset stamped on delivery is not what the others read."""

    __slots__ = ()


@cython.locals(copy=Record)
def unshared(record: Record) -> Record:
    """A plain ``Record`` with ``record``'s fields (and its own header list)."""
    copy: Record = Record.__new__(Record)
    for name in Record.__slots__:
        setattr(copy, name, getattr(record, name))
    if copy._headers is not None:
        copy._headers = list(copy._headers)
    return copy


def headers_or_none(record: Record) -> Headers | None:
    """``record``'s headers, or ``None`` when it has none (without making an empty list)."""
    return record._headers or None


def group_from_headers(headers: Headers) -> str | None:
    """The message group a ``bolide.group`` header names, or ``None``."""
    for name, value in headers:
        if name == MESSAGE_GROUP_HEADER:
            return value.decode(errors="replace")
    return None


@cython.locals(record=Record)
def trusted_record(
    data: bytes | None,
    key: bytes | None,
    headers: Headers,
    stream: str | None,
    partition: int | None,
    offset: int | None,
    timestamp_ms: int | None,
) -> Record:
    """A ``Record`` built from fields that are already in shape, without validation.

    The one constructor for records read back from Kafka, the SQL history or Spark: their
    values came from a broker or our own tables, so the checks and copies of ``Record()`` are
    skipped (reads are hot). Every slot is set: ``group`` from the ``bolide.group`` header,
    ``replayed`` false, ``value`` none.

    Args:
        data: The payload, as ``bytes`` (not a ``memoryview``), or ``None`` (a tombstone).
        key: The Kafka key, as ``bytes`` or ``None``.
        headers: ``(str, bytes)`` pairs; the record owns the list from now on.
        stream: The stream (topic) name.
        partition: The partition.
        offset: The Kafka offset.
        timestamp_ms: The record's timestamp in epoch milliseconds.
    """
    record: Record = Record.__new__(Record)  # no __init__: no checks, no copies
    record.data = data
    record.key = key
    record._headers = headers
    record.group = group_from_headers(headers) if headers else None
    record.stream = stream
    record.partition = partition
    record.offset = offset
    record.timestamp_ms = timestamp_ms
    record.replayed = False
    record.delivery_count = None
    record.value = None
    return record


@cython.locals(record=Record)
def record_from_message(
    msg: Message, topic: str | None = None, kind: type[Record] = Record
) -> Record:
    """A ``Record`` from a consumed Kafka message (a null value stays ``None``: a tombstone;
    null header values become ``b""``).

    Args:
        msg: A message without error.
        topic: The topic name when the caller knows it (saves a call per record).
        kind: ``Record`` or a subclass (``SharedRecord``): the type made. A compiled record
            type's class cannot be reassigned afterwards, so it is chosen here.
    """
    # Consumed messages carry a list of pairs or None, never a dict (an annotation, not cast():
    # no call on the poll path).
    headers: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
    # trusted_record's body, inlined: one Python call fewer per record read (reads are hot).
    if kind is Record:  # the common case: the compiled module allocates it directly
        record: Record = Record.__new__(Record)
    else:
        record = kind.__new__(kind)
    record.data = msg.value()
    record.key = msg.key()
    if headers:
        # A copy (the message keeps its own list); one pass finds the group and any null value.
        pairs = list(headers)
        group = None
        for name, value in pairs:
            if value is None:  # rare: rebuild with b"" for the nulls
                pairs = [(n, v if v is not None else b"") for n, v in pairs]
                group = group_from_headers(pairs)  # type: ignore[arg-type]
                break
            if group is None and name == MESSAGE_GROUP_HEADER:
                group = value.decode(errors="replace")
        record._headers = pairs  # type: ignore[assignment]  # no null values left
        record.group = group
    else:
        record._headers = None  # an empty list is made if it is ever asked for
        record.group = None
    record.stream = topic if topic is not None else msg.topic()
    record.partition = msg.partition()
    record.offset = msg.offset()
    record.timestamp_ms = msg.timestamp()[1]
    record.replayed = False
    record.delivery_count = None
    record.value = None
    return record
