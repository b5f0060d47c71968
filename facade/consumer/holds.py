"""``Holds``: which partitions of a subscriber are paused, and why.

Several parts of a subscriber stop Kafka fetching a partition for a while, each for its own
reason: the history splice (records below Kafka's log start are read from the store first), a
durable client's replay (live records held back until the replay ends), a parallel receiver's
throttle (enough in flight) and its retry tiers (enough records parked, or their copies not
read yet), the application (``Subscriber.pause``), the shared fetch (the partition is read
from the process's shared ring, not by this consumer) and a position store's claim that failed
(nothing read there could be confirmed). A partition is paused while any reason holds it and
resumed when the last one lets go, so no part resumes what another paused. A rebalance forgets the
pause of a partition it takes away (Kafka's rule): so does ``drop``. librdkafka, though, keeps
the pause of a partition handed straight back to the same member, so after each assignment
``reapply`` pauses what is still held and resumes the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, TypeAlias

__all__ = ["Holds", "Why"]

#: Why a partition is held: the history splice, a durable replay, a receiver's throttle, its
#: retry tiers (parked records, or a load), the application, the shared fetch, a failed claim.
Why: TypeAlias = Literal["history", "replay", "throttle", "parked", "user", "shared", "claim"]
_REASONS: tuple[Why, ...] = (
    "history", "replay", "throttle", "parked", "user", "shared", "claim"
)  # fmt: skip


class Holds:
    """The partitions each reason holds; ``pause`` is called on the first hold of a
    partition and ``resume`` when its last hold is released (``PartitionState`` passes its
    consumer's). Called under the subscriber's lock; ``holding`` may be read without it (each
    reason's set is replaced, never changed)."""

    __slots__ = ("_by", "_pause", "_resume")

    def __init__(
        self, pause: Callable[[frozenset[int]], None], resume: Callable[[frozenset[int]], None]
    ) -> None:
        self._pause = pause
        self._resume = resume
        self._by: dict[Why, frozenset[int]] = dict.fromkeys(_REASONS, frozenset())

    def hold(self, partitions: Iterable[int], why: Why) -> None:
        """Hold ``partitions`` for ``why``; Kafka stops fetching those no other reason held."""
        parts = frozenset(partitions) - self._by[why]
        if not parts:
            return
        new = parts - self.held()
        self._by[why] = self._by[why] | parts
        if new:
            self._pause(new)

    def release(self, partitions: Iterable[int], why: Why) -> frozenset[int]:
        """Let go of ``why``'s hold on ``partitions``; returns those no reason holds any more,
        which Kafka fetches again from where their delivery stopped."""
        parts = frozenset(partitions) & self._by[why]
        if not parts:
            return frozenset()
        self._by[why] = self._by[why] - parts
        free = parts - self.held()
        if free:
            self._resume(free)
        return free

    def holding(self, why: Why) -> frozenset[int]:
        """The partitions ``why`` holds."""
        return self._by[why]

    def held(self) -> frozenset[int]:
        """The partitions any reason holds: those Kafka does not fetch."""
        return frozenset().union(*self._by.values())

    def held_except(self, why: Why) -> frozenset[int]:
        """The partitions a reason other than ``why`` holds."""
        return frozenset().union(*(parts for w, parts in self._by.items() if w != why))

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget every hold on ``partitions``: they were given up (a rebalance forgets their
        pause; ``reapply`` clears the one librdkafka keeps if they come straight back)."""
        gone = frozenset(partitions)
        for why in _REASONS:
            if self._by[why] & gone:
                self._by[why] = self._by[why] - gone

    def reapply(self, partitions: Iterable[int]) -> None:
        """After the consumer assigned ``partitions``: pause those still held, resume the
        others (a pause librdkafka kept from before a revoke would stop them for good)."""
        parts = frozenset(partitions)
        held = self.held() & parts
        if held:
            self._pause(held)
        if parts - held:
            self._resume(parts - held)
