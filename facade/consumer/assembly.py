"""``assemble``: a subscriber's parts, built together because they share its partitions' state,
its queue, its lock and its error handler."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer.confirms import Confirms
from bolide.facade.consumer.fetch import Fetcher
from bolide.facade.consumer.host import ReceiverHooks, ReceiverSeat, SessionHost, SubscriberView
from bolide.facade.consumer.lease import Lease
from bolide.facade.consumer.membership import Membership
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.consumer.state import PartitionState
from bolide.facade.durable import DurableSession
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.kafka.fatal import Refusals
from bolide.facade.record import Record
from bolide.facade.support import HookLock

__all__ = ["Parts", "assemble"]


@dataclass(slots=True, frozen=True)
class Parts:
    """What a subscriber is made of (see docs/architecture.md)."""

    consumer: Consumer
    #: In a group or not: what joining, the lease, confirms and positions do differently.
    membership: Membership
    #: The partitions' state (held, positions, read, confirmed, holds): its only writer.
    state: PartitionState
    positions: Positions
    confirms: Confirms
    #: Read, not yet delivered.
    pending: deque[Message | Record]
    #: A durable client's session (GemFire's durable client), else ``None``.
    durable: DurableSession | None
    fetcher: Fetcher
    lease: Lease
    #: A running parallel receiver's revoke listener and confirm limit.
    receiver_hooks: ReceiverHooks

    def start(self, partitions: int) -> None:
        """Claim the durable id, then join the group or assign every partition (where each
        starts: its stored position, else the initial offset scheme). On failure the
        durable claim is given back and the consumer closed (never subscribed: nothing to
        revoke)."""
        try:
            if self.durable is not None:
                self.durable.connect()
            self.membership.start(self.positions, self.confirms, self.lease, partitions)
        except BaseException:
            try:
                if self.durable is not None:
                    self.durable.abort()
            finally:
                self.consumer.close()
            raise

    def for_transaction(self) -> tuple[list[TopicPartition], Any, Callable[[], None]]:
        """For ``Publisher.confirm``: the delivered positions, the group's metadata, and what
        to call once the transaction commits.

        Raises:
            IllegalSubscriberStateError: A durable client not built ``transactional``: its
                polls commit what they delivered, outside the transaction.
        """
        if self.durable is not None and not self.durable.transactional:
            raise IllegalSubscriberStateError(
                "a durable client confirmed through transactions must say so when it is "
                "built, SubscriberConfig(transactional=True): otherwise its polls commit what "
                "they delivered outside the transaction, and an abort loses it",
                stream=self.positions.topic,
            )
        return self.confirms.for_transaction(deactivated=self.lease.deactivated)

    def close(self, keep_alive: bool, *, failed: bool) -> None:
        """Shut the parts down in order: the durable client's last commit, leaving the
        group, the consumer, then confirms, the durable registry and the dead letters."""
        durable = self.durable
        try:
            if durable is not None:
                durable.before_close(keep_alive, failed=failed)
        finally:
            try:
                # A deactivated subscriber has left already: no join is on its way.
                self.membership.leave(self.lease, joining=not self.lease.deactivated)
                self.consumer.close()
            finally:
                self.confirms.close()
                if durable is not None:
                    durable.after_close(keep_alive)
                self.fetcher.close()

    def seat(
        self,
        subscriber: SubscriberView,
        lock: HookLock,
        report: Report,
        confirm: Callable[[int, int], None],
        rewind: Callable[[Mapping[int, int]], None],
    ) -> ReceiverSeat:
        """The receivers' view of ``subscriber`` (``ReceiverHost``)."""
        return ReceiverSeat(
            subscriber,
            self.consumer,
            state=self.state,
            lock=lock,
            report=report,
            confirm=confirm,
            note_finished=self.confirms.note_finished,
            rewind=rewind,
            decode=self.fetcher.decode,
            hooks=self.receiver_hooks,
            durable=self.durable,
        )


def assemble(
    cluster: Cluster,
    config: SubscriberConfig,
    consumer: Consumer,
    partitions: int,
    *,
    membership: Membership,
    report: Report,
    lock: HookLock,
    closed: Callable[[], bool],
    refusals: Refusals,
) -> Parts:
    """Build the parts of a subscriber of ``config`` on ``consumer`` (a stream of ``partitions``),
    in a group or not as ``membership`` says. Nothing talks to Kafka until ``Parts.start``."""
    topic, group_id, auto = config.single.name, membership.group_id, membership.auto_scheme
    state = membership.partition_state(cluster, config, consumer, partitions)
    positions = Positions(cluster, config, consumer, state, partitions, report, auto=auto)
    confirms = Confirms(topic, consumer, positions, commits=membership.commits, group_id=group_id,
                        store=config.positions, report=report, lock=lock)  # fmt: skip
    pending: deque[Message | Record] = deque()
    host = SessionHost(consumer, topic, positions, pending, report, lock)
    durable = DurableSession(host, cluster, config, partitions) if config.durable_id else None
    hooks = ReceiverHooks()
    fetcher = Fetcher(
        cluster,
        config,
        consumer,
        positions=positions,
        durable=durable,
        report=report,
        pending=pending,
        refusals=refusals,
        may_share=membership.may_share,
    )
    lease = Lease(
        config,
        consumer,
        topic,
        group_id,
        state=state,
        positions=positions,
        confirms=confirms,
        fetcher=fetcher,
        hooks=hooks,
        durable=durable,
        report=report,
        lock=lock,
        closed=closed,
    )
    return Parts(
        consumer, membership, state, positions, confirms, pending, durable, fetcher, lease, hooks
    )
