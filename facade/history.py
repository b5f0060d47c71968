"""The splice: reading a partition's history from the store until Kafka takes over.

A cursor per partition reads ``[position, kafka_start)`` from the stream's history store in
offset order; the subscriber keeps that Kafka partition paused until the cursor is done, so the
subscriber sees one log with no gap and no duplicate.
"""

from __future__ import annotations

from dataclasses import dataclass

from bolide.facade.config import StreamConfig
from bolide.facade.ports import Incarnations, TopicIdentity
from bolide.facade.record import Record

__all__ = ["HistoryCursor", "KnownTopic"]


@dataclass
class _Span:
    next_offset: int
    stop: int  # Kafka's log start: the first offset Kafka serves


class KnownTopic:
    """Which incarnation of a stream's topic a reader of a store keeps to (its rows' key,
    ``stored_as``), and the topic id it last met: what a history cursor and a subscriber's
    positions in the application's database each learn on assignment."""

    def __init__(self, stored_as: str | None = None) -> None:
        self.stored_as = stored_as
        self._topic_id: str | None = None

    def learn(self, store: object, stream: str, identity: TopicIdentity) -> str | None:
        """``stream`` is the topic ``identity`` now: recorded in ``store`` (one that keeps
        incarnations; else nothing changes), whose key is kept to from here. Returns the old
        topic id when the topic changed since the store, or this reader, last met it."""
        if not isinstance(store, Incarnations):
            return None
        current, retired = store.identify(stream, identity)
        before, self._topic_id = self._topic_id, identity.topic_id
        self.stored_as = current.stored_as
        if retired is not None:
            return retired.topic_id
        return before if before not in (None, identity.topic_id) else None


class HistoryCursor:
    """Per-partition reads from a stream's store below what Kafka still holds."""

    def __init__(self, stream: StreamConfig) -> None:
        self.stream = stream
        self.store = stream.store
        # The topic incarnation whose history is read (``identify``; by default the current).
        self._topic_known = KnownTopic()
        self._spans: dict[int, _Span] = {}
        self._finished: list[int] = []
        self._gaps: list[tuple[int, int, int]] = []

    @property
    def stored_as(self) -> str | None:
        """The key of the topic incarnation read (``None``: the store's current one)."""
        return self._topic_known.stored_as

    @stored_as.setter
    def stored_as(self, key: str | None) -> None:
        self._topic_known.stored_as = key

    def identify(self, identity: TopicIdentity) -> str | None:
        """The stream is the topic ``identity`` now: only that incarnation's history is read
        (a topic deleted and created again starts with none). Returns the old topic id when
        the topic changed since the store, or this cursor, last met it."""
        return self._topic_known.learn(self.store, self.stream.name, identity)

    def _which(self) -> dict[str, str]:
        """The store's keyword naming the incarnation read (none for the current one, and for
        a store that keeps no incarnations)."""
        return {} if self.stored_as is None else {"stored_as": self.stored_as}

    def first_offset(self, partition: int) -> int | None:
        """The first offset the store holds for ``partition`` (``None`` without a store)."""
        if self.store is None:
            return None
        return self.store.smallest_offset(self.stream.name, partition, **self._which())

    def covers(self, partition: int, offset: int, stop: int) -> bool:
        """True when the store holds records in ``[offset, stop)`` to splice in."""
        if self.store is None:
            return False
        largest = self.store.largest_offset(self.stream.name, partition, **self._which())
        return largest is not None and largest >= offset and offset < stop

    def open(self, partition: int, offset: int, stop: int) -> None:
        """Read ``[offset, stop)`` of ``partition`` from the store before Kafka."""
        self._spans[partition] = _Span(offset, stop)

    def reading(self) -> list[int]:
        """The partitions reading from the store now."""
        return sorted(self._spans)

    def span(self, partition: int) -> tuple[int, int] | None:
        """``(next offset, stop)`` of ``partition``'s read, if it is reading."""
        found = self._spans.get(partition)
        return None if found is None else (found.next_offset, found.stop)

    def active(self, partition: int) -> bool:
        """True while ``partition`` still reads from the store."""
        return partition in self._spans

    def close(self, partition: int) -> None:
        """Forget ``partition`` (revoked, or repositioned)."""
        self._spans.pop(partition, None)

    def position(self, partition: int) -> int | None:
        """The next offset the cursor reads on ``partition``, if it is reading."""
        span = self._spans.get(partition)
        return span.next_offset if span is not None else None

    def read(self, limit: int) -> list[Record]:
        """Up to ``limit`` records from the open spans, each partition in offset order."""
        out: list[Record] = []
        assert self.store is not None or not self._spans
        for partition, span in list(self._spans.items()):
            if len(out) >= limit:
                break
            want = min(limit - len(out), span.stop - span.next_offset)
            rows = (
                self.store.read(
                    self.stream.name, partition, span.next_offset, want, **self._which()
                )
                if self.store is not None and want > 0
                else []
            )
            rows = [r for r in rows if r.offset is not None and r.offset < span.stop]
            out.extend(rows)
            if rows:
                first, last = rows[0].offset, rows[-1].offset
                assert first is not None and last is not None
                if first > span.next_offset:
                    self._gaps.append((partition, span.next_offset, first))
                span.next_offset = last + 1
            if not rows or span.next_offset >= span.stop or len(rows) < want:
                if span.next_offset < span.stop:
                    self._gaps.append((partition, span.next_offset, span.stop))
                del self._spans[partition]
                self._finished.append(partition)
        return out

    def gaps(self) -> list[tuple[int, int, int]]:
        """``(partition, first, stop)`` ranges found in neither the store nor Kafka since the
        last call (the archive fell behind retention); offsets may be sparse, so a range can
        also be offsets that never held a record."""
        found, self._gaps = self._gaps, []
        return found

    def finished(self) -> list[int]:
        """Partitions whose history ended since the last call: Kafka takes over there."""
        done, self._finished = self._finished, []
        return done
