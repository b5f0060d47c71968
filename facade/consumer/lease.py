"""``Lease``: a grouped subscriber's ownership of its partitions in the consumer group: the
rebalance callbacks (assigned, revoked, lost), the lease lost when polls stop, and leaving the
group on close."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

from bolide.facade.config import SubscriberConfig
from bolide.facade.consumer.confirms import Confirms
from bolide.facade.consumer.fetch import Fetcher
from bolide.facade.consumer.host import ReceiverHooks
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.consumer.state import PartitionState
from bolide.facade.durable import DurableSession
from bolide.facade.errors import NotAssignedError
from bolide.facade.support import HookLock

__all__ = ["Lease"]

log = logging.getLogger(__name__)

#: How long ``leave`` serves the group's revocation before the consumer is closed anyway.
_LEAVE_TIMEOUT_S = 10.0
_LEAVE_BATCH = 500
_LEAVE_POLL_S = 0.05
#: Polls in a row with nothing assigned and no rebalance callback before ``close``.
_LEAVE_QUIET_POLLS = 4
#: How long a member waits before asking its position store again for a claim that failed.
_CLAIM_RETRY_S = 1.0

PartitionHook = Callable[[list[int]], None]


class Lease:
    """The partitions a subscriber holds, as the group moves them.

    Args:
        config: The subscriber's settings (its ``on_assign``/``on_revoke`` hooks).
        consumer: The subscriber's Kafka consumer.
        topic: The stream's topic.
        group_id: The subscriber group (for messages).
        state: The subscriber's partitions: which are held, their holds.
        positions: Where each partition reads; its holds and history cursors.
        confirms: The subscriber's confirms (committed on revocation by the hooks).
        fetcher: The subscriber's fetcher: what it holds of a partition that moves away goes.
        hooks: A running parallel receiver's revoke listener.
        durable: A durable client's session, else ``None``.
        report: The subscriber's error handler.
        lock: The subscriber's lock; user hooks run once it is let go.
        closed: Whether the subscriber is closed (a lost lease is not reported then).
    """

    def __init__(
        self,
        config: SubscriberConfig,
        consumer: Consumer,
        topic: str,
        group_id: str,
        *,
        state: PartitionState,
        positions: Positions,
        confirms: Confirms,
        fetcher: Fetcher,
        hooks: ReceiverHooks,
        durable: DurableSession | None,
        report: Report,
        lock: HookLock,
        closed: Callable[[], bool],
    ) -> None:
        self._config = config
        self._consumer = consumer
        self._topic = topic
        self._group_id = group_id
        self._state = state
        self._positions = positions
        self._confirms = confirms
        self._hooks = hooks
        self._durable = durable
        self._report = report
        self._lock = lock
        self._closed = closed
        self._fetcher = fetcher
        #: Rebalance callbacks served (see ``leave``); a first one means the group answered.
        self.rebalances = 0
        #: The subscriber gave its lease up (``deactivate``): served, reading nothing.
        self.deactivated = False
        # Partitions whose position store claim failed on assignment, and when to ask again.
        self._unclaimed: set[int] = set()
        self._claim_at = 0.0
        fetcher.follow(self)  # the fetcher asks this lease what a poll needs

    def subscribe(self) -> None:
        """Join the group (again), with this lease's rebalance callbacks.

        Caller: ``GroupMember.start`` (a grouped subscriber's start), ``reactivate``.
        Affects: the consumer's subscription; the callbacks then drive ``state``.
        """
        self._consumer.subscribe(
            [self._topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def deactivate(self) -> None:
        """Give the partitions up (revoked while still owned) and leave the group; the
        consumer is still served but reads nothing until ``reactivate``.

        Caller: ``OneStreamSubscriber.deactivate`` (the user, under the subscriber's lock).
        Affects: every held partition is lost (``lose``), ``deactivated``, the fetcher's
        pending records dropped, the subscription left.
        """
        if self.deactivated:
            return
        self.lose(sorted(self._state.assigned()), lost=False)  # on_revoke while still owned
        self.deactivated = True
        self._consumer.unsubscribe()
        self._fetcher.forget_pending()

    def reactivate(self) -> None:
        """Join the group again after ``deactivate``.

        Caller: ``OneStreamSubscriber.reactivate`` (the user, under the subscriber's lock).
        Affects: ``deactivated`` (the fetcher reads again); the subscription is made anew
        (``subscribe``).
        """
        if not self.deactivated:
            return
        self.deactivated = False
        self.subscribe()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalances += 1
        parts = [tp.partition for tp in partitions]
        positions = self._positions
        known: dict[int, int] = {}
        self._unclaimed.difference_update(parts)
        unclaimed: list[int] = []
        try:
            if parts:  # an incremental protocol's assignment may add nothing: no claim to ask
                positions.identify(self._confirms.identifier)
                committed = self._confirms.committed(parts)
                known = dict(committed)
                if self._durable is not None:
                    committed = self._durable.kept_positions(committed)
                positions.resume(parts, committed)
        except Exception as exc:
            # Never leave the lease half taken: go on from the confirmed positions read before
            # the failure (a position store's are ahead of the group's), never back below them.
            self._report(f"positioning {self._topic}{parts} failed; using confirmed offsets", exc)
            positions.fallback(parts, known)
            if self._confirms.keeps_positions and not known:
                # The store's claim failed: nothing read could be confirmed, and the group's
                # offsets lag the store's. Read nothing until a later poll claims them.
                unclaimed = parts
        state = self._state
        # An incremental protocol hands over only the partitions gained; eager, all held.
        state.take(state.assigned() | set(parts) if state.incremental else parts)
        if unclaimed:
            self._unclaimed.update(unclaimed)
            self._claim_at = time.monotonic() + _CLAIM_RETRY_S
            state.holds.hold(unclaimed, "claim")
        log.info("%s assigned %s[%s]", self._group_id, self._topic, parts)
        if self._durable is not None:
            self._durable.on_assigned(parts)
        hook = self._config.on_assign
        if hook is not None:
            self._lock.call(lambda: self._call_hook(hook, "on_assign", parts))

    def claim_again(self) -> None:
        """Ask the position store again (at most once a second) for the claims that failed on
        assignment; a partition claimed reads on from its stored position.

        Caller: the fetcher, before each poll.
        Affects: the claimed partitions' read position (``Fetcher.move``) and their "claim"
        hold, released; partitions whose claim fails again stay held and are retried.
        """
        if not self._unclaimed or time.monotonic() < self._claim_at:
            return
        state = self._state
        parts = sorted(self._unclaimed & state.assigned())
        self._unclaimed.clear()
        if not parts:
            return
        moved: list[int] = []
        try:
            self._positions.identify(self._confirms.identifier)
            committed = self._confirms.committed(parts)
            if self._durable is not None:
                committed = self._durable.kept_positions(committed)
            # The lookups of the log's start (and the initial scheme's) may fail too: a
            # partition not moved yet is asked again, never left paused for good.
            for p, offset in self._positions.resume_targets(parts, committed).items():
                self._fetcher.move(p, offset)  # the others stay where delivery stands
                moved.append(p)
        except Exception as exc:
            state.holds.release(moved, "claim")
            self._unclaimed.update(p for p in parts if p not in moved)
            self._claim_at = time.monotonic() + _CLAIM_RETRY_S
            self._report(f"claiming {self._topic}{parts} failed again; not reading them", exc)
            return
        state.holds.release(parts, "claim")
        log.info("%s claimed %s%s", self._group_id, self._topic, parts)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalances += 1
        parts = [tp.partition for tp in partitions]
        self.lose(parts, lost=False)
        self._state.unassign(parts)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalances += 1
        parts = [tp.partition for tp in partitions]
        self.lose(parts, lost=True)
        self._state.unassign(parts)

    def lose(self, parts: list[int], *, lost: bool) -> None:
        """Give up ``parts``: revoked while still owned (hooks may commit), or ``lost``.

        Caller: the rebalance callbacks (revoked, lost), ``deactivate``, ``expired`` and
        ``leave`` (a static member), on the thread that polls.
        Affects: the user's and a receiver's revoke hooks run (a confirm in them commits
        before the next owner reads), then ``state`` forgets the partitions and their holds,
        their history cursors close and the fetcher drops what it held of them; a lost lease
        is reported.
        """
        held = self._state.assigned() & set(parts)
        self._unclaimed.difference_update(parts)
        hook, listener = self._config.on_revoke, self._hooks.on_revoke
        if held and listener is not None and lost:
            listener(sorted(held), True)
        if held and (hook is not None or listener is not None) and not lost:
            # Kafka's onPartitionsRevoked: the partitions are still owned, so a confirm in the
            # hook commits (synchronously) before the next owner reads them.
            self._confirms.revoking = True
            try:
                if listener is not None:
                    listener(sorted(held), False)
                self._call_hook(hook, "on_revoke", sorted(held))
            finally:
                self._confirms.revoking = False
        # Its holds go too (a revoke forgets them; ``Holds.reapply`` resumes what librdkafka
        # kept paused of a partition handed straight back).
        self._state.lose(parts)
        for p in parts:
            self._positions.history.close(p)
        self._fetcher.drop(parts)
        # A revocation in a rebalance is routine (the lease may come straight back); only a
        # lost session is reported here. A confirm without the lease is reported by confirm().
        if lost and held and not self.deactivated and not self._closed():
            self._report(
                f"lease lost on {self._topic}{sorted(held)}",
                NotAssignedError("lease lost", stream=self._topic),
            )
        if held and hook is not None and lost:
            # Kafka's onPartitionsLost: another member may own them already; nothing to commit.
            self._call_hook(hook, "on_revoke", sorted(held))

    def _call_hook(self, hook: PartitionHook | None, name: str, parts: list[int]) -> None:
        if hook is None:
            return
        try:
            hook(parts)
        except Exception as exc:
            self._report(f"{name} raised", exc)

    def expired(self) -> None:
        """The consumer missed its poll deadline: the group has moved on without it.

        Caller: the fetcher, when librdkafka reports the poll interval exceeded.
        Affects: every held partition is lost (``lose(lost=True)``).
        """
        self.lose(sorted(self._state.assigned()), lost=True)

    def leave(self, *, joining: bool) -> None:
        """Leave the group, serving its callbacks here rather than in ``Consumer.close``.

        Any call on the consumer from a rebalance callback that ``close`` itself serves (the
        unassign every revocation needs) can wait for ever when the group still had a join or
        an assignment in flight (librdkafka #4884; the GIL is held there, so the whole process
        freezes), and librdkafka aborts the process (an assert in rd_kafka_cgrp_destroy_final)
        when a consumer closes while a re-subscription is still settling. So a join in flight
        (``joining``: the subscriber had not left already) is finished first, the subscription
        is left, and the consumer is polled until nothing is assigned and no rebalance callback
        has come for a few polls; ``close`` then finds nothing left to revoke. Records fetched
        meanwhile are dropped: nothing past the confirmed positions was delivered.

        Caller: ``GroupMember.leave`` (a grouped subscriber's close).
        Affects: the subscription (left, unless static: then every partition is given up
        here), the callbacks it serves.
        """
        consumer = self._consumer
        deadline = time.monotonic() + _LEAVE_TIMEOUT_S
        while joining and not self.rebalances and time.monotonic() < deadline:
            consumer.consume(num_messages=_LEAVE_BATCH, timeout=_LEAVE_POLL_S)
        # A static member (group.instance.id) keeps its place: unsubscribing sends the
        # LeaveGroup that rebalances the others, closing does not; it unassigns itself instead.
        static = "group.instance.id" in self._config.consumer_config
        if not static:
            consumer.unsubscribe()
        quiet = 0
        while time.monotonic() < deadline and quiet < _LEAVE_QUIET_POLLS:
            served = self.rebalances
            consumer.consume(num_messages=_LEAVE_BATCH, timeout=_LEAVE_POLL_S)
            settled = self.rebalances == served and (static or not consumer.assignment())
            quiet = quiet + 1 if settled else 0
        if static:
            self.lose(sorted(self._state.assigned()), lost=False)
            self._state.unassign()
