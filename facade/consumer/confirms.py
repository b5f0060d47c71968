"""``Confirms``: where a subscriber's confirms go.

Three places: the consumer group's committed offsets (``confirm()``), a Kafka transaction
(``Publisher.confirm(sub)``: the positions commit with the records published in it), or the
application's own database (``SubscriberConfig(positions=...)`` and ``confirm(conn=...)``: the
positions commit with the application's writes, and are read back from there).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bolide.facade.consumer.ledger import Ledger, decode_finished, encode_finished
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.errors import IllegalSubscriberStateError, NotAssignedError
from bolide.facade.history import KnownTopic
from bolide.facade.ports import Incarnations, PositionStore, TopicIdentity
from bolide.facade.support import HookLock

__all__ = ["Confirms"]

#: A commit inside ``on_revoke`` refused for a stale member epoch is sent this many times in
#: all, waiting a little longer each time for the group's heartbeat to bring the new epoch.
_STALE_ATTEMPTS = 4
_STALE_WAIT_S = 0.1


class Confirms:
    """A subscriber's confirms: what they move, and where they are written.

    Args:
        topic: The stream's topic.
        consumer: The subscriber's Kafka consumer.
        positions: The subscriber's positions (``last_read`` is what a confirm confirms).
        commits: The subscriber's consumer group keeps its offsets (``Membership.commits``:
            a subscriber group or a durable client; an ungrouped one's group is throwaway).
        group_id: Its consumer group id.
        store: Where the positions are kept instead of Kafka, or ``None``.
        report: The subscriber's error handler.
        lock: The subscriber's lock, held while its consumer is called: asynchronous commits
            from other threads are handed over to its holder (a poll in progress).

    Attributes:
        revoking: ``on_revoke`` runs: the partitions are still owned, commits are synchronous.
        group: The key the store keeps the positions under (``None`` without a store).
    """

    def __init__(
        self,
        topic: str,
        consumer: Consumer,
        positions: Positions,
        *,
        commits: bool,
        group_id: str,
        store: PositionStore | None,
        report: Report,
        lock: HookLock | None = None,
    ) -> None:
        self._topic = topic
        self._consumer = consumer
        self._positions = positions
        self._state = positions.state
        self._commits = commits
        self._store = store
        self._report = report
        self.group = (store.group or group_id) if store is not None else None
        self.revoking = False
        self._lock = threading.Lock()  # commits vs. closing the consumer
        self._consumer_lock = lock
        self._sent: dict[int, int] = {}  # the highest offset committed per partition
        self._closed = False
        # The store's rows this subscriber claimed (partition -> owner token, one per
        # assignment) and the highest position it knows committed there.
        self._owners: dict[int, str] = {}
        self._stored: dict[int, int] = {}
        self._instance = uuid.uuid4().hex[:16]
        self._claims = itertools.count(1)
        #: Finished sets left out of a write because their encoding did not fit.
        self.overflows = 0
        # The topic incarnation the store keeps the positions of (its rows' key; ``identify``).
        self._topic_known = KnownTopic(topic)

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
        held_only: bool = False,
    ) -> dict[int, int]:
        """The positions (next offsets) a confirm moves to, on partitions held.

        Without ``offset``: after the last record a poll returned (or, given ``read``, the
        last record handed out), on every partition. Records read on a partition a grouped
        subscriber no longer holds can no longer be confirmed by it: they are reported (once:
        they are forgotten) and left out, or with ``strict`` (a transaction, whose outputs of
        those records must not commit) raise; so do, with ``strict``, records read on a
        partition revoked since, even one handed straight back (it reads them again from its
        committed offset). With ``held_only`` (a confirm written in the caller's database
        transaction) records on a partition not held raise too: the effects written beside
        the confirm must roll back with it, not commit without their position. A
        ``deactivated`` subscriber holds none.

        Raises:
            ValueError: ``offset`` was never read on ``partition``.
            NotAssignedError: ``strict``, and records read on a partition no longer held (or
                on any, once deactivated, or revoked since they were read) are not confirmed;
                ``held_only``, and the partition is not held.
        """
        state = self._state
        last_read = state.confirmable(read) if read is not None else state.last_read()
        targets = dict(last_read) if offset is None else self._read(offset, partition, last_read)
        # An ungrouped subscriber holds every partition: what it read is all confirmable.
        assigned = set() if deactivated else set(state.assigned())
        unconfirmed = sorted(
            p for p, o in targets.items() if p not in assigned and state.unconfirmed(p, o)
        )
        if offset is None:  # another member reads them from here: reported or refused once
            state.forget_reads(set(targets) - assigned)
        if strict:
            self._refuse_revoked(unconfirmed)
        if held_only and unconfirmed:
            self._refuse_unheld(unconfirmed)
        if unconfirmed and not deactivated:
            self._report(
                f"confirm without the lease on {self._topic}{unconfirmed}: nothing changed",
                NotAssignedError(
                    "confirm without the lease", stream=self._topic, partition=unconfirmed[0]
                ),
            )
        return {p: o + 1 for p, o in targets.items() if p in assigned}

    def finished(
        self, positions: dict[int, int], offset: int | None, partition: int
    ) -> dict[int, list[int]]:
        """The records finished above each of ``positions`` (a confirm of one ``offset`` of
        ``partition`` counted): written with them, so that the next owner skips them.

        ``positions`` is updated in place: each jumps past the finished records that follow
        it without a gap (the frontier always moves), and a record confirmed above the first
        unfinished one writes its partition's frontier again, the record in its finished set.
        """
        state = self._state
        if offset is not None and partition not in positions and partition in state.assigned():
            frontier = state.frontier(partition)
            if 0 <= frontier <= offset:
                positions[partition] = frontier
        done: dict[int, list[int]] = {}
        for p, o in positions.items():
            ledger = Ledger(o, state.finished_above(p, o, offset if p == partition else None))
            ledger.advance(o)
            positions[p] = ledger.frontier
            done[p] = sorted(ledger.finished)
        return done

    def note_finished(self, partition: int, offsets: Iterable[int]) -> None:
        """Records of ``partition`` finished above its confirmed position (a parallel
        receiver's handlers finish out of order): kept in its ledger, written with the next
        position. With Kafka's group offsets the position is committed again now, with them
        in its metadata, so that the next owner (after a rebalance) skips them."""
        state = self._state
        state.finish(partition, offsets)
        if self._store is None and self._commits and partition in state.assigned():
            frontier = state.frontier(partition)
            if frontier >= 0:
                self.commit({partition: frontier})

    def _read(self, offset: int, partition: int, last_read: Mapping[int, int]) -> dict[int, int]:
        """``{partition: offset}``, a record read.

        Raises:
            ValueError: ``offset`` was never read on ``partition``.
        """
        last = last_read.get(partition)
        if last is None or offset > last:
            raise ValueError(
                f"offset {offset} of {self._topic}[{partition}] was never read (last read: {last})"
            )
        return {partition: offset}

    def _refuse_unheld(self, unheld: list[int]) -> None:
        """Raise for a confirm in the caller's transaction on partitions ``unheld``.

        Raises:
            NotAssignedError: Always.
        """
        raise NotAssignedError(
            f"{self._topic}{unheld} not held: the confirm is not written, and the "
            "transaction must not commit the effects of those records (roll it back; the "
            "partition's owner reads them again)",
            stream=self._topic,
            partition=unheld[0],
        )

    def _refuse_revoked(self, unconfirmed: list[int]) -> None:
        """Raise for records read and not confirmed on partitions ``unconfirmed`` (not held)
        or revoked since they were read; they are forgotten first, so it is raised once.

        Raises:
            NotAssignedError: There are such records.
        """
        revoked = sorted(set(unconfirmed) | set(self._state.revoked_since_read()))
        if not revoked:
            return
        self._state.forget_reads(revoked)
        raise NotAssignedError(
            f"records read on {self._topic}{revoked} are not confirmed and the partitions "
            "were revoked since: the transaction must not commit their outputs (it is "
            "aborted; the partitions' owner reads them again from the last confirm)",
            stream=self._topic,
            partition=revoked[0],
        )

    def confirm(
        self, positions: dict[int, int], conn: Any, finished: Mapping[int, list[int]] | None = None
    ) -> None:
        """Write ``positions`` (with the records ``finished`` above them): through ``conn``
        into the store, else to the consumer group.

        Raises:
            IllegalSubscriberStateError: ``conn`` is missing while the positions live in the
                application's database (Kafka's offsets are never read back there), or given
                without a store; or the consumer is closed.
        """
        finished = finished or {}
        if conn is not None:
            self.save(conn, positions, finished)
        elif self._store is not None:
            raise IllegalSubscriberStateError(
                "this subscriber keeps its positions in the application's database: confirm "
                "with sub.confirm(conn=...) in the transaction that holds the results",
                stream=self._topic,
            )
        else:
            self.commit(positions, finished=finished)

    # -- Kafka's group offsets ---------------------------------------------------------------

    def commit(
        self,
        positions: dict[int, int],
        *,
        note: bool = True,
        finished: Mapping[int, list[int]] | None = None,
    ) -> None:
        """Commit ``positions`` to the consumer group, the records ``finished`` above them in
        the commit's metadata: asynchronously, or synchronously while revoking (then a
        failure is reported). ``note`` remembers them as confirmed.

        Raises:
            IllegalSubscriberStateError: The consumer is closed.
        """
        if note:
            self._settle(positions, finished or {})
        commits = [TopicPartition(self._topic, p, o) for p, o in positions.items()]
        if not self.revoking and self._consumer_lock is not None:
            with self._lock:
                if self._closed:
                    raise IllegalSubscriberStateError("subscriber is closed", stream=self._topic)
            # Between two slices of a poll running in another thread, never waiting for it.
            self._consumer_lock.hand_over(lambda: self._send(commits))
            return
        with self._lock:
            if self._closed:
                raise IllegalSubscriberStateError("subscriber is closed", stream=self._topic)
            commits = self._fresh(commits)
            if not commits:
                return
            if not self.revoking:
                self._state.commit(commits, asynchronous=True)
                return
            try:
                self._commit_revoking(commits)
            except KafkaException as exc:
                for tp in commits:  # not committed: a later confirm may send it again
                    if self._sent.get(tp.partition) == tp.offset:
                        del self._sent[tp.partition]
                self._report(
                    f"confirm failed on {self._topic} while revoking; the partitions' next "
                    "owner reads their records again from the last commit",
                    exc,
                )

    def _commit_revoking(self, commits: list[TopicPartition]) -> None:
        """A synchronous commit inside ``on_revoke``. Under Kafka 4's consumer protocol the
        member's epoch may move on while the hook runs (the group's next heartbeat answered):
        the broker then refuses the commit as stale, though the partitions are still owned
        until the revocation is acknowledged. It is sent again with the new epoch, a few
        times.

        Raises:
            KafkaException: The commit failed, for another reason or for good.
        """
        for attempt in range(1, _STALE_ATTEMPTS + 1):
            try:
                self._state.commit(commits, asynchronous=False)
                return
            except KafkaException as exc:
                stale = exc.args[0].code() == KafkaError.STALE_MEMBER_EPOCH
                if not stale or attempt == _STALE_ATTEMPTS:
                    raise
                time.sleep(_STALE_WAIT_S * attempt)

    def _settle(self, positions: Mapping[int, int], finished: Mapping[int, list[int]]) -> None:
        """``positions`` are confirmed, the records ``finished`` above them with them: the one
        record of it, whether the group's offsets or the application's database holds them."""
        self._state.note_confirmed(positions)
        for p, o in positions.items():
            self._state.settled(p, o, finished.get(p, ()))

    def _metadata(self, partition: int, position: int) -> str:
        """The commit metadata of ``position``: the finished set above it, encoded (empty
        without one, or when it does not fit: those records run again, counted in
        ``overflows``). Read when the commit is sent: it holds every completion settled."""
        finished = self._state.finished_above(partition, position)
        if not finished:
            return ""
        text = encode_finished(position, finished)
        if text is None:
            self.overflows += 1
            return ""
        return text

    def _send(self, commits: list[TopicPartition]) -> None:
        """An asynchronous commit of what no later commit has passed (a commit handed over
        may run after one sent directly), unless the consumer closed meanwhile."""
        with self._lock:
            commits = self._fresh(commits)
            if commits and not self._closed:
                self._state.commit(commits, asynchronous=True)

    def _fresh(self, commits: list[TopicPartition]) -> list[TopicPartition]:
        """``commits`` above what was committed before; noted as committed (lock held)."""
        sent = self._sent
        # The same position goes out again with a finished set (its metadata).
        fresh = []
        for tp in commits:
            metadata = self._metadata(tp.partition, tp.offset)
            if tp.offset > sent.get(tp.partition, -1) or (
                metadata and tp.offset == sent.get(tp.partition)
            ):
                sent[tp.partition] = tp.offset
                fresh.append(TopicPartition(tp.topic, tp.partition, tp.offset, metadata=metadata))
        return fresh

    def committed(self, parts: list[int]) -> dict[int, int]:
        """Where ``parts`` resume: the store's positions (claimed for this assignment),
        else the group's committed offsets (negative where there is none)."""
        if self._store is None:
            found = self._positions.committed_with_metadata(parts)
            where = f"{self._topic} committed offsets"
            for p, (o, text) in found.items():
                self._state.resumes(p, o, decode_finished(o, text, where=where) if o >= 0 else ())
            return {p: o for p, (o, _) in found.items()}
        return self.stored(parts, claim=True)

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
        if not self._commits:
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
        offsets = [
            TopicPartition(self._topic, p, o, metadata=self._metadata(p, o))
            for p, o in positions.items()
        ]
        return offsets, metadata, lambda: self._state.note_confirmed(positions)

    # -- the application's database ----------------------------------------------------------

    @property
    def identifier(self) -> Callable[[TopicIdentity], str | None] | None:
        """``identify`` when the positions live in the application's database, else ``None``
        (Kafka forgets a deleted topic's offsets by itself)."""
        return self.identify if isinstance(self._store, Incarnations) else None

    def identify(self, identity: TopicIdentity) -> str | None:
        """The stream is the topic ``identity`` now: its positions are those of that
        incarnation (a topic deleted and created again starts without any). Returns the old
        topic id when the topic changed since the store, or this subscriber, last met it."""
        return self._topic_known.learn(self._store, self._topic, identity)

    @property
    def _stored_as(self) -> str:
        return self._topic_known.stored_as or self._topic

    def stored(self, parts: Iterable[int], *, claim: bool = False) -> dict[int, int]:
        """The store's positions of ``parts`` (negative where none is stored). With
        ``claim``, this subscriber becomes their only writer first (a fresh owner token per
        assignment: writes of an earlier one fail)."""
        assert self._store is not None and self.group is not None
        parts = list(parts)
        if not claim:
            found = self._store.load(self.group, self._stored_as, parts)
            return {p: found.get(p, -1) for p in parts}
        with self._lock:
            for p in parts:  # unclaimed until the claim commits: a failed claim refuses writes
                self._owners.pop(p, None)
        owner = f"{self._instance}-{next(self._claims)}"
        found = self._store.claim(self.group, self._stored_as, parts, owner)
        texts = self._store.finished(self.group, self._stored_as, parts)
        with self._lock:
            for p in parts:
                self._owners[p] = owner
                self._stored[p] = o = found.get(p, -1)
                finished = decode_finished(o, texts.get(p), where=f"{self._topic} positions")
                self._state.resumes(p, o, finished if o >= 0 else ())
        return {p: found.get(p, -1) for p in parts}

    def save(self, conn: Any, positions: dict[int, int], finished: Mapping[int, list[int]]) -> None:
        """Write ``positions`` in the application's transaction on ``conn`` (a position never
        moves back); once it commits, commit them to the consumer group too
        (asynchronously: for lag tools only).

        Raises:
            IllegalSubscriberStateError: No position store is configured.
            NotAssignedError: This subscriber does not hold the row's claim (the partition was
                taken over, or never claimed): the application's transaction must roll back.
        """
        store, group = self._store, self.group
        if store is None or group is None:
            raise IllegalSubscriberStateError(
                "confirm(conn=...) needs SubscriberConfig(positions=SqlPositions(...))",
                stream=self._topic,
            )
        with self._lock:
            stored = self._stored
            # The same position again, when records above it finished (its finished set).
            changed = {
                p: o
                for p, o in positions.items()
                if o > stored.get(p, -1) or (o == stored.get(p) and finished.get(p))
            }
            owners = {p: self._owners[p] for p in positions if p in self._owners}
        # Every partition's claim is checked, a position that moves nothing included: the
        # effects beside it (records read again below the stored position) commit only while
        # this subscriber is the partition's writer.
        unclaimed = sorted(set(positions) - set(owners))
        if unclaimed:
            raise NotAssignedError(
                f"{self._topic}{unclaimed}: this subscriber holds no claim on the stored "
                "positions (the partitions were taken over); roll back",
                stream=self._topic,
                partition=unclaimed[0],
            )

        done = {p: finished[p] for p in changed if finished.get(p)}

        def committed() -> None:
            with self._lock:
                mine = {p: o for p, o in changed.items() if self._owners.get(p) == owners[p]}
                for p, o in mine.items():
                    self._stored[p] = max(o, self._stored.get(p, -1))
                self._settle(mine, done)
            if not self._commits or not changed:
                return  # an ungrouped subscriber's consumer group is its own, and throwaway
            try:
                self.commit(changed, note=False)
            except Exception as exc:
                self._report(f"commit to Kafka after the database on {self._topic} failed", exc)

        # The unchanged positions are written too (never moving back): that checks their claim.
        key = self._stored_as
        store.save(conn, group, key, positions, owners=owners, on_commit=committed, finished=done)
