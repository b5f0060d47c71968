"""What a dead letter carries, whichever part of bolide sent it.

A record that cannot be handled (undecodable, a handler that still fails after its retries, a
sequence the resequencer must reject) goes to a dead-letter stream as it was (same key,
payload and headers) plus three headers, all UTF-8 text so raw consumers and Spark read them:

``bolide.reason``
    A short token from ``Reason``.
``bolide.reason.detail``
    A sentence for people.
``bolide.source``
    Where the record came from: ``<stream>/<partition>/<offset>``, when it was read from one.

A dead letter republished by ``bolide.stores.DeadLetters.replay`` loses those three and carries
``bolide.replayed.from``: the id (``<stream>/<partition>/<offset>``) of the dead letter.

``DeadLetterSink`` is the one place a receiver's or resequencer's ``dead_letter`` option (a
``Publisher`` or a function) is told apart and sent to; ``check_dead_letter`` refuses a bad one.
"""

from __future__ import annotations

import enum
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeAlias, TypeVar

from bolide.facade.config import Cluster, PublisherConfig, StreamConfig
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record

__all__ = [
    "DETAIL_HEADER",
    "REASON_HEADER",
    "REPLAYED_FROM_HEADER",
    "SOURCE_HEADER",
    "DeadLetterSink",
    "DeadLetterTarget",
    "LetterBox",
    "LetterDone",
    "Reason",
    "check_dead_letter",
    "letter",
    "parse_position",
    "replayed",
]

#: Where a receiver sends a record it gives up: a dead-letter stream's publisher, or
#: ``fn(record, error)``.
DeadLetterTarget: TypeAlias = Publisher | Callable[[Record, BaseException], object]

REASON_HEADER = "bolide.reason"
DETAIL_HEADER = "bolide.reason.detail"
#: Where a dead letter came from: ``<stream>/<partition>/<offset>`` of the original record.
SOURCE_HEADER = "bolide.source"
#: On a replayed dead letter: the id ``<stream>/<partition>/<offset>`` of the dead letter.
REPLAYED_FROM_HEADER = "bolide.replayed.from"

_WHY = frozenset((REASON_HEADER, DETAIL_HEADER))
_OURS = _WHY | {SOURCE_HEADER}


class Reason(enum.StrEnum):
    """Why a record went to the dead-letter target (the ``bolide.reason`` header value)."""

    UNDECODABLE = "undecodable"
    """The subscriber's serde could not decode the value."""
    FAILED = "failed"
    """A receiver's handler still raised after its last attempt (``Retry``)."""
    MALFORMED = "malformed"
    """A sequence header is missing, empty, not UTF-8 or not a decimal number."""
    OUT_OF_RANGE = "out_of_range"
    """The sequence number is negative or not below the group size."""
    SIZE_MISMATCH = "size_mismatch"
    """The record's size differs from the size the group's first record gave."""
    TOO_LARGE = "too_large"
    """Batch mode: the group is larger than the resequencer's capacity and can never complete."""
    TIMEOUT = "timeout"
    """The group did not complete within the timeout (``on_timeout="dead_letter"``)."""
    LATE = "late"
    """The record belongs to a group that already timed out."""
    REJECTED = "rejected"
    """The application rejected it on a share group (``ShareSubscriber.reject``)."""


def letter(record: Record, reason: Reason | str, detail: str, source: str | None = None) -> Record:
    """The dead letter for ``record``: same key, payload and headers, plus why and whence.

    ``source`` is ``<stream>/<partition>/<offset>``. The headers a previous dead-lettering
    added are replaced (the source only by a new one), so a record dead-lettered twice says
    why the last time.
    """
    replaced = _OURS if source is not None else _WHY
    headers = [h for h in record.headers if h[0] not in replaced]
    headers += [(REASON_HEADER, str(reason).encode()), (DETAIL_HEADER, detail.encode())]
    if source is not None:
        headers.append((SOURCE_HEADER, source.encode()))
    return Record(record.data, key=record.key, headers=headers)


#: What a dead-letter function is given after the record: the error (receivers) or the
#: ``Reason`` (the resequencer).
Cause = TypeVar("Cause")

#: Told how a dead letter went: ``None`` once the target took it, else why it did not.
LetterDone: TypeAlias = Callable[[BaseException | None], None]


def check_dead_letter(dead_letter: object, takes: str = "error") -> None:
    """Refuse a ``dead_letter`` option that is not ``None``, a ``Publisher`` or a callable.

    Args:
        dead_letter: The option as given.
        takes: What a function target gets after the record (``"error"``, ``"reason"``), for
            the message.

    Raises:
        TypeError: ``dead_letter`` is none of those (the message names the option).
    """
    if dead_letter is not None and not (
        isinstance(dead_letter, Publisher) or callable(dead_letter)
    ):
        raise TypeError(f"dead_letter must be a Publisher, a callable(record, {takes}) or None")


