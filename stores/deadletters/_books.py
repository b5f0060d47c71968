"""Which replay and purge rows belong to which dead letter, across topic incarnations.

A dead letter's place, ``(stream, partition, offset)``, does not name it for ever: a topic
deleted and created again starts its offsets over at 0, so a new dead letter takes the place
of an old one. Each row of ``bolide_dead_letter_replays`` and ``bolide_dead_letter_purges``
therefore also says which letter it was written about (``bolide.stores.schema``): the topic's id
when the letter was read from Kafka, and the letter's timestamp. A row covers a letter at its
place when:

- both topic ids are known (the row's, and the letter's: it was read from Kafka): they are
  equal. This is the only *certain* match, the one a purge trims Kafka on;
- else, the row has the letter's timestamp (written from ``0009`` on): the timestamps are
  equal. This names a letter only the archive holds, which carries no topic id, and letters
  of a broker that reports no topic ids;
- else (a row written before ``0009``: neither): the letter is no younger than the row
  (``timestamp_ms`` at most ``purged_ms`` / ``claimed_ms``). A letter of a topic created after
  the row was written was written after it too, so it is not covered; such a row hides and
  skips, and never lets a purge trim Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from bolide.stores.schema import UNKNOWN_TOPIC

__all__ = ["Books", "Entry", "Letter", "Place", "Replayed", "covering"]

E = TypeVar("E", bound="Entry")
#: ``(partition, offset)``: a place in a dead-letter stream.
Place = tuple[int, int]


@dataclass(frozen=True)
class Letter:
    """Which letter stands at a place: the topic id it was read under (``None``: read from the
    archive, or the broker reports none) and its timestamp."""

    topic_id: str | None
    timestamp_ms: int | None

    @property
    def stored_topic(self) -> str:
        """The ``topic_id`` a new row about this letter gets."""
        return self.topic_id or UNKNOWN_TOPIC


@dataclass(frozen=True)
class Entry:
    """What a replay or purge row says about the letter it was written for.

    Attributes:
        topic_id: The topic's id then, ``''`` when not known.
        timestamp_ms: The letter's timestamp, ``None`` on rows written before ``0009``.
        written_ms: When the row was written (``purged_ms``, ``claimed_ms``).
    """

    topic_id: str
    timestamp_ms: int | None
    written_ms: int

    def certain(self, letter: Letter) -> bool:
        """Both topic ids are known and equal: the row was written about this very letter."""
        return bool(self.topic_id) and self.topic_id == letter.topic_id

    def covers(self, letter: Letter) -> bool:
        """The row was written about ``letter`` (the module docstring gives the rule)."""
        if self.topic_id and letter.topic_id:
            return self.topic_id == letter.topic_id
        if self.timestamp_ms is not None:
            return self.timestamp_ms == letter.timestamp_ms
        if self.topic_id:  # known topic, no timestamp: a letter without one, named by topic
            return False
        return letter.timestamp_ms is not None and letter.timestamp_ms <= self.written_ms


def covering(entries: list[E], letter: Letter) -> E | None:
    """The first of ``entries`` (rows at the letter's place) that covers ``letter``."""
    return next((e for e in entries if e.covers(letter)), None)


@dataclass(frozen=True)
class Replayed(Entry):
    """An acknowledged replay of a dead letter to ``target``."""

    target: str


@dataclass(frozen=True)
class Books:
    """A stream's purge marks and acknowledged replays, by place (every incarnation's)."""

    marks: dict[Place, list[Entry]]
    replays: dict[Place, list[Replayed]]

    def purged(self, place: Place, letter: Letter) -> bool:
        """A purge mark covers ``letter`` at ``place``."""
        return covering(self.marks.get(place, []), letter) is not None

    def replayed_to(self, place: Place, letter: Letter) -> list[str]:
        """The streams ``letter`` at ``place`` was replayed to, oldest first."""
        return [r.target for r in self.replays.get(place, []) if r.covers(letter)]
