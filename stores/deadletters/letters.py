"""The dead-letter workbench: list, show, replay and purge the dead letters of a stream.

A dead-letter stream is an ordinary stream; what makes its records dead letters is the headers
every part of bolide adds when it gives a record up (``bolide.facade.deadletter``:
``bolide.reason``, ``bolide.reason.detail``, ``bolide.source``). ``DeadLetters`` reads such a
stream through the splice (the history store below Kafka's log start, Kafka from there), so it
sees archived dead letters and those still only in Kafka alike, with no archiver run first.
Replays and purges are kept in the store (revisions ``0008``, ``0009``), each naming its dead
letter by place, topic id and timestamp, so that a topic deleted and created again is never
taken for the one they were written about (``_books``). docs/dead-letters.md has the whole
story.

The workbench's parts beside it: reading a stream through the splice (``_scan``), ``where``
filters (``_filter``), which replay and purge rows cover which letter (``_books``), replaying
(``_replay``) and purging (``_purge``).
"""

from __future__ import annotations

import builtins
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bolide.facade.cluster import TOPIC_NAME
from bolide.facade.config import Cluster
from bolide.facade.deadletter import (
    DETAIL_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Reason,
    parse_position,
)
from bolide.facade.errors import DeadLetterNotFoundError, DeadLetterSourceError
from bolide.facade.record import Record, trusted_record
from bolide.stores.deadletters._books import Books, Letter
from bolide.stores.deadletters._filter import WHERE_TIMEOUT_MS, check_filter, select_ids
from bolide.stores.deadletters._purge import mark_and_delete, purged, trim_kafka
from bolide.stores.deadletters._replay import Job, Replay, replay_targets
from bolide.stores.deadletters._scan import StreamRead, read_one, read_stream
from bolide.stores.store import SqlStore

__all__ = ["DeadLetter", "DeadLetters"]

