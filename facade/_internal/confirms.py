"""``Confirms``: where a subscriber's confirms go.

Three places: the consumer group's committed offsets (``confirm()``), a Kafka transaction
(``Publisher.confirm(sub)``: the positions commit with the records published in it), or the
application's own database (``SubscriberConfig(positions=...)`` and ``confirm(conn=...)``: the
positions commit with the application's writes, and are read back from there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bolide.facade._internal.positions import Positions, Report
from bolide.facade.errors import IllegalSubscriberStateError, NotAssignedError
from bolide.facade.ports import PositionStore

__all__ = ["Confirms"]


class Confirms:
    """A subscriber's confirms: what they move, and where they are written.

    Args:
        topic: The stream's topic.
        consumer: The subscriber's Kafka consumer.
        positions: The subscriber's positions (``last_read`` is what a confirm confirms).
        assigned: The partitions the subscriber holds (updated in place by it).
        grouped: The subscriber has a consumer group (a subscriber group or a durable client).
        group_id: Its consumer group id.
        store: Where the positions are kept instead of Kafka, or ``None``.
        report: The subscriber's error handler.

    Attributes:
        revoking: ``on_revoke`` runs: the partitions are still owned, commits are synchronous.
        group: The key the store keeps the positions under (``None`` without a store).
    """

    def __init__(
        self,
        topic: str,
        consumer: Consumer,
        positions: Positions,
        assigned: set[int],
        *,
        grouped: bool,
        group_id: str,
        store: PositionStore | None,
        report: Report,
    ) -> None:
        self._topic = topic
        self._consumer = consumer
        self._positions = positions
        self._assigned = assigned
        self._grouped = grouped
        self._store = store
        self._report = report
        self.group = (store.group or group_id) if store is not None else None
        self.revoking = False
        self._lock = threading.Lock()  # commits vs. closing the consumer
        self._closed = False
        # What the store holds, as far as this subscriber knows: each write expects it.
        self._expected: dict[int, int | None] = {}

    @property
    def keeps_positions(self) -> bool:
        """True when the positions live in the application's database."""
        return self._store is not None

    # -- what a confirm moves ----------------------------------------------------------------

    def targets(
        self,
        offset: int | None,
        partition: int,
        *,
        deactivated: bool = False,
        read: Mapping[int, int] | None = None,
        strict: bool = False,
    ) -> dict[int, int]:
        """The positions (next offsets) a confirm moves to, on partitions held.

        Without ``offset``: after the last record a poll returned (or, given ``read``, the
        last record handed out), on every partition. Records read on a partition a grouped
        subscriber no longer holds can no longer be confirmed by it: they are reported (once:
        they are forgotten) and left out, or with ``strict`` (a transaction, whose outputs of
        those records must not commit) raise. A ``deactivated`` subscriber holds none.

        Raises:
            ValueError: ``offset`` was never read on ``partition``.
            NotAssignedError: ``strict``, and records read on a partition no longer held (or
                on any, once deactivated) are not confirmed.
        """
        last_read = self._positions.last_read if read is None else read
        if offset is None:
            targets = dict(last_read)
        else:
            last = last_read.get(partition)
            if last is None or offset > last:
                raise ValueError(
                    f"offset {offset} of {self._topic}[{partition}] was never read "
                    f"(last read: {last})"
                )
            targets = {partition: offset}
        if not self._grouped:
            return {p: o + 1 for p, o in targets.items()}
        assigned = set() if deactivated else set(self._assigned)
        confirmed = self._positions.confirmed
        unconfirmed = sorted(
            p for p, o in targets.items() if p not in assigned and o + 1 > confirmed.get(p, 0)
        )
        if read is None and offset is None:
            for p in set(targets) - assigned:  # another member reads them from here
                if self._positions.last_read.get(p) == targets[p]:
                    self._positions.last_read.pop(p, None)
        if unconfirmed and strict:
            raise NotAssignedError(
                f"records read on {self._topic}{unconfirmed} are not confirmed and the "
                "partitions are no longer held: the transaction must not commit their outputs "
                "(it is aborted; the partitions' new owner reads them again)",
                stream=self._topic,
                partition=unconfirmed[0],
            )
        if unconfirmed and not deactivated:
            self._report(
                f"confirm without the lease on {self._topic}{unconfirmed}: nothing changed",
                NotAssignedError(
                    "confirm without the lease", stream=self._topic, partition=unconfirmed[0]
                ),
            )
        return {p: o + 1 for p, o in targets.items() if p in assigned}

    def confirm(self, positions: dict[int, int], conn: Any) -> None:
        """Write ``positions``: through ``conn`` into the store, else to the consumer group.

        Raises:
            IllegalSubscriberStateError: ``conn`` is missing while the positions live in the
                application's database (Kafka's offsets are never read back there), or given
                without a store; or the consumer is closed.
        """
        if conn is not None:
            self.save(conn, positions)
        elif self._store is not None:
            raise IllegalSubscriberStateError(
                "this subscriber keeps its positions in the application's database: confirm "
                "with sub.confirm(conn=...) in the transaction that holds the results",
                stream=self._topic,
            )
        else:
            self.commit(positions)

    # -- Kafka's group offsets ---------------------------------------------------------------

    def commit(self, positions: dict[int, int], *, note: bool = True) -> None:
        """Commit ``positions`` to the consumer group: asynchronously, or synchronously while
        revoking (then a failure is reported). ``note`` remembers them as confirmed.

        Raises:
            IllegalSubscriberStateError: The consumer is closed.
        """
        if note:
            self._positions.note_confirmed(positions)
        commits = [TopicPartition(self._topic, p, o) for p, o in positions.items()]
        with self._lock:
            if self._closed:
                raise IllegalSubscriberStateError("subscriber is closed", stream=self._topic)
            if not self.revoking:
                self._consumer.commit(offsets=commits, asynchronous=True)
                return
            try:
                self._consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                self._report(f"confirm failed on {self._topic} while revoking", exc)

    def committed(self, parts: list[int]) -> dict[int, int]:
        """Where ``parts`` resume: the store's positions, else the group's committed offsets
        (negative where there is none)."""
        if self._store is None:
            return self._positions.committed(parts)
        return self.stored(parts)

    def close(self) -> None:
        """The consumer closes: later commits fail."""
        with self._lock:
            self._closed = True

    # -- a Kafka transaction -----------------------------------------------------------------

    def for_transaction(
        self, *, deactivated: bool = False
    ) -> tuple[list[TopicPartition], Any, Callable[[], None]]:
        """What ``Publisher.confirm`` sends with its transaction: the delivered positions,
        the group's metadata (for fencing), and what to call once the transaction commits.

        Raises:
            IllegalSubscriberStateError: The subscriber is ungrouped, keeps its positions in
                the application's database, or is closed.
            NotAssignedError: Records read on a partition no longer held are not confirmed.
        """
        if not self._grouped:
            raise IllegalSubscriberStateError(
                "a transaction confirms a grouped subscriber's positions (its consumer group "
                "holds them); this subscriber is ungrouped",
                stream=self._topic,
            )
        if self._store is not None:
            raise IllegalSubscriberStateError(
                "this subscriber keeps its positions in the application's database: confirm "
                "with sub.confirm(conn=...)",
                stream=self._topic,
            )
        positions = self.targets(None, 0, deactivated=deactivated, strict=True)
        with self._lock:
            if self._closed:
                raise IllegalSubscriberStateError("subscriber is closed", stream=self._topic)
            metadata = self._consumer.consumer_group_metadata()
        offsets = [TopicPartition(self._topic, p, o) for p, o in positions.items()]
        return offsets, metadata, lambda: self._positions.note_confirmed(positions)

    # -- the application's database ----------------------------------------------------------

    def stored(self, parts: Iterable[int]) -> dict[int, int]:
        """The store's positions of ``parts`` (negative where none is stored); later writes
        expect them."""
        assert self._store is not None and self.group is not None
        parts = list(parts)
        with self._lock:
            for p in parts:  # unknown until read: a failed read leaves writes refused
                self._expected.pop(p, None)
        found = self._store.load(self.group, self._topic, parts)
        with self._lock:
            for p in parts:
                self._expected[p] = found.get(p)
        return {p: found.get(p, -1) for p in parts}

    def save(self, conn: Any, positions: dict[int, int]) -> None:
        """Write ``positions`` in the application's transaction on ``conn``; once it commits,
        commit them to the consumer group too (asynchronously: for lag tools only).

        Raises:
            IllegalSubscriberStateError: No position store is configured.
            NotAssignedError: Another subscriber moved a stored position (the partition was
                taken over): the application's transaction must roll back.
        """
        store, group = self._store, self.group
        if store is None or group is None:
            raise IllegalSubscriberStateError(
                "confirm(conn=...) needs SubscriberConfig(positions=SqlPositions(...))",
                stream=self._topic,
            )
        with self._lock:
            changed = {p: o for p, o in positions.items() if self._expected.get(p) != o}
            if not changed:
                return
            expected = {p: self._expected.get(p) for p in changed}
            self._expected.update(changed)  # a second confirm in the same transaction builds on it

        def rolled_back() -> None:
            with self._lock:
                for p, o in expected.items():
                    if self._expected.get(p) == changed[p]:
                        self._expected[p] = o

        def committed() -> None:
            if not self._grouped:
                return  # an ungrouped subscriber's consumer group is its own, and throwaway
            try:
                self.commit(changed, note=False)
            except Exception as exc:
                self._report(f"commit to Kafka after the database on {self._topic} failed", exc)

        try:
            store.save(
                conn,
                group,
                self._topic,
                changed,
                expected=expected,
                on_commit=committed,
                on_rollback=rolled_back,
            )
        except BaseException:
            rolled_back()
            raise
