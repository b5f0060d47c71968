"""``PartitionState``: one subscriber's partitions, and the one writer of their state.

Which partitions the subscriber holds (and since which assignment: its epoch), where each reads
next, the last offset a poll returned on each (what ``confirm()`` confirms), the positions it
confirmed, and why each is paused: the subscriber's parts (fetching, confirms, the lease, the
durable session, the shared fetch, the receivers) ask it and tell it, and never hold its
dictionaries. It is also the only caller of the subscriber's consumer's ``assign``,
``unassign``, ``pause``, ``resume``, ``seek`` and ``commit`` (tests/test_architecture.py
checks it), so each change of a partition's state has one place where it happens.

Group and manual assignment are two classes chosen once, when the subscriber is built: a
group member holds what the group hands it and gives partitions up one by one (``lose``); a
subscriber without a group holds every partition of its stream for its whole life.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bolide.facade.consumer.holds import Holds
from bolide.facade.consumer.ledger import Ledger

__all__ = ["GroupState", "ManualState", "PartitionState"]


class PartitionState:
    """A subscriber's partitions on one stream; called under the subscriber's lock.

    The views it hands out (``assigned``, ``nexts``, ``last_read``, ``confirmed``) are
    read-only and live: a hot loop may keep one in a local.

    Args:
        consumer: The subscriber's Kafka consumer.
        topic: The stream's topic.
        held: The partitions held from the start.

    Attributes:
        holds: Which partitions are paused, and why.
    """

    #: A rewound partition is repositioned by assigning again (no group lease to keep).
    reassigns_on_rewind = False
    #: The group moves partitions one by one (cooperative or KIP-848): the consumer's
    #: assignment changes by increments, and the others' keep reading meanwhile.
    incremental = False

    def __init__(self, consumer: Consumer, topic: str, held: Iterable[int] = ()) -> None:
        self._consumer = consumer
        self.topic = topic
        self._assigned: set[int] = set(held)
        self._next: dict[int, int] = {}
        self._last_read: dict[int, int] = {}
        self._confirmed: dict[int, int] = {}
        # Each assignment of a partition gets a new epoch; a read not yet confirmed keeps the
        # epoch of its first record, so a confirm sees a revocation in between (even one
        # handed straight back: the partition then reads again from its committed offset).
        self._epochs = itertools.count(1)
        self._epoch: dict[int, int] = {p: next(self._epochs) for p in self._assigned}
        self._read_in: dict[int, int] = {}
        # Per partition held: the confirmed frontier and the records finished above it.
        # Confirms from handler threads record completions: one lock keeps none from being lost.
        self._ledgers: dict[int, Ledger] = {}
        self._ledger_lock = threading.Lock()
        self.holds = Holds(self._pause, self._resume)
        self._views = (
            MappingProxyType(self._next),
            MappingProxyType(self._last_read),
            MappingProxyType(self._confirmed),
        )

    # -- what it answers ---------------------------------------------------------------------

    def assigned(self) -> AbstractSet[int]:
        """The partitions held (a live view)."""
        return self._assigned

    def holding(self, partition: int) -> int | None:
        """The id of the assignment that holds ``partition`` (``None`` when not held): one
        revoked and assigned again is held by another."""
        return self._epoch.get(partition)

    def nexts(self) -> Mapping[int, int]:
        """The next offset to deliver, per partition (a live view)."""
        return self._views[0]

    def last_read(self) -> Mapping[int, int]:
        """The last offset a poll returned, per partition (a live view)."""
        return self._views[1]

    def confirmed(self) -> Mapping[int, int]:
        """The highest position (next offset) this member confirmed, per partition."""
        return self._views[2]

    def finished_above(self, partition: int, position: int, also: int | None = None) -> list[int]:
        """The records of ``partition`` finished at or above ``position`` (``also`` counted):
        what is written with that position so that the next owner skips them."""
        with self._ledger_lock:
            ledger = self._ledgers.get(partition)
            if ledger is None:
                return [] if also is None or also < position else [also]
            return ledger.above(position, also)

    def frontier(self, partition: int) -> int:
        """The confirmed position ``partition`` resumed from or moved to (``-1``: unknown)."""
        ledger = self._ledgers.get(partition)
        return -1 if ledger is None else ledger.frontier

    def skips(self, partition: int, offset: int) -> bool:
        """``offset`` of ``partition`` finished already (a confirmed finished set says so):
        it is not handed out again."""
        ledger = self._ledgers.get(partition)
        return ledger is not None and offset in ledger.finished

    def skipping(self) -> bool:
        """Some partition delivers next at or below a record finished already (it resumed
        above the frontier, or read again from below): its records are checked one by one."""
        nexts = self._next
        with self._ledger_lock:  # handler threads add ledgers
            return any(
                ledger.finished and ledger.high >= nexts.get(p, -1)
                for p, ledger in self._ledgers.items()
            )

    # -- what it is told ---------------------------------------------------------------------

    def resumes(self, partition: int, position: int, finished: Iterable[int]) -> None:
        """``partition`` resumes from the confirmed ``position``, ``finished`` records above
        it (written with it) done already: they are skipped."""
        with self._ledger_lock:
            self._ledgers[partition] = Ledger(position, finished)

    def starts(self, partition: int, offset: int) -> None:
        """``partition`` is read from ``offset`` on, no confirmed position known: the
        frontier starts there."""
        with self._ledger_lock:
            ledger = self._ledgers.get(partition)
            if ledger is None or ledger.frontier < 0:
                finished = () if ledger is None else ledger.finished
                self._ledgers[partition] = Ledger(offset, finished)

    def finish(self, partition: int, offsets: Iterable[int]) -> None:
        """``offsets`` of ``partition`` finished, above its confirmed position."""
        if partition in self._assigned:
            with self._ledger_lock:
                ledger = self._ledgers.setdefault(partition, Ledger())
                for offset in offsets:
                    ledger.finish(offset)

    def settled(self, partition: int, position: int, finished: Iterable[int]) -> None:
        """``position`` and the ``finished`` records above it were written (committed)."""
        if partition in self._assigned:
            with self._ledger_lock:
                ledger = self._ledgers.setdefault(partition, Ledger())
                for offset in finished:
                    ledger.finish(offset)
                ledger.advance(position)

    def delivered(self, partition: int, next_offset: int) -> None:
        """``partition`` delivers from ``next_offset`` on."""
        self._next[partition] = next_offset

    def forget_next(self, partition: int) -> None:
        """Nothing is known of where ``partition`` delivers next (Kafka's group says)."""
        self._next.pop(partition, None)

    def read(self, offsets: Mapping[int, int]) -> None:
        """A poll returned records up to ``offsets`` (the last offset per partition)."""
        self._last_read.update(offsets)
        for p in offsets:
            self._read_in.setdefault(p, self._epoch.get(p, 0))

    def revoked_since_read(self) -> list[int]:
        """Partitions read and not confirmed since, revoked after that first read (held or
        not now): nothing read there before the revocation may be confirmed."""
        return sorted(p for p, e in self._read_in.items() if self._epoch.get(p) != e)

    def forget_reads(self, partitions: Iterable[int]) -> None:
        """What was read on ``partitions`` is not confirmable (its new owner, or this member
        from its committed offset, reads it again)."""
        for p in partitions:
            self._read_in.pop(p, None)
            self._last_read.pop(p, None)

    def unread(self, partition: int) -> None:
        """Nothing read on ``partition`` is confirmable any more."""
        self._last_read.pop(partition, None)

    def restore_read(self, before: Mapping[int, int]) -> dict[int, int]:
        """Put ``last_read`` back as it was (``before``); returns the offsets that had moved."""
        moved = {p: o for p, o in self._last_read.items() if before.get(p) != o}
        for p in moved:
            if p in before:
                self._last_read[p] = before[p]
            else:
                del self._last_read[p]
        return moved

    def read_again_from(self, partition: int, offset: int) -> None:
        """``partition`` is read again from ``offset``: what lies below stays confirmable."""
        if offset > 0 and self._last_read.get(partition, -1) >= offset:
            self._last_read[partition] = offset - 1
        elif offset == 0:
            self._last_read.pop(partition, None)

    def note_confirmed(self, positions: Mapping[int, int]) -> None:
        """Remember positions this member confirmed, whichever store wrote them (the group's
        offsets, a transaction, the application's database): a rebalance never resumes below
        them, and what was read below them is confirmed, on a partition lost since too."""
        for p, o in positions.items():
            self._confirmed[p] = max(o, self._confirmed.get(p, o))
            if p in self._ledgers:
                with self._ledger_lock:
                    self._ledgers[p].advance(o)
            if o > self._last_read.get(p, -1):
                self._read_in.pop(p, None)  # all it read is confirmed

    def unconfirmed(self, partition: int, last: int) -> bool:
        """Records of ``partition`` read up to ``last`` lie above what this member
        confirmed there."""
        return last + 1 > self._confirmed.get(partition, 0)

    def take(self, partitions: Iterable[int]) -> None:
        """The group assigned exactly ``partitions`` (a group member's rebalance).

        Caller: ``Lease`` (the assigned callback). Affects: the held set; each partition
        newly held gets a fresh epoch (reads of an earlier holding are told apart).
        """
        parts = set(partitions)
        self._assigned.intersection_update(parts)
        for p in parts - self._assigned:
            self._epoch[p] = next(self._epochs)
        self._assigned.update(parts)

    def lose(self, partitions: Iterable[int]) -> frozenset[int]:
        """Give up ``partitions`` (revoked or lost, or every one when the lease expired),
        keeping the others; returns those that were held. Their holds go too (a rebalance
        forgets a moved partition's pause; ``Holds.reapply`` resumes a partition handed
        straight back, whose pause librdkafka keeps).

        Caller: ``Lease.lose`` (revoked, lost, deactivated, expired, a static member leaving).
        Affects: the held set, the partitions' epochs and ledgers, their confirmed reads and
        their holds.
        """
        parts = frozenset(partitions)
        held = frozenset(self._assigned & parts)
        self._assigned -= parts
        for p in held:
            self._epoch.pop(p, None)
            self._ledgers.pop(p, None)
        # What was read there and confirmed is done with: no later confirm names the partition
        # (nor a view of the reads kept elsewhere, an asyncio iteration's: ``confirmable``).
        # Reads not confirmed stay, for the next confirm to report or refuse once.
        self.forget_reads(p for p in held if not self.unconfirmed(p, self._last_read.get(p, -1)))
        self.holds.drop(parts)
        return held

    def confirmable(self, read: Mapping[int, int]) -> dict[int, int]:
        """``read`` (a view of the last record handed out per partition, kept apart from this
        state) without the partitions whose reads this state forgot: held, or read here and
        not confirmed yet."""
        known = self._last_read
        return {p: o for p, o in read.items() if p in self._assigned or p in known}

    # -- the consumer ------------------------------------------------------------------------

    def assign(self, assignment: list[TopicPartition]) -> None:
        """Assign the consumer ``assignment`` (topic partitions at their offsets); under an
        incremental protocol, only those partitions, the consumer's others untouched.

        Caller: ``Positions`` (an ungrouped start, a member positioned on assignment).
        Affects: the consumer's assignment and fetch positions.
        """
        if not self.incremental:
            self._consumer.assign(assignment)
            return
        wanted = {tp.partition for tp in assignment}
        moving = [tp for tp in self._consumer.assignment() if tp.partition in wanted]
        if moving:  # repositioned: assigned again at their new offsets
            self._consumer.incremental_unassign(moving)
        self._consumer.incremental_assign(assignment)

    def unassign(self, partitions: Iterable[int] | None = None) -> None:
        """The consumer lets go of its assignment (a revocation handled); under an
        incremental protocol, of ``partitions`` only (``None``: all it has).

        Caller: ``Lease`` (revoked and lost callbacks, a static member leaving).
        Affects: the consumer's assignment.
        """
        if not self.incremental:
            self._consumer.unassign()
            return
        held = self._consumer.assignment()
        if partitions is not None:
            parts = set(partitions)
            held = [tp for tp in held if tp.partition in parts]
        if held:
            self._consumer.incremental_unassign(held)

    def seek(self, partition: int, offset: int) -> None:
        """The consumer fetches ``partition`` from ``offset``.

        Caller: ``Positions`` (seek, resume) and the fetcher (moving a partition on).
        Affects: the consumer's fetch position of ``partition`` (records fetched before are
        not delivered).
        """
        self._consumer.seek(TopicPartition(self.topic, partition, offset))

    def commit(self, offsets: list[TopicPartition], *, asynchronous: bool) -> None:
        """Commit ``offsets`` (of any topic: a retry tier's too) to the consumer group."""
        if asynchronous:  # two calls: the client's typing overloads on the literal
            self._consumer.commit(offsets=offsets, asynchronous=True)
        else:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def _pause(self, parts: frozenset[int]) -> None:
        self._call_on(self._consumer.pause, parts)

    def _resume(self, parts: frozenset[int]) -> None:
        self._call_on(self._consumer.resume, parts)

    def _call_on(self, method: object, parts: frozenset[int]) -> None:
        assert callable(method)
        # The consumer closed or the partitions went away: nothing left to pause or resume.
        with contextlib.suppress(KafkaException, RuntimeError):
            method([TopicPartition(self.topic, p) for p in sorted(parts)])


class GroupState(PartitionState):
    """A consumer group member's partitions: none until the group hands it some (``take``);
    given up one by one as the group moves them (``lose``). ``incremental``: the group
    rebalances cooperatively (cooperative-sticky, or Kafka 4's consumer protocol)."""

    def __init__(self, consumer: Consumer, topic: str, *, incremental: bool = False) -> None:
        super().__init__(consumer, topic)
        self.incremental = incremental


class ManualState(PartitionState):
    """An ungrouped subscriber's partitions: every partition of its stream, for its life."""

    reassigns_on_rewind = True

    def __init__(self, consumer: Consumer, topic: str, partitions: int) -> None:
        super().__init__(consumer, topic, range(partitions))