#: ``since``/``before``: a datetime (naive means UTC) or epoch milliseconds.
When = datetime.datetime | int
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: a record of a dead-letter stream and what its headers say.

    Attributes:
        stream: The dead-letter stream.
        partition: Its partition there.
        offset: Its offset there.
        timestamp_ms: Its timestamp (epoch milliseconds), when the broker gave one.
        key: The Kafka key, as the failed record had it.
        value: The payload, as the failed record had it (``None``: a tombstone).
        headers: Every header, the dead-letter ones included, in order.
        archived: The history store holds it (else only Kafka does).
        replayed_to: The streams a replay has published it to.
        topic_id: The dead-letter topic's Kafka topic id when it was read from Kafka
            (``None``: read from the archive alone, or the broker reports no topic ids). A
            topic deleted and created again gets a new id.
    """

    stream: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    archived: bool = False
    replayed_to: tuple[str, ...] = ()
    topic_id: str | None = None

    @property
    def id(self) -> str:
        """``<stream>/<partition>/<offset>``: what ``DeadLetters.show`` takes."""
        return f"{self.stream}/{self.partition}/{self.offset}"

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or ``None``."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    def _text(self, name: str) -> str | None:
        raw = self.header(name)
        return None if raw is None else raw.decode(errors="replace")

    @property
    def reason(self) -> Reason | str | None:
        """``bolide.reason``: a ``Reason``, the raw text for a reason bolide does not know,
        or ``None`` for a record that carries none."""
        text = self._text(REASON_HEADER)
        if text is None:
            return None
        try:
            return Reason(text)
        except ValueError:
            return text

    @property
    def detail(self) -> str | None:
        """``bolide.reason.detail``: why, for people (the error and the attempts)."""
        return self._text(DETAIL_HEADER)

    @property
    def source(self) -> str | None:
        """``bolide.source``: ``<stream>/<partition>/<offset>`` of the record that failed."""
        return self._text(SOURCE_HEADER)

    @property
    def source_position(self) -> tuple[str, int, int] | None:
        """``(stream, partition, offset)`` from ``source``, when it has that shape."""
        source = self.source
        return None if source is None else parse_position(source)

    @property
    def timestamp(self) -> datetime.datetime | None:
        """``timestamp_ms`` as an aware UTC datetime."""
        if self.timestamp_ms is None:
            return None
        return datetime.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=datetime.UTC)

    def record(self) -> Record:
        """The dead letter as a ``Record`` of its stream (headers as they are)."""
        return trusted_record(
            self.value,
            self.key,
            list(self.headers),
            self.stream,
            self.partition,
            self.offset,
            self.timestamp_ms,
        )

    def columns(self) -> dict[str, Any]:
        """The values a ``where`` filter sees, by column (docs/dead-letters.md lists them)."""
        position = self.source_position
        reason = self.reason
        return {
            "id": self.id,
            "stream": self.stream,
            "kafka_partition": self.partition,
            "kafka_offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "key": self.key,
            "payload": self.value,
            "key_text": _utf8(self.key),
            "payload_text": _utf8(self.value),
            "reason": None if reason is None else str(reason),
            "detail": self.detail,
            "source": self.source,
            "source_stream": position[0] if position else None,
            "source_partition": position[1] if position else None,
            "source_offset": position[2] if position else None,
            "archived": int(self.archived),
            "replayed": int(bool(self.replayed_to)),
        }


def _utf8(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


class DeadLetters:
    """List, show, replay and purge dead letters, reading Kafka and the history store.

    Args:
        store: The history store: it may hold archived dead letters, and it keeps the replays
            and purges (schema revision ``0009`` or newer: ``bolide db upgrade``).
        cluster: Where the dead-letter streams, and the streams replays publish to, live.
        where_timeout_ms: How long a ``where`` filter may run, in milliseconds, all its
            statements together; one that runs longer raises ``DeadLetterFilterError`` and
            nothing is replayed or purged.

    Every call reads the dead-letter stream whole (archive and Kafka), so its cost grows with
    the stream; dead-letter streams are meant to stay small.
    """

    def __init__(
        self, store: SqlStore, cluster: Cluster, *, where_timeout_ms: int = WHERE_TIMEOUT_MS
    ) -> None:
        if not isinstance(store, SqlStore):
            raise TypeError(f"store must be a SqlStore, not {type(store).__name__}")
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, not {type(cluster).__name__}")
        if isinstance(where_timeout_ms, bool) or not isinstance(where_timeout_ms, int):
            raise TypeError(
                f"where_timeout_ms must be an int, not {type(where_timeout_ms).__name__}"
            )
        if where_timeout_ms <= 0:
            raise ValueError(f"where_timeout_ms must be positive, not {where_timeout_ms}")
        self.store = store
        self.cluster = cluster
        self.where_timeout_ms = where_timeout_ms

    def __repr__(self) -> str:
        return f"DeadLetters({self.store!r}, {self.cluster!r})"

    # -- reading ----------------------------------------------------------------------------

    def list(
        self, stream: str, reason: Reason | str | None = None, since: When | None = None
    ) -> builtins.list[DeadLetter]:
        """The dead letters of ``stream``, partition by partition in offset order.

        Args:
            stream: The dead-letter stream.
            reason: Only dead letters with this ``bolide.reason`` (a ``Reason`` or its text).
            since: Only dead letters at or after this time: a datetime (naive means UTC)
                or epoch milliseconds.

        Raises:
            DeadLetterNotFoundError: Neither Kafka nor the store knows ``stream``.
            BrokerError: Kafka could not be read. StoreError: the database failed.
        """
        stream = _stream_name("stream", stream)
        wanted = _Wanted.of(reason, since, None)
        letters, _ = self._letters(stream)
        return wanted.apply(letters)

    def select(self, stream: str, where: str) -> builtins.list[DeadLetter]:
        """The dead letters of ``stream`` that ``where`` picks (the SQL filter ``replay``
        and ``purge`` take), partition by partition in offset order.

        Raises:
            DeadLetterFilterError: ``where`` is not one read-only expression over the dead
                letters' columns, or ran longer than ``where_timeout_ms``.
            DeadLetterNotFoundError: Neither Kafka nor the store knows ``stream``.
        """
        stream = _stream_name("stream", stream)
        expression = check_filter(where)
        letters, _ = self._letters(stream)
        return self._where(letters, expression)

    def show(self, id: str) -> DeadLetter:
        """The dead letter ``id`` (``<stream>/<partition>/<offset>``), read from Kafka or, when
        Kafka no longer holds it, from the store.

        Raises:
            ValueError: ``id`` is not ``<stream>/<partition>/<offset>``.
            DeadLetterNotFoundError: No such dead letter (or it was purged).
        """
        if not isinstance(id, str):
            raise TypeError(f"id must be a str, not {type(id).__name__}")
        where = parse_position(id.strip())
        if where is None or not TOPIC_NAME.match(where[0]):
            raise ValueError(f"id {id!r} is not <stream>/<partition>/<offset>")
        stream, partition, offset = where
        books = self._books(stream)
        found = read_one(self.cluster, self.store, stream, partition, offset)
        if found is None or books.purged((partition, offset), found[1]):
            raise DeadLetterNotFoundError(
                f"no dead letter {id}: neither Kafka nor {self.store.url} holds it, or it "
                "was purged",
                stream=stream,
                partition=partition,
                offset=offset,
            )
        record, which, archived = found
        targets = books.replayed_to((partition, offset), which)
        return _letter(record, archived, targets, which.topic_id)

    def _books(self, stream: str) -> Books:
        """The purge marks and acknowledged replays of ``stream``."""
        self.store.check_schema_once()

        def fetch() -> Books:
            with self.store.engine.connect() as conn:
                return Books(purged(conn, stream), replay_targets(conn, stream))

        return self.store.guarded("dead-letter books", fetch, stream=stream)

    def _letters(self, stream: str) -> tuple[builtins.list[DeadLetter], StreamRead]:
        self.store.check_schema_once()
        read = read_stream(self.cluster, self.store, stream)
        books = self._books(stream)
        if not read.bounds and not read.records and not books.marks:
            raise DeadLetterNotFoundError(
                f"no dead-letter stream {stream!r}: neither {self.cluster.bootstrap_servers} "
                f"nor {self.store.url} holds it",
                stream=stream,
            )
        letters = []
        for record in read.records:
            place = (record.partition or 0, record.offset or 0)
            topic = read.topic_id if read.from_kafka(record) else None
            which = Letter(topic, record.timestamp_ms)
            if not books.purged(place, which):
                targets = books.replayed_to(place, which)
                letters.append(_letter(record, place in read.archived, targets, topic))
        return letters, read

    def _where(
        self, letters: builtins.list[DeadLetter], where: str | None
    ) -> builtins.list[DeadLetter]:
        if where is None:
            return letters
        rows = (d.columns() for d in letters)
        chosen = select_ids(self.store.engine.url, where, rows, timeout_ms=self.where_timeout_ms)
        return [d for d in letters if d.id in chosen]

    # -- replay -------------------------------------------------------------------------------

    def replay(
        self,
        stream: str,
        to: str | None = None,
        where: str | None = None,
        *,
        claim_timeout_s: float = 300.0,
        progress: Callable[[int, int], object] | None = None,
    ) -> int:
        """Publish dead letters of ``stream`` again: to their source stream, or to ``to``.

        Each replayed record has the dead letter's key, payload and headers, without the
        dead-letter headers and with ``bolide.replayed.from`` = the dead letter's id. A dead
        letter is replayed to a given stream once: running the same replay again publishes
        nothing and returns 0 (docs/dead-letters.md says what a crash can do).

        Args:
            stream: The dead-letter stream.
            to: The stream to publish to; ``None``: each dead letter's ``bolide.source`` stream.
            where: An SQL expression over the dead letters' columns (``COLUMNS`` in
                ``bolide.stores.deadletters._filter``, listed in docs/dead-letters.md), e.g.
                ``"reason = 'failed' AND source_offset >= 100"``; checked, then run read-only by
                the database, which keeps it to those columns and to ``where_timeout_ms``.
            claim_timeout_s: A claim another replay left unfinished is taken over only when
                older than this and its record is not in the target.
            progress: ``fn(done, total)`` after each batch.

        Returns:
            How many records this call published.

        Raises:
            DeadLetterFilterError: ``where`` is not one read-only expression over the dead
                letters' columns, or ran longer than ``where_timeout_ms`` (nothing sent).
            StoreError: On PostgreSQL, the store's user cannot run a filter as the role
                ``bolide_filter`` (the message names the grant).
            DeadLetterSourceError: A chosen dead letter has no ``bolide.source`` and ``to``
                is ``None`` (nothing sent).
            DeadLetterNotFoundError: No such dead-letter stream.
            PublishError: Records were not published (those published are recorded).
        """
        stream = _stream_name("stream", stream)
        target = None if to is None else _stream_name("to", to)
        if target == stream:
            raise ValueError(f"to {to!r} is the dead-letter stream itself")
        expression = None if where is None else check_filter(where)
        timeout = _claim_timeout(claim_timeout_s)
        letters, _ = self._letters(stream)
        jobs = _jobs(stream, self._where(letters, expression), target)
        run = Replay(self.store, self.cluster, stream, claim_timeout_s=timeout, progress=progress)
        return run.run(jobs)

    # -- purge --------------------------------------------------------------------------------

    def purge(
        self,
        stream: str,
        reason: Reason | str | None = None,
        since: When | None = None,
        before: When | None = None,
        where: str | None = None,
    ) -> int:
        """Remove dead letters of ``stream`` for good; with no filter, all of them.

        The chosen ones are marked purged (list, show and replay skip them from then on),
        their archived rows are deleted, and where the broker supports DeleteRecords each
        partition's records are deleted up to its first dead letter that is not purged.

        Args:
            stream: The dead-letter stream.
            reason: Only dead letters with this ``bolide.reason``.
            since: Only dead letters at or after this time (datetime, naive = UTC, or epoch ms).
            before: Only dead letters before this time.
            where: An SQL filter, as for ``replay``.

        Returns:
            How many dead letters were purged.
        """
        stream = _stream_name("stream", stream)
        wanted = _Wanted.of(reason, since, before)
        expression = None if where is None else check_filter(where)
        letters, read = self._letters(stream)
        chosen = self._where(wanted.apply(letters), expression)
        mark_and_delete(self.store, stream, [(d.partition, d.offset, _which(d)) for d in chosen])
        trim_kafka(self.store, self.cluster, stream, read)
        return len(chosen)


def _letter(
    record: Record, archived: bool, targets: builtins.list[str], topic: str | None
) -> DeadLetter:
    return DeadLetter(
        stream=str(record.stream),
        partition=record.partition or 0,
        offset=record.offset or 0,
        timestamp_ms=record.timestamp_ms,
        key=record.key,
        value=record.data,
        headers=tuple(record.headers),
        archived=archived,
        replayed_to=tuple(targets),
        topic_id=topic,
    )


def _which(letter: DeadLetter) -> Letter:
    """Which letter ``letter`` is at its place, for the replay and purge books."""
    return Letter(letter.topic_id, letter.timestamp_ms)


def _jobs(stream: str, chosen: builtins.list[DeadLetter], target: str | None) -> builtins.list[Job]:
    """What to replay where; refuses (sending nothing) when a dead letter names no source
    and no target was given."""
    jobs, orphans = [], []
    for letter in chosen:
        position = letter.source_position
        to = target
        if to is None and position is not None:
            to = position[0]
        if to is not None:
            which = _which(letter)
            jobs.append(Job(letter.record(), to, which, which.stored_topic))
        else:
            orphans.append(letter.id)
    if orphans:
        raise DeadLetterSourceError(
            f"{len(orphans)} dead letters of {stream!r} carry no {SOURCE_HEADER} header "
            f"(first: {orphans[0]}): replay them with to=STREAM, or leave them out with "
            'where="source IS NOT NULL"',
            ids=orphans,
            stream=stream,
        )
    return jobs


def _claim_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"claim_timeout_s must be a number, not {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"claim_timeout_s must be >= 0, got {value}")
    return float(value)


def _stream_name(argument: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")
    if not TOPIC_NAME.match(value) or value in {".", ".."}:
        raise ValueError(f"{argument} {value!r} is not a stream name (1-249 of [A-Za-z0-9._-])")
    return value


def _epoch_ms(argument: str, when: object) -> int:
    """``when`` (a datetime, naive meaning UTC, or epoch milliseconds) in epoch milliseconds."""
    if isinstance(when, datetime.datetime):
        aware = when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)
        return (aware - _EPOCH) // datetime.timedelta(milliseconds=1)  # exact, no float
    if isinstance(when, int) and not isinstance(when, bool):
        return when
    raise TypeError(
        f"{argument} must be a datetime or epoch milliseconds, not {type(when).__name__}"
    )


@dataclass(frozen=True)
class _Wanted:
    """The plain filters of ``list`` and ``purge``, checked before anything is read."""

    reason: str | None
    low: int | None
    high: int | None

    @classmethod
    def of(cls, reason: object, since: object, before: object) -> _Wanted:
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a Reason or a str, not {type(reason).__name__}")
        return cls(
            None if reason is None else str(reason),
            None if since is None else _epoch_ms("since", since),
            None if before is None else _epoch_ms("before", before),
        )

    def apply(self, letters: builtins.list[DeadLetter]) -> builtins.list[DeadLetter]:
        out = []
        for letter in letters:
            at = letter.timestamp_ms
            if self.reason is not None and letter.reason != self.reason:
                continue
            if self.low is not None and (at is None or at < self.low):
                continue
            if self.high is not None and (at is None or at >= self.high):
                continue
            out.append(letter)
        return out