class DeadLetterSink(Generic[Cause]):
    """Where a receiver or a resequencer sends the records it gives up: a dead-letter stream's
    ``Publisher`` (it gets ``letter(record, reason, detail, source)``) or a function
    ``fn(record, cause)``. Which one is told apart here, once, so callers never ask.

    Thread safety: as the target's (a ``Publisher`` may be used from any thread).

    Attributes:
        stream: The dead-letter stream's name when the target is a ``Publisher``, else
            ``None``: for a caller that writes ``letter(...)`` to it within a transaction of
            its own instead of calling ``send_async``.
    """

    def __init__(self, target: Publisher | Callable[[Record, Cause], object]) -> None:
        self._publisher: Publisher | None = None
        self._fn: Callable[[Record, Cause], object] | None = None
        self.stream: str | None = None
        if isinstance(target, Publisher):
            self._publisher, self.stream = target, target.stream.name
        else:
            self._fn = target

    def send_async(
        self,
        record: Record,
        cause: Cause,
        done: LetterDone,
        *,
        reason: Reason | str,
        detail: str,
        source: str | None = None,
    ) -> Awaitable[Any] | None:
        """Send ``record``'s dead letter without waiting for a publisher's acknowledgement.

        ``done`` is called once: at once for a function (and a publisher that refuses the
        record), else on the publisher's delivery thread.

        Args:
            record: The record given up.
            cause: What a function target gets after the record.
            done: ``done(None)`` once the target took it, ``done(error)`` if not (a raise of
                the function or of ``publish_async``, or a failed delivery).
            reason, detail, source: The letter's headers (see ``letter``).

        Returns:
            What an ``async def`` function returned, not awaited and with ``done`` not yet
            called: the caller awaits it (on its event loop), then calls ``done``. Otherwise
            ``None``.
        """
        if self._publisher is not None:
            dead = letter(record, reason, detail, source)
            try:
                self._publisher.publish_async(dead, callback=lambda _, error: done(error))
            except Exception as exc:
                done(exc)
            return None
        assert self._fn is not None  # one of the two, set in __init__
        try:
            result = self._fn(record, cause)
        except Exception as exc:
            done(exc)
            return None
        if inspect.isawaitable(result):
            return result
        done(None)
        return None

    def send(
        self,
        record: Record,
        cause: Cause,
        *,
        reason: Reason | str,
        detail: str,
        source: str | None = None,
    ) -> None:
        """Send ``record``'s dead letter and wait: the publisher's ``publish`` (its
        acknowledgement), or the function's call (what it returns is not looked at).

        Args:
            record, cause, reason, detail, source: As for ``send_async``.

        Raises:
            Exception: What the publisher (``PublishError``, ``TimeoutError``...) or the
                function raised: the target did not take it.
        """
        if self._publisher is not None:
            self._publisher.publish(letter(record, reason, detail, source))
            return
        assert self._fn is not None  # one of the two, set in __init__
        self._fn(record, cause)

    def __repr__(self) -> str:
        target = self._publisher if self._publisher is not None else self._fn
        return f"DeadLetterSink({target!r})"


class LetterBox:
    """A subscriber's ``dead_letter`` stream: each letter published (and acknowledged) through
    one publisher, made on the first letter, from any thread."""

    def __init__(self, cluster: Cluster, stream: StreamConfig) -> None:
        self._cluster, self._stream = cluster, stream
        self._publisher: Publisher | None = None
        self._lock = threading.Lock()

    def post(self, record: Record, reason: Reason, detail: str) -> None:
        """Publish ``record``'s dead letter, saying ``reason`` and ``detail``, and whence."""
        with self._lock:
            if self._publisher is None:
                self._publisher = Publisher(self._cluster, PublisherConfig(stream=self._stream))
            publisher = self._publisher
        source = f"{record.stream}/{record.partition}/{record.offset}"
        publisher.publish(letter(record, reason, detail, source))

    def close(self) -> None:
        """Close the publisher, if a letter made one."""
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()


def replayed(dead: Record, dead_letter_id: str) -> Record:
    """The record a replay publishes for the dead letter ``dead``: its key, payload and
    headers without the dead-letter headers, plus ``bolide.replayed.from`` (a record replayed
    before keeps only the newest)."""
    gone = _OURS | {REPLAYED_FROM_HEADER}
    headers = [h for h in dead.headers if h[0] not in gone]
    headers.append((REPLAYED_FROM_HEADER, dead_letter_id.encode()))
    return Record(dead.data, key=dead.key, headers=headers)


def parse_position(text: str) -> tuple[str, int, int] | None:
    """``(stream, partition, offset)`` from ``<stream>/<partition>/<offset>`` (a
    ``bolide.source`` value or a dead letter's id); ``None`` when ``text`` is not one.

    Kafka topic names hold no ``/``, so the last two parts are the numbers.
    """
    stream, sep, rest = text.partition("/")
    partition, sep2, offset = rest.partition("/")
    if not (sep and sep2 and stream and partition.isdigit() and offset.isdigit()):
        return None
    if not (partition.isascii() and offset.isascii()):
        return None
    return stream, int(partition), int(offset)
